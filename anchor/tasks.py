"""Celery tasks for deposits: thin, id-based, safe to run twice (STYLE.md)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from anchor import (
    deposits,
    inbox,
    platform,
    reconciler,
    refunds,
    releases,
    stellar,
    submissions,
)
from anchor import razorpay as rzp
from common.sweeps import Sweep

log = logging.getLogger(__name__)
RETRYABLE = (platform.PlatformError, stellar.HorizonUnavailable, stellar.NoChannelFree,
             deposits.PaymentUnconfirmed)


@shared_task(bind=True, max_retries=None)
def deposit_funds_received(self, transaction_id: str) -> None:
    """After a payment was recorded: confirm it with Razorpay, tell AP, then release.
    Retries transport errors (Razorpay unreachable included); the sweep and the order
    reconciler cover anything that still falls through."""
    try:
        deposits.funds_received(transaction_id=transaction_id)
    except deposits.PaymentRefunded:
        # Corridor's own refund whose row a failover lost: rebuilt from Razorpay (a
        # Razorpay error leaves it to the confirmed-payment sweeps: the rebuild below
        # in the reconciler, the notify sweep's refund of an expired deposit)
        try:
            refunds.refund_rebuild(transaction_id=transaction_id)
        except rzp.RazorpayError as exc:
            log.warning("deposit %s: refund not rebuilt yet: %s", transaction_id, exc)
    except (releases.ReleaseRefused, deposits.PaymentRejected) as exc:
        log.info("release of %s not started: %s", transaction_id, exc)
    except platform.RpcError:
        # INR captured after AP expired the deposit: AP refuses it for good, the INR
        # goes back (anchor/refunds.py); any other refusal is the notify sweeper's.
        if refunds.refund_if_ap_expired(transaction_id=transaction_id) is None:
            raise
    except RETRYABLE as exc:
        raise self.retry(exc=exc, countdown=settings.RELEASE_RETRY_DELAY_S,
                         max_retries=20) from exc


@shared_task(bind=True, max_retries=None)
def deposit_release(self, transaction_id: str) -> None:
    """Start (or find) the release of a deposit AP reports in pending_anchor."""
    try:
        releases.release_start(transaction_id=transaction_id)
    except releases.ReleaseRefused as exc:
        log.info("release of %s not started: %s", transaction_id, exc)
    except stellar.NoChannelFree as exc:
        if settings.STELLAR_SUBMIT_MODE != "async":
            raise self.retry(exc=exc, countdown=settings.RELEASE_RETRY_DELAY_S,
                             max_retries=20) from exc
        # The next freed channel wakes it (stellar.await_channel); this retry is the
        # fallback, CHANNEL_WAIT_RETRY_S apart (the AP sweep is the last one).
        stellar.await_channel(transaction_id)
        countdown = settings.CHANNEL_WAIT_RETRY_S or settings.RELEASE_RETRY_DELAY_S
        raise self.retry(exc=exc, countdown=countdown, max_retries=None) from exc
    except RETRYABLE as exc:
        raise self.retry(exc=exc, countdown=settings.RELEASE_RETRY_DELAY_S,
                         max_retries=20) from exc


@shared_task(acks_late=True, reject_on_worker_lost=True)
def release_follow(release_id: int, follows: int = 1) -> str:
    """Async submission (STELLAR_SUBMIT_MODE=async): one more look at a posted release
    by its stored hash (``release_drive`` with the chain check: landed -> completed;
    alive -> the same envelope re-posted; dead -> rebuilt; unknown -> waited for), then
    the next look if it is still open. Safe to run twice (the drive lock, conditional
    updates). Returns the release's status."""
    release = releases.release_drive(release_id=release_id, redrive=True)
    releases.follow_later(release, follows=follows)
    return release.status


@shared_task
def inbound_drain() -> int:
    """Dispatch the follow-ups stored on inbound_events rows (anchor/inbox.py): woken
    by the web after a delivery, and run by beat as the sweep for lost wake-ups."""
    return inbox.drain()


@shared_task(base=Sweep)
def reconcile_releases() -> dict:
    return reconciler.reconcile_releases()


@shared_task(base=Sweep)
def sweep_ap_deposits() -> dict:
    return reconciler.sweep_ap_deposits()


@shared_task(base=Sweep)
def reconcile_orders() -> dict:
    return reconciler.reconcile_orders()


@shared_task(base=Sweep)
def sweep_unnotified() -> dict:
    return reconciler.sweep_unnotified()


@shared_task(base=Sweep)
def expire_abandoned_deposits() -> int:
    return reconciler.expire_abandoned()


@shared_task(base=Sweep)
def sweep_submissions() -> dict:
    return submissions.sweep_submissions()


@shared_task(base=Sweep)
def erase_customers() -> int:
    """Erase the personal data of deleted customers past their retention."""
    from anchor import customers

    return customers.erase_due()


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def deposit_refund_drive(self, refund_id: int) -> str:
    """Drive one deposit refund (anchor/refunds.py ``refund_drive``); retried while a
    call went unanswered (``requested`` or ``processed`` with an error); a ``pending``
    refund waits for its webhook (and the beat sweep's poll). Safe to run twice."""
    refund = refunds.refund_drive(refund_id=refund_id)
    if refund.status in (refund.Status.REQUESTED, refund.Status.PROCESSED) and refund.last_error:
        raise self.retry(countdown=settings.DEPOSIT_REFUND_RETRY_S,
                         max_retries=settings.DEPOSIT_REFUND_MAX_ATTEMPTS * 4)
    return refund.status


@shared_task(base=Sweep)
def sweep_deposit_refunds() -> dict:
    return refunds.sweep_refunds()
