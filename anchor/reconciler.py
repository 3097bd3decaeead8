"""Periodic recovery for deposits (Celery beat; DESIGN.md §4 "Reconciler" and "Also on
beat"). Each pass is idempotent and safe to run concurrently with the workers.

- ``reconcile_releases``: open releases older than RECONCILER_AGE_S are re-driven
  (chain check first). Cost grows with the stuck rows (partial index), not the table.
- ``sweep_ap_deposits``: AP deposits in ``pending_anchor`` without a release (events
  can be lost) and in ``pending_trust`` whose trustline now exists.
- ``reconcile_orders``: open Razorpay orders whose payment webhook never came, and
  recorded payments not yet confirmed with Razorpay (its API was down, or the task
  gave up): confirmed now, then AP is told and the release starts.
- ``sweep_unnotified``: confirmed payments AP was never told about (the task died on
  a -32603, AP was down past its retries, the broker lost it): re-notified, with
  backoff and without end, and raised in the review queue after AP_NOTIFY_REVIEW_S.
  A payment AP refuses because it already expired the deposit is refunded instead
  (anchor/refunds.py ``refund_if_ap_expired``); a payment being refunded is skipped.
- ``expire_abandoned``: ``notify_transaction_expired`` for deposits nobody paid within
  DEPOSIT_EXPIRY_S (AP expires nothing itself, NOTES §4.4 item 6).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from anchor import callbacks, deposits, limits, platform, refunds, releases, stellar
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositPayment, DepositRefund, DepositRelease

log = logging.getLogger(__name__)
BATCH = 200


def stuck_releases():
    """The reconciler's query: ids of open releases untouched for RECONCILER_AGE_S,
    oldest first, at most BATCH (``deposit_releases_open_idx``; corridor/periodic.py)."""
    cutoff = timezone.now() - timedelta(seconds=settings.RECONCILER_AGE_S)
    return DepositRelease.objects.filter(
        status__in=DepositRelease.OPEN_STATUSES, updated_at__lt=cutoff
    ).order_by("updated_at").values_list("pk", flat=True)[:BATCH]


def reconcile_releases() -> dict[str, int]:
    """Re-drive stuck releases, and rebuild releases and deposit refunds a failover
    lost; returns counts by resulting status (``rebuilt`` / ``refund_rebuilt`` for the
    latter)."""
    counts: dict[str, int] = {}
    for release_id in list(stuck_releases()):
        release = releases.release_drive(release_id=release_id, redrive=True)
        releases.follow_later(release)  # async mode: restart a lost or stopped chain
        counts[release.status] = counts.get(release.status, 0) + 1
    for release in list(releases.unknown_fate_reviews()):
        try:
            if releases.resume_landed_review(release) is not None:
                counts["review_landed"] = counts.get("review_landed", 0) + 1
        except stellar.HorizonUnavailable as exc:
            log.warning("review of %s not resumed: %s", release.transaction_id, exc)
    for transaction_id in list(unreleased_payments()):
        try:
            if releases.release_rebuild(transaction_id=transaction_id) is not None:
                counts["rebuilt"] = counts.get("rebuilt", 0) + 1
            elif refunds.refund_rebuild(transaction_id=transaction_id) is not None:
                counts["refund_rebuilt"] = counts.get("refund_rebuilt", 0) + 1
        except (platform.PlatformError, stellar.HorizonUnavailable, rzp.RazorpayError) as exc:
            log.warning("rebuild: %s not rebuilt: %s", transaction_id, exc)
    return counts


def unreleased_payments(limit: int = 50):
    """Confirmed payments AP was told about RECONCILER_AGE_S ago with no release claimed
    (the ``confirmed_not_released`` kind of corridor/stranded.py, on its index): after a
    failover that lost a release row while AP completed it, the only trace left is AP's
    hash and the chain (``releases.release_rebuild``); after one that lost a deposit
    refund's row, Razorpay's refund under our receipt (``refunds.refund_rebuild``).
    Oldest first, at most ``limit``."""
    since = timezone.now() - timedelta(seconds=settings.RECONCILER_AGE_S)
    return (DepositPayment.objects.filter(
        confirmation=DepositPayment.Confirmation.CONFIRMED, ap_notified_at__isnull=False,
        release_claimed_at__isnull=True, ap_notified_at__lt=since)
        .exclude(transaction_id__in=DepositRefund.objects.values("transaction_id"))
        .order_by("ap_notified_at").values_list("transaction_id", flat=True)[:limit])


def sweep_ap_deposits() -> dict[str, int]:
    """Start releases AP is waiting for, and finish trustline waits."""
    counts = {"started": 0, "trust_set": 0, "skipped": 0}
    for tx in platform.list_transactions(statuses=["pending_anchor", "pending_trust"],
                                         kind="deposit"):
        transaction_id = tx["id"]
        if release_of(transaction_id).exists():
            continue
        if not live_payment_of(transaction_id).exists():
            counts["skipped"] += 1  # AP's status alone never releases anything
            continue
        try:
            if tx["status"] == "pending_trust":
                if not _trust_ready(tx):
                    continue
                counts["trust_set"] += 1
            if releases.release_start(transaction_id=transaction_id) is not None:
                counts["started"] += 1
        except (releases.ReleaseRefused, deposits.PaymentUnconfirmed, platform.PlatformError,
                platform.RpcError, stellar.HorizonUnavailable, stellar.NoChannelFree) as exc:
            log.warning("sweep: %s not started: %s", transaction_id, exc)
    return counts


def release_of(transaction_id: str):
    """The release of one AP deposit (a unique-key lookup of the AP sweep)."""
    return DepositRelease.objects.filter(transaction_id=transaction_id)


def live_payment_of(transaction_id: str):
    """The live (not rejected) payment of one AP deposit (the AP sweep's lookup,
    ``deposit_payments_transaction_live``)."""
    return DepositPayment.objects.live().filter(transaction_id=transaction_id)


def _trust_ready(tx: dict) -> bool:
    """pending_trust -> pending_anchor once the destination trusts USDC
    (``notify_trust_set``, AP 4.2+: always to pending_anchor, NOTES §1.5)."""
    destination = tx.get("destination_account") or ""
    if stellar.has_trustline(destination, stellar.usdc()):
        releases.notify_trust_set(tx["id"])
        return True
    return False


def reconcile_orders() -> dict[str, int]:
    """Confirm the payments recorded (by a webhook or here) more than
    ORDER_RECONCILER_AGE_S ago that are still unconfirmed, and drive each confirmed
    one on (AP notify, release); then ask Razorpay about open orders older than
    ORDER_RECONCILER_AGE_S and record their captured payments (a forged claim
    rejected first frees its order for the real payment in the same pass). Returns
    counts by outcome: confirmed | rejected | unconfirmed | refund_claimed (INR captured
    after AP expired the deposit), plus ``payment_record``'s."""
    counts: dict[str, int] = {}
    counts.update(rebuild_lost_orders())
    open_orders = stale_orders()
    recordable = ("captured", "refunded") if settings.DEPOSIT_REFUNDED_PAYMENT_RECORD \
        else ("captured",)
    for transaction_id in list(unconfirmed_payments()):
        outcome = _confirm_and_drive(transaction_id)
        counts[outcome] = counts.get(outcome, 0) + 1
    for order in open_orders:
        try:
            payments = rzp.order_payments(order.order_id)
        except rzp.RazorpayError as exc:
            log.warning("order reconciler: %s: %s", order.order_id, exc)
            continue
        for payment in payments:
            # "refunded" too: a payment we refunded whose row, refund row and the order's
            # paid mark a failover lost (20-seed loaded campaign at 6756f1d, seed 8): Razorpay
            # shows it refunded, never captured again; recorded, its confirmation finds
            # our refund (deposits.PaymentRefunded) and the refund is rebuilt and booked.
            # One refunded by anyone else is recorded and then rejected.
            if payment.get("status") in recordable:
                try:
                    callbacks.check_payment(payment)
                except callbacks.MalformedEvent as exc:
                    # Never stored (a column would refuse it): the operators see it in
                    # the log; the order stays open for a payment that fits.
                    log.error("order reconciler: %s: payment not storable: %s",
                              order.order_id, exc)
                    counts["malformed"] = counts.get("malformed", 0) + 1
                    continue
                outcome = deposits.payment_record(payment=payment, from_reconciler=True)
                counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def rebuild_lost_orders() -> dict[str, int]:
    """AP deposits that took our ``request_offchain_funds`` with no order in Corridor: a
    failover lost it (issue 25 §2), and with it, perhaps, the payment and the release.
    Listed from AP: the live ones (``pending_user_transfer_start``, and
    ``pending_anchor`` / ``pending_trust``, whose INR AP was told of: the AP sweep
    releases nothing without a payment row), those AP expired in the last
    DEPOSIT_ORDER_REBUILD_EXPIRED_S (the customer can still pay the order at Razorpay:
    that INR must be found and refunded), and those AP completed in the last
    DEPOSIT_ORDER_REBUILD_COMPLETED_S (the USDC left: its booking must be rebuilt). Each
    is rebuilt from Razorpay and AP (``deposits.order_rebuild``); the order pass then
    records the payment the customer made to it, and the release is found on chain
    (``releases.release_claim`` / ``release_rebuild``) or the INR refunded (expired).
    Returns ``{"order_rebuilt": n}`` when any was."""
    if not settings.DEPOSIT_ORDER_REBUILD:
        return {}
    now = timezone.now()
    waiting = platform.list_transactions(
        statuses=["pending_user_transfer_start", "pending_anchor", "pending_trust"],
        kind="deposit")
    waiting += platform.list_transactions(
        statuses=["expired"], kind="deposit", started_after=now - timedelta(
            seconds=settings.DEPOSIT_ORDER_REBUILD_EXPIRED_S))
    waiting += platform.list_transactions(
        statuses=["completed"], kind="deposit", started_after=now - timedelta(
            seconds=settings.DEPOSIT_ORDER_REBUILD_COMPLETED_S))
    known = set(DepositOrder.objects.filter(
        transaction_id__in=[tx["id"] for tx in waiting]).values_list("transaction_id",
                                                                     flat=True))
    rebuilt = 0
    for tx in waiting:
        if tx["id"] in known:
            continue
        try:
            rebuilt += deposits.order_rebuild(ap_tx=tx) is not None
        except rzp.RazorpayError as exc:
            log.warning("order reconciler: %s not rebuilt: %s", tx["id"], exc)
    return {"order_rebuilt": rebuilt} if rebuilt else {}


