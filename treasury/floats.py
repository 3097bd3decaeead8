"""The treasury view's figures (issue 13 §4): the float per account now (books and
outside), against its floor, and the closing balances and flows per day over time.

Outside balances come from the SEP-24 pages' cached reads (anchor/liquidity.py,
payouts/liquidity.py; ``live=True`` reads them now) or else the last reconciliation
run's; books from the ledger. Amounts Decimal; INR rupees, USDC.

Why the two differ (``outside - books``): what the last reconciliation run found in
flight (RazorpayX's payouts debited there and not booked paid yet, the distribution
account's receipts no posting counts yet), what the open row breaks on the account
explain (the sum of their differences: a missing or differing statement row), and the
unexplained remainder, which an operator looks into."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from anchor import liquidity as usdc_float
from ledger import chart
from ledger import services as ledger
from payouts import liquidity as inr_float
from treasury import report
from treasury.models import Break, ReconRun

# (account, currency, the run's balances key, the floor setting, the live read)
WATCHED = [
    (chart.DISTRIBUTION, "USDC", "stellar:distribution USDC", "TREASURY_FLOOR_DISTRIBUTION_USDC",
     usdc_float.distribution_usdc, usdc_float.KEY),
    (chart.RAZORPAYX_CURRENT, "INR", "razorpayx:current INR", "TREASURY_FLOOR_RAZORPAYX_INR",
     inr_float.razorpayx_available, inr_float.KEY),
]
CHARTED = [(chart.DISTRIBUTION, "USDC"), (chart.RAZORPAYX_CURRENT, "INR"),
           (chart.BANK_SETTLEMENTS, "INR"), (chart.RAZORPAY_PENDING, "INR")]


@dataclass(frozen=True)
class Float:
    account: str
    currency: str
    books: Decimal
    outside: Decimal | None  # None: never read
    source: str  # "live" | "cached" | "reconciliation <time>" | "unknown"
    floor: Decimal
    in_flight: Decimal = Decimal(0)  # the last run's in-flight part of outside - books
    breaks: Decimal = Decimal(0)  # what the open row breaks on the account explain

    @property
    def gap(self) -> Decimal | None:
        """outside - books (None: the outside was never read)."""
        return None if self.outside is None else self.outside - self.books

    @property
    def explained(self) -> Decimal:
        return self.in_flight + self.breaks

    @property
    def unexplained(self) -> Decimal | None:
        """What neither the payments in flight nor the open row breaks explain."""
        return None if self.gap is None else self.gap - self.explained

    @property
    def low(self) -> bool:
        """Below its floor (as the outside says; the books when it was never read)."""
        value = self.outside if self.outside is not None else self.books
        return value < self.floor


def floats(*, live: bool = False) -> list[Float]:
    """The watched accounts' float now. ``live``: read the outside now (the treasury
    page); else only what is cached or the last run's (``/metrics``: no network)."""
    run = ReconRun.objects.filter(status=ReconRun.Status.DONE).first()
    out = []
    for account, currency, run_key, floor, read, key in WATCHED:
        outside, source = None, "unknown"
        if live:
            outside, source = read(), "live"
        elif cache.get(key) is not None:
            outside, source = Decimal(cache.get(key)), "cached"
        if outside is None and run is not None and run_key in run.balances:
            outside = Decimal(run.balances[run_key]["outside"])
            source = f"reconciliation {run.finished_at:%Y-%m-%d %H:%M} UTC"
        out.append(Float(account, currency, ledger.balance(account=account, currency=currency),
                         outside, source if outside is not None else "unknown",
                         Decimal(getattr(settings, floor)), _in_flight(run, run_key),
                         _row_breaks(account, currency)))
    return out


def _in_flight(run: ReconRun | None, run_key: str) -> Decimal:
    """The part of the run's ``outside - books`` that was in flight: what is left once
    its row breaks and its unexplained difference are taken out (sign as it moves the
    difference: a RazorpayX payout debited there and not booked paid is negative, a
    receipt not booked yet positive). 0 without a run."""
    compared = (run.balances or {}).get(run_key) if run is not None else None
    if not compared:
        return Decimal(0)
    return (Decimal(compared["outside"]) - Decimal(compared["books"])
            - Decimal(compared["difference"])
            - Decimal(compared.get("explained_by_breaks") or 0))


def _row_breaks(account: str, currency: str) -> Decimal:
    """The sum of the open row breaks' differences on the account (a balance break is
    the unexplained remainder itself, left out)."""
    return sum(Break.objects.filter(status=Break.Status.OPEN, account=account,
                                    currency=currency)
               .exclude(kind=Break.Kind.BALANCE_DIFFERS)
               .values_list("difference", flat=True), Decimal(0))


def history(days: int = 14, today: date | None = None) -> list[tuple[date, dict]]:
    """Per day (oldest first): (account, currency) -> the report row (closing, debits,
    credits) of the charted accounts."""
    today = today or timezone.now().date()
    out = []
    for back in range(days - 1, -1, -1):
        day = today - timedelta(days=back)
        rows = {(r.account, r.currency): r for r in report.daily_report(day)
                if (r.account, r.currency) in CHARTED}
        out.append((day, rows))
    return out


def svg_chart(series: list[tuple[date, dict]], width: int = 640, height: int = 180) -> list[dict]:
    """One small line chart per charted account: {account, currency, points, low, high,
    last} with ``points`` an SVG polyline (x across the days, y the closing balance)."""
    charts = []
    for account, currency in CHARTED:
        values = [rows[(account, currency)].closing if (account, currency) in rows else
                  Decimal(0) for _, rows in series]
        low, high = min(values), max(values)
        span = (high - low) or Decimal(1)
        step = width / max(1, len(values) - 1)
        ys = [height - 5 - float((v - low) / span) * (height - 10) for v in values]
        points = " ".join(f"{i * step:.1f},{y:.1f}" for i, y in enumerate(ys))
        charts.append({"account": account, "currency": currency, "points": points,
                       "low": low, "high": high, "last": values[-1] if values else 0,
                       "width": width, "height": height})
    return charts
