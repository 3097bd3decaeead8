"""Celery tasks for withdrawals: thin, id-based, safe to run twice."""

import logging

from celery import shared_task

from common.sweeps import Sweep
from payouts import guard, poller, refunds
from payouts.models import WithdrawalPayout

log = logging.getLogger(__name__)


@shared_task(base=Sweep)
def poll_withdrawals() -> dict:
    return poller.poll_withdrawals()


@shared_task
def payout_complete_ap(payout_id: int) -> None:
    payout = WithdrawalPayout.objects.get(pk=payout_id)
    if payout.status == WithdrawalPayout.Status.COMPLETED and payout.ap_completed_at is None:
        guard.payout_complete_ap(payout=payout)


@shared_task(base=Sweep)
def sweep_refunds() -> dict:
    return refunds.refund_sweep()


@shared_task
def receive_process(transaction_id: str) -> str:
    """A SEP-31 transaction AP told us about: re-read it and decide or pay
    (payouts/poller.py ``receive_process``; the poller does the same every pass)."""
    from anchor import platform
    from payouts import poller

    ap_tx = platform.get_transaction(transaction_id)
    if ap_tx is None or ap_tx.get("kind") != "receive":
        return "not_ours"
    return poller.receive_process(ap_tx=ap_tx)


@shared_task
def receive_customer_updated() -> dict:
    """A customer changed (AP's ``customer_updated``): decide again the SEP-31
    transactions waiting for customer information."""
    from anchor import platform
    from payouts import poller

    counts: dict[str, int] = {}
    for ap_tx in platform.list_transactions(statuses=["pending_customer_info_update"],
                                            kind="receive", sep="31"):
        # One refusal must not leave the others waiting; the poller decides it again.
        try:
            outcome = poller.receive_process(ap_tx=ap_tx)
        except Exception:  # noqa: BLE001 - logged, retried by the poller's next pass
            log.warning("SEP-31 %s: not decided", ap_tx.get("id"), exc_info=True)
            outcome = "error"
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts
