"""Apply a verified RazorpayX payout webhook to our rows (razorpay/NOTES.md §2.8).

The payout is matched by provider id, else by ``reference_id`` (= AP transaction id):
the webhook can arrive before the create call returned (NOTES §5 bug 5), but our row
and key were committed before the call, so there is always a row to match. Events that
match nothing get 2xx (Razorpay disables endpoints after failures) and are logged.

A webhook is a claim, never the fact (issue 9: a leaked webhook secret alone must not
mark a payout paid): Corridor fetches the payout itself (``GET /v1/payouts/{id}``) and
applies what the API says -- its status and its UTR -- through the same forward-only
ranks as the poller. The webhook is stored when it arrives and applied by the inbound
drain (anchor/inbox.py ``store``, issue 11 §3), so the fetch is never on the request's
path. When RazorpayX cannot be asked, ``ProviderUnreachable`` is raised: the drain
rolls the apply back and the stored row waits for a later drain (the beat sweep,
every ``INBOUND_SWEEP_PERIOD_S``); the poller, which fetches every ``processing``
payout by itself, settles it meanwhile in any case."""

from __future__ import annotations

import logging

from django.db import transaction

from anchor import razorpay as rzp
from corridor import inbound
from payouts import guard
from payouts.models import PayoutAttempt, WithdrawalPayout
from payouts.providers.base import PayoutNotFound
from payouts.providers.razorpayx import _payout

log = logging.getLogger(__name__)


def check_payout_event(event: dict) -> None:
    """Shape of a payout event (razorpay/NOTES.md §2.8), each field checked against the
    column it lands in (corridor/inbound.py): ``entity.id`` ->
    ``payout_attempts.provider_payout_id``, ``amount`` -> ``withdrawal_payouts
    .amount_paise`` (integer paise, 0..2^63-1), ``status`` ->
    ``payout_attempts.provider_status``, ``reference_id`` -> the AP transaction id,
    ``utr`` -> ``withdrawal_payouts.reference``; ``status_details`` an object whose
    ``reason`` is storable text. Raises MalformedEvent."""
    from anchor.callbacks import MalformedEvent

    try:
        _check_payout_event(event)
    except MalformedEvent:
        raise
    except inbound.InboundError as exc:
        raise MalformedEvent(str(exc)) from None


def _check_payout_event(event: dict) -> None:
    from anchor.callbacks import MalformedEvent

    if not isinstance(event.get("event", ""), str):
        raise MalformedEvent("event must be a string")
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
    where = "payload.payout.entity"
    inbound.field_text(PayoutAttempt, "provider_payout_id", entity.get("id"), f"{where}.id")
    inbound.field_int(WithdrawalPayout, "amount_paise", entity.get("amount"),
                      f"{where}.amount")
    inbound.field_text(PayoutAttempt, "provider_status", entity.get("status"),
                       f"{where}.status", required=False)
    inbound.field_text(WithdrawalPayout, "transaction_id", entity.get("reference_id"),
                       f"{where}.reference_id", required=False)
    inbound.field_text(WithdrawalPayout, "reference", entity.get("utr"), f"{where}.utr",
                       required=False)
    details = entity.get("status_details") or {}
    if not isinstance(details, dict):
        raise MalformedEvent(f"{where}.status_details must be an object")
    if not isinstance(details.get("reason") or "", str):
        raise MalformedEvent(f"{where}.status_details.reason must be a string")


class ProviderUnreachable(Exception):
    """RazorpayX could not be asked about the payout a webhook names: nothing was
    applied; the drain rolls the apply back and the stored row waits for a later drain
    (the webhook was answered when it was stored)."""


def payout_webhook_apply_stored(event: dict) -> str:
    """The drain's apply of a stored payout webhook (anchor/inbox.py ``store``):
    :func:`payout_webhook_apply`; ProviderUnreachable leaves the row waiting for a
    later drain (the poller settles the payout meanwhile in any case). Stored rows name
    this function by its dotted path (``APPLY`` follow-up), so it stays as long as rows
    written with that name may wait in ``inbound_events``."""
    return payout_webhook_apply(event=event)


def payout_webhook_apply(*, event: dict) -> str:
    """Apply a verified ``payout.*`` event: find our payout by the event's payout id or
    reference, fetch that payout from RazorpayX, check the API's ``reference_id`` and
    ``amount`` (paise) against our row, and move the row by the API's status (forward
    only, ``guard.payout_apply_status``): ``processed`` -> ``completed`` with the API's
    UTR, then AP's ``notify_offchain_funds_sent`` after commit. Runs inside the
    drain's claim transaction of the stored webhook (``anchor.inbox.drain``). Returns the outcome
    (``ignored``, ``unknown_payout``, ``amount_mismatch``, ``payout_not_found``,
    ``reference_mismatch`` or ``<before>-><after>``). Raises ProviderUnreachable."""
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
    try:
        confirmed = guard.provider().fetch(state.payout_id)
    except PayoutNotFound as exc:
        log.error("payout webhook %s names payout %s, which RazorpayX does not hold: %s",
                  name, state.payout_id, exc)
        return "payout_not_found"
    except rzp.RazorpayError as exc:
        raise ProviderUnreachable(f"fetch {state.payout_id}: {exc}") from exc
    if confirmed.payout_id != state.payout_id or \
            confirmed.reference != payout.transaction_id[:40]:
        log.error("payout webhook %s: RazorpayX shows payout %s under reference %r, not ours",
                  name, confirmed.payout_id, confirmed.reference)
        return "reference_mismatch"
    if confirmed.amount_paise != payout.amount_paise:
        log.error("payout %s amount %s (API) differs from ours %s", confirmed.payout_id,
                  confirmed.amount_paise, payout.amount_paise)
        return "amount_mismatch"
    if confirmed.status != state.status:
        log.warning("payout webhook %s said %s; RazorpayX says %s: acting on the API",
                    name, state.status, confirmed.status)
    before = payout.status
    payout = guard.payout_apply_status(payout=payout, state=confirmed, complete_ap=False)
    if payout.status == WithdrawalPayout.Status.COMPLETED and payout.ap_completed_at is None:
        transaction.on_commit(lambda: _complete_ap_after_commit(payout.pk))
    return f"{before}->{payout.status}"


def _complete_ap_after_commit(payout_id: int) -> None:
    """Step 5 once the webhook's transaction committed (never an AP call while the
    dedupe row and the payout row are locked); if AP could not be told, the task
    (and the poller after it) tries again."""
    from payouts import tasks

    payout = guard.payout_complete_ap(payout=WithdrawalPayout.objects.get(pk=payout_id))
    if payout.ap_completed_at is None:
        tasks.payout_complete_ap.delay(payout.pk)
