"""The saga engine (sagas/engine.py) on the real test database, with real transactions
and, for the races, real concurrent connections (threads with their own connections).

Safety properties and the switch that shows each one's test failing without it:
- fencing (SAGA_FENCING): the seed's race books twice without it;
- exactly-once booking (SAGA_STEP_KEYS): a stale commit books twice when keys are per
  attempt;
- reverse compensation order (SAGA_COMPENSATE_IN_REVERSE): the order check reports it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection, connections
from django.utils import timezone

from ledger import services as ledger
from ledger.models import Entry
from ledger.services import Line
from sagas import engine, plans
from sagas.legs import Booking, Leg, LegOutcome, Pending, Plan
from sagas.models import Saga, SagaEvent, SagaStep
from sagas.plans.testing import LEGS, LedgerLeg
from tests.dbcount import count_write_commits
from tests.flows import (
    CeleryWorker,
    bookings,
    drive,
    events,
    fail_at,
    invariant_violations,
    new_saga,
    purge_broker,
    run_manage,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

S = Saga.Status
D = Decimal
KINDS = [kind for kind, _ in LEGS]  # test.fill, test.convert, test.fund, test.payout


# --- helpers of this module (the shared ones are in tests/flows.py) --------------------


def row_version(saga_id: int) -> tuple:
    """The saga row's version (xmin) and the number of its events: both stay put when
    nothing was written."""
    with connection.cursor() as cur:
        cur.execute("SELECT xmin::text FROM sagas WHERE id = %s", [saga_id])
        xmin = cur.fetchone()[0]
    return xmin, SagaEvent.objects.filter(saga_id=saga_id).count()


# --- test-local plans -------------------------------------------------------------------

class Gate:
    """Holds worker A inside a leg until the test lets it go."""

    def __init__(self):
        self.inside = threading.Event()
        self.release = threading.Event()
        self.workers = {"A"}

    def stall(self, ctx) -> None:
        if ctx.worker in self.workers:
            self.inside.set()
            assert self.release.wait(10), "test never released worker A"


GATE = Gate()
CALLS: Counter = Counter()
_payments = itertools.count(1)


class SendLeg(Leg):
    """Pays through a provider that has no idempotency key: every call is a new payment,
    booked under its own external reference (the seed's race)."""

    kind = "race.send"

    def forward(self, ctx):
        CALLS[(ctx.saga.id, self.kind, ctx.worker)] += 1
        GATE.stall(ctx)
        payment = f"pay-{next(_payments)}"
        return LegOutcome(output={"payment": payment}, bookings=[Booking(
            "race.send", [Line("race:hub", "USDC", D("-5")), Line("race:out", "USDC", D("5"))],
            reference=payment)])


class StallingLedgerLeg(LedgerLeg):
    def forward(self, ctx):
        CALLS[(ctx.saga.id, self.kind, ctx.worker)] += 1
        GATE.stall(ctx)
        return super().forward(ctx)


class PendingLeg(Leg):
    """Not yet, twice: then done."""

    kind = "wait.funds"

    def forward(self, ctx):
        CALLS[(ctx.saga.id, self.kind)] += 1
        if CALLS[(ctx.saga.id, self.kind)] <= 2:
            return Pending(retry_after=0.05, reason="funds not seen yet")
        return LegOutcome(output={"seen": True})


class LongLeg(Leg):
    """Works longer than the lease, renewing it as it goes."""

    kind = "long.work"

    def forward(self, ctx):
        for _ in range(4):
            time.sleep(0.2)
            ctx.renew_lease()
        return LegOutcome(output={"worked": True})


class FlakyPayLeg(Leg):
    """Commits its intent, then the provider times out: the payment may have happened."""

    kind = "flaky.pay"

    def forward(self, ctx):
        if ctx.intent is None:
            ctx.commit_intent({"to": "anchor", "amount": "5", "reference": ctx.idempotency_key})
        raise TimeoutError("provider did not answer")


class LopsidedLeg(Leg):
    """A bug: its booking does not balance."""

    kind = "bug.book"

    def forward(self, ctx):
        return LegOutcome(bookings=[Booking("bug.book", [Line("a", "USDC", D("-1")),
                                                         Line("b", "USDC", D("2"))])])


fill, convert, fund, payout = (LedgerLeg(kind, fn) for kind, fn in LEGS)
plans.register(Plan("t.race", (SendLeg(), LedgerLeg("test.tail", LEGS[0][1]))))
plans.register(Plan("t.stall", (StallingLedgerLeg("test.fill", LEGS[0][1]), convert, fund,
                                payout)))
plans.register(Plan("t.pending", (PendingLeg(), fill)))
plans.register(Plan("t.long", (LongLeg(), fill)))
plans.register(Plan("t.flaky", (fill, FlakyPayLeg())))
plans.register(Plan("t.bug", (fill, LopsidedLeg())))


@pytest.fixture(autouse=True)
def _reset():
    GATE.inside.clear()
    GATE.release.clear()
    GATE.workers = {"A"}
    CALLS.clear()
    yield
    GATE.release.set()


def in_thread(fn):
    """Run ``fn`` in a thread with its own database connection; join() returns its result."""
    box = {}

    def body():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()

    def join(timeout=20):
        thread.join(timeout)
        assert not thread.is_alive(), "thread did not finish"
        if "error" in box:
            raise box["error"]
        return box["result"]

    return join


# --- the happy path and what it costs ---------------------------------------------------

def test_a_four_leg_saga_completes_with_one_commit_per_ledger_leg():
    with count_write_commits() as started:
        saga = new_saga()
    with count_write_commits() as ran:
        result = engine.run(saga.pk, "w1", dispatch=False)

    assert (result.status, result.leased, result.stale) == (S.COMPLETED, True, False)
    assert started["commits"] == 1
    assert ran["commits"] == 1 + 4  # the lease, then one per leg
    assert bookings(saga.pk) == [f"{saga.pk}:{i}" for i in range(4)]
    assert events(saga.pk) == [("saga.started", None)] + [("step.done", i) for i in range(4)] \
        + [("saga.completed", None)]
    saga.refresh_from_db()
    assert (saga.fence, saga.lease_owner, saga.lease_until, saga.wake_at) == (1, "", None, None)
    assert [s.status for s in saga.steps.all()] == ["done"] * 4
    assert saga.steps.get(idx=3).output["inr"] == "850.00"
    assert invariant_violations(saga.pk) == []


def test_legs_with_an_external_side_effect_cost_two_commits_each():
    saga = new_saga("testing.external")

    with count_write_commits() as ran:
        result = engine.run(saga.pk, "w1", dispatch=False)

    assert result.status == S.COMPLETED
    assert ran["commits"] == 1 + 2 * 4  # the lease, then intent + result per leg
    step = saga.steps.get(idx=0)
    assert step.intent["reference"] == f"{saga.pk}:0" and step.attempts == 1
    assert events(saga.pk, "step.intent", "step.done")[:2] == [("step.intent", 0),
                                                                 ("step.done", 0)]


def test_start_is_idempotent_on_the_reference():
    saga = new_saga()

    again = engine.start(kind="testing", reference=saga.reference, input=saga.input,
                         dispatch=False)

    assert again.pk == saga.pk and Saga.objects.count() == 1
    with pytest.raises(engine.SagaConflict):
        engine.start(kind="testing", reference=saga.reference, input={"amount": "11"},
                     dispatch=False)


def test_a_stopped_or_unknown_saga_is_not_run():
    saga = new_saga()
    drive(saga.pk)
    before = row_version(saga.pk)

    stopped = engine.run(saga.pk, "w2", dispatch=False)
    unknown = engine.run(10**9, "w2", dispatch=False)

    assert stopped == engine.RunResult(S.COMPLETED, leased=False)
    assert unknown == engine.RunResult(None, leased=False)
    assert row_version(saga.pk) == before


# --- leases and fencing ---------------------------------------------------------------

def test_two_workers_at_the_same_moment_exactly_one_does_work():
    saga = new_saga("t.stall")
    GATE.workers = {"A", "B"}  # whoever wins stays inside leg 0 until released
    barrier = threading.Barrier(2)
    results: dict = {}

    def contender(name):
        barrier.wait(5)
        try:
            results[name] = engine.run(saga.pk, name, dispatch=False)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contender, args=(n,)) for n in "AB"]
    for t in threads:
        t.start()
    assert GATE.inside.wait(5)
    wait_for(lambda: len(results) == 1, timeout=5, what="the loser returns")
    GATE.release.set()
    for t in threads:
        t.join(10)

    winners = [name for name, r in results.items() if r.leased]
    assert len(winners) == 1, results
    loser = results[{"A": "B", "B": "A"}[winners[0]]]
    assert loser == engine.RunResult(S.RUNNING, leased=False)
    assert sum(n for (sid, kind, _), n in CALLS.items() if kind == "test.fill") == 1
    assert results[winners[0]].status == S.COMPLETED
    assert invariant_violations(saga.pk) == []