def stale_orders():
    """The order reconciler's orders: open (``awaiting_payment``) for more than
    ORDER_RECONCILER_AGE_S, oldest first, at most BATCH (``deposit_orders_open_idx``)."""
    cutoff = timezone.now() - timedelta(seconds=settings.ORDER_RECONCILER_AGE_S)
    return DepositOrder.objects.filter(
        status=DepositOrder.Status.AWAITING_PAYMENT, created_at__lt=cutoff
    ).order_by("created_at")[:BATCH]


def unconfirmed_payments():
    """The order reconciler's payments: recorded more than ORDER_RECONCILER_AGE_S ago
    and still unconfirmed, oldest first, at most BATCH (``deposit_payments_unconf_idx``)."""
    cutoff = timezone.now() - timedelta(seconds=settings.ORDER_RECONCILER_AGE_S)
    return DepositPayment.objects.filter(
        confirmation=DepositPayment.Confirmation.UNCONFIRMED, created_at__lt=cutoff
    ).order_by("created_at").values_list("transaction_id", flat=True)[:BATCH]


def _confirm_and_drive(transaction_id: str) -> str:
    try:
        deposits.payment_confirm(transaction_id=transaction_id)
    except deposits.PaymentRefunded:
        # our own refund, whose row a failover lost: rebuilt from Razorpay and booked
        try:
            rebuilt = refunds.refund_rebuild(transaction_id=transaction_id)
        except rzp.RazorpayError as exc:
            log.warning("order reconciler: %s refund not rebuilt yet: %s", transaction_id, exc)
            rebuilt = None
        return "refund_rebuilt" if rebuilt is not None else "refunded"
    except deposits.PaymentRejected:
        return "rejected"
    except deposits.PaymentUnconfirmed:
        return "unconfirmed"
    try:
        deposits.funds_received(transaction_id=transaction_id)
    except platform.RpcError as exc:
        # INR captured after AP expired the deposit (a rebuilt order's, too): refunded
        # now, as the task does (anchor/tasks.py); any other refusal is the notify sweep's.
        if refunds.refund_if_ap_expired(transaction_id=transaction_id) is not None:
            return "refund_claimed"
        log.warning("order reconciler: %s confirmed, not released yet: %s",
                    transaction_id, exc)
    except (releases.ReleaseRefused, deposits.PaymentRejected, deposits.PaymentUnconfirmed,
            platform.PlatformError, stellar.HorizonUnavailable,
            stellar.NoChannelFree) as exc:
        log.warning("order reconciler: %s confirmed, not released yet: %s",
                    transaction_id, exc)
    return "confirmed"


