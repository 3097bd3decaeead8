"""The withdrawal-refund outbox: USDC a withdrawal received, sent back on chain to its
sender (``withdrawal_refunds``), driven like the deposit release (DESIGN.md §4 steps
2-6) and decided by the same rule (``anchor.envelopes``).

An operator's action (``payouts.operations.withdrawal_refund_on_chain``) stores the
signed envelope, its hash and the audit row in one commit, then calls
``refund_drive``. The same outbox sends back an unconsumed receipt
(``payouts.operations.receipt_refund_on_chain``: ``receipt`` set, one refund per
receipt, AP not told). Everything after that needs no person: ``refund_sweep`` (Celery
beat, every REFUND_SWEEP_PERIOD_S) re-drives refunds left open for REFUND_SWEEP_AGE_S,
so a refund stuck after a 504 finishes by itself.

A failover that loses the refund's commits (issue 25 §2) while the payment stays on
chain: a fresh claim first adopts the unrecorded payment (``landed_unrecorded``, as
``anchor.releases.release_adopt`` does for a release), and the same sweep rebuilds the
lost row of a request still waiting for its refund (``refund_rebuild``): ``submitted``
and booked when AP has not recorded it yet (then AP is told), ``completed`` and booked
when AP shows it ``refunded`` with that hash. A receipt's own refund (``receipt:<id>``)
has no request to lead there: a claim of it looks on chain first the same way, under
either memo a receipt's refund is sent with (``receipt_refund_memos``), and the sweep
looks for the refund of every receipt still raised and unrefunded
(``receipt_refund_rebuild``): the row rebuilt ``submitted`` and booked with the
receipt, then driven (completed, the receipt settled).

A drive: on a resumed drive the stored envelope's fate is read first (``landed`` ->
adopt it; ``dead`` -> rebuild, new sequence, bounds and hash; ``alive`` -> re-post the
same envelope; ``unknown`` -> wait, and ``manual_review`` once
``envelopes.unknown_overdue``); then POST, then AP ``notify_refund_sent``. Every step
is a conditional UPDATE under a per-refund advisory lock, so a sweep and an operator
can run at the same moment.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import envelopes, limits, platform, stellar
from anchor.models import DepositRelease
from common.console import AUTOMATIC
from common.locks import try_session_lock
from payouts import books, receipts
from payouts.models import (
    PayoutEvent,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)

log = logging.getLogger(__name__)
F = WithdrawalRefund.Status
OPEN = (F.SUBMITTING, F.SUBMITTED)
BATCH = 200


def holder(transaction_id: str) -> str:
    """The channel-lease holder name of a withdrawal's refund."""
    return f"refund:{transaction_id}"


def receipt_key(receipt_id: int) -> str:
    """The outbox's unique key (``withdrawal_refunds.transaction_id``) and the audit
    rows' ``transaction_id`` of a receipt's own refund: ``receipt:<id>``."""
    return f"receipt:{receipt_id}"


def refund_sweep() -> dict[str, int]:
    """Re-drive refunds open (``submitting`` / ``submitted``) and untouched for
    REFUND_SWEEP_AGE_S, oldest first, then rebuild refunds a failover lost: a
    request's (``refund_rebuild``) and a receipt's own (``receipt_refund_rebuild``);
    returns counts by resulting status (``rebuilt`` for the latter two)."""
    counts: dict[str, int] = {}
    for refund_id in list(stuck_refunds()):
        refund = refund_drive(refund_id=refund_id, resumed=True)
        counts[refund.status] = counts.get(refund.status, 0) + 1
    for request_id in list(unrefunded_requests()):
        try:
            if refund_rebuild(request_id=request_id) is not None:
                counts["rebuilt"] = counts.get("rebuilt", 0) + 1
        except (platform.PlatformError, stellar.HorizonUnavailable) as exc:
            log.warning("refund rebuild: request %s not rebuilt: %s", request_id, exc)
    for receipt_id in list(unrefunded_receipts()):
        try:
            if receipt_refund_rebuild(receipt_id=receipt_id) is not None:
                counts["rebuilt"] = counts.get("rebuilt", 0) + 1
        except stellar.HorizonUnavailable as exc:
            log.warning("refund rebuild: receipt %s not rebuilt: %s", receipt_id, exc)
    return counts