def stale_race(kind: str, lease_s: float = 0.3):
    """The seed's race: A stalls inside leg 0 past its lease; B takes the saga over and
    completes it; then A wakes up and tries to commit. Returns (A's result, B's)."""
    saga = new_saga(kind)
    join_a = in_thread(lambda: engine.run(saga.pk, "A", dispatch=False))
    assert GATE.inside.wait(5)
    time.sleep(lease_s + 0.15)  # A's lease lapses while it is stuck
    result_b = engine.run(saga.pk, "B", dispatch=False)
    GATE.release.set()
    return saga, join_a(), result_b


def test_stale_worker_is_fenced_and_the_payment_is_booked_once(settings):
    settings.SAGA_LEASE_S = 0.3

    saga, a, b = stale_race("t.race")

    assert (b.status, b.leased, b.stale) == (S.COMPLETED, True, False)
    assert (a.status, a.leased, a.stale) == (S.COMPLETED, True, True)  # StaleLeaseError
    assert CALLS[(saga.pk, "race.send", "A")] == CALLS[(saga.pk, "race.send", "B")] == 1
    assert Entry.objects.filter(saga_id=saga.pk, kind="race.send").count() == 1
    assert not SagaEvent.objects.filter(saga=saga, worker="A").exists()  # A wrote nothing
    saga.refresh_from_db()
    assert (saga.fence, saga.recoveries) == (2, 1)
    assert set(SagaStep.objects.filter(saga=saga).values_list("fence", flat=True)) == {2}
    assert ledger.trial_balance().ok


