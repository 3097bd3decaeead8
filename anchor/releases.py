"""The release outbox (transfer-after-commit, DEC-007): DESIGN.md §4 steps 1-6.

1. claim and prepare in one transaction: the ``deposit_releases`` row, a channel
   account's next sequence under a row lock, the signed envelope, its hash and
   ``max_time``. Commit.
2. on a re-drive only: look the stored hash up on Horizon.
3. submit the stored envelope; a timeout or 5xx re-posts the same envelope later; a
   new envelope only once the stored one is provably dead (``anchor.envelopes``, the
   one rule every Stellar outbox uses; horizon/NOTES.md §2.6). An envelope whose fate
   Horizon cannot prove yet (``unknown``) is waited for, never rebuilt; past
   ENVELOPE_UNKNOWN_REVIEW_S after its max_time it goes to ``manual_review``.
4. mark ``submitted``. Commit.
5. ``notify_onchain_funds_sent`` with the hash; -32600 -> re-read (done only if
   ``completed`` with our hash); -32603 -> retry the notify later, never the payment.
6. mark ``completed``. Commit.

The happy path costs three commits. Everything here may run twice at once (a
worker's task and the reconciler): the unique ``transaction_id`` decides the claim,
a per-release advisory lock keeps drives apart, and every status change is a
conditional UPDATE.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import deposits, envelopes, platform, stellar
from anchor.models import (
    DepositOrder,
    DepositPayment,
    DepositRefund,
    DepositRelease,
    ReleaseEvent,
)
from common.console import operator_name
from common.crashpoints import crash_point
from common.locks import try_session_lock
from ledger import chart

log = logging.getLogger(__name__)
Status = DepositRelease.Status

# Included-but-failed operation codes that no retry fixes by itself.
TERMINAL_OP_CODES = {"op_underfunded", "op_no_destination", "op_not_authorized",
                     "op_line_full", "op_no_issuer", "op_src_no_trust",
                     "op_src_not_authorized", "op_malformed"}


class ReleaseRefused(Exception):
    """The deposit is not releasable (no captured payment of ours, AP in another
    state, amounts disagree). Nothing was written."""


# --- entry point -------------------------------------------------------------------

def release_start(*, transaction_id: str) -> DepositRelease | None:
    """Release the USDC of deposit ``transaction_id`` if, and only if, Corridor holds
    a captured payment for it that Corridor itself confirmed with Razorpay's API
    (``deposits.payment_confirm``: fetched, ``captured``, same order, paise and
    currency) and AP (re-read now) shows it ``pending_anchor``. Every claim passes
    here: the task after a webhook, the AP sweep, the order reconciler, ``manage.py
    release_deposit``; a signed webhook alone never releases anything.

    Returns the release (new or existing), or None when the deposit is waiting for a
    trustline. Raises ReleaseRefused (a rejected payment included),
    deposits.PaymentUnconfirmed (Razorpay unreachable), platform.PlatformError,
    stellar.HorizonUnavailable, stellar.NoChannelFree (callers retry these later)."""
    with bound_contextvars(transaction_id=transaction_id):
        existing = DepositRelease.objects.filter(transaction_id=transaction_id).first()
        if existing is not None:
            return existing
        if settings.STELLAR_SUBMIT_MODE == "async" and not stellar.channel_free_now():
            # A backlog waits here, not after the AP, Razorpay and Horizon reads below;
            # the next freed channel wakes the oldest waiter (``_wake_waiter``).
            stellar.count_refusal()
            stellar.await_channel(transaction_id)
            raise stellar.NoChannelFree("all channel accounts have a transaction in flight")
        payment = DepositPayment.objects.live().filter(transaction_id=transaction_id).first()
        if payment is None:
            raise ReleaseRefused(f"{transaction_id}: no captured payment recorded by Corridor")
        if DepositRefund.objects.filter(transaction_id=transaction_id).exists():
            raise ReleaseRefused(f"{transaction_id}: its INR is being refunded (anchor/refunds.py)")
        order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
        if order is None:
            raise ReleaseRefused(f"{transaction_id}: no deposit order")
        ap_tx = platform.get_transaction(transaction_id)
        if ap_tx is None or ap_tx.get("kind") != "deposit":
            raise ReleaseRefused(f"{transaction_id}: AP has no such deposit")
        if ap_tx["status"] != "pending_anchor":
            raise ReleaseRefused(f"{transaction_id}: AP status is {ap_tx['status']}")
        _check_ap_amount(ap_tx, order)
        try:  # outside any transaction: the fetch holds no lock
            deposits.payment_confirm(transaction_id=transaction_id)
        except deposits.PaymentRejected as exc:
            raise ReleaseRefused(f"{transaction_id}: payment not confirmed by Razorpay: {exc}"
                                 ) from exc

        destination = ap_tx.get("destination_account") or ""
        memo_type = ap_tx.get("memo_type") or "none"
        memo = ap_tx.get("memo") or ""
        if destination.startswith("C"):
            return _claim_for_review(
                order, destination, memo_type, memo,
                "contract (C...) destination needs a token transfer; not built")
        trust = stellar.has_trustline(destination, stellar.usdc())
        if trust is None:
            # A 404 from a Horizon node behind the account's creation proves nothing
            # (the attacker's finding; the envelope rule's reasoning, DESIGN §4): the
            # AP sweep asks again, and only a destination still missing
            # DESTINATION_MISSING_REVIEW_S after the payment was confirmed is a
            # person's to decide.
            since = payment.confirmed_at or payment.created_at
            if timezone.now() - since < timedelta(seconds=settings.DESTINATION_MISSING_REVIEW_S):
                raise ReleaseRefused(f"{transaction_id}: destination {destination} not found "
                                     "on Stellar yet; asked again by the AP sweep")
            return _claim_for_review(order, destination, memo_type, memo,
                                     "destination account does not exist on Stellar")
        if trust is False:
            _request_trust(transaction_id)
            return None
        adopted = release_adopt(order=order, destination=destination, memo_type=memo_type,
                                memo=memo)
        if adopted is not None:
            return adopted
        release = release_claim(order=order, destination=destination, memo_type=memo_type,
                                memo=memo)
        if release is None:  # someone else claimed it first; they drive it
            return DepositRelease.objects.get(transaction_id=transaction_id)
        crash_point("after_claim")
        release = release_drive(release_id=release.pk)
        follow_later(release)
        return release


def _check_ap_amount(ap_tx: dict, order: DepositOrder) -> None:
    amount_out = (ap_tx.get("amount_out") or {})
    asset = f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
    if amount_out.get("asset") != asset:
        raise ReleaseRefused(f"AP amount_out asset {amount_out.get('asset')} is not {asset}")
    if Decimal(amount_out.get("amount", "0")) != order.amount_out:
        raise ReleaseRefused(
            f"AP amount_out {amount_out.get('amount')} differs from ours {order.amount_out}"
        )


def notify_trust_set(transaction_id: str) -> None:
    """AP ``notify_trust_set`` (pending_trust -> pending_anchor; AP 4.2+ always goes to
    pending_anchor, NOTES §1.5). The one place it is called: the AP sweep once Horizon
    shows the trustline, a release after op_no_trust, and a release whose payment
    landed while AP was sent to pending_trust behind it."""
    platform.rpc_once("notify_trust_set", {"transaction_id": transaction_id, "success": True},
                      reached=lambda tx: tx["status"] == "pending_anchor")


def _request_trust(transaction_id: str) -> None:
    """AP ``request_trust`` (pending_anchor -> pending_trust); the sweep watches Horizon
    for the trustline and calls ``notify_trust_set``."""
    platform.rpc_once("request_trust", {"transaction_id": transaction_id},
                      reached=lambda tx: tx["status"] == "pending_trust")


# --- step 1: claim and prepare ------------------------------------------------------

def release_claim(*, order: DepositOrder, destination: str, memo_type: str,
                  memo: str) -> DepositRelease | None:
    """Step 1, one transaction: insert the row (``submitting``), lease a channel and
    its next sequence, build and sign the payment, store envelope, hash, max_time.
    Returns None when another worker owns the release (unique ``transaction_id``).
    The deposit's live payment row is locked first, as the refund claim locks it
    (anchor/refunds.py ``refund_claim``): a deposit whose INR is being refunded is
    refused (ReleaseRefused), so no deposit gets both its USDC and its rupees."""
    try:
        with transaction.atomic():
            _lock_payment_unrefunded(order.transaction_id)
            prepared = stellar.prepare_payment(
                holder=order.transaction_id, destination=destination,
                amount=order.amount_out, memo_type=memo_type, memo=memo)
            release = _create(order, Status.SUBMITTING, destination=destination,
                              memo_type=memo_type, memo=memo, **prepared)
            _mark_claimed(order.transaction_id)
            return release
    except IntegrityError:
        return None


def landed_unrecorded(*, order: DepositOrder, destination: str, memo: str
                      ) -> stellar.Transfer | None:
    """This deposit's payment already on chain with no release row recording it: the
    release a failover lost (its claim, envelope and hash were in commits the promoted
    standby never received, while Horizon kept the payment; issue 25 §2). A successful
    USDC payment from the distribution account to ``destination`` of the order's
    ``amount_out`` under the deposit's memo ("" for none), made after the order was
    created, whose hash no other release holds (two identical deposits to one wallet
    each take their own). None when there is none. Raises HorizonUnavailable.

    A Horizon lagging behind the payment hides it (not proven absent): the re-claim
    then builds a new envelope. Left open (issue 25 §2, closing note)."""
    distribution = stellar.distribution_keypair().public_key
    for transfer in stellar.transfers_since(destination, order.created_at):
        if (transfer.source, transfer.destination, transfer.asset, transfer.amount,
                transfer.memo) != (distribution, destination, stellar.usdc_asset_id(),
                                   order.amount_out, memo):
            continue
        if not DepositRelease.objects.filter(tx_hash=transfer.tx_hash).exists():
            return transfer
    return None


def release_adopt(*, order: DepositOrder, destination: str, memo_type: str,
                  memo: str) -> DepositRelease | None:
    """Before a fresh claim: adopt this deposit's payment found on chain
    (``landed_unrecorded``) as its release, ``submitted`` with that hash and booked
    (rule 2 of the books) in one transaction with the claim mark, then tell AP (steps
    5-6). None when nothing is on chain (claim as usual) or another worker holds the
    row. Raises HorizonUnavailable."""
    transfer = landed_unrecorded(order=order, destination=destination, memo=memo)
    if transfer is None:
        return None
    try:
        with transaction.atomic():
            _lock_payment_unrefunded(order.transaction_id)
            release = _create(
                order, Status.SUBMITTED, destination=destination, memo_type=memo_type,
                memo=memo, tx_hash=transfer.tx_hash,
                last_error=f"adopted from the chain: {transfer.tx_hash} landed with no "
                           "release recorded (a lost commit)")
            _book_released(release)
            _mark_claimed(order.transaction_id)
    except IntegrityError:
        return None
    log.warning("release %s adopted from the chain: %s", order.transaction_id,
                transfer.tx_hash)
    return _complete(release)


def release_rebuild(*, transaction_id: str) -> DepositRelease | None:
    """A deposit AP shows ``completed`` whose release row is missing (lost with a
    failover's last commits, issue 25 §2): rebuilt from AP's ``stellar_transactions``
    hash once that hash is found on chain as this deposit's payment
    (``landed_unrecorded``), ``completed`` and booked in one transaction. None when
    there is nothing to rebuild (no order, a release exists, AP not completed, its hash
    not on chain as ours). Raises HorizonUnavailable, PlatformError."""
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    if order is None or DepositRelease.objects.filter(transaction_id=transaction_id).exists():
        return None
    ap_tx = platform.get_transaction(transaction_id) or {}
    hashes = {st.get("id") for st in ap_tx.get("stellar_transactions") or []}
    if ap_tx.get("status") != "completed" or not hashes:
        return None
    destination = ap_tx.get("destination_account") or ""
    memo = ap_tx.get("memo") or ""
    transfer = landed_unrecorded(order=order, destination=destination, memo=memo)
    if transfer is None or transfer.tx_hash not in hashes:
        return None
    try:
        with transaction.atomic():
            release = _create(
                order, Status.COMPLETED, destination=destination,
                memo_type=ap_tx.get("memo_type") or "none", memo=memo,
                tx_hash=transfer.tx_hash,
                last_error=f"rebuilt from AP and the chain: {transfer.tx_hash} (a lost "
                           "commit)")
            _book_released(release)
            _mark_claimed(transaction_id)
    except IntegrityError:
        return None
    log.warning("release %s rebuilt from AP and the chain: %s", transaction_id,
                transfer.tx_hash)
    return release


def _lock_payment_unrefunded(transaction_id: str) -> None:
    """Inside the claim's transaction: lock the deposit's live payment row (the lock the
    refund claim takes first) and refuse when a refund of it exists. Raises
    ReleaseRefused."""
    list(DepositPayment.objects.live().select_for_update()
         .filter(transaction_id=transaction_id).values_list("pk", flat=True))
    if DepositRefund.objects.filter(transaction_id=transaction_id).exists():
        raise ReleaseRefused(f"{transaction_id}: its INR is being refunded (anchor/refunds.py)")


def _create(order: DepositOrder, status: str, *, destination: str, memo_type: str,
            memo: str, **fields) -> DepositRelease:
    """The deposit's one release row (unique ``transaction_id``: IntegrityError when it
    exists), USDC of ``order.amount_out`` to ``destination`` under the memo, in
    ``status``; ``fields`` the envelope or hash and the note."""
    return DepositRelease.objects.create(
        transaction_id=order.transaction_id, status=status, destination=destination,
        asset_code=settings.STELLAR_USDC_CODE, asset_issuer=settings.STELLAR_USDC_ISSUER,
        amount=order.amount_out, memo=memo, memo_type=memo_type, **fields)


def _mark_claimed(transaction_id: str) -> None:
    """The payment now has its release (corridor/stranded.py reads this)."""
    DepositPayment.objects.live().filter(
        transaction_id=transaction_id, release_claimed_at__isnull=True
    ).update(release_claimed_at=timezone.now())


def _claim_for_review(order: DepositOrder, destination: str, memo_type: str, memo: str,
                      reason: str) -> DepositRelease:
    try:
        with transaction.atomic():
            _lock_payment_unrefunded(order.transaction_id)
            release = _create(order, Status.MANUAL_REVIEW, destination=destination,
                              memo_type=memo_type, memo=memo, last_error=reason)
            _mark_claimed(order.transaction_id)
            return release
    except IntegrityError:
        return DepositRelease.objects.get(transaction_id=order.transaction_id)


# --- steps 2-6 ---------------------------------------------------------------------

def _drive_lock(release_id: int):
    """One drive per release at a time, across processes."""
    return try_session_lock(f"deposit_release:{release_id}")


def release_drive(*, release_id: int, redrive: bool = False) -> DepositRelease:
    """Steps 2-6 for one release. ``redrive`` (the reconciler, a retry) checks the
    chain first. Returns the release as it stands afterwards; never raises for an
    unknown outcome (the row stays open for the reconciler)."""
    with _drive_lock(release_id) as got:
        release = DepositRelease.objects.get(pk=release_id)
        with bound_contextvars(transaction_id=release.transaction_id):
            if not got:
                return release
            try:
                return _drive(release, redrive=redrive)
            except (platform.PlatformError, stellar.HorizonUnavailable) as exc:
                _note(release, f"{type(exc).__name__}: {exc}")
                return DepositRelease.objects.get(pk=release_id)


def _drive(release: DepositRelease, *, redrive: bool) -> DepositRelease:
    if release.status in (Status.COMPLETED, Status.MANUAL_REVIEW):
        return release
    if release.status == Status.SUBMITTED:
        return _complete(release)
    if release.status == Status.FAILED and \
            release.failure_code == DepositRelease.FailureCode.NO_TRUST:
        return _after_no_trust(release)

    if redrive:
        if not settings.RELEASE_CHAIN_CHECK:
            # Test-only switch: what a naive retry does (rebuild without looking).
            release = _rebuild(release, reason="re-drive without chain check")
            if release.status == Status.MANUAL_REVIEW:
                return release
        else:
            if _followable(release):
                # A look of the async follow while the envelope's time bounds are open:
                # found by hash -> landed; else post the same envelope again (harmless
                # whatever its fate: one envelope applies once; a landed one answers
                # tx_bad_seq, which goes to the rule). Death is only ever decided by
                # the rule, after max_time.
                found = stellar.find_transaction(release.tx_hash)
                if found is not None:
                    return _landed(release, found)
                return _post_async(release)
            fate = _fate(release)
            if fate.state == envelopes.LANDED:
                return _landed(release, fate.transaction)
            if fate.state == envelopes.UNKNOWN:
                return _undecided(release, fate)
            if fate.state == envelopes.DEAD:
                stored = release.tx_hash
                release = _rebuild(release, reason=f"stored envelope is dead: {fate.reason}")
                if not _replaced(stored, release):
                    return release

    if settings.STELLAR_SUBMIT_MODE == "async":
        return _post_async(release)
    result = stellar.submit(release.envelope_xdr)
    crash_point("after_submit")
    if result.kind == "applied":
        release = _mark_submitted(release)
        crash_point("after_mark_submitted")
        return _complete(release)
    if result.kind == "unknown":
        _note(release, f"submit outcome unknown: {result.detail}")
        return DepositRelease.objects.get(pk=release.pk)
    # 400: included with a failed op, or refused by core before inclusion (tx_bad_seq
    # also comes back for an envelope that landed where this Horizon has not looked
    # yet, stellar/go #2628): the rule decides, never the code alone.
    reason = f"{result.tx_code} {' '.join(result.op_codes)}".strip()
    fate = _fate(release)
    if fate.state == envelopes.LANDED:
        return _landed(release, fate.transaction)
    if fate.state == envelopes.UNKNOWN:
        return _undecided(release, fate, note=f"refused ({reason}); ")
    if fate.state == envelopes.DEAD and result.tx_code in ("tx_bad_seq", "tx_too_late"):
        stored = release.tx_hash
        release = _rebuild(release, reason=f"refused: {reason}; {fate.reason}")
        if _replaced(stored, release) and not redrive:
            return _drive(release, redrive=False)
        return release
    _set_status(release, Status.FAILED, f"refused: {reason}")
    return DepositRelease.objects.get(pk=release.pk)


def _followable(release: DepositRelease) -> bool:
    """An async release posted and not yet past its max_time: a look needs no proof."""
    return (settings.STELLAR_SUBMIT_MODE == "async" and release.status == Status.SUBMITTING
            and release.max_time is not None and timezone.now() <= release.max_time)


def _post_async(release: DepositRelease) -> DepositRelease:
    """Step 3 without waiting for a ledger: POST the stored envelope to
    ``/transactions_async`` and return at once; ``follow_later`` (the task
    ``release_follow``, and the reconciler behind it) then follows the stored hash by the
    one rule until it landed or is provably dead, re-posting the same envelope while it
    is alive (PENDING only means queued: core may still drop it). A refusal is never
    read as death by its code: the endpoint does not consult Horizon's history, so an
    envelope that already landed answers ERROR ``tx_bad_seq``; the rule decides."""
    result = stellar.submit_async(release.envelope_xdr)
    crash_point("after_submit")
    if result.kind != stellar.REFUSED:
        _note(release, f"posted async: {result.kind} ({result.detail})")
        return DepositRelease.objects.get(pk=release.pk)
    reason = result.tx_code or "refused"
    fate = _fate(release)
    if fate.state == envelopes.LANDED:
        return _landed(release, fate.transaction)
    if fate.state == envelopes.UNKNOWN:
        return _undecided(release, fate, note=f"refused ({reason}); ")
    if fate.state == envelopes.ALIVE:
        # Not applied yet and still applicable (a sequence gap, surge pricing): the
        # same envelope is posted again on the next look, a new one only once dead.
        _note(release, f"refused ({reason}) while alive: {fate.reason}")
        return DepositRelease.objects.get(pk=release.pk)
    if result.tx_code in ("tx_bad_seq", "tx_too_late"):
        stored = release.tx_hash
        release = _rebuild(release, reason=f"refused: {reason}; {fate.reason}")
        if _replaced(stored, release):
            return _post_async(release)
        return release
    _set_status(release, Status.FAILED, f"refused: {reason}")
    return DepositRelease.objects.get(pk=release.pk)


FOLLOWED = (Status.SUBMITTING, Status.SUBMITTED)


def _wake_waiter() -> None:
    """After a commit that freed a channel (async mode): start the oldest release that
    was refused one (``stellar.await_channel``). A wake-up lost with a crash costs only
    time: the refused task's own retry and the AP sweep still start it."""
    if settings.STELLAR_SUBMIT_MODE != "async":
        return
    from anchor import tasks

    for transaction_id in stellar.next_waiting(1):
        tasks.deposit_release.delay(transaction_id)