def unnotified_payments():
    """Confirmed payments (captured INR Corridor itself confirmed with Razorpay) for
    which ``notify_offchain_funds_received`` never succeeded: the query of the notify
    sweeper and of ``corridor.stranded``, served by ``deposit_payments_unnot_idx``."""
    return DepositPayment.objects.filter(confirmation=DepositPayment.Confirmation.CONFIRMED,
                                         ap_notified_at__isnull=True)


def notify_backoff_s(attempts: int) -> float:
    """Seconds before the sweeper's next try after ``attempts`` failed ones: doubling
    from AP_NOTIFY_SWEEP_AGE_S, capped at AP_NOTIFY_BACKOFF_MAX_S (never infinite)."""
    base = max(settings.AP_NOTIFY_SWEEP_AGE_S, 0.1)
    return min(base * 2 ** max(attempts - 1, 0), settings.AP_NOTIFY_BACKOFF_MAX_S)


def sweep_unnotified() -> dict[str, int]:
    """Re-drive every confirmed payment AP was not told about for AP_NOTIFY_SWEEP_AGE_S
    (``deposits.funds_received``: AP pending_user_transfer_start -> pending_anchor, then
    the release as usual; a repeat is harmless, ``rpc_once``). Nothing gives up: a
    refusal (-32603, AP down, ...) is stored in ``notify_error`` and the payment is
    tried again after ``notify_backoff_s``; once it was confirmed AP_NOTIFY_REVIEW_S
    ago and AP still refuses, ``notify_review_at`` puts it in the operators' queue
    (kind ``notify``) while the retries go on. Returns counts: notified | refused |
    raised (raised to the queue this pass). Off with STRANDED_SWEEPERS=False."""
    counts = {"notified": 0, "refused": 0, "raised": 0}
    if not settings.STRANDED_SWEEPERS:
        return counts
    for pk, transaction_id in list(due_unnotified()):
        if DepositRefund.objects.filter(transaction_id=transaction_id).exists():
            continue  # its INR is going back (anchor/refunds.py): AP is told there
        try:
            deposits.funds_received(transaction_id=transaction_id)
        except (releases.ReleaseRefused, stellar.HorizonUnavailable,
                stellar.NoChannelFree) as exc:
            # AP was told (ap_notified_at is set): the release's own sweeps own it now.
            log.warning("notify sweep: %s notified, release not started: %s",
                        transaction_id, exc)
        except (deposits.PaymentRejected, deposits.PaymentUnconfirmed, platform.PlatformError,
                platform.RpcError) as exc:
            counts["refused"] += 1
            counts["raised"] += _notify_refused(pk, transaction_id, exc)
            continue
        counts["notified"] += 1
    return counts