def unrefunded_requests(limit: int = 50):
    """Requests a refund may have left for with its row lost: no refund row, and in
    ``manual_review`` (a person's queue: the refund's own commit moved no status of a
    SEP-24 withdrawal) or with a ``failed`` / ``reversed`` payout (a receive refunded
    after its payout failed). Untouched for REFUND_SWEEP_AGE_S, most recent first, at
    most ``limit`` (each costs an AP read and a Horizon page)."""
    cutoff = timezone.now() - timedelta(seconds=settings.REFUND_SWEEP_AGE_S)
    failed = WithdrawalPayout.objects.filter(
        status__in=(WithdrawalPayout.Status.FAILED, WithdrawalPayout.Status.REVERSED)
    ).values("transaction_id")
    return (WithdrawalRequest.objects.filter(refund__isnull=True, updated_at__lt=cutoff)
            .filter(Q(status=WithdrawalRequest.Status.MANUAL_REVIEW)
                    | Q(transaction_id__in=failed))
            .order_by("-updated_at").values_list("pk", flat=True)[:limit])


def unrefunded_receipts(limit: int = 50):
    """Receipts a refund of their own may have left for with its row lost: raised in
    the operators' queue (``review_reason``), unsettled, no refund row, raised more than
    REFUND_SWEEP_AGE_S ago, most recent first, at most ``limit`` (each costs a Horizon
    page; ``stellar_receipts_open_idx``). A refund is only ever stored for such a
    receipt (``payouts.operations._receipt_refund_store``)."""
    cutoff = timezone.now() - timedelta(seconds=settings.REFUND_SWEEP_AGE_S)
    return (receipts.open_receipts().exclude(review_reason="")
            .filter(refund__isnull=True, reviewed_at__lt=cutoff)
            .order_by("-reviewed_at").values_list("pk", flat=True)[:limit])


def receipt_refund_memos(receipt: StellarReceipt) -> tuple[str, ...]:
    """The memos a receipt's own refund goes out with: none (the operator's,
    ``receipt_refund_on_chain``) or the receipt's own (Corridor's return of USDC late
    for an expired receive, ``late_receipt_refund``). Either path may have paid before
    a failover lost the row, so a lookup accepts both."""
    return ("", receipt.memo) if receipt.memo else ("",)


def landed_unrecorded(*, destination: str, amount: Decimal, memo: str | tuple[str, ...],
                      since) -> stellar.Transfer | None:
    """A refund already on chain with no row recording it: its claim was lost with a
    failover's last commits while Horizon kept the payment (issue 25 §2). A successful
    USDC payment from the distribution account to ``destination`` (G..., or M...: then
    that muxed address exactly) of ``amount`` (Decimal, 7 dp) under ``memo`` ("" for
    none; a tuple: any of them), whose ledger closed at or after ``since`` (the
    request's creation, the receipt's arrival), whose hash no refund or release row
    holds. None when there is none. Raises HorizonUnavailable.

    A Horizon lagging behind the payment hides it (not proven absent): a claim then
    builds a new envelope, as a release's does (issue 25 §2, left open there too)."""
    distribution = stellar.distribution_keypair().public_key
    memos = (memo,) if isinstance(memo, str) else memo
    base = receipts.base_account(destination)
    muxed = destination if destination != base else ""
    for transfer in stellar.transfers_since(base, since):
        if (transfer.source, transfer.destination, transfer.asset, transfer.amount) != (
                distribution, base, stellar.usdc_asset_id(), amount) or \
                transfer.memo not in memos or transfer.destination_muxed != muxed:
            continue
        if not (WithdrawalRefund.objects.filter(tx_hash=transfer.tx_hash).exists()
                or DepositRelease.objects.filter(tx_hash=transfer.tx_hash).exists()):
            return transfer
    return None