stellar.CHANNEL_FREED.append(_wake_waiter)


def follow_later(release: DepositRelease, *, follows: int = 0) -> bool:
    """In async mode, after a drive that left ``release`` open (``submitting``: posted,
    not landed; ``submitted``: landed, AP not told yet), schedule its next look
    (``anchor.tasks.release_follow``) RELEASE_FOLLOW_DELAY_S from now, after the
    caller's commit. Stops after RELEASE_FOLLOW_MAX looks (the reconciler, every
    RECONCILER_PERIOD_S, restarts any chain that stopped or was lost with a killed
    worker). Returns whether it scheduled one."""
    if settings.STELLAR_SUBMIT_MODE != "async" or release.status not in FOLLOWED:
        return False
    if follows >= settings.RELEASE_FOLLOW_MAX:
        return False
    from anchor import tasks

    release_id = release.pk
    delay = settings.RELEASE_FOLLOW_DELAY_S
    if follows == 0 and release.status == Status.SUBMITTING:
        delay = _until_next_close(delay)
    transaction.on_commit(lambda: tasks.release_follow.apply_async(
        (release_id, follows + 1), countdown=delay))
    return True


def _until_next_close(default: float) -> float:
    """Seconds from now to RELEASE_FOLLOW_MARGIN_S after the next ledger close expected
    from Horizon's latest close (``history_latest_ledger_closed_at``) and
    STELLAR_LEDGER_CLOSE_S: the first look at a fresh post finds it landed, instead of
    several looks per ledger. ``default`` when Horizon cannot say."""
    period = settings.STELLAR_LEDGER_CLOSE_S
    if not period:
        return default
    try:
        closed_at = stellar.latest_ledger_close_time()
    except stellar.HorizonUnavailable:
        return default
    # closed_at is whole seconds (the close happened up to 1 s later): its midpoint
    elapsed = (timezone.now() - closed_at).total_seconds() - 0.5
    until = period - (elapsed % period) + settings.RELEASE_FOLLOW_MARGIN_S
    return max(0.1, min(until, period + settings.RELEASE_FOLLOW_MARGIN_S))


