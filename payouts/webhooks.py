"""Apply a verified RazorpayX payout webhook to our rows (razorpay/NOTES.md §2.8).

The payout is matched by provider id, else by ``reference_id`` (= AP transaction id):
the webhook can arrive before the create call returned (NOTES §5 bug 5), but our row
and key were committed before the call, so there is always a row to match. Events that
match nothing get 2xx (Razorpay disables endpoints after failures) and are logged."""

from __future__ import annotations

import logging

from django.db import transaction

from payouts import guard
from payouts.models import PayoutAttempt, WithdrawalPayout
from payouts.providers.razorpayx import _payout

log = logging.getLogger(__name__)


def check_payout_event(event: dict) -> None:
    """Shape of a payout event (razorpay/NOTES.md §2.8); raises MalformedEvent."""
    from anchor.callbacks import MalformedEvent

    payload = event.get("payload")
    if payload is None:
        return
    if not isinstance(payload, dict):
        raise MalformedEvent("payload must be an object")
    payout = payload.get("payout")
    if payout is None:
        return
    if not isinstance(payout, dict) or not isinstance(payout.get("entity", {}), dict):
        raise MalformedEvent("payload.payout.entity must be an object")
    entity = payout.get("entity") or {}
    if not entity:
        return
    if not isinstance(entity.get("id"), str) or not 0 < len(entity["id"]) <= 40:
        raise MalformedEvent("payload.payout.entity.id must be a payout id")
    amount = entity.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or not 0 <= amount < 10**15:
        raise MalformedEvent("payload.payout.entity.amount must be integer paise")
    for name in ("status", "reference_id", "utr"):
        if entity.get(name) is not None and (not isinstance(entity[name], str)
                                             or len(entity[name]) > 64):
            raise MalformedEvent(f"payload.payout.entity.{name} must be a short string")
    if not isinstance(entity.get("status_details") or {}, dict):
        raise MalformedEvent("payload.payout.entity.status_details must be an object")


def payout_webhook_apply(*, event: dict) -> str:
    name = str(event.get("event", ""))
    entity = (((event.get("payload") or {}).get("payout") or {}).get("entity")) or {}
    if not name.startswith("payout.") or not entity.get("id"):
        return "ignored"
    state = _payout(entity)
    attempt = PayoutAttempt.objects.filter(provider_payout_id=state.payout_id).first()
    payout = attempt.payout if attempt else WithdrawalPayout.objects.filter(
        transaction_id=state.reference).first()
    if payout is None:
        log.warning("payout webhook %s for unknown payout %s (reference %s)", name,
                    state.payout_id, state.reference)
        return "unknown_payout"
    if payout.amount_paise != state.amount_paise:
        log.error("payout %s amount %s differs from ours %s", state.payout_id,
                  state.amount_paise, payout.amount_paise)
        return "amount_mismatch"
    before = payout.status
    payout = guard.payout_apply_status(payout=payout, state=state)
    if payout.status == WithdrawalPayout.Status.COMPLETED and payout.ap_completed_at is None:
        from payouts import tasks

        transaction.on_commit(lambda: tasks.payout_complete_ap.delay(payout.pk))
    return f"{before}->{payout.status}"
