"""A worker process SIGKILLed at every commit boundary of a 4-leg plan, forward and
compensating, then resumed by another worker found through the beat sweep's query
(never by broker redelivery): DESIGN.md §8 invariants 2-5 must hold
(ledger-and-sagas.md §5, §7 rule 8: the crash matrix).

Each scenario is a real ``manage.py run_saga`` process on the test database with
``CORRIDOR_CRASH_AT`` (or an input ``crash_*`` fault); the scenarios of a group run a
few at a time to keep the suite quick."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings

from sagas import engine
from sagas.models import Saga, SagaStep
from tests.flows import drive, fail_at, invariant_violations, new_saga, run_manage, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

S = Saga.Status
PAYOUT_FAILS = fail_at("test.payout", "non_retryable")
BOUNDARIES = ("before_commit", "after_commit")

# (plan, input, CORRIDOR_CRASH_AT or None for an input fault, final status)
GROUPS = {
    "forward": [("testing", {}, "saga.after_lease", S.COMPLETED)] + [
        ("testing", {}, f"saga.forward.{i}.{b}", S.COMPLETED)
        for i in range(4) for b in BOUNDARIES],
    "external intents": [
        ("testing.external", {}, f"saga.forward.{i}.intent.{b}", S.COMPLETED)
        for i in range(4) for b in BOUNDARIES],
    "compensation": [("testing", PAYOUT_FAILS, f"saga.forward.3.{b}", S.COMPENSATED)
                     for b in BOUNDARIES] + [
        ("testing", PAYOUT_FAILS, f"saga.compensate.{i}.{b}", S.COMPENSATED)
        for i in (2, 1, 0) for b in BOUNDARIES],
    "input faults": [
        ("testing", fail_at("test.fund", f"crash_{b}"), None, S.COMPLETED)
        for b in BOUNDARIES] + [
        ("testing", {"faults": {"fail_at": [
            {"leg": "test.payout", "mode": "non_retryable"},
            {"leg": "test.convert", "mode": f"crash_{b}", "phase": "compensate"}]}},
         None, S.COMPENSATED) for b in BOUNDARIES],
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_sigkill_at_every_commit_boundary_then_another_worker_resumes(group):
    scenarios = [(new_saga(plan, **input_), crash_at, final)
                 for plan, input_, crash_at, final in GROUPS[group]]

    def kill(scenario):
        saga, crash_at, _ = scenario
        return run_manage("run_saga", str(saga.pk), "--worker", "victim", crash_at=crash_at)

    with ThreadPoolExecutor(max_workers=4) as pool:
        killed = list(pool.map(kill, scenarios))

    wrong = {}
    for (saga, crash_at, _), proc in zip(scenarios, killed, strict=True):
        if proc.returncode != -9:  # the boundary was reached and the process died there
            wrong[label(saga, crash_at)] = \
                f"exit {proc.returncode}: {proc.stdout}{proc.stderr[-2000:]}"
    assert not wrong, wrong

    # The victim's lease lapses; the beat sweep's query finds every saga it left open
    # (a kill after the last commit leaves nothing to resume).
    left_open = {saga.pk for saga, _, _ in scenarios
                 if Saga.objects.get(pk=saga.pk).status in Saga.OPEN_STATUSES}
    wait_for(lambda: left_open <= set(engine.resume_due()),
             timeout=settings.SAGA_LEASE_S + 5, interval=0.1,
             what="the sweep sees the abandoned sagas")
    for saga, crash_at, final in scenarios:
        name = label(saga, crash_at)
        result = drive(saga.pk, worker="rescuer")
        saga.refresh_from_db()
        takeovers = 1 if saga.pk in left_open else 0
        if result.status != final:
            wrong[name] = f"ended {result.status}: {saga.error}"
        elif (saga.recoveries, saga.fence) != (takeovers, 1 + takeovers):
            wrong[name] = f"fence {saga.fence}, recoveries {saga.recoveries}"
        elif violations := invariant_violations(saga.pk):
            wrong[name] = violations
    assert not wrong, wrong


def label(saga: Saga, crash_at: str | None) -> str:
    return crash_at or str(saga.input["faults"]["fail_at"])

def test_an_intent_committed_before_the_crash_is_found_by_the_rescuer():
    saga = new_saga("testing.external")

    killed = run_manage("run_saga", str(saga.pk), crash_at="saga.forward.1.intent.after_commit")
    assert killed.returncode == -9
    step = SagaStep.objects.get(saga=saga, idx=1)
    assert (step.status, step.attempts, step.intent["reference"]) == \
        ("running", 1, f"{saga.pk}:1")
    drive(saga.pk, worker="rescuer", timeout=10)  # waits out the victim's lease

    step.refresh_from_db()
    assert (step.status, step.attempts) == ("done", 1)  # the intent was reused, not redone
    assert invariant_violations(saga.pk) == []
