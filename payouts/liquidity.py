"""Whether the RazorpayX account holds the rupees a withdrawal will pay, asked before the
wallet sends its USDC (issue 13 §4). ``payout_shortfall(amount_inr)`` reads RazorpayX's
``banking_balances`` (``payouts.statement.balance``: ``available_amount``), cached per
process for TREASURY_BALANCE_CACHE_S seconds, and returns the customer-facing reason
when it is below ``amount_inr`` ("" when enough, or when the balance cannot be read:
logged, never a refusal)."""

from __future__ import annotations

import logging
from decimal import Decimal

from django.conf import settings

from anchor import razorpay as rzp
from common.cached import cached_decimal
from payouts import statement

log = logging.getLogger(__name__)
KEY = "corridor:liquidity:razorpayx_available_inr"


def razorpayx_available() -> Decimal | None:
    """RazorpayX's available rupees as last read (cached), or None if unreadable."""
    def read() -> Decimal | None:
        try:
            return statement.balance().available
        except rzp.RazorpayError as exc:
            log.warning("liquidity: RazorpayX balance unreadable: %s", exc)
            return None

    return cached_decimal(KEY, read, settings.TREASURY_BALANCE_CACHE_S)


def payout_shortfall(amount_inr: Decimal) -> str:
    """The reason to show when ``amount_inr`` cannot be paid out now, else ""."""
    available = razorpayx_available()
    if available is None or available >= amount_inr:
        return ""
    return (f"We cannot take this withdrawal right now: our payout account holds less than "
            f"the ₹{amount_inr:,.2f} it would pay. Do not send any USDC; please try a "
            "smaller amount or again later.")