def _landed(release: DepositRelease, found: dict) -> DepositRelease:
    """The stored hash is on chain: adopt it (successful) or settle the failure."""
    if found.get("successful"):
        release = _mark_submitted(release)
        crash_point("after_mark_submitted")
        return _complete(release)
    codes = _op_codes(found)
    if "op_no_trust" in codes:
        with transaction.atomic():
            _set_status(release, Status.FAILED, "op_no_trust: waiting for the trustline",
                        failure_code=DepositRelease.FailureCode.NO_TRUST)
            stellar.free_channel(address=release.source_account, holder=release.transaction_id)
        _request_trust(release.transaction_id)
        return DepositRelease.objects.get(pk=release.pk)
    with transaction.atomic():
        _set_status(release, Status.MANUAL_REVIEW,
                    f"included but failed: {' '.join(codes) or 'tx_failed'}")
        stellar.free_channel(address=release.source_account, holder=release.transaction_id)
    return DepositRelease.objects.get(pk=release.pk)


def _op_codes(found: dict) -> list[str]:
    from stellar_sdk import xdr

    try:
        result = xdr.TransactionResult.from_xdr(found["result_xdr"])
        names = []
        for op in result.result.results or []:
            code = op.tr.payment_result.code if op.tr and op.tr.payment_result else None
            names.append(_payment_code_name(code))
        return names
    except Exception:  # an undecodable result still fails safe: manual review
        return []


