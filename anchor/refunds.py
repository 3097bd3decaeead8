"""Deposit refunds: captured INR whose deposit cannot complete goes back to the customer
through Razorpay's refunds API, at most once (issue 13 §3; razorpay/TREASURY.md §2,
anchor-platform/NOTES.md §1.5-1.6). The guard is the ``deposit_refunds`` row
(``DepositRefund``), built like the payout guard (DESIGN.md §5):

1. **Claim** (:func:`refund_claim`), one transaction: lock the deposit's live,
   confirmed ``deposit_payments`` row (the release claim locks the same row first:
   anchor/releases.py ``release_claim``), refuse if a release exists that sent or may
   send USDC, insert the row ``requested`` with Corridor's ``receipt`` (the AP
   transaction id) and ``X-Refund-Idempotency`` key (:func:`refund_key`, derived from
   the payment, so a claim a failover lost is made again under the same key), and the audit
   row (``ap_transaction_events``). Commit, then enqueue the drive.
2. **Create** (:func:`refund_drive`): ``attempts`` is counted in a commit of its own
   before ``POST /v1/payments/{id}/refund`` (the whole captured amount, receipt, key).
   A lost answer (timeout, 5xx, 409) leaves the row ``requested``; the next drive first
   **lists the payment's refunds** (``GET /v1/payments/{id}/refunds``) and adopts the one
   whose ``receipt`` is ours, and only if there is none re-posts with the **same key**
   (Razorpay replays it). A new key is never minted, so there is never a second refund.
   A payment that shows refunded paise with none of our receipt goes to
   ``manual_review``, as does an outcome still unknown after
   DEPOSIT_REFUND_MAX_ATTEMPTS creates.
3. **Settle**: ``refund.created`` / ``refund.processed`` / ``refund.failed`` webhooks
   (:func:`refund_webhook_apply`, deduped in ``inbound_events`` with the pay-in
   webhooks) are claims: Corridor re-reads ``GET /v1/refunds/{id}`` and applies what
   the API says, forward only (``requested < pending < processed | failed``), so any
   order and any number of copies end in the same row. The drive polls the same
   endpoint for a refund still ``pending`` (lost webhooks).
4. **Tell AP** (``processed -> completed``): ``notify_refund_sent`` with ``refund.id`` =
   the ``rfnd_...`` id, ``amount`` = the rupees refunded and ``amount_fee`` = AP's
   ``amount_in`` less them (0 for the usual full refund), both in the ``amount_in``
   asset, so that amount + fee = ``amount_in`` and AP moves to ``refunded`` (NOTES §1.5;
   AP 4.3 ``NotifyRefundSentHandler``). It is allowed from ``pending_anchor`` (funds
   received) and ``pending_external`` (§1.6); Corridor first brings AP there:
   ``pending_user_transfer_start`` / ``on_hold`` by ``notify_offchain_funds_received``,
   ``pending_trust`` by ``notify_trust_set``, ``error`` by
   ``notify_transaction_recovery``. AP is told only once Razorpay says ``processed``
   (no ``notify_refund_pending`` first: a refund that then fails could not be taken
   back out of AP). A deposit AP already ``expired`` (the INR was captured after the
   expiry) can never be moved (recovery needs funds received, expiry needs none): the
   refund is made and recorded here and the row goes to ``manual_review`` -- the
   operators' queue, kind ``refund`` -- with that reason.

Triggers: an operator's action (anchor/operations.py ``deposit_refund``, permission
``anchor.refund_deposit``), and Corridor itself for INR captured on a deposit AP had
already expired (:func:`refund_if_ap_expired`, called where AP's refusal of
``notify_offchain_funds_received`` is seen: anchor/tasks.py and the notify sweeper).
Beat re-drives open rows (:func:`sweep_refunds`, DEPOSIT_REFUND_SWEEP_*). A row a
failover lost (issue 25 §2) is rebuilt from Razorpay by the reconciler
(:func:`refund_rebuild`: the payment's refund carrying our receipt), and a claim made
again replays Razorpay's refund by its derived key: the INR goes back once.

``DEPOSIT_REFUND_GUARD = False`` (tests only) makes a retry after a lost answer what
code without this guard does: no listing, a new key, a new refund.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import deposits, inbox, limits, platform, releases
from anchor import razorpay as rzp
from anchor.models import (
    ApTransactionEvent,
    DepositOrder,
    DepositPayment,
    DepositRefund,
    DepositRelease,
)
from common.console import OperationRefused, operator_name
from common.locks import try_session_lock
from ledger import chart

log = logging.getLogger(__name__)
S = DepositRefund.Status
BATCH = 200
# Forward-only ranks of the provider's refund statuses (TREASURY §2.2).
RANK = {S.REQUESTED: 0, S.PENDING: 1, S.PROCESSED: 2, S.FAILED: 2}
PROVIDER = {"pending": S.PENDING, "processed": S.PROCESSED, "failed": S.FAILED}
# AP statuses no RPC moves a deposit out of towards ``refunded`` (NOTES §1.6).
AP_UNMOVABLE = frozenset({"expired", "completed", "no_market", "too_small", "too_large"})
# AP statuses from which nothing is refunded at all: the USDC went out, or it is done.
AP_REFUSED = frozenset({"completed", "refunded"})
# Nothing refunds its INR once AP showed the deposit completed.


@dataclass
class RefundCheck:
    payment: DepositPayment
    order: DepositOrder | None
    release: DepositRelease | None
    ap_tx: dict


def _release_never_built(release: DepositRelease) -> bool:
    """A release that went to ``manual_review`` before any envelope existed (a C...
    destination, a missing account): no USDC was or can be sent under it (a re-drive
    is refused once a refund exists, anchor/operations.py)."""
    return (release.status == DepositRelease.Status.MANUAL_REVIEW and not release.tx_hash
            and not release.envelope_xdr)


def _release_refusal(release: DepositRelease | None) -> str:
    if release is None or _release_never_built(release):
        return ""
    return (f"the deposit's release is {release.status} (hash {release.tx_hash or 'none'}): "
            "its USDC was sent or may still land; INR is refunded only for a deposit whose "
            "release can never happen")


def refund_check(transaction_id: str) -> RefundCheck:
    """Everything that must hold before a deposit's INR is refunded, read outside any
    transaction: a live payment Razorpay confirmed, no refund yet, no release that sent
    or may send USDC, and AP not ``completed``/``refunded``. Raises OperationRefused."""
    payment = DepositPayment.objects.live().filter(transaction_id=transaction_id).first()
    if payment is None or payment.confirmation != DepositPayment.Confirmation.CONFIRMED:
        raise OperationRefused("Corridor holds no captured payment for this deposit that "
                               "Razorpay confirmed")
    existing = DepositRefund.objects.filter(transaction_id=transaction_id).first()
    if existing is not None:
        raise OperationRefused(f"this deposit's INR is being refunded already "
                               f"({existing.status}, {existing.refund_id or 'no refund id yet'})")
    release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
    refusal = _release_refusal(release)
    if refusal:
        raise OperationRefused(refusal)
    try:
        ap_tx = platform.get_transaction(transaction_id)
    except platform.PlatformError as exc:
        raise OperationRefused(f"AP cannot be read: {exc}") from exc
    if ap_tx is None or ap_tx.get("kind") != "deposit":
        raise OperationRefused(f"AP has no deposit {transaction_id}")
    if ap_tx.get("status") in AP_REFUSED:
        raise OperationRefused(f"AP shows the deposit {ap_tx['status']}: nothing to refund")
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    return RefundCheck(payment, order, release, ap_tx)


def refund_claim(*, transaction_id: str, trigger: str, reason: str, operator,
                 note: str) -> DepositRefund:
    """Step 1: claim the refund of deposit ``transaction_id``'s whole captured payment
    (integer paise) and write its audit row (``deposit.refund``, naming ``operator`` or
    Corridor), in one transaction under the payment's row lock; the drive is enqueued
    after the commit. ``trigger``: ``DepositRefund.Trigger``. Nothing is sent here.
    Raises OperationRefused (nothing written)."""
    with bound_contextvars(transaction_id=transaction_id):
        check = refund_check(transaction_id)
        try:
            with transaction.atomic():
                payment = DepositPayment.objects.live().select_for_update().filter(
                    transaction_id=transaction_id,
                    confirmation=DepositPayment.Confirmation.CONFIRMED).first()
                if payment is None or payment.pk != check.payment.pk:
                    raise OperationRefused("the deposit's payment changed since it was checked")
                refusal = _release_refusal(
                    DepositRelease.objects.filter(transaction_id=transaction_id).first())
                if refusal:
                    raise OperationRefused(refusal)
                refund = DepositRefund.objects.create(
                    transaction_id=transaction_id, payment_id=payment.payment_id,
                    amount_paise=payment.amount_paise, currency=payment.currency,
                    receipt=deposits.refund_receipt(transaction_id),
                    idempotency_key=refund_key(payment.payment_id),
                    trigger=trigger, reason=reason[:2000], operator=operator_name(operator),
                    ap_status_at_claim=str(check.ap_tx.get("status", ""))[:32])
                ApTransactionEvent.objects.create(
                    transaction_id=transaction_id, kind="deposit", event="deposit.refund",
                    operator=operator_name(operator), note=note,
                    detail={"refund": refund.pk, "payment_id": payment.payment_id,
                            "amount_paise": payment.amount_paise, "trigger": trigger,
                            "ap_status": refund.ap_status_at_claim,
                            "release": check.release.status if check.release else None})
                transaction.on_commit(lambda: _enqueue_drive(refund.pk))
        except IntegrityError as exc:  # a concurrent claim won
            raise OperationRefused("this deposit's INR is being refunded already") from exc
        log.info("deposit refund claimed: %s paise of %s (%s)", refund.amount_paise,
                 refund.payment_id, trigger)
        return refund


def refund_key(payment_id: str) -> str:
    """The ``X-Refund-Idempotency`` key of the refund of payment ``payment_id``
    (``pay_...``): derived from the payment, as payouts/guard.py ``attempt_key`` is from
    the withdrawal. One refund per payment (its whole captured amount), so a claim whose
    commit a failover lost is made again with the same key and the same body, and
    Razorpay answers with the refund it made instead of making a second one (issue 25
    §2; razorpay/TREASURY.md §2.1: at least 10 characters of ``[A-Za-z0-9_-]``)."""
    return f"dr-{payment_id}"


def refund_rebuild(*, transaction_id: str) -> DepositRefund | None:
    """A deposit whose refund row a failover lost while Razorpay kept the refund (issue
    25 §2): the payment's refund carrying our ``receipt`` (``GET
    /v1/payments/{id}/refunds``) becomes the row again (trigger ``rebuilt``, its derived
    key, one create counted), with an audit row naming Corridor; then Razorpay's entity
    is applied (booked with the move to ``processed``, ``_apply_entity``) and the drive
    goes on (AP told, or found ``refunded`` with it: ``completed``). None when there is
    nothing to rebuild (a refund row exists, no confirmed payment, no refund of ours at
    Razorpay, or a release claimed: a person's). Raises rzp.RazorpayError."""
    if DepositRefund.objects.filter(transaction_id=transaction_id).exists():
        return None
    payment = DepositPayment.objects.live().filter(
        transaction_id=transaction_id,
        confirmation=DepositPayment.Confirmation.CONFIRMED).first()
    if payment is None:
        return None
    receipt = deposits.refund_receipt(transaction_id)
    ours = [i for i in rzp.payment_refunds(payment.payment_id) if i.get("receipt") == receipt]
    if not ours:
        return None
    entity = min(ours, key=lambda i: i.get("created_at") or 0)
    note = f"rebuilt from Razorpay: {entity.get('id')} carries our receipt (a lost commit)"
    try:
        with transaction.atomic():
            locked = DepositPayment.objects.live().select_for_update().filter(
                pk=payment.pk).first()
            if locked is None:
                return None
            if DepositRelease.objects.filter(transaction_id=transaction_id).exists():
                log.error("deposit %s: Razorpay refunded %s but a release is claimed: left "
                          "to a person", transaction_id, entity.get("id"))
                return None
            refund = DepositRefund.objects.create(
                transaction_id=transaction_id, payment_id=payment.payment_id,
                amount_paise=payment.amount_paise, currency=payment.currency,
                receipt=receipt, idempotency_key=refund_key(payment.payment_id),
                attempts=1, trigger=DepositRefund.Trigger.REBUILT, reason=note,
                operator=operator_name(None))
            ApTransactionEvent.objects.create(
                transaction_id=transaction_id, kind="deposit",
                event="deposit.refund_rebuilt", operator=operator_name(None), note=note,
                detail={"refund": refund.pk, "refund_id": entity.get("id"),
                        "payment_id": payment.payment_id,
                        "status": entity.get("status")})
    except IntegrityError:  # a claim or another rebuild won
        return None
    log.warning("deposit refund %s: %s", transaction_id, note)
    _apply_entity(refund, entity)
    return refund_drive(refund_id=refund.pk)


def _enqueue_drive(refund_id: int) -> None:
    from anchor import tasks

    tasks.deposit_refund_drive.delay(refund_id)


def refund_if_ap_expired(*, transaction_id: str) -> DepositRefund | None:
    """Corridor's own refund of INR captured for a deposit AP already ``expired`` (AP
    refuses ``notify_offchain_funds_received`` there for good, NOTES §1.6): claimed as
    the operator's action would be, the audit row naming Corridor. Returns the refund
    (new or existing), or None when AP does not show ``expired`` or it is not
    refundable (logged)."""
    existing = DepositRefund.objects.filter(transaction_id=transaction_id).first()
    if existing is not None:
        return existing
    try:
        ap_tx = platform.get_transaction(transaction_id)
    except platform.PlatformError:
        return None
    if (ap_tx or {}).get("status") != "expired":
        return None
    reason = "INR captured after AP expired the deposit; AP cannot take it"
    try:
        return refund_claim(transaction_id=transaction_id,
                            trigger=DepositRefund.Trigger.EXPIRED, reason=reason,
                            operator=None, note=reason)
    except OperationRefused as exc:
        log.warning("deposit %s expired in AP, INR not refunded automatically: %s",
                    transaction_id, exc)
        return None


# --- steps 2-4: the drive -----------------------------------------------------------

def refund_drive(*, refund_id: int) -> DepositRefund:
    """Move one refund as far as it goes now: create (or recover) the Razorpay refund,
    poll a pending one, tell AP once processed. One drive per refund at a time (a
    session advisory lock); every status change is a conditional UPDATE. Never raises
    for an unknown outcome: the row stays open with ``last_error`` for the next drive
    (task retry or beat sweep). Returns the row as it stands afterwards."""
    with try_session_lock(f"deposit_refund:{refund_id}") as got:
        refund = DepositRefund.objects.get(pk=refund_id)
        if not got:
            return refund
        with bound_contextvars(transaction_id=refund.transaction_id):
            if refund.status == S.REQUESTED:
                refund = _create_or_recover(refund)
            if refund.status == S.PENDING:
                refund = _poll(refund)
            if refund.status == S.PROCESSED:
                refund = _tell_ap(refund)
            return refund


def _review(refund: DepositRefund, reason: str) -> DepositRefund:
    log.error("deposit refund %s to manual_review: %s", refund.pk, reason)
    DepositRefund.transition(refund.pk, DepositRefund.sources_of(S.MANUAL_REVIEW),
                             S.MANUAL_REVIEW, last_error=reason[:2000])
    refund.refresh_from_db()
    return refund


def _note(refund: DepositRefund, error: str) -> DepositRefund:
    log.warning("deposit refund %s: %s", refund.pk, error)
    DepositRefund.note(refund.pk, error)
    refund.refresh_from_db()
    return refund


FOREIGN = object()  # the payment shows refunded paise, none under our receipt


def _find_ours(refund: DepositRefund):
    """Our refund among the payment's (``receipt`` = ours), FOREIGN when the payment
    shows a live refund of someone else's, or None. Raises rzp.RazorpayError."""
    items = rzp.payment_refunds(refund.payment_id)
    ours = [i for i in items if i.get("receipt") == refund.receipt]
    if len(ours) > 1:
        log.error("deposit refund %s: %s refunds carry our receipt %s", refund.pk, len(ours),
                  refund.receipt)
    if ours:
        return min(ours, key=lambda i: i.get("created_at") or 0)
    if any(i.get("status") != "failed" for i in items):
        return FOREIGN
    return None


def _create_or_recover(refund: DepositRefund) -> DepositRefund:
    if refund.attempts > 0:
        if settings.DEPOSIT_REFUND_GUARD:
            try:
                found = _find_ours(refund)
            except rzp.RazorpayError as exc:
                return _note(refund, f"refunds of {refund.payment_id} cannot be listed: {exc}")
            if found is FOREIGN:
                return _review(refund, f"{refund.payment_id} shows a refund that is not ours "
                                       f"(no receipt {refund.receipt}): refunded elsewhere?")
            if found is not None:
                log.info("deposit refund %s: found %s by receipt after a lost answer",
                         refund.pk, found.get("id"))
                return _apply_entity(refund, found)
        else:
            # Test-only: a retry that trusts nothing it stored, under a new key.
            DepositRefund.objects.filter(pk=refund.pk).update(
                idempotency_key=f"dr-{uuid.uuid4()}")
            refund.refresh_from_db()
    if refund.attempts >= settings.DEPOSIT_REFUND_MAX_ATTEMPTS:
        return _review(refund, f"the refund's outcome is unknown after {refund.attempts} "
                               f"create calls: {refund.last_error}")
    DepositRefund.objects.filter(pk=refund.pk, status=S.REQUESTED).update(
        attempts=F("attempts") + 1, updated_at=timezone.now())
    try:
        entity = rzp.create_refund(
            payment_id=refund.payment_id, amount_paise=refund.amount_paise,
            receipt=refund.receipt, notes={"transaction_id": refund.transaction_id},
            speed=settings.DEPOSIT_REFUND_SPEED, idempotency_key=refund.idempotency_key)
    except rzp.RefundRefused as exc:
        try:
            found = _find_ours(refund) if settings.DEPOSIT_REFUND_GUARD else None
        except rzp.RazorpayError:
            found = None
        if found is not None and found is not FOREIGN:
            return _apply_entity(refund, found)
        return _review(refund, f"Razorpay refused the refund: {exc.description}")
    except rzp.RazorpayError as exc:
        return _note(refund, f"refund create not answered: {exc}")
    return _apply_entity(refund, entity)


def _poll(refund: DepositRefund) -> DepositRefund:
    try:
        entity = rzp.fetch_refund(refund.refund_id)
    except rzp.RazorpayError as exc:
        return _note(refund, f"refund {refund.refund_id} cannot be read: {exc}")
    return _apply_entity(refund, entity)


def _mismatch(refund: DepositRefund, entity: dict) -> str:
    reasons = []
    if refund.refund_id and entity.get("id") != refund.refund_id:
        reasons.append(f"id {entity.get('id')!r}, ours {refund.refund_id!r}")
    if entity.get("payment_id") != refund.payment_id:
        reasons.append(f"payment {entity.get('payment_id')!r}, ours {refund.payment_id!r}")
    if entity.get("receipt") != refund.receipt:
        reasons.append(f"receipt {entity.get('receipt')!r}, ours {refund.receipt!r}")
    amount = entity.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount != refund.amount_paise:
        reasons.append(f"amount {amount!r} paise, ours {refund.amount_paise}")
    return "; ".join(reasons)


def _apply_entity(refund: DepositRefund, entity: dict) -> DepositRefund:
    """Apply a refund entity Razorpay's API returned: forward only by RANK, with its
    id, status and ARN. A contradicting entity sends the row to manual_review."""
    mismatch = _mismatch(refund, entity)
    if mismatch:
        return _review(refund, f"Razorpay's refund contradicts ours: {mismatch}")
    target = PROVIDER.get(entity.get("status"))
    if target is None:
        return _note(refund, f"refund {entity.get('id')} has status {entity.get('status')!r}")
    sources = [s for s in DepositRefund.sources_of(target) if RANK.get(s, 3) < RANK[target]]
    fields = {"refund_id": entity["id"], "provider_status": entity["status"],
              "arn": str(((entity.get("acquirer_data") or {}).get("arn")) or "")[:64],
              "last_error": ""}
    if target == S.PROCESSED:
        fields["processed_at"] = timezone.now()
    with transaction.atomic():
        moved = DepositRefund.transition(refund.pk, sources, target, **fields)
        if moved and target == S.PROCESSED:
            # The books, in the transaction of the state change (ledger/chart.py).
            chart.deposit_refunded(refund_id=refund.pk, payment_id=refund.payment_id,
                                   transaction_id=refund.transaction_id,
                                   amount=chart.rupees(refund.amount_paise))
    if moved:
        log.info("deposit refund %s: %s (%s)", refund.pk, target, entity["id"])
        if target == S.PROCESSED:
            limits.release(refund.transaction_id)  # the rupees went back: off the limits
        if target == S.FAILED:
            log.error("deposit refund %s failed at Razorpay: the INR is still ours; queued",
                      refund.pk)
    refund.refresh_from_db()
    return refund


def _ap_shows_ours(tx: dict, refund: DepositRefund) -> bool:
    payments = ((tx.get("refunds") or {}).get("payments")) or []
    return any(p.get("id") == refund.refund_id for p in payments)


def _tell_ap(refund: DepositRefund) -> DepositRefund:
    """Step 4 (module docstring): AP to ``refunded`` with this refund, or the row to
    manual_review when AP cannot be moved."""
    tid = refund.transaction_id
    try:
        ap_tx = platform.get_transaction(tid)
        if ap_tx is None:
            return _review(refund, f"AP has no deposit {tid}; refund {refund.refund_id} made")
        status = ap_tx["status"]
        if status == "refunded" and _ap_shows_ours(ap_tx, refund):
            return _completed(refund)
        if status in AP_UNMOVABLE or status == "refunded":
            return _review(refund, f"Razorpay refunded {refund.amount_paise} paise "
                                   f"({refund.refund_id}); AP shows the deposit {status} and "
                                   "no RPC can record the refund there")
        if status == "error":
            platform.rpc_once("notify_transaction_recovery", {"transaction_id": tid},
                              reached=lambda tx: tx["status"] != "error")
        elif status in ("pending_user_transfer_start", "on_hold"):
            deposits.notify_funds_received(transaction_id=tid)
        elif status == "pending_trust":
            releases.notify_trust_set(tid)
        ap_tx = platform.get_transaction(tid) or {}
        amount_in = Decimal(str((ap_tx.get("amount_in") or {}).get("amount", "0")))
        asset = (ap_tx.get("amount_in") or {}).get("asset") or settings.AP_FIAT_ASSET
        refunded = rzp.paise_to_rupees(refund.amount_paise)
        fee = amount_in - refunded
        if fee < 0:
            return _review(refund, f"AP's amount_in {amount_in} is less than the "
                                   f"{refunded} refunded ({refund.refund_id})")
        platform.rpc_once(
            "notify_refund_sent",
            {"transaction_id": tid, "message": "Your payment was refunded to you",
             "refund": {"id": refund.refund_id,
                        "amount": {"amount": format(refunded, "f"), "asset": asset},
                        "amount_fee": {"amount": format(fee, "f"), "asset": asset}}},
            reached=lambda tx: tx["status"] == "refunded" and _ap_shows_ours(tx, refund))
    except platform.RpcError as exc:
        if exc.code == platform.INTERNAL_ERROR:
            return _note(refund, f"AP: {exc}")
        return _review(refund, f"Razorpay refunded {refund.refund_id}; AP refused to record "
                               f"it: {exc}")
    except (platform.PlatformError, deposits.PaymentUnconfirmed,
            deposits.PaymentRejected) as exc:
        return _note(refund, f"AP not told yet: {exc}")
    return _completed(refund)


def _completed(refund: DepositRefund) -> DepositRefund:
    DepositRefund.transition(refund.pk, [S.PROCESSED], S.COMPLETED,
                             ap_refunded_at=timezone.now(), last_error="")
    refund.refresh_from_db()
    log.info("deposit refund %s completed: AP shows %s refunded", refund.pk,
             refund.transaction_id)
    return refund


# --- webhooks -----------------------------------------------------------------------

def refund_webhook_apply(*, event: dict) -> str:
    """Apply a verified ``refund.*`` pay-in webhook (TREASURY §2.3), stored when it
    arrived, inside the drain's claim transaction (``inbox.store``, ``inbox.drain``):
    find our row by the refund id, else by
    our receipt on the same payment (the webhook can beat the create's answer), re-read
    the refund from Razorpay and apply what the API says, forward only. Razorpay
    unreachable: the drive is asked for (it polls) and nothing else is applied.
    Returns the outcome (``ignored``, ``unknown_refund``, ``refund_unconfirmed``,
    ``refund_mismatch`` or ``refund <before>-><after>``)."""
    entity = (((event.get("payload") or {}).get("refund") or {}).get("entity")) or {}
    refund_id = entity.get("id")
    if not isinstance(refund_id, str) or not refund_id:
        return "ignored"
    refund = DepositRefund.objects.filter(refund_id=refund_id).first()
    if refund is None and isinstance(entity.get("receipt"), str):
        refund = DepositRefund.objects.filter(receipt=entity["receipt"],
                                              payment_id=entity.get("payment_id")).first()
    if refund is None:
        log.warning("refund webhook for %s matches no deposit refund of ours", refund_id)
        return "unknown_refund"
    from anchor import tasks

    try:
        confirmed = rzp.fetch_refund(refund_id)
    except rzp.RazorpayError as exc:
        log.warning("refund webhook %s: Razorpay cannot be asked (%s); the drive polls",
                    refund_id, exc)
        inbox.follow_up(tasks.deposit_refund_drive, refund.pk)
        return "refund_unconfirmed"
    mismatch = _mismatch(refund, confirmed)
    if mismatch:
        log.error("refund webhook %s: %s", refund_id, mismatch)
        return "refund_mismatch"
    before = refund.status
    refund = _apply_entity(refund, confirmed)
    if refund.status == S.PROCESSED:
        inbox.follow_up(tasks.deposit_refund_drive, refund.pk)
    return f"refund {before}->{refund.status}"


# --- beat ---------------------------------------------------------------------------

def stuck_refunds():
    """The sweep's query: ids of open refunds untouched for DEPOSIT_REFUND_SWEEP_AGE_S,
    oldest first, at most BATCH (``deposit_refunds_open_idx``; corridor/periodic.py)."""
    cutoff = timezone.now() - timedelta(seconds=settings.DEPOSIT_REFUND_SWEEP_AGE_S)
    return DepositRefund.objects.filter(
        status__in=DepositRefund.OPEN_STATUSES, updated_at__lt=cutoff
    ).order_by("updated_at").values_list("pk", flat=True)[:BATCH]


def sweep_refunds() -> dict[str, int]:
    """Re-drive every refund left open (a lost task, a lost webhook, AP down); returns
    counts by resulting status."""
    counts: dict[str, int] = {}
    for refund_id in list(stuck_refunds()):
        status = refund_drive(refund_id=refund_id).status
        counts[status] = counts.get(status, 0) + 1
    return counts
