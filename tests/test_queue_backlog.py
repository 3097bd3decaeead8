"""A worker behind schedule finds the queue full of copies of the same sweeps: it runs
one of each, and the saga sweep sends one run per due saga, not one per pass.

Found by ``make chaos --seeds 20 --cpu-burners 2``: the workers ran slower than beat
sent its fifteen one-second sweeps, the queue grew to hundreds of messages (289 sampled
in a 2-seed loaded run), and a remittance saga that was due waited minutes behind them
(saga 445: ``running``, fence 0, only ``saga.started``, while the saga sweep "resumed"
it every second, adding a run per pass). Dropping copies by age (Celery ``expires``)
starved instead: once the queue was older than the expiry, every run the sweep sent
expired unrun (the next 20-seed run: saga 144 waited 5.7 minutes after its lease
lapsed). The backlog here is built with no worker running, the state a loaded or
frozen worker leaves; the worker then started is counted from its own log.
"""

from __future__ import annotations

import time

import pytest
from celery import current_app
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import ModelEntry

from common.sweeps import Sweep
from corridor.schedules import periodic_tasks
from sagas import engine, tasks
from sagas.models import Saga
from tests.flows import CeleryWorker, purge_broker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BACKLOG = 15  # 15 x 3 copies: enough to tell one of each from all of them
SWEEPS = ("anchor.tasks.reconcile_releases", "ledger.tasks.rollup_balances",
          "treasury.tasks.reconcile_today")


def _queued(task: str | None = None) -> int:
    """Messages waiting in the default queue, its priority lists included."""
    import json

    with current_app.connection_for_write() as conn:
        client = conn.default_channel.client
        messages = [m for key in client.keys("celery*") if client.type(key) == b"list"
                    for m in client.lrange(key, 0, -1)]
    return sum(1 for m in messages if task is None or json.loads(m)["headers"]["task"] == task)


def _send_as_beat(task: str) -> None:
    """One message of the periodic task exactly as beat sends it: its row's ModelEntry,
    whose options carry the row's ``priority``."""
    entry = ModelEntry(PeriodicTask.objects.get(task=task), app=current_app)
    current_app.send_task(entry.task, args=entry.args, kwargs=entry.kwargs, **entry.options)


def _received(log: str) -> list[str]:
    """Task names in the order the worker took them from the broker."""
    import json

    out = []
    for line in log.splitlines():
        if line.startswith("{") and '"celery.worker.strategy"' in line:
            event = json.loads(line)["event"]
            if event.endswith("received"):
                out.append(event.split()[1].split("[")[0])
    return out


def _runs(log: str, task: str) -> tuple[int, int]:
    """(ran, skipped) copies of ``task`` in a worker's log: a skipped copy returns None,
    a sweep that ran returns its counts."""
    import json

    done = []
    for line in log.splitlines():
        if line.startswith("{") and f"{task}[" in line and (
                "succeeded" in line or "raised" in line):
            done.append(json.loads(line)["event"])
    skipped = sum(1 for event in done if event.endswith(": None"))
    return len(done) - skipped, skipped


def test_every_periodic_task_but_the_inbox_wake_is_a_sweep():
    current_app.loader.import_default_modules()
    for _, name, _ in periodic_tasks():
        task = current_app.tasks[name]
        # inbound_drain is also the web's wake-up after each delivery: never skipped
        assert isinstance(task, Sweep) == (name != "anchor.tasks.inbound_drain"), name


@pytest.mark.parametrize("gap", ["on", "off"])
def test_a_backlog_of_stale_sweeps_runs_one_copy_of_each(gap):
    call_command("setup_periodic_tasks")
    purge_broker()
    for _ in range(BACKLOG):
        for task in SWEEPS:
            _send_as_beat(task)  # what beat sends, once per period
    assert _queued() == BACKLOG * len(SWEEPS)

    worker = CeleryWorker(name=f"backlog-{gap}",
                          SWEEP_MIN_GAP_S="600" if gap == "on" else "0",
                          SWEEP_MAX_RUN_S="600" if gap == "on" else "0")
    try:
        wait_for(lambda: _queued() == 0, timeout=240, what="the backlog drained")
        wait_for(lambda: sum(sum(_runs(worker.log_path.read_text(), t)) for t in SWEEPS)
                 == BACKLOG * len(SWEEPS), timeout=120, what="every copy acknowledged")
    finally:
        worker.stop()
    log = worker.log_path.read_text()

    runs = {task: _runs(log, task) for task in SWEEPS}
    if gap == "off":  # the protection switched off: the worker runs the whole backlog
        assert runs == {task: (BACKLOG, 0) for task in SWEEPS}, runs
        return
    # the first copy of each runs (never starved, as expiry by age starved it), the rest
    # are acknowledged unrun
    assert runs == {task: (1, BACKLOG - 1) for task in SWEEPS}, runs


@pytest.mark.parametrize("requeue", ["on", "off"])
def test_the_saga_sweep_queues_one_run_per_due_saga(settings, requeue):
    settings.SAGA_RESUME_REQUEUE_S = 600 if requeue == "on" else 0
    purge_broker()
    saga = engine.start(kind="testing", reference=f"backlog-{time.time_ns()}",
                        input={"amount": "10.00"}, dispatch=False)
    for _ in range(BACKLOG):
        tasks.resume_sagas()  # the saga sweep, every period while no worker runs

    queued = _queued("sagas.tasks.run_saga")
    if requeue == "off":  # the protection switched off: one run per pass
        assert queued == BACKLOG
        purge_broker()
        return
    assert queued == 1

    worker = CeleryWorker(name="backlog-saga")
    try:
        wait_for(lambda: Saga.objects.get(pk=saga.pk).status == "completed", timeout=120,
                 what="the saga completed")
    finally:
        worker.stop()
    # the run started, so a saga due again is sent a run by the next pass at once
    assert not current_app.connection_for_write().default_channel.client.exists(
        tasks.QUEUED.format(id=saga.pk))


@pytest.mark.parametrize("priority", ["on", "off"])
def test_a_saga_run_queued_behind_a_backlog_of_sweeps_is_taken_first(settings, priority):
    settings.SWEEP_PRIORITY = 9 if priority == "on" else 0
    call_command("setup_periodic_tasks")
    purge_broker()
    for _ in range(BACKLOG):
        for task in SWEEPS:
            _send_as_beat(task)
    saga = engine.start(kind="testing", reference=f"behind-{time.time_ns()}",
                        input={"amount": "10.00"}, dispatch=True)  # its run, queued last

    worker = CeleryWorker(name=f"behind-{priority}", concurrency=1)
    try:
        wait_for(lambda: Saga.objects.get(pk=saga.pk).status == "completed", timeout=240,
                 what="the saga completed")
    finally:
        worker.stop()
    taken = _received(worker.log_path.read_text())
    if priority == "off":  # the protection switched off: first in, first out
        assert taken[0] != "sagas.tasks.run_saga" and taken.index("sagas.tasks.run_saga") \
            >= BACKLOG * len(SWEEPS) - 1, taken[:5]
        return
    assert taken[0] == "sagas.tasks.run_saga", taken[:5]