def _payment_code_name(code) -> str:
    if code is None:
        return "op_unknown"
    name = code.name.removeprefix("PAYMENT_").lower()
    return "op_success" if name == "success" else f"op_{name}"


def _fate(release: DepositRelease) -> envelopes.Fate:
    """The release's stored envelope under the one rule (``anchor.envelopes``)."""
    return envelopes.envelope_fate(tx_hash=release.tx_hash,
                                   source_account=release.source_account,
                                   sequence=release.sequence, max_time=release.max_time)


def _undecided(release: DepositRelease, fate: envelopes.Fate, *,
               note: str = "") -> DepositRelease:
    """Horizon cannot prove the envelope landed, alive or dead: wait (the reconciler
    asks again), never rebuild; once ``envelopes.unknown_overdue``, a person decides,
    with the evidence."""
    if envelopes.unknown_overdue(release.max_time):
        with transaction.atomic():
            stopped = _set_status(release, Status.MANUAL_REVIEW,
                                  f"{note}envelope fate unknown past max_time + "
                                  f"{settings.ENVELOPE_UNKNOWN_REVIEW_S:g}s: {fate.reason}; "
                                  f"evidence {fate.evidence}")
            if stopped:
                ReleaseEvent.objects.create(
                    release=release, event=UNKNOWN_FATE_EVENT,
                    operator=operator_name(None), note=fate.reason[:2000],
                    detail={"tx_hash": release.tx_hash, "evidence": fate.evidence})
    else:
        _note(release, f"{note}envelope fate unknown, waiting: {fate.reason}")
    return DepositRelease.objects.get(pk=release.pk)