def chain_fields(tx_hash: str) -> dict:
    """The envelope fields of a refund row (``source_account``, ``sequence``,
    ``envelope_xdr``, ``tx_hash``, ``max_time``) read back from the landed transaction
    ``tx_hash`` (Horizon ``GET /transactions/{hash}``; ``max_time`` from its time bounds,
    its close time when it has none). Raises HorizonUnavailable (also when Horizon does
    not show it)."""
    found = stellar.find_transaction(tx_hash)
    if found is None:
        raise stellar.HorizonUnavailable(f"transaction {tx_hash} not found on Horizon")
    bounds = ((found.get("preconditions") or {}).get("timebounds") or {}).get("max_time")
    if bounds and int(bounds):
        max_time = datetime.fromtimestamp(int(bounds), UTC)
    else:
        max_time = datetime.fromisoformat(found["created_at"].replace("Z", "+00:00"))
    return {"source_account": found["source_account"],
            "sequence": int(found["source_account_sequence"]),
            "envelope_xdr": found["envelope_xdr"], "tx_hash": tx_hash, "max_time": max_time}


def refund_rebuild(*, request_id: int) -> WithdrawalRefund | None:
    """A request whose refund row a failover lost (issue 25 §2): the USDC its receipts
    brought (one sender, less what their own completed refunds sent back) found sent
    back on chain (``landed_unrecorded``, AP's ``refund_memo``) becomes its refund row
    in one transaction with its booking (rule 6) and its receipts settled, as
    ``payouts.operations._refund_store`` writes them: ``completed`` when AP's refund
    payments (their ids are Stellar hashes) name that hash, else ``submitted`` and
    driven on (AP is told). None when there is nothing to rebuild (a refund row exists,
    no such payment on chain, or AP shows it refunded by another hash). Raises
    HorizonUnavailable, PlatformError."""
    request = WithdrawalRequest.objects.get(pk=request_id)
    tid = request.transaction_id
    if WithdrawalRefund.objects.filter(transaction_id=tid).exists():
        return None
    usdc = list(StellarReceipt.objects.filter(
        memo_type=request.memo_type or "id", memo=request.memo,
        to_account=stellar.distribution_keypair().public_key,
        asset=stellar.usdc_asset_id()).order_by("paging_token"))
    senders = {r.from_account for r in usdc}
    own = list(WithdrawalRefund.objects.filter(receipt__in=usdc))
    if len(senders) != 1 or any(f.status != F.COMPLETED for f in own):
        return None
    amount = sum((r.amount for r in usdc), Decimal(0)) - sum((f.amount for f in own),
                                                              Decimal(0))
    ap_tx = platform.get_transaction(tid) or {}
    memo_type = ap_tx.get("refund_memo_type") or "none"
    memo = ap_tx.get("refund_memo") or ""
    destination = senders.pop()
    transfer = landed_unrecorded(destination=destination, amount=amount, memo=memo,
                                 since=request.created_at)
    if transfer is None:
        return None
    recorded = _recorded(transfer.tx_hash)(ap_tx)
    if ap_tx.get("status") == "refunded" and not recorded:
        log.warning("refund rebuild: %s refunded in AP by another hash than %s: left to a "
                    "person", tid, transfer.tx_hash)
        return None
    fields = chain_fields(transfer.tx_hash)
    status, how = (F.COMPLETED, "rebuilt from AP and the chain") if recorded else (
        F.SUBMITTED, "adopted from the chain")
    refund = _store_found(request=request, receipts=usdc, destination=destination,
                          amount=amount, memo_type=memo_type, memo=memo, fields=fields,
                          status=status, note=f"{how}: {transfer.tx_hash} landed with no "
                                              "refund recorded (a lost commit)")
    if refund is None or status == F.COMPLETED:
        return refund
    return refund_drive(refund_id=refund.pk, resumed=False)


