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

from common.sweeps import Sweep
from corridor.schedules import periodic_tasks
from sagas import engine, tasks
from sagas.models import Saga
from tests.flows import CeleryWorker, purge_broker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BACKLOG = 60
SWEEPS = ("anchor.tasks.reconcile_releases", "ledger.tasks.rollup_balances",
          "treasury.tasks.reconcile_today")


def _queued(task: str | None = None) -> int:
    import json

    with current_app.connection_for_write() as conn:
        messages = conn.default_channel.client.lrange("celery", 0, -1)
    return sum(1 for m in messages if task is None or json.loads(m)["headers"]["task"] == task)


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
    purge_broker()
    for _ in range(BACKLOG):
        for task in SWEEPS:
            current_app.send_task(task)  # what beat sends, once per period
    assert _queued() == BACKLOG * len(SWEEPS)

    worker = CeleryWorker(name=f"backlog-{gap}",
                          SWEEP_MIN_GAP_S="600" if gap == "on" else "0")
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