def test_without_fencing_the_stale_worker_books_the_payment_twice(settings):
    """The protection switched off: the same race, and the ledger shows two payments."""
    settings.SAGA_LEASE_S = 0.3
    settings.SAGA_FENCING = False

    saga, a, b = stale_race("t.race")

    assert not a.stale
    assert Entry.objects.filter(saga_id=saga.pk, kind="race.send").count() == 2
    assert SagaEvent.objects.filter(saga=saga, worker="A").exists()


def test_step_keys_book_once_even_when_a_stale_commit_gets_through(settings):
    """Ledger-only legs are keyed on the step: with the fence switched off, the stale
    worker's booking replays B's entry instead of adding one."""
    settings.SAGA_LEASE_S = 0.3
    settings.SAGA_FENCING = False

    saga, a, b = stale_race("t.stall")

    assert bookings(saga.pk) == [f"{saga.pk}:{i}" for i in range(4)]


def test_without_step_keys_a_stale_commit_books_twice(settings):
    """Both protections off (fence, step keys): the same leg is booked twice."""
    settings.SAGA_LEASE_S = 0.3
    settings.SAGA_FENCING = False
    settings.SAGA_STEP_KEYS = False

    saga, a, b = stale_race("t.stall")

    assert Entry.objects.filter(saga_id=saga.pk, kind="test.fill").count() == 2
    assert any("bookings" in v for v in invariant_violations(saga.pk))