def _rebuild(release: DepositRelease, *, reason: str) -> DepositRelease:
    """Replace a provably dead envelope: new sequence, new bounds, new hash; one commit.
    After RELEASE_MAX_ATTEMPTS the release goes to manual_review instead.

    First the chain is asked for this deposit's payment under a hash the row does not
    hold (``landed_unrecorded``): an envelope built by an earlier rebuild whose commit
    a failover lost, which landed (chaos, 20 loaded seeds, seed 4: the stored envelope
    was the first, dead; its successor had paid 6.1834117 USDC; a third envelope paid
    it again). Found: adopted, never rebuilt. The look counts only on a Horizon whose
    history reaches the moment of the decision (``stellar.history_height`` closed within
    RELEASE_REBUILD_HORIZON_LAG_S of now); a Horizon further behind, the release waits
    for the next drive. RELEASE_LOST_SUCCESSOR_CHECK off: the test-only naive rebuild."""
    if settings.RELEASE_LOST_SUCCESSOR_CHECK and release.status in _REBUILDABLE:
        adopted = _adopt_lost_successor(release)
        if adopted is not None:
            return adopted
    with transaction.atomic():
        current = DepositRelease.objects.select_for_update().get(pk=release.pk)
        if current.tx_hash != release.tx_hash or current.status not in _REBUILDABLE:
            return current  # another worker already moved it on
        stellar.forget_sequence(address=current.source_account, holder=current.transaction_id)
        if current.attempts >= settings.RELEASE_MAX_ATTEMPTS:
            DepositRelease.transition(
                current.pk, current.status, Status.MANUAL_REVIEW, require=True,
                last_error=f"attempts exhausted ({current.attempts}); last: {reason}"[:2000])
            current.refresh_from_db()
            return current
        DepositRelease.transition(current.pk, current.status, Status.SUBMITTING, require=True,
                                  last_error=reason[:2000], **_new_envelope(current))
        current.refresh_from_db()
        log.info("release %s rebuilt (attempt %s): %s", current.transaction_id,
                 current.attempts, reason)
        return current