def _store_found(*, request: WithdrawalRequest, receipts: list[StellarReceipt],
                 destination: str, amount: Decimal, memo_type: str, memo: str,
                 fields: dict, status: str, note: str) -> WithdrawalRefund | None:
    """One transaction: the request locked (the lock order of every withdrawal path),
    no refund row yet, the request in review (a receive's failed payout is never paid
    again), the receipts settled under the request, the row stored with the found
    payment's fields, booked (rule 6). None when another row won."""
    try:
        with transaction.atomic():
            current = WithdrawalRequest.objects.select_for_update().get(pk=request.pk)
            if WithdrawalRefund.objects.filter(transaction_id=request.transaction_id
                                               ).exists():
                return None
            if current.status != WithdrawalRequest.Status.MANUAL_REVIEW:
                # A receive whose payout failed, as _refund_store leaves it: the poller
                # never pays a request in review.
                WithdrawalRequest.objects.filter(pk=current.pk).update(
                    status=WithdrawalRequest.Status.MANUAL_REVIEW,
                    review_reason=f"refunded on chain: {note}"[:2000],
                    updated_at=timezone.now())
            StellarReceipt.objects.filter(pk__in=[r.pk for r in receipts]).update(
                settled_at=timezone.now(), transaction_id=request.transaction_id)
            refund = WithdrawalRefund.objects.create(
                request=request, transaction_id=request.transaction_id, status=status,
                destination=destination, amount=amount, memo=memo, memo_type=memo_type,
                last_error=note[:2000], **fields)
            books.refund_landed(refund)
    except IntegrityError:
        return None
    if request.kind == WithdrawalRequest.Kind.RECEIVE:
        limits.release(request.transaction_id)  # no INR moves for it: off the limits
    log.warning("refund %s: %s", request.transaction_id, note)
    return refund


def receipt_refund_rebuild(*, receipt_id: int) -> WithdrawalRefund | None:
    """A receipt whose own refund's row a failover lost after the payment landed
    (issue 25 §2): its unconsumed part (Decimal, 7 dp) found sent back to its sender on
    chain (``landed_unrecorded`` under ``receipt_refund_memos``, since the receipt
    arrived) becomes its refund row (``receipt:<id>``) in one transaction with the
    booking (rule 6: the receipt received and sent back) and an audit row naming
    Corridor (``receipt.refund_adopted``), then is driven (``completed``, the receipt
    settled: it leaves the operators' queue). None when there is nothing to rebuild (a
    refund row exists, the receipt is settled or no longer raised, or no such payment
    is on chain). Raises HorizonUnavailable."""
    receipt = StellarReceipt.objects.get(pk=receipt_id)
    if receipt.settled_at is not None or not receipt.review_reason or \
            receipt.unconsumed <= 0 or WithdrawalRefund.objects.filter(receipt=receipt
                                                                        ).exists():
        return None
    transfer = landed_unrecorded(destination=receipt.from_account, amount=receipt.unconsumed,
                                 memo=receipt_refund_memos(receipt), since=receipt.created_at)
    if transfer is None:
        return None
    fields = chain_fields(transfer.tx_hash)
    note = (f"rebuilt from the chain: {transfer.tx_hash} sent the receipt back with no "
            "refund recorded (a lost commit)")
    key = receipt_key(receipt.pk)
    try:
        with transaction.atomic():
            current = StellarReceipt.objects.select_for_update().get(pk=receipt.pk)
            if current.settled_at is not None or not current.review_reason or \
                    current.unconsumed != receipt.unconsumed or \
                    WithdrawalRefund.objects.filter(receipt=current).exists():
                return None
            refund = WithdrawalRefund.objects.create(
                receipt=current, transaction_id=key, status=F.SUBMITTED,
                destination=current.from_account, amount=current.unconsumed,
                memo=transfer.memo, memo_type=transfer.memo_type,
                last_error=note, **fields)
            books.refund_landed(refund)  # rule 6, with the row that records it
            PayoutEvent.objects.create(
                transaction_id=key, event="receipt.refund_adopted", operator=AUTOMATIC,
                note=note, detail={"amount": format(refund.amount, "f"),
                                   "destination": refund.destination,
                                   "tx_hash": transfer.tx_hash,
                                   "receipt": {"tx_hash": current.tx_hash,
                                               "reason": current.review_reason}})
    except IntegrityError:  # a claim of the same receipt won
        return None
    log.warning("refund %s: %s", key, note)
    return refund_drive(refund_id=refund.pk, resumed=False)


