"""Celery tasks for sagas: thin, id-based, safe to run twice (STYLE.md).

``run_saga`` is enqueued after the commit that makes a saga due (start, a retry, a
wait); ``resume_sagas`` (beat, every SAGA_RESUME_PERIOD_S) re-enqueues every open saga
that is due and not leased, so a run lost with a SIGKILLed worker (its ``acks_late``
message invisible until Redis's visibility timeout) is picked up by the sweep, never by
waiting for redelivery (DESIGN.md §6); it sends one run per due saga, not one per pass,
while that run waits in the queue. ``sweep_late_money`` (beat, every
LATE_MONEY_SWEEP_PERIOD_S) compensates the sagas in manual_review whose anchor's refund
arrived after they stopped waiting (sagas/latemoney.py). Both sweeps are
``common.sweeps.Sweep``s."""

from __future__ import annotations

import logging
import os
import socket

from celery import shared_task
from django.conf import settings

from common.sweeps import Sweep, broker_redis, start_once
from sagas import engine, latemoney

log = logging.getLogger(__name__)


@shared_task(bind=True, acks_late=True)
def run_saga(self, saga_id: int) -> str | None:
    """Drive one saga. The worker id is unique per task execution, so two deliveries of
    the same message never share a lease."""
    worker = f"celery:{socket.gethostname()}:{os.getpid()}:{self.request.id}"
    _forget_queued(saga_id)  # a run started: the next sweep may send another
    result = engine.run(saga_id, worker)
    return result.status


QUEUED = "corridor:saga-run-queued:{id}"


@shared_task(base=Sweep)
def resume_sagas() -> int:
    """Enqueue one run of every due saga (``engine.resume_due``), but none for a saga
    whose run this sweep sent less than SAGA_RESUME_REQUEUE_S ago and no worker started
    yet: a worker behind schedule finds one run per saga queued, not one per sweep.
    Returns how many runs were sent."""
    sent = 0
    for saga_id in engine.resume_due():
        if start_once(QUEUED.format(id=saga_id), settings.SAGA_RESUME_REQUEUE_S):
            run_saga.apply_async(kwargs={"saga_id": saga_id})
            sent += 1
    if sent:
        log.info("resumed %d due sagas", sent)
    return sent


def _forget_queued(saga_id: int) -> None:
    try:
        broker_redis().delete(QUEUED.format(id=saga_id))
    except Exception:  # noqa: BLE001 - the marker then lapses by itself
        log.debug("saga %s: queued marker not cleared", saga_id)


@shared_task(base=Sweep)
def sweep_late_money() -> dict[str, int]:
    return latemoney.sweep_late_money()