# A stored envelope is replaced only while nothing of it was accepted yet.
_REBUILDABLE = (Status.SUBMITTING, Status.FAILED)


def _replaced(stored_hash: str, release: DepositRelease) -> bool:
    """After ``_rebuild``: a new envelope to submit (not review, not adopted from the
    chain, not waiting for Horizon with the old one): only then may the caller go on."""
    return release.status == Status.SUBMITTING and release.tx_hash != stored_hash


def _adopt_lost_successor(release: DepositRelease) -> DepositRelease | None:
    """``_rebuild``'s look at the chain: the release, ``submitted`` with the found hash
    and booked in one commit, then completed (steps 5-6); or the release unchanged with
    a note when Horizon is too far behind to prove nothing landed; or None (nothing
    landed: rebuild). Raises HorizonUnavailable."""
    _, closed_at = stellar.history_height()
    lag = timezone.now() - closed_at
    if lag > timedelta(seconds=settings.RELEASE_REBUILD_HORIZON_LAG_S):
        _note(release, f"not rebuilt: Horizon's history ends {lag.total_seconds():.1f}s "
                       "ago, a lost successor envelope could be hidden")
        return DepositRelease.objects.get(pk=release.pk)
    order = DepositOrder.objects.get(transaction_id=release.transaction_id)
    transfer = landed_unrecorded(order=order, destination=release.destination,
                                 memo=release.memo)
    if transfer is None:
        return None
    with transaction.atomic():
        moved = DepositRelease.transition(
            release.pk, _REBUILDABLE, Status.SUBMITTED, where=Q(tx_hash=release.tx_hash),
            tx_hash=transfer.tx_hash,
            last_error=f"adopted from the chain: {transfer.tx_hash} landed, built by a "
                       "rebuild whose commit was lost; the stored envelope is dead")
        if not moved:
            return DepositRelease.objects.get(pk=release.pk)
        _book_released(release)
        stellar.free_channel(address=release.source_account, holder=release.transaction_id)
    log.warning("release %s: a lost successor envelope %s landed: adopted, not rebuilt",
                release.transaction_id, transfer.tx_hash)
    return _complete(DepositRelease.objects.get(pk=release.pk))


def _new_envelope(current: DepositRelease) -> dict:
    """The fields of a new channel sequence and envelope for a locked release (the old
    one is dead) and one more attempt; the caller writes them with its transition in
    the same transaction."""
    prepared = stellar.prepare_payment(
        holder=current.transaction_id, destination=current.destination,
        amount=current.amount, memo_type=current.memo_type, memo=current.memo, resync=True)
    return {**prepared, "attempts": F("attempts") + 1}


def _mark_submitted(release: DepositRelease) -> DepositRelease:
    """Step 4: ``submitted``, and the channel is free again. One commit."""
    with transaction.atomic():
        moved = DepositRelease.transition(release.pk, _REBUILDABLE, Status.SUBMITTED,
                                          where=Q(tx_hash=release.tx_hash), last_error="")
        if moved:
            _book_released(release)
        stellar.free_channel(address=release.source_account, holder=release.transaction_id)
    release.refresh_from_db()
    return release


def _book_released(release: DepositRelease) -> None:
    """Rule 2 of the books (ledger/chart.py ``deposit_released``), in the transaction
    that marks the release landed: the order's amount_in, fee and amount_out (the
    release's amount is the order's amount_out)."""
    order = DepositOrder.objects.get(transaction_id=release.transaction_id)
    payment = DepositPayment.objects.live().filter(
        transaction_id=release.transaction_id).first()
    chart.deposit_released(transaction_id=release.transaction_id,
                           payment_id=payment.payment_id if payment else None,
                           amount_in=order.amount_in, fee=order.fee, amount_out=release.amount)