def stuck_refunds():
    """The refund sweep's query: ids of refunds open and untouched for
    REFUND_SWEEP_AGE_S, oldest first, at most BATCH (``withdrawal_refunds_open_idx``;
    corridor/periodic.py)."""
    cutoff = timezone.now() - timedelta(seconds=settings.REFUND_SWEEP_AGE_S)
    return (WithdrawalRefund.objects.filter(status__in=OPEN, updated_at__lt=cutoff)
            .order_by("updated_at").values_list("pk", flat=True)[:BATCH])


def refund_drive(*, refund_id: int, resumed: bool) -> WithdrawalRefund:
    """Submit a stored refund and tell AP. ``resumed``: an earlier drive may have
    submitted it, so its fate is read first. Returns the refund as it stands; never
    raises for an unknown outcome (the row stays open for the sweep)."""
    with try_session_lock(f"withdrawal_refund:{refund_id}") as got:
        refund = WithdrawalRefund.objects.get(pk=refund_id)
        if not got:
            return refund
        with bound_contextvars(transaction_id=refund.transaction_id):
            try:
                if refund.status == F.SUBMITTING:
                    refund = _submit(refund, resumed=resumed)
                if refund.status == F.SUBMITTED:
                    refund = _notify(refund)
            except (platform.PlatformError, stellar.HorizonUnavailable,
                    stellar.NoChannelFree) as exc:
                _note(refund, f"{type(exc).__name__}: {exc}")
        return WithdrawalRefund.objects.get(pk=refund_id)


def _fate(refund: WithdrawalRefund) -> envelopes.Fate:
    return envelopes.envelope_fate(tx_hash=refund.tx_hash,
                                   source_account=refund.source_account,
                                   sequence=refund.sequence, max_time=refund.max_time)


def _submit(refund: WithdrawalRefund, *, resumed: bool) -> WithdrawalRefund:
    if resumed:
        fate = _fate(refund)
        if fate.state == envelopes.LANDED:
            return _landed(refund, fate.transaction)
        if fate.state == envelopes.UNKNOWN:
            return _undecided(refund, fate)
        if fate.state == envelopes.DEAD:
            refund = _rebuild(refund, reason=fate.reason)
            if refund.status != F.SUBMITTING:
                return refund
    result = stellar.submit(refund.envelope_xdr)
    if result.kind == "applied":
        return _landed(refund, {"successful": True})
    if result.kind == "unknown":
        _note(refund, f"submit outcome unknown: {result.detail}")
        return WithdrawalRefund.objects.get(pk=refund.pk)
    reason = f"{result.tx_code} {' '.join(result.op_codes)}".strip()
    fate = _fate(refund)
    if fate.state == envelopes.LANDED:
        return _landed(refund, fate.transaction)
    if fate.state == envelopes.UNKNOWN:
        return _undecided(refund, fate, note=f"refused ({reason}); ")
    if fate.state == envelopes.DEAD and result.tx_code in ("tx_bad_seq", "tx_too_late"):
        refund = _rebuild(refund, reason=f"refused: {reason}; {fate.reason}")
        if refund.status == F.SUBMITTING:  # the sweep submits the new envelope
            _note(refund, f"refused ({reason}); a new envelope was stored")
    elif fate.state == envelopes.ALIVE and result.tx_code == "tx_bad_seq":
        _note(refund, f"refused ({reason}) but may still land: {fate.reason}")
    else:
        _set(refund, F.MANUAL_REVIEW, f"refused: {reason}")
    return WithdrawalRefund.objects.get(pk=refund.pk)