def test_a_long_leg_renews_its_lease_and_keeps_the_saga(settings):
    settings.SAGA_LEASE_S = 0.5
    saga = new_saga("t.long")

    join = in_thread(lambda: engine.run(saga.pk, "A", dispatch=False))
    time.sleep(0.7)  # past the first lease: only the renewals keep A's claim
    intruder = engine.run(saga.pk, "B", dispatch=False)
    result = join()

    assert intruder == engine.RunResult(S.RUNNING, leased=False)
    assert (result.status, result.stale) == (S.COMPLETED, False)
    saga.refresh_from_db()
    assert (saga.fence, saga.recoveries) == (1, 0)


def test_takeover_increments_the_fence_and_counts_a_recovery():
    saga = new_saga()
    # A worker that died holding the lease, as a SIGKILL leaves it.
    Saga.objects.filter(pk=saga.pk).update(lease_owner="dead", fence=5,
                                           lease_until=timezone.now())

    result = engine.run(saga.pk, "B", dispatch=False)

    assert result.status == S.COMPLETED
    saga.refresh_from_db()
    assert (saga.fence, saga.recoveries) == (6, 1)
    assert set(SagaEvent.objects.filter(saga=saga).exclude(event="saga.started")
               .values_list("fence", flat=True)) == {6}


def test_a_live_lease_of_another_worker_is_left_alone():
    saga = new_saga()
    Saga.objects.filter(pk=saga.pk).update(
        lease_owner="other", fence=3, lease_until=timezone.now() + timezone.timedelta(60))

    before = row_version(saga.pk)

    result = engine.run(saga.pk, "B", dispatch=False)

    assert result == engine.RunResult(S.RUNNING, leased=False)
    assert row_version(saga.pk) == before  # the conditional UPDATE matched nothing
    assert Saga.objects.get(pk=saga.pk).fence == 3


def test_a_saga_that_keeps_killing_its_worker_stops_for_review(settings):
    settings.SAGA_MAX_RECOVERIES = 2
    saga = new_saga()
    Saga.objects.filter(pk=saga.pk).update(lease_owner="dead", recoveries=2,
                                           lease_until=timezone.now())

    result = engine.run(saga.pk, "B", dispatch=False)

    assert result.status == S.MANUAL_REVIEW
    assert events(saga.pk)[-1] == ("saga.manual_review", None)
    assert bookings(saga.pk) == []


def test_resume_due_lists_open_sagas_that_are_due_and_not_leased():
    running = new_saga()
    leased = new_saga()
    lapsed = new_saga()
    waiting = new_saga()
    done = new_saga()
    drive(done.pk)
    now = timezone.now()
    Saga.objects.filter(pk=leased.pk).update(lease_owner="w", lease_until=now + timezone
                                             .timedelta(seconds=60))
    Saga.objects.filter(pk=lapsed.pk).update(lease_owner="w", lease_until=now)
    Saga.objects.filter(pk=waiting.pk).update(wake_at=now + timezone.timedelta(seconds=60))

    assert sorted(engine.resume_due()) == sorted([running.pk, lapsed.pk])


# --- failures, retries, waits ------------------------------------------------------------

def test_a_retryable_failure_is_retried_with_backoff_and_then_completes():
    saga = new_saga(**fail_at("test.convert", "retryable", times=2))

    first = engine.run(saga.pk, "w", dispatch=False)
    step = SagaStep.objects.get(saga=saga, idx=1)
    assert first.status == S.RUNNING and step.attempts == 1
    assert step.next_attempt_at > timezone.now() - timezone.timedelta(seconds=1)
    result = drive(saga.pk)

    assert result.status == S.COMPLETED
    assert events(saga.pk, "step.retry") == [("step.retry", 1), ("step.retry", 1)]
    delays = [e.detail["retry_in_s"] for e in SagaEvent.objects.filter(saga=saga,
                                                                         event="step.retry")]
    assert delays == [0.05, 0.1]  # SAGA_DEFAULT_BACKOFF_MS (tests) doubling
    assert SagaStep.objects.get(saga=saga, idx=1).attempts == 2
    assert invariant_violations(saga.pk) == []