def _complete(release: DepositRelease) -> DepositRelease:
    """Steps 5-6: tell AP the hash, then mark completed."""
    tx_hash = release.tx_hash

    def reached(tx: dict) -> bool:
        return tx.get("status") == "completed" and any(
            st.get("id") == tx_hash for st in tx.get("stellar_transactions") or [])

    def notify() -> None:
        platform.rpc_once("notify_onchain_funds_sent",
                          {"transaction_id": release.transaction_id,
                           "stellar_transaction_id": tx_hash},
                          reached=reached)

    ap_tx = None  # AP's transaction as read after a refusal: one read decides
    try:
        try:
            notify()
        except platform.RpcError as exc:
            if exc.code == platform.INTERNAL_ERROR:
                raise
            ap_tx = platform.get_transaction(release.transaction_id) or {}
            if not reached(ap_tx):
                if not _trust_detour_undone(release, ap_tx):
                    raise
                ap_tx = None  # AP moved since: a second refusal is read afresh
                notify()
    except platform.RpcError as exc:
        if exc.code == platform.INTERNAL_ERROR:
            # AP's ledger client may not see a fresh hash yet (AP PR #1962): retry the
            # notify later, never the payment.
            _note(release, f"notify_onchain_funds_sent: {exc.code} {exc.message}")
            return DepositRelease.objects.get(pk=release.pk)
        if _refusal_contradicted(release, ap_tx):
            return DepositRelease.objects.get(pk=release.pk)
        _set_status(release, Status.MANUAL_REVIEW,
                    f"AP refused notify_onchain_funds_sent: {exc.code} {exc.message}")
        return DepositRelease.objects.get(pk=release.pk)
    crash_point("after_notify")
    DepositRelease.transition(release.pk, Status.SUBMITTED, Status.COMPLETED, last_error="")
    release.refresh_from_db()
    return release


def _refusal_contradicted(release: DepositRelease, ap_tx: dict | None) -> bool:
    """AP refused ``notify_onchain_funds_sent`` (-32600) for our landed payment, and the
    read that decides (``ap_tx``, the one ``_complete`` made after the refusal; read
    here only when there is none) shows ``pending_anchor``, the status from which AP
    takes that notify: the read lags behind AP (a lost answer to a notify AP applied,
    or a ``request_trust`` behind it; found by the stale-read attacker), not proof that
    AP refuses it for good. The release stays ``submitted`` with the reason; the
    reconciler asks AP again (``corridor.stranded`` counts it if that never ends).
    Returns whether it was so. Reading AP a second time here sent a paid, completed
    deposit to manual_review when the first re-read lagged and the second did not.
    ``RELEASE_NOTIFY_CONTRADICTION = False`` (tests and ``make chaos`` only): never."""
    if not settings.RELEASE_NOTIFY_CONTRADICTION:
        return False
    if ap_tx is None:
        ap_tx = platform.get_transaction(release.transaction_id) or {}
    if ap_tx.get("status") != "pending_anchor":
        return False
    _note(release, "notify_onchain_funds_sent refused (-32600) while AP reads "
                   "pending_anchor: a stale read; asked again later")
    return True


def _trust_detour_undone(release: DepositRelease, ap_tx: dict) -> bool:
    """AP refused ``notify_onchain_funds_sent`` for a payment that landed successfully:
    if AP (``ap_tx``, read after the refusal) is in ``pending_trust``, a concurrent start
    of the same deposit read the destination from a Horizon behind its trustline and
    called ``request_trust`` after this release was claimed (found by ``make chaos``).
    The landed payment proves the trustline, so ``notify_trust_set`` takes AP back to
    ``pending_anchor`` (AP 4.2+, NOTES §1.5) and the notify can be sent. Returns whether
    it did."""
    if ap_tx.get("status") != "pending_trust":
        return False
    notify_trust_set(release.transaction_id)
    log.info("release: AP was in pending_trust after our payment landed; trust set")
    return True


def _after_no_trust(release: DepositRelease) -> DepositRelease:
    """A payment that failed with op_no_trust: once the trustline exists and AP is
    back in pending_anchor, build a new envelope (the failed one used its sequence)."""
    if not stellar.has_trustline(release.destination, stellar.usdc()):
        return release
    ap_tx = platform.get_transaction(release.transaction_id) or {}
    if ap_tx.get("status") == "pending_trust":
        notify_trust_set(release.transaction_id)
    with transaction.atomic():
        DepositRelease.objects.filter(pk=release.pk, status=Status.FAILED).update(
            last_error="trustline set")
    release.refresh_from_db()
    stored = release.tx_hash
    release = _rebuild(release, reason="trustline set")
    if not _replaced(stored, release):
        return release
    return _drive(release, redrive=False)


def _set_status(release: DepositRelease, status: str, error: str, **fields) -> bool:
    """Move an open release to ``status`` (failed or manual_review) from whichever open
    status may reach it; a release that moved on meanwhile is left alone."""
    sources = tuple(s for s in DepositRelease.OPEN_STATUSES
                    if status in DepositRelease.TRANSITIONS[s])
    return DepositRelease.transition(release.pk, sources, status, last_error=error[:2000],
                                     **fields)


def _note(release: DepositRelease, error: str) -> None:
    """Record why a drive stopped (``StatusMachine.note``: the reconciler looks again
    after its age threshold)."""
    DepositRelease.note(release.pk, error)


# --- operator helpers (anchor/operations.py: the console's "re-drive") ---------------

@dataclass(frozen=True)
class ChainCheck:
    """Where a release's stored envelope stands on chain (DESIGN.md §4 step 3;
    horizon/NOTES.md §2.6 rule 3; decided by ``anchor.envelopes``). ``state``: ``none``
    (no envelope was ever built), ``landed`` (the stored hash is in a ledger, successful
    or not), ``dead`` (provably never applicable: its sequence unused as of a ledger
    that closed after its max_time, or used by another transaction), ``live`` (may
    still land), ``unknown`` (Horizon cannot prove which yet). ``provably_off_chain``
    is True for ``none`` and ``dead`` only; ``detail`` carries the evidence."""

    state: str
    reason: str
    detail: dict

    @property
    def provably_off_chain(self) -> bool:
        return self.state in ("none", "dead")