def _undecided(refund: WithdrawalRefund, fate: envelopes.Fate, *,
               note: str = "") -> WithdrawalRefund:
    """Horizon cannot prove where the envelope stands: wait for the next sweep, never
    rebuild; once overdue, a person decides with the evidence."""
    if envelopes.unknown_overdue(refund.max_time):
        _set(refund, F.MANUAL_REVIEW,
             f"{note}envelope fate unknown past max_time + "
             f"{settings.ENVELOPE_UNKNOWN_REVIEW_S:g}s: {fate.reason}; "
             f"evidence {fate.evidence}")
    else:
        _note(refund, f"{note}envelope fate unknown, waiting: {fate.reason}")
    return WithdrawalRefund.objects.get(pk=refund.pk)


def _landed(refund: WithdrawalRefund, found: dict) -> WithdrawalRefund:
    with transaction.atomic():
        if found.get("successful"):
            if WithdrawalRefund.transition(refund.pk, F.SUBMITTING, F.SUBMITTED,
                                           where=Q(tx_hash=refund.tx_hash), last_error=""):
                books.refund_landed(refund)  # rule 6, with the landing
        else:
            _set(refund, F.MANUAL_REVIEW, "included in a ledger but failed")
        stellar.free_channel(address=refund.source_account,
                             holder=holder(refund.transaction_id))
    return WithdrawalRefund.objects.get(pk=refund.pk)


def _rebuild(refund: WithdrawalRefund, *, reason: str) -> WithdrawalRefund:
    """Replace a provably dead envelope: new sequence, bounds and hash; one commit.
    After RELEASE_MAX_ATTEMPTS envelopes the refund goes to manual_review instead."""
    name = holder(refund.transaction_id)
    with transaction.atomic():
        current = WithdrawalRefund.objects.select_for_update().get(pk=refund.pk)
        if current.tx_hash != refund.tx_hash or current.status != F.SUBMITTING:
            return current
        stellar.forget_sequence(address=current.source_account, holder=name)
        if current.attempts >= settings.RELEASE_MAX_ATTEMPTS:
            WithdrawalRefund.transition(
                current.pk, F.SUBMITTING, F.MANUAL_REVIEW, require=True,
                last_error=f"attempts exhausted ({current.attempts}); last: {reason}"[:2000])
            current.refresh_from_db()
            return current
        prepared = stellar.prepare_payment(
            holder=name, destination=current.destination, amount=current.amount,
            memo_type=current.memo_type, memo=current.memo, resync=True)
        for field_name, value in prepared.items():
            setattr(current, field_name, value)
        current.attempts += 1
        current.last_error = f"stored envelope was dead ({reason}); rebuilt"[:2000]
        # Not a status change (it stays submitting): every field but ``status``.
        current.save(update_fields=[*prepared, "attempts", "last_error", "updated_at"])
        log.info("refund %s rebuilt (attempt %s): %s", current.transaction_id,
                 current.attempts, reason)
        return current