def test_a_retryable_failure_that_never_clears_compensates_after_max_attempts(settings):
    settings.SAGA_DEFAULT_MAX_ATTEMPTS = 3
    saga = new_saga(**fail_at("test.fund", "retryable"))

    result = drive(saga.pk)

    assert result.status == S.COMPENSATED
    assert len(events(saga.pk, "step.retry")) == 2
    step = SagaStep.objects.get(saga=saga, idx=2)
    assert (step.status, step.attempts) == ("failed", 3)
    assert events(saga.pk, "step.compensated") == [("step.compensated", 1),
                                                   ("step.compensated", 0)]
    assert invariant_violations(saga.pk) == []


def test_a_non_retryable_failure_compensates_at_once():
    saga = new_saga(**fail_at("test.fund", "non_retryable"))

    result = engine.run(saga.pk, "w", dispatch=False)

    assert result.status == S.COMPENSATED
    assert events(saga.pk, "step.retry") == []
    assert SagaStep.objects.get(saga=saga, idx=2).attempts == 1
    assert invariant_violations(saga.pk) == []


def test_manual_review_stops_without_retry_or_compensation():
    saga = new_saga(**fail_at("test.payout", "manual_review"))

    result = engine.run(saga.pk, "w", dispatch=False)

    assert result.status == S.MANUAL_REVIEW
    assert events(saga.pk, "step.retry", "step.compensated", "saga.compensating") == []
    assert bookings(saga.pk) == [f"{saga.pk}:{i}" for i in range(3)]  # left as they are
    saga.refresh_from_db()
    assert "ManualReviewError" in saga.error and saga.lease_owner == ""
    assert engine.resume_due() == []  # nobody picks it up again
    assert invariant_violations(saga.pk) == []


def test_retries_exhausted_after_a_committed_intent_go_to_manual_review(settings):
    """An external leg whose outcome is unknown is never compensated blindly
    (ledger-and-sagas.md §7 rule 5)."""
    settings.SAGA_DEFAULT_MAX_ATTEMPTS = 2
    saga = new_saga("t.flaky")

    result = drive(saga.pk)

    assert result.status == S.MANUAL_REVIEW
    assert "outcome unknown" in Saga.objects.get(pk=saga.pk).error
    assert events(saga.pk, "step.intent", "step.retry", "step.failed", "step.compensated") \
        == [("step.intent", 1), ("step.retry", 1), ("step.failed", 1)]
    assert SagaStep.objects.get(saga=saga, idx=1).attempts == 2


def test_a_booking_the_ledger_refuses_stops_the_saga_for_review():
    saga = new_saga("t.bug")

    result = engine.run(saga.pk, "w", dispatch=False)

    assert result.status == S.MANUAL_REVIEW
    assert "booking refused" in Saga.objects.get(pk=saga.pk).error
    assert bookings(saga.pk) == [f"{saga.pk}:0"]  # nothing of step 1 was kept


def test_a_failing_compensation_lands_in_manual_review():
    saga = new_saga(faults={"fail_at": [
        {"leg": "test.payout", "mode": "non_retryable"},
        {"leg": "test.fund", "mode": "non_retryable", "phase": "compensate"}]})

    result = engine.run(saga.pk, "w", dispatch=False)

    assert result.status == S.MANUAL_REVIEW
    assert events(saga.pk, "undo.failed", "step.compensated") == [("undo.failed", 2)]
    assert [s.status for s in SagaStep.objects.filter(saga=saga)] == \
        ["done", "done", "compensating", "failed"]  # stopped: 1 and 0 not undone
    assert "compensation failed" in Saga.objects.get(pk=saga.pk).error
    assert invariant_violations(saga.pk) == []


