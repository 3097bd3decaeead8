"""Celery tasks for sagas: thin, id-based, safe to run twice (STYLE.md).

``run_saga`` is enqueued after the commit that makes a saga due (start, a retry, a
wait); ``resume_sagas`` (beat, every SAGA_RESUME_PERIOD_S) re-enqueues every open saga
that is due and not leased, so a run lost with a SIGKILLed worker (its ``acks_late``
message invisible until Redis's visibility timeout) is picked up by the sweep, never by
waiting for redelivery (DESIGN.md §6). ``sweep_late_money`` (beat, every
LATE_MONEY_SWEEP_PERIOD_S) compensates the sagas in manual_review whose anchor's refund
arrived after they stopped waiting (sagas/latemoney.py)."""

from __future__ import annotations

import logging
import os
import socket

from celery import shared_task
from django.conf import settings

from sagas import engine, latemoney

log = logging.getLogger(__name__)


@shared_task(bind=True, acks_late=True)
def run_saga(self, saga_id: int) -> str | None:
    """Drive one saga. The worker id is unique per task execution, so two deliveries of
    the same message never share a lease."""
    worker = f"celery:{socket.gethostname()}:{os.getpid()}:{self.request.id}"
    result = engine.run(saga_id, worker)
    return result.status


@shared_task
def resume_sagas() -> int:
    """Enqueue a run of every due saga. Each run expires after PERIODIC_EXPIRY_PERIODS
    sweep periods unrun (the next sweep sends another while the saga is still due), so a
    saga due for a while never has more than a few runs queued."""
    ids = engine.resume_due()
    periods = settings.PERIODIC_EXPIRY_PERIODS
    expires = max(1.0, settings.SAGA_RESUME_PERIOD_S * periods) if periods > 0 else None
    for saga_id in ids:
        run_saga.apply_async(kwargs={"saga_id": saga_id}, expires=expires)
    if ids:
        log.info("resumed %d due sagas", len(ids))
    return len(ids)


@shared_task
def sweep_late_money() -> dict[str, int]:
    return latemoney.sweep_late_money()