def _amount_text(amount: Decimal) -> str:
    """A Decimal as AP wants it: plain, no trailing zeros (``9.5``, ``10``)."""
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _notify(refund: WithdrawalRefund) -> WithdrawalRefund:
    """AP ``notify_refund_sent`` (refund id = the hash, amount in the amount_in asset,
    fee 0): total refunded = amount_in -> ``refunded`` (AP NOTES §1.5). Not idempotent
    in AP: on -32600 re-read, done if our refund id is there."""
    if refund.receipt_id is not None:
        # An unconsumed receipt's refund: no AP transaction holds this USDC, so the
        # payment on chain is the end (the receipt leaves the queue, settled).
        with transaction.atomic():
            WithdrawalRefund.transition(refund.pk, F.SUBMITTED, F.COMPLETED, last_error="")
            StellarReceipt.objects.filter(pk=refund.receipt_id, settled_at__isnull=True
                                          ).update(settled_at=timezone.now())
        return WithdrawalRefund.objects.get(pk=refund.pk)
    if refund.request is not None and refund.request.kind == WithdrawalRequest.Kind.RECEIVE:
        return _notify_receive(refund)
    asset = f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
    tx_hash = refund.tx_hash
    reached = _recorded(tx_hash)

    try:
        platform.rpc_once("notify_refund_sent", {
            "transaction_id": refund.transaction_id,
            "refund": {"id": tx_hash, "amount": {"amount": _amount_text(refund.amount),
                                                 "asset": asset},
                       "amount_fee": {"amount": "0", "asset": asset}}}, reached=reached)
    except platform.RpcError as exc:
        if exc.code == platform.INTERNAL_ERROR:
            return _ap_busy(refund, exc)
        _set(refund, F.MANUAL_REVIEW,
             f"the USDC is back on chain but AP refused notify_refund_sent: {exc}")
        return WithdrawalRefund.objects.get(pk=refund.pk)
    WithdrawalRefund.transition(refund.pk, F.SUBMITTED, F.COMPLETED, last_error="")
    return WithdrawalRefund.objects.get(pk=refund.pk)


def _ap_busy(refund: WithdrawalRefund, exc: platform.RpcError) -> WithdrawalRefund:
    """AP answered -32603 (its optimistic lock, "modified by another request", NOTES
    §1.6: re-read and retry; or a failing database): not a refusal. The refund stays
    ``submitted`` with the reason and the sweep tells AP again (each drive re-reads
    AP first); read as a refusal, it went to manual_review, where nothing drives it,
    with AP left in pending_anchor for a refund already on chain."""
    _note(refund, f"AP not told yet: {exc}")
    return WithdrawalRefund.objects.get(pk=refund.pk)


def _recorded(tx_hash: str):
    """``reached`` of ``notify_refund_sent``: AP's refunds name our Stellar hash."""
    def reached(tx: dict) -> bool:
        payments = (tx.get("refunds") or {}).get("payments") or []
        return any(p.get("id") == tx_hash for p in payments)

    return reached