def due_unnotified():
    """The notify sweeper's query: (pk, transaction_id) of unnotified payments confirmed
    more than AP_NOTIFY_SWEEP_AGE_S ago whose backoff ran out, oldest first, at most
    BATCH (``deposit_payments_unnot_idx``)."""
    now = timezone.now()
    return (unnotified_payments()
            .filter(confirmed_at__lt=now - timedelta(seconds=settings.AP_NOTIFY_SWEEP_AGE_S))
            .filter(Q(notify_next_at__isnull=True) | Q(notify_next_at__lte=now))
            .order_by("confirmed_at").values_list("pk", "transaction_id")[:BATCH])


# AP statuses from which ``notify_offchain_funds_received`` can never succeed.
AP_FINAL_STATUSES = frozenset({"expired", "error", "refunded", "completed", "no_market",
                               "too_small", "too_large"})


def _notify_refused(pk: int, transaction_id: str, exc: Exception) -> int:
    """Store AP's refusal and the next try; raise to the queue once overdue. Returns 1
    when this call raised it."""
    from django.db.models import F

    now = timezone.now()
    payment = DepositPayment.objects.get(pk=pk)
    attempts = payment.notify_attempts + 1
    error = f"{type(exc).__name__}: {exc}"[:2000]
    DepositPayment.objects.filter(pk=pk).update(
        notify_attempts=F("notify_attempts") + 1, notify_error=error,
        notify_next_at=now + timedelta(seconds=notify_backoff_s(attempts)))
    overdue = payment.confirmed_at is not None and \
        now - payment.confirmed_at > timedelta(seconds=settings.AP_NOTIFY_REVIEW_S)
    if not overdue and isinstance(exc, platform.RpcError):
        # AP refuses for good in a final status (INR captured after the deposit expired,
        # NOTES §1.6): no retry will move it, a person refunds the INR -- raised now.
        try:
            ap_status = (platform.get_transaction(transaction_id) or {}).get("status")
        except platform.PlatformError:
            ap_status = None
        if ap_status == "expired" and refunds.refund_if_ap_expired(
                transaction_id=transaction_id) is not None:
            # INR captured after AP expired the deposit: Corridor refunds it; the
            # refund (kind ``refund``) is what the operators see, not this notify.
            return 0
        overdue = ap_status in AP_FINAL_STATUSES
    raised = 0
    if overdue:
        raised = DepositPayment.objects.filter(pk=pk, notify_review_at__isnull=True,
                                               ap_notified_at__isnull=True
                                               ).update(notify_review_at=now)
        if raised:
            log.error("notify sweep: %s: AP refused notify_offchain_funds_received for "
                      "%ss or for good, raised to the review queue (still retrying): %s",
                      transaction_id, settings.AP_NOTIFY_REVIEW_S, error)
    log.warning("notify sweep: %s: attempt %s refused: %s", transaction_id, attempts, error)
    return raised


