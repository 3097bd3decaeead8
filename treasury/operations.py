"""Operators' treasury actions (issue 13 §2), one service each (common/console.py):
one transaction, one audit row (``recon_break_events``), the permission checked here
too (``treasury.resolve_break``), refusals raise ``OperationRefused`` having written
nothing.

- ``break_explain``: an open break is explained with an adjusting entry in the ledger
  (``ledger.chart.adjusted``: ``amount`` on the break's account, the other side
  ``equity:adjustments``; one per break) and closed ``explained``;
- ``break_fix``: an open break whose cause was mended outside (a missing settlement
  chased with Razorpay, a reversal booked by a new attempt) is closed ``fixed``;
  nothing is posted;
- ``reconcile_now``: an operator's on-demand run (``treasury.reconcile.reconcile``).
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils import timezone

from common.console import OperationRefused, Preview, clean_note, operator_name, require_permission
from ledger import chart
from treasury.models import Break, BreakEvent, ReconRun

PERMISSION = "treasury.resolve_break"


def _open(break_id: int, *, lock: bool = False) -> Break:
    rows = Break.objects.select_for_update() if lock else Break.objects
    row = rows.filter(pk=break_id).first()
    if row is None:
        raise OperationRefused(f"no break {break_id}")
    if row.status != Break.Status.OPEN:
        raise OperationRefused(f"break {row.key} is {row.status}, not open")
    return row


def _amount(value, currency: str) -> Decimal:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError) as exc:
        raise OperationRefused(f"not an amount: {value!r}") from exc
    places = 2 if currency == "INR" else 7
    if not amount.is_finite() or amount == 0 or amount != round(amount, places):
        raise OperationRefused(f"the adjustment must be a non-zero {currency} amount with at "
                               f"most {places} decimals")
    return amount


def break_explain_preview(break_id: int) -> Preview:
    row = Break.objects.get(pk=break_id)
    refusal = "" if row.status == Break.Status.OPEN else f"the break is {row.status}"
    return Preview(
        will=[f"Post an adjusting entry: the amount you give on {row.account} {row.currency} "
              f"(positive: debit), the other side on {chart.ADJUSTMENTS}.",
              "Close the break as explained, with your note in its audit row."],
        evidence=[("Break", row.key), ("Difference (outside - books)", row.difference),
                  ("Books", row.books), ("Outside", row.outside)],
        refusal=refusal)


def break_explain(*, break_id: int, operator, amount, note: str) -> Break:
    """Explain break ``break_id`` with an adjusting entry of ``amount`` (Decimal or
    text, the break's currency, positive = debit its account) and close it
    ``explained``. Raises OperationRefused (permission, not open, bad amount, note)."""
    require_permission(operator, PERMISSION)
    note = clean_note(note)
    with transaction.atomic():
        row = _open(break_id, lock=True)
        value = _amount(amount, row.currency)
        # One entry per break: a break reopened under an earlier one's key (its
        # difference came back, treasury/reconcile.py) gets an entry of its own.
        key = row.key if not chart.posted(f"adjust:{row.key}") else f"{row.key[:180]}#{row.pk}"
        entry = chart.adjusted(break_key=key, account=row.account, currency=row.currency,
                               amount=value, note=note)
        Break.objects.filter(pk=row.pk).update(
            status=Break.Status.EXPLAINED, resolution=note, adjusting_key=entry.idempotency_key,
            resolved_by=operator_name(operator), resolved_at=timezone.now(),
            updated_at=timezone.now())
        BreakEvent.objects.create(break_row=row, action="explain",
                                  operator=operator_name(operator), note=note,
                                  detail={"entry": entry.idempotency_key, "amount": str(value),
                                          "account": row.account, "currency": row.currency})
    row.refresh_from_db()
    return row


def break_fix_preview(break_id: int) -> Preview:
    row = Break.objects.get(pk=break_id)
    refusal = "" if row.status == Break.Status.OPEN else f"the break is {row.status}"
    return Preview(
        will=["Close the break as fixed (its cause was mended): nothing is posted.",
              "A later reconciliation that sees the difference again opens a new break "
              "only if this one is reopened by it."],
        evidence=[("Break", row.key), ("Difference (outside - books)", row.difference),
                  ("Books", row.books), ("Outside", row.outside)],
        refusal=refusal)


def break_fix(*, break_id: int, operator, note: str) -> Break:
    """Close break ``break_id`` as ``fixed``. Raises OperationRefused."""
    require_permission(operator, PERMISSION)
    note = clean_note(note)
    with transaction.atomic():
        row = _open(break_id, lock=True)
        Break.objects.filter(pk=row.pk).update(
            status=Break.Status.FIXED, resolution=note, resolved_by=operator_name(operator),
            resolved_at=timezone.now(), updated_at=timezone.now())
        BreakEvent.objects.create(break_row=row, action="fix", operator=operator_name(operator),
                                  note=note)
    row.refresh_from_db()
    return row


def reconcile_now(*, operator, day: date | None = None) -> ReconRun:
    """An operator's on-demand reconciliation of ``day`` (default today). Raises
    OperationRefused without the permission."""
    from treasury.reconcile import reconcile

    require_permission(operator, PERMISSION)
    run = reconcile(day, trigger="operator", operator=operator_name(operator))
    BreakEvent.objects.create(action="reconcile", operator=operator_name(operator),
                              detail={"run": run.pk, "status": run.status,
                                      "breaks": run.counts.get("breaks", 0)})
    return run
