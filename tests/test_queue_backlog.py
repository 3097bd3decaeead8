"""A backlog of stale sweep messages never holds the work queued behind it.

Found by ``make chaos --seeds 20 --cpu-burners 2``: on a loaded machine the workers ran
slower than beat sent its fifteen one-second sweeps, the queue grew by hundreds of
messages a seed, and a remittance saga that was due waited minutes behind them (saga
445: ``running``, fence 0, only ``saga.started``, while the saga sweep "resumed" it every
second). A sweep's message and a run the saga sweep sent expire after
PERIODIC_EXPIRY_PERIODS of their periods (a later one is on its way), so the worker
drops the stale ones unrun. The backlog here is built with the broker and the worker
stopped, which is the state a loaded or frozen worker leaves, then the worker is
started: whatever it runs of the backlog is counted from its own log.
"""

from __future__ import annotations

import time

import pytest
from celery import current_app
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import ModelEntry

from sagas import engine, tasks
from sagas.models import Saga
from tests.flows import CeleryWorker, purge_broker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BACKLOG = 60  # of each stale message; every one run would take seconds, none is run
SWEEPS = ("anchor.tasks.reconcile_releases", "payouts.tasks.poll_withdrawals",
          "treasury.tasks.reconcile_today")


def _send_as_beat(task: str) -> None:
    """Publish one message of the periodic task exactly as beat does: its row's
    ModelEntry, whose options carry the row's ``expire_seconds`` as ``expires``."""
    entry = ModelEntry(PeriodicTask.objects.get(task=task), app=current_app)
    current_app.send_task(entry.task, args=entry.args, kwargs=entry.kwargs, **entry.options)


def _ran(log: str, task: str) -> int:
    return sum(1 for line in log.splitlines() if f"{task}[" in line and "succeeded" in line)


@pytest.mark.parametrize("expiry", ["on", "off"])
def test_a_due_saga_is_not_run_behind_a_backlog_of_stale_sweeps(settings, expiry):
    settings.SAGA_RESUME_PERIOD_S = 1
    settings.PERIODIC_EXPIRY_PERIODS = 1 if expiry == "on" else 0
    for name in ("RECONCILER_PERIOD_S", "WITHDRAW_POLL_PERIOD_S", "TREASURY_RECON_PERIOD_S"):
        setattr(settings, name, 1)
    call_command("setup_periodic_tasks")
    purge_broker()
    saga = engine.start(kind="testing", reference=f"backlog-{time.time_ns()}",
                        input={"amount": "10.00"}, dispatch=False)
    for _ in range(BACKLOG):
        for task in SWEEPS:
            _send_as_beat(task)
        tasks.resume_sagas()  # the saga sweep, every second while no worker ran
    time.sleep(1.5)  # the backlog is now older than its expiry (1 s)

    worker = CeleryWorker(name=f"backlog-{expiry}")
    try:
        tasks.resume_sagas()  # the sweep that comes after the worker is back
        wait_for(lambda: Saga.objects.get(pk=saga.pk).status == "completed", timeout=120,
                 what="the saga completed")
        wait_for(lambda: _queued() == 0, timeout=120, what="the backlog drained")
        time.sleep(0.5)  # the last message's log line
    finally:
        worker.stop()
    log = worker.log_path.read_text()

    ran = {task: _ran(log, task) for task in (*SWEEPS, "sagas.tasks.run_saga")}
    if expiry == "off":  # the protection switched off: the worker runs the whole backlog
        assert ran["anchor.tasks.reconcile_releases"] == BACKLOG, ran
        return
    assert [ran[task] for task in SWEEPS] == [0, 0, 0], ran
    assert ran["sagas.tasks.run_saga"] == 1, ran  # the fresh sweep's run; 60 stale dropped
    assert Saga.objects.get(pk=saga.pk).status == "completed"


def _queued() -> int:
    with current_app.connection_for_write() as conn:
        return conn.default_channel.client.llen("celery")