def test_a_compensation_that_fails_once_is_retried(settings):
    saga = new_saga(faults={"fail_at": [
        {"leg": "test.payout", "mode": "non_retryable"},
        {"leg": "test.convert", "mode": "retryable", "phase": "compensate", "times": 1}]})

    result = drive(saga.pk)

    assert result.status == S.COMPENSATED
    assert events(saga.pk, "undo.retry") == [("undo.retry", 1)]
    assert invariant_violations(saga.pk) == []


def test_pending_reschedules_without_using_an_attempt():
    saga = new_saga("t.pending")

    first = engine.run(saga.pk, "w", dispatch=False)
    assert first.status == S.RUNNING
    assert engine.resume_due() == []  # not due before retry_after
    result = drive(saga.pk)

    assert result.status == S.COMPLETED
    assert CALLS[(saga.pk, "wait.funds")] == 3
    assert SagaStep.objects.get(saga=saga, idx=0).attempts == 0
    assert events(saga.pk, "step.waiting") == [("step.waiting", 0)]  # first wait only


# --- compensation order -------------------------------------------------------------------

@pytest.mark.parametrize("failing", range(4))
def test_compensation_runs_last_to_first_over_the_completed_legs(failing):
    saga = new_saga(**fail_at(KINDS[failing], "non_retryable"))

    result = engine.run(saga.pk, "w", dispatch=False)

    assert result.status == S.COMPENSATED
    expected = list(range(failing - 1, -1, -1))
    assert [idx for _, idx in events(saga.pk, "step.compensated")] == expected
    undo = Entry.objects.filter(saga_id=saga.pk, idempotency_key__endswith=":undo")
    assert list(undo.order_by("id").values_list("kind", flat=True)) == \
        [f"{KINDS[i]}.undo" for i in expected]
    assert ledger.trial_balance().ok
    assert invariant_violations(saga.pk) == []


def test_the_order_check_catches_compensation_in_forward_order(settings):
    """The protection switched off: first-to-last compensation is reported."""
    settings.SAGA_COMPENSATE_IN_REVERSE = False
    saga = new_saga(**fail_at("test.payout", "non_retryable"))

    engine.run(saga.pk, "w", dispatch=False)

    assert [idx for _, idx in events(saga.pk, "step.compensated")] == [0, 1, 2]
    assert any(v.startswith("4:") for v in invariant_violations(saga.pk))


# --- Celery: runs after commit, retries through the broker, the beat sweep -----------------

@pytest.mark.slow
def test_celery_runs_sagas_retries_through_the_broker_and_the_sweep_recovers():
    from sagas import tasks

    purge_broker()
    worker = CeleryWorker(name="sagas", concurrency=2)
    try:
        retried = engine.start(kind="testing", reference="celery-retry",
                               input={"amount": "3", **fail_at("test.fund", "retryable",
                                                               times=2)})
        crashed = new_saga(**fail_at("test.convert", "crash_after_commit"))
        killed = run_manage("run_saga", str(crashed.pk))
        assert killed.returncode == -9, killed.stderr

        def settled():
            tasks.resume_sagas()  # what beat does every SAGA_RESUME_PERIOD_S
            return all(Saga.objects.get(pk=pk).status == S.COMPLETED
                       for pk in (retried.pk, crashed.pk))

        wait_for(settled, timeout=30, interval=0.5, what="both sagas completed by Celery")
    finally:
        worker.stop()
        purge_broker()

    assert events(retried.pk, "step.retry") == [("step.retry", 2), ("step.retry", 2)]
    assert Saga.objects.get(pk=crashed.pk).recoveries == 1
    for pk in (retried.pk, crashed.pk):
        assert invariant_violations(pk) == []


def test_the_engine_publishes_the_run_task_by_its_registered_name():
    """The engine publishes ``run_saga`` by name (no import of sagas.tasks, which imports
    the engine): the name it sends must be the one Celery registered."""
    from sagas import tasks

    assert engine.RUN_SAGA_TASK == tasks.run_saga.name