def _notify_receive(refund: WithdrawalRefund) -> WithdrawalRefund:
    """A SEP-31 receive's refund, on chain already, recorded in AP (SEP31-RECEIVE.md
    §3.2, §3.3, §4 step 4). AP takes ``notify_refund_sent`` only from
    ``pending_receiver`` and only one, so from ``pending_external`` or
    ``pending_customer_info_update`` it goes ``notify_transaction_error`` -> ``error``,
    then ``notify_transaction_recovery`` (funds received) -> ``pending_receiver``, then
    the refund: amount = ``amount_in`` in its asset, fee 0 in the fee asset -> ``refunded``.
    A refund short of ``amount_in`` (the sender paid short) would leave AP in the
    ``pending_anchor`` dead end (§3.3), so AP gets ``notify_transaction_error`` naming the
    refund instead; one above it (an overpayment, all sent back) is recorded as
    ``amount_in`` (AP refuses more). ``completed`` (the bank reversed a payout AP was
    told of): no RPC leaves it; the refund is recorded here and in the audit rows. Each
    step re-reads AP, so a drive cut between two calls goes on from where AP stands."""
    tx_hash = refund.tx_hash
    reached = _recorded(tx_hash)
    ap_tx = platform.get_transaction(refund.transaction_id) or {}
    status = ap_tx.get("status")
    if reached(ap_tx):
        return _done(refund, "")
    if status == "completed":
        return _done(refund, "AP shows the remittance completed and no RPC leaves it: the "
                             "refund is recorded here and in the audit rows only")
    if status == "refunded":
        _set(refund, F.MANUAL_REVIEW, "the USDC is back on chain but AP shows the remittance "
                                      "refunded by another refund: compare them")
        return WithdrawalRefund.objects.get(pk=refund.pk)
    amount_in = ap_tx.get("amount_in") or {}
    due = Decimal(amount_in.get("amount") or "0")
    asset = amount_in.get("asset") or \
        f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
    fee_asset = (ap_tx.get("fee_details") or {}).get("asset") or asset
    sent = f"{_amount_text(refund.amount)} USDC sent back on Stellar in {tx_hash}"
    tid = refund.transaction_id
    try:
        if status == "pending_sender":
            # AP's observer missed what our receipts hold: tell it (amount_in = what
            # arrived, the first receipt's hash), or no refund can be recorded.
            first = StellarReceipt.objects.filter(transaction_id=tid).order_by(
                "paging_token").first()
            if first is None:
                _set(refund, F.MANUAL_REVIEW, "AP never saw the USDC and no receipt of it is "
                                              "kept: record the refund in AP by hand")
                return WithdrawalRefund.objects.get(pk=refund.pk)
            ap_tx = platform.rpc_once("notify_onchain_funds_received", {
                "transaction_id": tid, "stellar_transaction_id": first.tx_hash,
                "amount_in": {"amount": _amount_text(refund.amount)}},
                reached=lambda tx: tx.get("status") != "pending_sender")
            status = ap_tx.get("status")
            due = Decimal((ap_tx.get("amount_in") or {}).get("amount") or "0")
        if refund.amount < due:
            if status not in ("error", "expired"):
                platform.rpc_once("notify_transaction_error", {
                    "transaction_id": tid,
                    "message": f"refunded what arrived: {sent} (of {_amount_text(due)})"},
                    reached=lambda tx: tx.get("status") in ("error", "expired"))
            return _done(refund, f"AP takes only a full refund: {sent} of "
                                 f"{_amount_text(due)}; AP shows error with that message")
        if status != "pending_receiver":
            if status not in ("error", "expired"):
                platform.rpc_once("notify_transaction_error", {
                    "transaction_id": tid, "message": f"the payout failed: {sent}"},
                    reached=lambda tx: tx.get("status") in ("error", "expired"))
            platform.rpc_once("notify_transaction_recovery", {
                "transaction_id": tid, "message": "recording the refund"},
                reached=lambda tx: tx.get("status") == "pending_receiver")
        platform.rpc_once("notify_refund_sent", {
            "transaction_id": tid,
            "refund": {"id": tx_hash, "amount": {"amount": _amount_text(due), "asset": asset},
                       "amount_fee": {"amount": "0", "asset": fee_asset}}}, reached=reached)
    except platform.RpcError as exc:
        if exc.code == platform.INTERNAL_ERROR:
            return _ap_busy(refund, exc)
        _set(refund, F.MANUAL_REVIEW,
             f"the USDC is back on chain but AP refused to record the refund: {exc}")
        return WithdrawalRefund.objects.get(pk=refund.pk)
    return _done(refund, "" if refund.amount == due else
                 f"AP records {_amount_text(due)} USDC (amount_in) of the {sent}")


def _done(refund: WithdrawalRefund, note: str) -> WithdrawalRefund:
    WithdrawalRefund.transition(refund.pk, F.SUBMITTED, F.COMPLETED, last_error=note[:2000])
    return WithdrawalRefund.objects.get(pk=refund.pk)


def _set(refund: WithdrawalRefund, status: str, error: str) -> bool:
    """Move an open refund to ``status`` from whichever open status may reach it; a
    refund that moved on meanwhile (completed, or in review already) is left alone."""
    sources = tuple(s for s in OPEN if status in WithdrawalRefund.TRANSITIONS[s])
    return WithdrawalRefund.transition(refund.pk, sources, status, last_error=error[:2000])


def _note(refund: WithdrawalRefund, error: str) -> None:
    WithdrawalRefund.note(refund.pk, error)