def release_chain_check(release: DepositRelease) -> ChainCheck:
    """Where the release's envelope stands, by the one rule (``envelopes.envelope_fate``,
    which reads the account first so a landing between its reads can never pass for
    dead). Reads only. Raises stellar.HorizonUnavailable."""
    if not release.tx_hash:
        return ChainCheck("none", "no envelope was ever built for this release", {})
    fate = _fate(release)
    state = {envelopes.ALIVE: "live"}.get(fate.state, fate.state)
    return ChainCheck(state, fate.reason, fate.evidence)


UNKNOWN_FATE_EVENT = "release.review_unknown_fate"


_review_turn = {"after": 0}  # this process's place in the turn (a restart begins again)


def unknown_fate_reviews(limit: int | None = None) -> list[DepositRelease]:
    """Releases stopped for a person because Horizon could not place their envelope in
    time (``_undecided``, which writes a ``release.review_unknown_fate`` audit row in the
    same commit), at most ``limit`` (RELEASE_REVIEW_RECHECK_BATCH): the reconciler asks
    the rule again (``resume_landed_review``). Chosen by that row being the release's
    latest event (an operator's action since writes its own), never by the text of
    ``last_error``. They take turns by id, wrapping round, so reviews that stay
    unresolved never keep later ones from being asked (stop 34's review: a fixed
    oldest-50 starved the 51st)."""
    limit = limit or settings.RELEASE_REVIEW_RECHECK_BATCH
    latest = (ReleaseEvent.objects.filter(release=OuterRef("pk"))
              .order_by("-id").values("event")[:1])
    reviews = (DepositRelease.objects.filter(status=Status.MANUAL_REVIEW)
               .exclude(tx_hash="").annotate(latest_event=Subquery(latest))
               .filter(latest_event=UNKNOWN_FATE_EVENT).order_by("pk"))
    chosen = list(reviews.filter(pk__gt=_review_turn["after"])[:limit])
    if len(chosen) < limit and _review_turn["after"]:
        seen = {r.pk for r in chosen}
        chosen += [r for r in reviews.filter(pk__lte=_review_turn["after"])[:limit - len(chosen)]
                   if r.pk not in seen]
    _review_turn["after"] = chosen[-1].pk if chosen else 0
    return chosen


def resume_landed_review(release: DepositRelease) -> DepositRelease | None:
    """A release in review because its envelope's fate stayed unknown, whose envelope
    Horizon now shows landed and successful (later evidence, issue 25 §1: the review no
    longer states what the chain contradicts): back to ``submitting`` with the same
    envelope (the one edge out of review), an audit row naming Corridor in the same
    commit, then the drive marks it landed, books it and tells AP, as for any landing.
    A fate still unknown or dead leaves it to the person (the operator's re-drive).
    None when nothing moved (another fate, or an operator acted first: the conditional
    transition on the same status and hash). Raises stellar.HorizonUnavailable."""
    fate = _fate(release)
    if not (fate.state == envelopes.LANDED and fate.successful):
        return None
    note = f"landed after the review: {fate.reason}"
    with transaction.atomic():
        moved = DepositRelease.transition(
            release.pk, Status.MANUAL_REVIEW, Status.SUBMITTING,
            where=Q(tx_hash=release.tx_hash), last_error=note[:2000])
        if not moved:
            return None
        ReleaseEvent.objects.create(
            release=release, event="release.review_withdrawn", operator=operator_name(None),
            note=note[:2000], detail={"tx_hash": release.tx_hash, "evidence": fate.evidence})
    log.warning("release %s: %s", release.transaction_id, note)
    return release_drive(release_id=release.pk, redrive=True)


def release_prepare_redrive(*, release_id: int, expected_hash: str | None,
                            reason: str) -> DepositRelease:
    """An operator's re-drive of a release in ``manual_review`` whose envelope was
    shown provably off chain (``release_chain_check``): a new envelope (a channel
    leased in this transaction, its next sequence, new time bounds and hash), one more
    attempt, status ``submitting``. Runs in the caller's transaction (it writes the
    audit row there); nothing is submitted here: ``release_drive`` does that after the
    commit. The channel's sequence is read from Horizon under the channel's row lock,
    as ``release_claim`` and ``_rebuild`` do (step 1: concurrent releases must never
    collide on a sequence). Raises ReleaseRefused when the row moved on since the
    check (another status or another hash), stellar.NoChannelFree,
    stellar.HorizonUnavailable."""
    # The payment row first, as both claims lock it (``release_claim``, the refund's
    # ``refund_claim``): a refund claimed since the operator's checks is seen here and
    # refused, and a refund claimed after this commits sees the release submitting.
    transaction_id = DepositRelease.objects.values_list(
        "transaction_id", flat=True).get(pk=release_id)
    _lock_payment_unrefunded(transaction_id)
    current = DepositRelease.objects.select_for_update().get(pk=release_id)
    if current.status != Status.MANUAL_REVIEW or current.tx_hash != expected_hash:
        raise ReleaseRefused(f"release {release_id} changed since it was checked "
                             f"(now {current.status}, hash {current.tx_hash})")
    if current.source_account:
        stellar.forget_sequence(address=current.source_account,
                                holder=current.transaction_id)
    DepositRelease.transition(current.pk, Status.MANUAL_REVIEW, Status.SUBMITTING,
                              require=True, last_error=reason[:2000], **_new_envelope(current))
    current.refresh_from_db()
    return current
