"""Periodic recovery for deposits (Celery beat; DESIGN.md §4 "Reconciler" and "Also on
beat"). Each pass is idempotent and safe to run concurrently with the workers.

- ``reconcile_releases``: open releases older than RECONCILER_AGE_S are re-driven
  (chain check first). Cost grows with the stuck rows (partial index), not the table.
- ``sweep_ap_deposits``: AP deposits in ``pending_anchor`` without a release (events
  can be lost) and in ``pending_trust`` whose trustline now exists.
- ``reconcile_orders``: open Razorpay orders whose payment webhook never came.
- ``expire_abandoned``: ``notify_transaction_expired`` for deposits nobody paid within
  DEPOSIT_EXPIRY_S (AP expires nothing itself, NOTES §4.4 item 6).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from anchor import deposits, platform, releases, stellar
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositPayment, DepositRelease

log = logging.getLogger(__name__)
BATCH = 200


def reconcile_releases() -> dict[str, int]:
    """Re-drive stuck releases; returns counts by resulting status."""
    cutoff = timezone.now() - timedelta(seconds=settings.RECONCILER_AGE_S)
    stuck = DepositRelease.objects.filter(
        status__in=DepositRelease.OPEN_STATUSES, updated_at__lt=cutoff
    ).order_by("updated_at").values_list("pk", flat=True)[:BATCH]
    counts: dict[str, int] = {}
    for release_id in list(stuck):
        release = releases.release_drive(release_id=release_id, redrive=True)
        counts[release.status] = counts.get(release.status, 0) + 1
    return counts


def sweep_ap_deposits() -> dict[str, int]:
    """Start releases AP is waiting for, and finish trustline waits."""
    counts = {"started": 0, "trust_set": 0, "skipped": 0}
    for tx in platform.list_transactions(statuses=["pending_anchor", "pending_trust"],
                                         kind="deposit"):
        transaction_id = tx["id"]
        if DepositRelease.objects.filter(transaction_id=transaction_id).exists():
            continue
        if not DepositPayment.objects.filter(transaction_id=transaction_id).exists():
            counts["skipped"] += 1  # AP's status alone never releases anything
            continue
        try:
            if tx["status"] == "pending_trust":
                if not _trust_ready(tx):
                    continue
                counts["trust_set"] += 1
            if releases.release_start(transaction_id=transaction_id) is not None:
                counts["started"] += 1
        except (releases.ReleaseRefused, platform.PlatformError, platform.RpcError,
                stellar.HorizonUnavailable, stellar.NoChannelFree) as exc:
            log.warning("sweep: %s not started: %s", transaction_id, exc)
    return counts


def _trust_ready(tx: dict) -> bool:
    """pending_trust -> pending_anchor once the destination trusts USDC
    (``notify_trust_set``, AP 4.2+: always to pending_anchor, NOTES §1.5)."""
    destination = tx.get("destination_account") or ""
    if stellar.has_trustline(destination, stellar.usdc()):
        platform.rpc_once("notify_trust_set", {"transaction_id": tx["id"], "success": True},
                          reached=lambda t: t["status"] == "pending_anchor")
        return True
    return False


def reconcile_orders() -> dict[str, int]:
    """Ask Razorpay about open orders older than ORDER_RECONCILER_AGE_S."""
    cutoff = timezone.now() - timedelta(seconds=settings.ORDER_RECONCILER_AGE_S)
    counts: dict[str, int] = {}
    open_orders = DepositOrder.objects.filter(
        status=DepositOrder.Status.AWAITING_PAYMENT, created_at__lt=cutoff
    ).order_by("created_at")[:BATCH]
    for order in open_orders:
        try:
            payments = rzp.order_payments(order.order_id)
        except rzp.RazorpayError as exc:
            log.warning("order reconciler: %s: %s", order.order_id, exc)
            continue
        for payment in payments:
            if payment.get("status") == "captured":
                outcome = deposits.payment_record(payment=payment)
                counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def expire_abandoned() -> int:
    """Expire deposits still unpaid after DEPOSIT_EXPIRY_S (only before funds
    arrive: AP refuses notify_transaction_expired afterwards, NOTES §1.6)."""
    cutoff = timezone.now() - timedelta(seconds=settings.DEPOSIT_EXPIRY_S)
    expired = 0
    for order in DepositOrder.objects.filter(
            status=DepositOrder.Status.AWAITING_PAYMENT, created_at__lt=cutoff)[:BATCH]:
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
        expired += 1
    return expired
