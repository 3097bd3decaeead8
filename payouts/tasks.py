"""Celery tasks for withdrawals: thin, id-based, safe to run twice."""

from celery import shared_task

from payouts import guard, poller, refunds
from payouts.models import WithdrawalPayout


@shared_task
def poll_withdrawals() -> dict:
    return poller.poll_withdrawals()


@shared_task
def payout_complete_ap(payout_id: int) -> None:
    payout = WithdrawalPayout.objects.get(pk=payout_id)
    if payout.status == WithdrawalPayout.Status.COMPLETED and payout.ap_completed_at is None:
        guard.payout_complete_ap(payout=payout)


@shared_task
def sweep_refunds() -> dict:
    return refunds.refund_sweep()
