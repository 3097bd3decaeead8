"""Fault switches shared by the sandbox's stand-ins.

Every name a stand-in reads is listed in ``KNOWN`` (each stand-in documents what its
own do in its module docstring). Switching on any other name is an error
(``UnknownFault``; ``POST /sandbox/faults`` answers 400 with the known names), so a
typo in a test or the demo can never leave a fault silently off.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from sandbox.control.models import FaultSwitch

DB = "sandbox"

KNOWN: frozenset[str] = frozenset({
    # sandbox/horizon/service.py
    "horizon.submit_504_after_apply", "horizon.submit_drop", "horizon.lookup_404_once",
    "horizon.lookup_lag", "horizon.ingest_behind", "horizon.split_nodes",
    "horizon.stale_history", "horizon.try_again_later", "horizon.close_hold",
    # sandbox/ap (service.py, observer.py, assets.py, rpc.py, events.py, views.py)
    "ap.rpc_32603_unindexed_hash", "ap.rpc_32603", "ap.rpc_slow", "ap.next_withdraw_memo",
    "ap.event_duplicate", "ap.event_reorder", "ap.event_lose", "ap.stale_status",
    "ap.require_aud", "ap.asset_decimals", "ap.observer_off", "ap.observer_miss",
    "ap.observer_match_first", "ap.rpc_answer_lost",
    # sandbox/razorpay/payins.py
    "razorpay.webhook_replay", "razorpay.webhook_lose", "razorpay.webhook_reorder",
    "razorpay.payment_failed_then_captured", "razorpay.payment_fetch_5xx",
    # sandbox/razorpay/refunds.py
    "razorpay.refund_settle_delay", "razorpay.refund_create_5xx_after_create",
    "razorpay.refund_fail", "razorpay.refund_webhook_lose",
    "razorpay.refund_webhook_duplicate", "razorpay.refund_webhook_reorder",
    "razorpay.refund_fetch_5xx",
    # sandbox/razorpay/settlements.py
    "razorpay.settlement_omit_payment", "razorpay.settlement_fee_mismatch",
    "razorpay.settlement_delay",
    # sandbox/razorpay/payouts.py
    "razorpayx.settle_delay", "razorpayx.payout_stuck_processing",
    "razorpayx.processed_then_reversed", "razorpayx.fail_payout",
    "razorpayx.create_5xx_after_create", "razorpayx.webhook_before_create_returns",
    "razorpayx.webhook_duplicate", "razorpayx.webhook_reorder", "razorpayx.webhook_lose",
    "razorpayx.payout_fetch_5xx", "razorpayx.list_lag",
    "razorpayx.reversal_statement_only", "razorpayx.statement_fee_mismatch",
    "razorpayx.statement_utr_mismatch", "razorpayx.statement_omit_payout",
    # sandbox/anchor31/machine.py
    "anchor31.reject_before_funding", "anchor31.refund_after_funding",
    "anchor31.fail_payout", "anchor31.slow", "anchor31.step_delay", "anchor31.http_5xx",
    "anchor31.refund_short", "anchor31.fail_payout_then_refund",
})


class UnknownFault(ValueError):
    """No stand-in reads a fault of this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown fault {name!r}")
        self.name = name


def set_fault(name: str, *, times: int | None = None, params: dict | None = None) -> None:
    """Switch fault ``name`` on (``times`` None = until cleared), counting from zero.
    Raises UnknownFault for a name no stand-in reads."""
    if name not in KNOWN:
        raise UnknownFault(name)
    FaultSwitch.objects.using(DB).update_or_create(
        name=name, defaults={"times": times, "params": params or {}, "fired": 0}
    )


def clear_faults() -> None:
    FaultSwitch.objects.using(DB).all().delete()


def take(name: str) -> dict | None:
    """Fire fault ``name`` once if it is on: return its params, else None. Atomic."""
    fired = take_numbered(name)
    return None if fired is None else fired[0]


def take_numbered(name: str) -> tuple[dict, int] | None:
    """Fire fault ``name`` once if it is on: (its params, how many times it fired
    before this one), else None. Atomic: concurrent callers get distinct numbers."""
    with transaction.atomic(using=DB):
        switch = (
            FaultSwitch.objects.using(DB).select_for_update().filter(name=name).first()
        )
        if switch is None:
            return None
        if switch.times is not None and switch.fired >= switch.times:
            return None
        FaultSwitch.objects.using(DB).filter(pk=switch.pk).update(fired=F("fired") + 1)
        return switch.params, switch.fired


def peek(name: str) -> dict | None:
    """Params of fault ``name`` if it is on (without firing it), else None."""
    switch = FaultSwitch.objects.using(DB).filter(name=name).first()
    if switch is None or (switch.times is not None and switch.fired >= switch.times):
        return None
    return switch.params


def listing() -> list[dict]:
    return [
        {"name": s.name, "params": s.params, "times": s.times, "fired": s.fired}
        for s in FaultSwitch.objects.using(DB).order_by("name")
    ]
