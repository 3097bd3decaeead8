"""The daily report (issue 13 §2): per day and ledger account, the opening balance, the
day's debits and credits, the closing balance and the breaks about that account, for an
accountant to sign off; as rows (the admin page) and as CSV.

Days are UTC calendar days of the entries' ``created_at``. Sign convention as the
ledger's (a positive amount is a debit). One statement over ``ledger_postings``, in a
REPEATABLE READ snapshot."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.db import connection, transaction

from treasury.models import Break

COLUMNS = ("day", "account", "currency", "opening", "debits", "credits", "closing",
           "breaks_open", "breaks_closed")


@dataclass(frozen=True)
class ReportRow:
    day: date
    account: str
    currency: str
    opening: Decimal
    debits: Decimal
    credits: Decimal  # negative (the ledger's sign)
    closing: Decimal
    breaks_open: int
    breaks_closed: int


def daily_report(day: date) -> list[ReportRow]:
    """Every account that has a posting up to the end of ``day``, ordered by account."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    end = start + timedelta(days=1)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute("""
            SELECT a.code, a.currency,
                   COALESCE(SUM(p.amount) FILTER (WHERE e.created_at < %s), 0),
                   COALESCE(SUM(p.amount) FILTER (WHERE e.created_at >= %s AND p.amount > 0), 0),
                   COALESCE(SUM(p.amount) FILTER (WHERE e.created_at >= %s AND p.amount < 0), 0)
              FROM ledger_postings p
              JOIN ledger_entries e ON e.id = p.entry_id
              JOIN ledger_accounts a ON a.id = p.account_id
             WHERE e.created_at < %s
             GROUP BY a.code, a.currency
             ORDER BY a.code, a.currency""", [start, start, start, end])
        sums = cur.fetchall()
        breaks: dict[tuple[str, str], list[int]] = {}
        for account, currency, status in Break.objects.filter(
                created_at__lt=end, updated_at__gte=start).values_list(
                "account", "currency", "status"):
            counts = breaks.setdefault((account, currency), [0, 0])
            counts[0 if status == Break.Status.OPEN else 1] += 1
    return [ReportRow(day, code, currency, opening, debits, credits,
                      opening + debits + credits, *breaks.get((code, currency), [0, 0]))
            for code, currency, opening, debits, credits in sums]


def report_csv(day: date) -> str:
    """``daily_report(day)`` as CSV text (header ``COLUMNS``)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for row in daily_report(day):
        writer.writerow([_plain(getattr(row, column)) for column in COLUMNS])
    return out.getvalue()


def _plain(value):
    """A Decimal in plain notation (``0.0000000``, never ``str``'s ``0E-7``)."""
    return format(value, "f") if isinstance(value, Decimal) else value