def expire_abandoned() -> int:
    """Expire deposits still unpaid after DEPOSIT_EXPIRY_S (only before funds
    arrive: AP refuses notify_transaction_expired afterwards, NOTES §1.6)."""
    expired = 0
    for order in expirable_orders():
        # A payment may have been captured without its webhook: ask first.
        try:
            if any(p.get("status") == "captured" for p in rzp.order_payments(order.order_id)):
                continue
        except rzp.RazorpayError:
            continue
        try:
            platform.rpc_once(
                "notify_transaction_expired",
                {"transaction_id": order.transaction_id,
                 "message": "No payment arrived in time; start a new deposit."},
                reached=lambda tx: tx["status"] == "expired")
        except platform.RpcError as exc:
            log.warning("expire %s refused: %s", order.transaction_id, exc)
            continue
        DepositOrder.objects.filter(pk=order.pk, status=DepositOrder.Status.AWAITING_PAYMENT
                                    ).update(status=DepositOrder.Status.EXPIRED)
        limits.release(order.transaction_id)  # no money moved: off the customer's limits
        expired += 1
    return expired


def expirable_orders():
    """Expiry's query: orders still ``awaiting_payment`` DEPOSIT_EXPIRY_S after their
    creation, at most BATCH (``deposit_orders_open_idx``)."""
    cutoff = timezone.now() - timedelta(seconds=settings.DEPOSIT_EXPIRY_S)
    return DepositOrder.objects.filter(
        status=DepositOrder.Status.AWAITING_PAYMENT, created_at__lt=cutoff)[:BATCH]
