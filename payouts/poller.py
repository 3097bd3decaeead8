"""The withdrawal poller (Celery beat; DESIGN.md §5 step 1).

Each pass: read new USDC receipts from Horizon (payouts/receipts.py), then page AP's
withdrawals in ``pending_user_transfer_start``, ``pending_anchor`` and
``pending_external`` (AP's observer misses and silently mis-records payments, NOTES
§4.4, §6 faults 4-6, 13, 18, 20), verify each receipt ourselves, tell AP what its
observer missed, and hand verified withdrawals to the guard. Rows of ours still open
(a payout ``processing``, a completed payout AP has not heard of) are resumed too, so
a stale AP status never decides anything. Last, every USDC receipt is accounted for
(``receipts.classify_receipts``): consumed by a payout, or raised for a refund.

Rows a failover lost with its last commits (issue 25 §2) are rebuilt from AP and
RazorpayX on the way: a request AP took (``withdrawals.request_rebuild``; AP
``refunded`` ones too, for the refund sweep), and a payout AP shows started
(``pending_external``, or ``completed`` within WITHDRAWAL_REBUILD_WINDOW_S:
``rebuild_completed``) from RazorpayX's payout under its reference
(``guard.payout_rebuild``), never paid again.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import platform, stellar
from anchor import razorpay as rzp
from payouts import books, guard, operations, receipts, receive, withdrawals
from payouts.models import PAYOUT_POLL_OPEN, WithdrawalPayout, WithdrawalRequest
from payouts.providers.base import ProviderError

log = logging.getLogger(__name__)
AP_STATUSES = ["pending_user_transfer_start", "pending_anchor", "pending_external"]


def poll_withdrawals() -> dict[str, int]:
    """One pass; returns counts by outcome."""
    counts: dict[str, int] = {}

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    receipts.scan()
    seen = set()
    for ap_tx in platform.list_transactions(statuses=AP_STATUSES, kind="withdrawal"):
        seen.add(ap_tx["id"])
        with bound_contextvars(transaction_id=ap_tx["id"]):
            try:
                count(_refunded_if_failed_for_good(ap_tx, withdrawal_process(ap_tx=ap_tx)))
            except (platform.PlatformError, platform.RpcError, stellar.HorizonUnavailable) as exc:
                log.warning("withdrawal %s: %s", ap_tx["id"], exc)
                count("error")
    try:  # SEP-31: decided here, then paid as above; closed ones whose rows were lost
        received = receive.transactions() + receive.lost_closed_transactions()
    except platform.PlatformError as exc:
        log.warning("SEP-31 listing: %s", exc)
        received = []
    for ap_tx in received:
        seen.add(ap_tx["id"])
        with bound_contextvars(transaction_id=ap_tx["id"]):
            try:
                count(receive_process(ap_tx=ap_tx))
            except (platform.PlatformError, platform.RpcError, stellar.HorizonUnavailable,
                    rzp.RazorpayError, ProviderError) as exc:
                log.warning("SEP-31 %s: %s", ap_tx["id"], exc)
                count("error")
    for payout in open_payouts(seen=seen):
        guard.payout_resume(payout=payout)
        count("resumed")
    for outcome, n in rebuild_completed().items():
        counts[outcome] = counts.get(outcome, 0) + n
    for outcome, n in receipts.classify_receipts().items():
        if n:
            counts[f"receipts_{outcome}"] = n
    for receipt in receipts.late_for_expired_receives():  # late money goes back by itself
        if operations.late_receipt_refund(receipt_id=receipt.pk) is not None:
            count("late_refunded")
    return counts


def rebuild_completed() -> dict[str, int]:
    """AP withdrawals ``completed`` or ``refunded`` (so never in the poller's listing)
    and started within WITHDRAWAL_REBUILD_WINDOW_S with rows lost by a failover (issue
    25 §2). ``completed`` with no payout here: the payout row was lost after RazorpayX
    paid and AP was told, perhaps the request too; the request is rebuilt from AP and
    RazorpayX when missing (``withdrawals.request_rebuild``), then the payout from
    RazorpayX (``guard.payout_rebuild``). ``refunded`` with no request: the request is
    rebuilt in review, and the refund sweep rebuilds its refund from AP and the chain
    (otherwise its receipt is an "unknown memo" an operator could send back twice). One
    AP listing (newest first, stopping at the window), one query per kind of row it
    names, and RazorpayX reads only for the ones missing. Returns
    ``{"payout_rebuilt": n, "request_rebuilt": m}`` (the non-zero ones)."""
    if not settings.WITHDRAWAL_REQUEST_REBUILD:
        return {}
    since = timezone.now() - timedelta(seconds=settings.WITHDRAWAL_REBUILD_WINDOW_S)
    try:
        done = platform.list_transactions(statuses=["completed", "refunded"],
                                          kind="withdrawal", started_after=since)
    except platform.PlatformError as exc:  # the rest of the pass goes on; the next looks
        log.warning("rebuild: AP's completed withdrawals not listed: %s", exc)
        return {}
    ids = [tx["id"] for tx in done]
    paid = set(WithdrawalPayout.objects.filter(transaction_id__in=ids)
               .values_list("transaction_id", flat=True))
    requested = set(WithdrawalRequest.objects.filter(transaction_id__in=ids)
                    .values_list("transaction_id", flat=True))
    counts: dict[str, int] = {}
    for ap_tx in done:
        tid, refunded = ap_tx["id"], ap_tx.get("status") == "refunded"
        if tid in paid or (refunded and tid in requested):
            continue
        with bound_contextvars(transaction_id=tid):
            try:
                request = request_of(tid).first()
                if request is None:
                    request = withdrawals.request_rebuild(ap_tx=ap_tx)
                    if request is not None:
                        counts["request_rebuilt"] = counts.get("request_rebuilt", 0) + 1
                if request is not None and not refunded and \
                        guard.payout_rebuild(request=request, ap_tx=ap_tx) is not None:
                    counts["payout_rebuilt"] = counts.get("payout_rebuilt", 0) + 1
            except (rzp.RazorpayError, stellar.HorizonUnavailable) as exc:
                log.warning("withdrawal %s: not rebuilt: %s", tid, exc)
    return counts


def open_payouts(*, seen=()):
    """The poller's resume query: payouts of ours still open (``PAYOUT_POLL_OPEN``:
    ``processing``, or ``completed`` with AP not told) that this pass's AP listing did not
    cover (``seen``: AP transaction ids), least recently touched first, at most 200
    (``withdrawal_payouts_poll_idx``; corridor/periodic.py)."""
    return (WithdrawalPayout.objects.filter(PAYOUT_POLL_OPEN)
            .exclude(transaction_id__in=seen).order_by("updated_at")[:200])


def request_of(transaction_id: str):
    """The withdrawal request of one AP withdrawal (a unique-key lookup)."""
    return WithdrawalRequest.objects.filter(transaction_id=transaction_id)


def payout_of(transaction_id: str):
    """The payout of one AP withdrawal (a unique-key lookup)."""
    return WithdrawalPayout.objects.filter(transaction_id=transaction_id)


def receive_process(*, ap_tx: dict) -> str:
    """One SEP-31 transaction: decided (payouts/receive.py) until its funds were
    requested, then verified and paid like a withdrawal."""
    request = request_of(ap_tx["id"]).first()
    if request is None and receive.funds_asked(ap_tx):
        # AP took our funds request and we hold no row: a failover lost it (issue 25 §2).
        request = receive.receive_rebuild(ap_tx=ap_tx)
        if request is None:
            return "not_due"
    if request is not None and request.funds_requested_at is None:
        # AP's record of our funds request stands for the row's mark of it, lost with
        # its commit or its worker (chaos at 9f7ddba, seed 3: the sender's USDC sat
        # unpaid behind a decision that saw AP past asking, ``not_due``, every pass).
        receive.mark_funds_requested(request, ap_tx=ap_tx)
        request = request_of(ap_tx["id"]).first()
    if request is None or request.funds_requested_at is None or receive.unasked(ap_tx):
        # Also a row that says funds were asked for while AP says they were not: the
        # decision asks again (a transaction never waits for what it already has).
        return receive.decide(ap_tx=ap_tx)
    if receive.expire_if_due(request, ap_tx):
        return "expired"
    return _refunded_if_failed_for_good(ap_tx, withdrawal_process(ap_tx=ap_tx))


def _refunded_if_failed_for_good(ap_tx: dict, outcome: str) -> str:
    """After a pass left the transaction failed or in review: when its payout can never
    succeed (``receive.failed_for_good``), Corridor refunds the USDC itself."""
    if outcome not in ("payout_failed", "manual_review"):
        return outcome
    request = request_of(ap_tx["id"]).first()
    why = receive.failed_for_good(request) if request is not None else ""
    if why and operations.refund_for_good(request_id=request.pk, reason=why):
        return "refunding"
    return outcome


def withdrawal_process(*, ap_tx: dict) -> str:
    """Decide one AP withdrawal; returns the outcome."""
    with bound_contextvars(transaction_id=ap_tx["id"]):
        transaction_id = ap_tx["id"]
        request = request_of(transaction_id).first()
        if request is None and settings.WITHDRAWAL_REQUEST_REBUILD:
            try:  # a row a failover lost (issue 25 §2)
                request = withdrawals.request_rebuild(ap_tx=ap_tx)
            except rzp.RazorpayError as exc:
                log.warning("withdrawal %s: request not rebuilt: %s", transaction_id, exc)
        if request is None or request.funds_requested_at is None:
            return "not_ours"
        if settings.PAYOUT_GUARD:
            payout = payout_of(transaction_id).first()
            if payout is None and ap_tx.get("status") in ("pending_external", "completed"):
                # AP says a payout was started (or made) and we hold none: a lost commit.
                # Found at RazorpayX by reference; otherwise the claim below replays its
                # key (and AP completed with none at RazorpayX: payout_rebuild's review).
                try:
                    payout = guard.payout_rebuild(request=request, ap_tx=ap_tx)
                except rzp.RazorpayError as exc:
                    log.warning("withdrawal %s: payout not rebuilt: %s", transaction_id, exc)
                    return "error"
                if payout is not None:
                    return f"payout_{payout.status}"
                if ap_tx.get("status") == "completed":
                    # Paid by someone, never by a claim of ours now: the next pass looks
                    # again (the receipts rescanned), or a person (AP's confirmation).
                    return "completed_unrecorded"
            if payout is not None:
                guard.payout_resume(payout=payout)  # self-healing; never a second payout
                return f"payout_{payout.status}"
        if not settings.PAYOUT_GUARD and ap_tx.get("status") != "pending_anchor":
            # Test-only naive variant: AP's status alone decides whether to pay.
            payout = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
            if payout is not None:
                guard.payout_resume(payout=payout)
            return "not_due"
        if request.status == WithdrawalRequest.Status.MANUAL_REVIEW:
            return "manual_review"
        if request.status == WithdrawalRequest.Status.EXPIRED:
            return "expired"

        verdict = receipts.verify(request, ap_source=ap_tx.get("source_account") or
                                  request.source_account)
        if verdict.outcome == "review":
            _review(request, verdict.reason, verdict.evidence)
            return "manual_review"
        if verdict.outcome == "waiting":
            if verdict.first_at is None:
                return "waiting"
            WithdrawalRequest.objects.filter(pk=request.pk, first_receipt_at__isnull=True).update(
                first_receipt_at=verdict.first_at, received_amount=verdict.received,
                chain_evidence=verdict.evidence)
            grace = timedelta(seconds=settings.WITHDRAW_SHORT_GRACE_S)
            if timezone.now() - verdict.first_at > grace:
                _review(request, f"{verdict.reason}; grace period over", verdict.evidence)
                return "manual_review"
            return "short_waiting"

        if ap_tx["status"] == receive.ap_status_for(request, "pending_user_transfer_start"):
            # AP's observer missed it (or is down): tell AP ourselves.
            platform.rpc_once("notify_onchain_funds_received",
                              {"transaction_id": transaction_id,
                               "stellar_transaction_id": verdict.first_hash,
                               "amount_in": {"amount": format(verdict.received, "f")}},
                              reached=lambda tx: tx["status"] != ap_tx["status"])
        elif ap_tx["status"] == receive.ap_status_for(request, "pending_anchor") and \
                _ap_amount(ap_tx) != verdict.received:
            # AP's observer overwrote amount_in with one payment of several (NOTES §4.4).
            log.info("withdrawal %s: AP amount_in %s, chain %s", transaction_id,
                     _ap_amount(ap_tx), verdict.received)
        late = receive.late_for_quote(request, verdict.first_at)
        if late:
            _review(request, late, verdict.evidence)
            return "manual_review"
        with transaction.atomic():
            current = WithdrawalRequest.objects.select_for_update().get(pk=request.pk)
            if current.status in (WithdrawalRequest.Status.MANUAL_REVIEW,
                                  WithdrawalRequest.Status.EXPIRED):
                return "manual_review"  # a person took it (review, refund) since the read
            if current.status != WithdrawalRequest.Status.FUNDS_VERIFIED:
                # Rule 3, once, with the first verification; the row keeps what it
                # booked. A later pass that sees more USDC (a second payment before the
                # payout exists) changes neither: the reconciliation and a receipt's
                # refund read chain_evidence as "booked by rule 3" (chaos seed 7), and
                # the extra receipt is raised and sent back as one nobody booked.
                WithdrawalRequest.objects.filter(pk=request.pk).update(
                    status=WithdrawalRequest.Status.FUNDS_VERIFIED,
                    received_amount=verdict.received, chain_evidence=verdict.evidence,
                    review_reason=verdict.reason)
                books.received(request, verdict.received)
        payout = guard.payout_run(request=request)
        if payout is not None:
            return f"payout_{payout.status}"
        request.refresh_from_db()
        if request.status == WithdrawalRequest.Status.MANUAL_REVIEW:
            return "manual_review"  # the beneficiary was refused
        if not payout_of(transaction_id).exists():
            return "beneficiary_pending"
        return "claimed_elsewhere"


def _ap_amount(ap_tx: dict):
    from decimal import Decimal

    return Decimal((ap_tx.get("amount_in") or {}).get("amount") or "0")


def _review(request: WithdrawalRequest, reason: str, evidence: list[dict]) -> None:
    WithdrawalRequest.objects.filter(pk=request.pk).update(
        status=WithdrawalRequest.Status.MANUAL_REVIEW, review_reason=reason[:2000],
        chain_evidence=evidence, updated_at=timezone.now())
