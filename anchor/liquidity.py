"""Whether the distribution account holds the USDC a deposit will need, asked before the
customer pays (issue 13 §4: "the SEP-24 page tells the customer before they pay,
instead of failing after").

``release_shortfall(amount_usdc)`` reads the distribution account's USDC on Horizon
(``stellar.asset_balance``, with HTTP_TIMEOUT_S), cached per process for
TREASURY_BALANCE_CACHE_S seconds, and returns the customer-facing reason when the
balance is below ``amount_usdc`` ("" when it is enough, or when Horizon cannot be read:
an unknown balance never stops a payment, it is logged). The release itself stays
the one guard of the money (a shortfall after the customer paid still goes to the
queue, never a partial payment)."""

from __future__ import annotations

import logging
from decimal import Decimal

from django.conf import settings

from anchor import stellar
from common.cached import cached_decimal

log = logging.getLogger(__name__)
KEY = "corridor:liquidity:distribution_usdc"


def distribution_usdc() -> Decimal | None:
    """The distribution account's USDC as last read (cached), or None if unreadable."""
    def read() -> Decimal | None:
        try:
            return stellar.asset_balance(stellar.distribution_keypair().public_key,
                                         stellar.usdc())
        except stellar.HorizonUnavailable as exc:
            log.warning("liquidity: distribution USDC unreadable: %s", exc)
            return None

    return cached_decimal(KEY, read, settings.TREASURY_BALANCE_CACHE_S)


def release_shortfall(amount_usdc: Decimal) -> str:
    """The reason to show when ``amount_usdc`` cannot be released now, else ""."""
    balance = distribution_usdc()
    if balance is None or balance >= amount_usdc:
        return ""
    return (f"We cannot take this deposit right now: we hold less USDC than the "
            f"{amount_usdc.normalize():f} USDC it would release. Nothing has been charged; "
            "please try a smaller amount or again later.")
