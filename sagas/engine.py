"""The saga engine (DESIGN.md §6): plans run as sagas persisted in PostgreSQL, under a
lease with a fencing token, compensated in exact reverse order, booking every
movement in the ledger exactly once.

Services (keyword-only except ``run``, whose shape the design fixes):

- ``start(kind=, reference=, input=)``: one commit (saga, its steps, ``saga.started``);
  a Celery run is enqueued after it.
- ``run(saga_id, worker)``: take the lease and drive the saga until it stops, waits or
  fails; returns ``RunResult``. Must be called outside any transaction.
- ``resume_due()``: ids of sagas the beat sweep must run again (lease lapsed, retry or
  pending due). Recovery never relies on the broker redelivering a task.

Leases and fencing (ledger-and-sagas.md §1.3, §7 rule 1). The lease is a conditional
UPDATE (``_ACQUIRE``): free, lapsed, or already ours. A new grant adds one to ``fence``;
a renewal by the live holder keeps it. The first write of every commit of a run is
``_Guard``: ``UPDATE sagas ... WHERE id AND fence AND lease_owner``, in the same
transaction as the step row, the events and the ledger entries. With bookings, the
ledger locks their accounts (in id order) and calls the guard as its precondition hook
before it writes; without, the commit calls it first. No row -> ``StaleLeaseError``,
the transaction keeps nothing, and ``run`` returns the saga's real status. The guard
also renews the lease, and ``ctx.renew_lease()`` does the same alone.

Commits (ledger-and-sagas.md §6, §7 rules 3 and 9). A ledger-only leg costs ONE
commit: guard (status, ``wake_at``, lease), its ledger entries, its step row (status,
output, fence) and its ``saga_events`` rows. A leg with an external side effect adds
one before the call: ``ctx.commit_intent`` (guard, step ``running`` with the intent and
one more attempt, ``step.intent``). Taking the lease is one more commit per run.

Keys (§7 rule 2): ``{saga_id}:{idx}`` for the leg and its bookings without an external
reference (``{key}:{n}`` for the n-th further one), ``{saga_id}:{idx}:undo`` for its
compensation; a booking with an external reference is keyed ``{kind}:{reference}``.

Failures (DESIGN.md §6; §7 rules 4 and 5): ``Pending(retry_after)`` -> the step waits,
no attempt used. Any other exception -> retry after ``backoff_ms * 2**(n-1)`` (capped
at SAGA_BACKOFF_MAX_S) through Celery, up to ``max_attempts``; then compensate, or
``manual_review`` if the step had committed an intent (its outcome is unknown).
``NonRetryableError`` -> compensate now. ``ManualReviewError`` -> stop. Compensations
retry the same way; one that still fails, or raises NonRetryable/ManualReview, stops the
saga in ``manual_review`` (compensation failure is a durable state, §7 rule 4). A saga
whose lease had to be taken over more than SAGA_MAX_RECOVERIES times (a leg that keeps
killing its worker) also stops in ``manual_review``.

Fault injection (off unless the input asks): ``input["faults"]["fail_at"]`` is one
spec or a list of specs ``{"leg": kind, "mode": m, "phase": "forward"|"compensate",
"times": n}`` with m in ``retryable`` (while the step has failed fewer than n times;
always without n), ``non_retryable``, ``manual_review``, ``crash_before_commit``,
``crash_after_commit`` (SIGKILL around the leg's result commit while the saga has been
recovered fewer than n times, default 1). ``CORRIDOR_CRASH_AT`` crash points
(``common.crashpoints``): ``saga.after_lease``, ``saga.{forward|compensate}.{idx}
.before_commit|after_commit`` and ``saga.forward.{idx}.intent.before_commit|
after_commit``.

Test-only switches (settings, never from the environment), each showing what its
protection prevents: SAGA_FENCING (commits ignore the fence), SAGA_COMPENSATE_IN_REVERSE
(False compensates first-to-last), SAGA_STEP_KEYS (False keys bookings per attempt).
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import dataclass
from functools import partial
from typing import Any

from celery import current_app
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from structlog.contextvars import bound_contextvars

from common.crashpoints import crash_point
from ledger import services as ledger
from sagas import plans
from sagas.legs import (
    Booking,
    Leg,
    LegContext,
    LegOutcome,
    ManualReviewError,
    NonRetryableError,
    Pending,
    SagaInfo,
    StaleLeaseError,
)
from sagas.models import Saga, SagaStep

log = logging.getLogger(__name__)
S = Saga.Status
T = SagaStep.Status


class SagaConflict(Exception):
    """``start`` with a reference already used by a saga of another kind or input."""


class InjectedFault(Exception):
    """The retryable failure of ``faults.fail_at`` mode ``retryable``."""


@dataclass(frozen=True)
class RunResult:
    """``status``: the saga's status when ``run`` returned (None: no such saga).
    ``leased``: this call held the lease. ``stale``: it lost the lease mid-run and its
    last commit was refused (StaleLeaseError)."""

    status: str | None
    leased: bool
    stale: bool = False


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, cls=DjangoJSONEncoder)


def _load(value: Any) -> Any:
    """jsonb from a raw cursor: Django leaves it as text for JSONField to parse."""
    return json.loads(value) if isinstance(value, str) else value


def _checked(result: Any) -> LegOutcome | Pending:
    if not isinstance(result, LegOutcome | Pending):
        raise TypeError(f"a leg returns LegOutcome or Pending, not {type(result).__name__}")
    return result


# --- start -------------------------------------------------------------------------

def start(*, kind: str, reference: str, input: dict[str, Any] | None = None,
          stellar_cursor: str = "", dispatch: bool = True) -> Saga:
    """Create a saga of plan ``kind`` (one commit: the saga, one pending step per leg,
    ``saga.started``) and, if ``dispatch``, enqueue its run after commit.

    Idempotent on ``reference``: the same reference again returns the existing saga;
    with another kind or input it raises ``SagaConflict``. ``input`` is JSON (Decimals
    become strings)."""
    plan = plans.get(kind)
    payload = _json(input or {})
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "INSERT INTO sagas (kind, reference, status, input, stellar_cursor, wake_at) "
            "VALUES (%s, %s, 'running', %s::jsonb, %s, clock_timestamp()) "
            "ON CONFLICT (reference) DO NOTHING RETURNING id",
            [kind, reference, payload, stellar_cursor])
        row = cur.fetchone()
        if row is None:
            existing = Saga.objects.get(reference=reference)
            if existing.kind != kind or existing.input != json.loads(payload):
                raise SagaConflict(f"reference {reference} is saga {existing.pk} "
                                   f"({existing.kind}) with other input")
            return existing
        saga_id = row[0]
        steps = ", ".join(["(%s, %s, %s, 'pending')"] * len(plan.legs))
        cur.execute(
            f"WITH steps AS (INSERT INTO saga_steps (saga_id, idx, kind, status) "
            f"VALUES {steps}) "
            "INSERT INTO saga_events (saga_id, idx, event, detail) "
            "VALUES (%s, NULL, 'saga.started', %s::jsonb)",
            [v for idx, leg in enumerate(plan.legs) for v in (saga_id, idx, leg.kind)]
            + [saga_id, _json({"kind": kind, "legs": [leg.kind for leg in plan.legs]})])
        if dispatch:
            _enqueue_after_commit(saga_id, 0.0)
    saga = Saga(id=saga_id, kind=kind, reference=reference, status=S.RUNNING,
                input=json.loads(payload), stellar_cursor=stellar_cursor)
    saga._state.adding = False
    return saga


def _enqueue_after_commit(saga_id: int, delay_s: float) -> None:
    """Enqueue the saga's run once the transaction commits; a broker that refuses the
    publish is logged and nothing else (the commit stands; the resume sweep owns the
    saga). A named function, not a ``partial``: Django's robust ``on_commit`` logs the
    callback's ``__qualname__``, which a partial lacks (found by ``make chaos``)."""

    def enqueue_run() -> None:
        _enqueue(saga_id, delay_s)

    transaction.on_commit(enqueue_run, robust=True)


RUN_SAGA_TASK = "sagas.tasks.run_saga"


def _enqueue(saga_id: int, delay_s: float) -> None:
    """Publish ``sagas.tasks.run_saga`` by name, as anchor/inbox.py publishes its
    follow-ups: the engine never imports the tasks module that imports it (the import
    circle engine <-> tasks, which the late-money sweep had grown to four files)."""
    current_app.send_task(RUN_SAGA_TASK, kwargs={"saga_id": saga_id},
                          countdown=max(0.0, delay_s))


# --- the lease -----------------------------------------------------------------------

_ACQUIRE = """
UPDATE sagas SET
    fence = CASE WHEN lease_owner = %(w)s AND lease_until > clock_timestamp()
                 THEN fence ELSE fence + 1 END,
    recoveries = recoveries + CASE WHEN lease_owner <> ''
                                    AND NOT (lease_owner = %(w)s
                                             AND lease_until > clock_timestamp())
                                   THEN 1 ELSE 0 END,
    lease_owner = %(w)s,
    lease_until = clock_timestamp() + make_interval(secs => %(lease)s),
    updated_at = clock_timestamp()
WHERE id = %(id)s
  AND status IN ('running', 'compensating')
  AND wake_at <= clock_timestamp()
  AND (lease_owner = '' OR lease_until <= clock_timestamp() OR lease_owner = %(w)s)
RETURNING fence, recoveries, status, kind, reference, input, stellar_cursor
"""


def _status(saga_id: int) -> str | None:
    with connection.cursor() as cur:
        cur.execute("SELECT status FROM sagas WHERE id = %s", [saga_id])
        row = cur.fetchone()
    return row[0] if row else None


def run(saga_id: int, worker: str, *, dispatch: bool = True) -> RunResult:
    """Drive saga ``saga_id`` as ``worker`` (unique per concurrent caller) until it
    stops (completed, compensated, manual_review), waits (retry, Pending) or this worker
    loses the lease. Another live holder, a saga not due or stopped -> its status, no
    work, no write. ``dispatch``: enqueue the Celery run of a retry or a wait after its
    commit (False: the caller drives, as tests, the bench and ``run_saga`` do)."""
    with bound_contextvars(saga_id=saga_id):
        if connection.in_atomic_block:
            raise RuntimeError("sagas.engine.run owns its transactions: call it outside one")
        with connection.cursor() as cur:
            cur.execute(_ACQUIRE, {"w": worker, "id": saga_id, "lease": settings.SAGA_LEASE_S})
            row = cur.fetchone()
        if row is None:
            return RunResult(_status(saga_id), leased=False)
        crash_point("saga.after_lease")
        fence, recoveries, status, kind, reference, input_, cursor = row
        saga = SagaInfo(id=saga_id, kind=kind, reference=reference, input=_load(input_),
                        stellar_cursor=cursor)
        drive = _Run(saga, worker=worker, fence=fence, status=status, recoveries=recoveries,
                     dispatch=dispatch)
        try:
            return RunResult(drive.drive(), leased=True)
        except StaleLeaseError as exc:
            log.warning("saga %s: %s lost its lease (fence %s): %s", saga_id, worker, fence, exc)
            return RunResult(_status(saga_id), leased=True, stale=True)


def resume_due(*, limit: int | None = None) -> list[int]:
    """Open sagas that are due (``wake_at`` passed) and not leased (free or lapsed): the
    beat sweep enqueues a run for each. Served by the partial index ``sagas_due_idx``."""
    with connection.cursor() as cur:
        cur.execute(*due_sql(limit=limit))
        return [row[0] for row in cur.fetchall()]


def due_sql(*, limit: int | None = None) -> tuple[str, list]:
    """(sql, params) of ``resume_due``'s query (corridor/periodic.py explains it)."""
    return ("SELECT id FROM sagas WHERE status IN ('running', 'compensating') "
            "AND wake_at <= clock_timestamp() "
            "AND (lease_owner = '' OR lease_until <= clock_timestamp()) "
            "ORDER BY wake_at LIMIT %s", [limit or settings.SAGA_RESUME_BATCH])


# --- one run -------------------------------------------------------------------------

@dataclass
class _Step:
    idx: int
    kind: str
    status: str
    attempts: int
    undo_attempts: int
    intent: dict | None
    output: dict | None
    undo_output: dict | None
    error: str


_GUARD = """
UPDATE sagas SET
    status = %(status)s,
    wake_at = clock_timestamp() + make_interval(secs => %(wake_in)s),
    lease_owner = CASE WHEN %(release)s THEN '' ELSE lease_owner END,
    lease_until = CASE WHEN %(release)s THEN NULL
                       ELSE clock_timestamp() + make_interval(secs => %(lease)s) END,
    error = COALESCE(%(error)s, error),
    updated_at = clock_timestamp()
WHERE id = %(id)s
"""
_FENCED = " AND fence = %(fence)s AND lease_owner = %(worker)s"


class _Guard:
    """The fence check of one transaction: the first call runs the guard UPDATE (and
    so writes the saga row); later calls in the same transaction do nothing. Passed to
    ``ledger.post_many`` as its precondition."""

    def __init__(self, run: _Run, cur, *, status: str, wake_in: float | None, release: bool,
                 error: str | None):
        self.run, self.cur, self.checked = run, cur, False
        self.params = {"status": status, "wake_in": wake_in, "release": release,
                       "lease": settings.SAGA_LEASE_S, "error": error, "id": run.saga.id,
                       "fence": run.fence, "worker": run.worker}

    def __call__(self, balances: Any = None) -> None:
        if self.checked:
            return
        sql = _GUARD + (_FENCED if settings.SAGA_FENCING else "")
        self.cur.execute(sql, self.params)
        if self.cur.rowcount != 1:
            raise StaleLeaseError(f"saga {self.run.saga.id}: fence {self.run.fence} of "
                                  f"{self.run.worker} is no longer the saga's")
        self.checked = True


class _Run:
    def __init__(self, saga: SagaInfo, *, worker: str, fence: int, status: str,
                 recoveries: int, dispatch: bool):
        self.saga, self.worker, self.fence = saga, worker, fence
        self.status, self.recoveries, self.dispatch = status, recoveries, dispatch
        self.plan = plans.get(saga.kind)
        self.steps: list[_Step] = []

    # -- the loop --

    def drive(self) -> str:
        self.steps = self._load_steps()
        if self.recoveries > settings.SAGA_MAX_RECOVERIES:
            self._commit(phase="forward", step=None, status=S.MANUAL_REVIEW, release=True,
                         error=f"lease taken over {self.recoveries} times: a leg keeps "
                               "stopping its worker",
                         events=[(None, "saga.manual_review",
                                  {"reason": "recoveries", "recoveries": self.recoveries})])
            return self.status
        while True:
            if self.status == S.RUNNING:
                step = next((s for s in self.steps if s.status != T.DONE), None)
                if step is None:  # only after a switch-off test; kept for safety
                    self._commit(phase="forward", step=None, status=S.COMPLETED, release=True,
                                 events=[(None, "saga.completed", {})])
                    return self.status
                go_on = self._forward(step)
            elif self.status == S.COMPENSATING:
                step = self._next_to_compensate()
                if step is None:
                    self._commit(phase="compensate", step=None, status=S.COMPENSATED,
                                 release=True, events=[(None, "saga.compensated", {})])
                    return self.status
                go_on = self._compensate(step)
            else:
                return self.status
            if not go_on:
                return self.status

    def _load_steps(self) -> list[_Step]:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT idx, kind, status, attempts, undo_attempts, intent, output, "
                "undo_output, error FROM saga_steps WHERE saga_id = %s ORDER BY idx",
                [self.saga.id])
            steps = [_Step(idx, kind, status, attempts, undo_attempts, _load(intent),
                           _load(output), _load(undo_output), error)
                     for idx, kind, status, attempts, undo_attempts, intent, output,
                     undo_output, error in cur.fetchall()]
        for step, leg in zip(steps, self.plan.legs, strict=True):
            if step.kind != leg.kind:
                raise RuntimeError(f"saga {self.saga.id} step {step.idx} is {step.kind}, "
                                   f"plan {self.plan.kind} says {leg.kind}")
        return steps

    def _next_to_compensate(self) -> _Step | None:
        todo = [s for s in self.steps if s.status in (T.DONE, T.COMPENSATING)]
        if not todo:
            return None
        return todo[-1] if settings.SAGA_COMPENSATE_IN_REVERSE else todo[0]

    def _context(self, step: _Step, *, compensating: bool) -> LegContext:
        key = f"{self.saga.id}:{step.idx}" + (":undo" if compensating else "")
        done = (T.DONE, T.COMPENSATING, T.COMPENSATED)
        ctx = LegContext(
            saga=self.saga, idx=step.idx, leg=step.kind, idempotency_key=key,
            outputs=[s.output if s.status in done else None for s in self.steps],
            attempt=(step.undo_attempts if compensating else step.attempts) + 1,
            intent=step.intent, worker=self.worker, compensating=compensating,
            step_kinds=[s.kind for s in self.steps], _renew=self._renew)
        if not compensating:
            ctx._commit_intent = partial(self._commit_intent, step, ctx)
        return ctx

    # -- forward --

    def _forward(self, step: _Step) -> bool:
        leg = self.plan.legs[step.idx]
        ctx = self._context(step, compensating=False)
        try:
            self._inject(step, "forward", "call")
            result = _checked(leg.forward(ctx))
        except StaleLeaseError:
            raise
        except ManualReviewError as exc:
            self._stop_for_review(step, "forward", f"ManualReviewError: {exc}", T.FAILED,
                                  bookings=self._keyed(ctx, exc.bookings),
                                  attempts=self._attempts(step, ctx))
            return False
        except NonRetryableError as exc:
            return self._fail_forward(step, f"NonRetryableError: {exc}",
                                      attempts=self._attempts(step, ctx))
        except Exception as exc:  # anything else is retryable (DESIGN.md §6)
            failures = self._attempts(step, ctx)
            error = f"{type(exc).__name__}: {exc}"
            if failures < self._max_attempts(leg):
                self._retry(step, "forward", failures, error, leg)
                return False
            if step.intent is not None:
                self._stop_for_review(
                    step, "forward", f"retries exhausted after the intent was committed; "
                    f"outcome unknown: {error}", T.FAILED, attempts=failures)
                return False
            return self._fail_forward(step, f"retries exhausted: {error}", attempts=failures)
        if isinstance(result, Pending):
            self._wait(step, "forward", result)
            return False
        try:
            return self._done(step, ctx, result)
        except ledger.LedgerError as exc:  # a leg's bookings are wrong: no retry fixes it
            self._stop_for_review(step, "forward", f"booking refused: {exc}", T.FAILED,
                                  attempts=self._attempts(step, ctx))
            return False

    @staticmethod
    def _attempts(step: _Step, ctx: LegContext) -> int:
        """Attempts used once this one failed: an intent commit already counted it."""
        return step.attempts + (0 if ctx._intent_committed else 1)

    def _done(self, step: _Step, ctx: LegContext, outcome: LegOutcome) -> bool:
        last = step.idx == len(self.steps) - 1
        events = [(step.idx, "step.done", {"attempt": ctx.attempt})]
        if last:
            events.append((None, "saga.completed", {}))
        self._commit(phase="forward", step=step, step_status=T.DONE, output=outcome.output,
                     error="", status=S.COMPLETED if last else S.RUNNING, release=last,
                     wake_in=None if last else 0.0, events=events,
                     bookings=self._keyed(ctx, outcome.bookings), inject=True)
        return not last

    def _fail_forward(self, step: _Step, error: str, *, attempts: int) -> bool:
        """The step failed for good: compensate the completed steps (or, with none,
        end compensated at once)."""
        any_done = any(s.status == T.DONE for s in self.steps)
        events = [(step.idx, "step.failed", {"error": error}),
                  (None, "saga.compensating", {"failed_idx": step.idx})]
        if not any_done:
            events.append((None, "saga.compensated", {}))
        self._commit(phase="forward", step=step, step_status=T.FAILED, error=error,
                     attempts=attempts, status=S.COMPENSATING if any_done else S.COMPENSATED,
                     release=not any_done, wake_in=0.0 if any_done else None, events=events,
                     inject=True)
        return any_done

    def _commit_intent(self, step: _Step, ctx: LegContext, intent: dict[str, Any]) -> None:
        self._commit(phase="forward", step=step, step_status=T.RUNNING, intent=intent,
                     attempts=step.attempts + 1, status=S.RUNNING, release=False,
                     wake_in=0.0, events=[(step.idx, "step.intent", {"attempt": ctx.attempt})],
                     crash_name=f"saga.forward.{step.idx}.intent")
        ctx._intent_committed = True

    # -- compensation --

    def _compensate(self, step: _Step) -> bool:
        leg = self.plan.legs[step.idx]
        ctx = self._context(step, compensating=True)
        try:
            self._inject(step, "compensate", "call")
            result = _checked(leg.compensate(ctx, step.output or {}))
        except StaleLeaseError:
            raise
        except (ManualReviewError, NonRetryableError) as exc:
            self._stop_for_review(step, "compensate",
                                  f"compensation failed: {type(exc).__name__}: {exc}",
                                  T.COMPENSATING, undo_attempts=step.undo_attempts + 1,
                                  bookings=self._keyed(ctx, getattr(exc, "bookings", ())))
            return False
        except Exception as exc:
            failures = step.undo_attempts + 1
            error = f"{type(exc).__name__}: {exc}"
            if failures < self._max_attempts(leg):
                self._retry(step, "compensate", failures, error, leg)
            else:
                self._stop_for_review(step, "compensate",
                                      f"compensation failed after {failures} attempts: {error}",
                                      T.COMPENSATING, undo_attempts=failures)
            return False
        if isinstance(result, Pending):
            self._wait(step, "compensate", result)
            return False
        remaining = [s for s in self.steps
                     if s.status in (T.DONE, T.COMPENSATING) and s.idx != step.idx]
        events = [(step.idx, "step.compensated", {"attempt": ctx.attempt})]
        if not remaining:
            events.append((None, "saga.compensated", {}))
        try:
            self._commit(phase="compensate", step=step, step_status=T.COMPENSATED,
                         undo_output=result.output, error=step.error,
                         status=S.COMPENSATING if remaining else S.COMPENSATED,
                         release=not remaining, wake_in=0.0 if remaining else None,
                         events=events, bookings=self._keyed(ctx, result.bookings),
                         inject=True)
        except ledger.LedgerError as exc:
            self._stop_for_review(step, "compensate", f"compensation booking refused: {exc}",
                                  T.COMPENSATING, undo_attempts=step.undo_attempts + 1)
            return False
        return bool(remaining)

    # -- shared transitions --

    def _max_attempts(self, leg: Leg) -> int:
        return leg.max_attempts or settings.SAGA_DEFAULT_MAX_ATTEMPTS

    def _retry(self, step: _Step, phase: str, failures: int, error: str, leg: Leg) -> None:
        backoff_ms = leg.backoff_ms if leg.backoff_ms is not None \
            else settings.SAGA_DEFAULT_BACKOFF_MS
        delay = min(backoff_ms * 2 ** (failures - 1) / 1000, settings.SAGA_BACKOFF_MAX_S)
        fields: dict[str, Any] = {"attempts": failures} if phase == "forward" \
            else {"undo_attempts": failures}
        status = T.RUNNING if phase == "forward" else T.COMPENSATING
        self._commit(phase=phase, step=step, step_status=status, error=error,
                     next_in=delay, status=self.status, release=True, wake_in=delay,
                     events=[(step.idx, "step.retry" if phase == "forward" else "undo.retry",
                              {"attempt": failures, "error": error, "retry_in_s": delay})],
                     **fields)

    def _wait(self, step: _Step, phase: str, pending: Pending) -> None:
        status = T.RUNNING if phase == "forward" else T.COMPENSATING
        events = []
        if step.status != status:  # log the first wait only, not every poll
            events = [(step.idx, "step.waiting" if phase == "forward" else "undo.waiting",
                       {"reason": pending.reason, "retry_in_s": pending.retry_after})]
        self._commit(phase=phase, step=step, step_status=status, next_in=pending.retry_after,
                     status=self.status, release=True, wake_in=pending.retry_after,
                     events=events)

    def _stop_for_review(self, step: _Step, phase: str, reason: str, step_status: str,
                         *, bookings: list | None = None, **fields: Any) -> None:
        """Stop the saga for a person, booking ``bookings`` (movements that happened,
        from ``ManualReviewError.bookings``) in the same commit; bookings the ledger
        refuses are left out and the refusal is added to the reason."""
        event = "step.failed" if phase == "forward" else "undo.failed"

        def stop(why: str, booked: list | None) -> None:
            self._commit(phase=phase, step=step, step_status=step_status, error=why,
                         status=S.MANUAL_REVIEW, release=True, wake_in=None,
                         saga_error=why, inject=True, bookings=booked,
                         events=[(step.idx, event, {"error": why}),
                                 (None, "saga.manual_review", {"reason": why})], **fields)

        if bookings:
            try:
                return stop(reason, bookings)
            except ledger.LedgerError as exc:  # rolled back: stop without them
                reason = f"{reason}; booking refused: {exc}"
        stop(reason, None)

    def _keyed(self, ctx: LegContext, bookings: list[Booking] | tuple) -> list:
        specs, n = [], 0
        for booking in bookings:
            if booking.reference:
                key = f"{booking.kind}:{booking.reference}"
            else:
                key = ctx.idempotency_key if n == 0 else f"{ctx.idempotency_key}:{n}"
                n += 1
                if not settings.SAGA_STEP_KEYS:
                    key += f"@{self.fence}"  # test-only: a key per attempt
            specs.append(ledger.EntrySpec(
                idempotency_key=key, kind=booking.kind, lines=booking.lines,
                reference=booking.reference or self.saga.reference, saga_id=self.saga.id))
        return specs

    # -- faults --

    def _inject(self, step: _Step, phase: str, where: str) -> None:
        fail_at = (self.saga.input.get("faults") or {}).get("fail_at")
        specs = fail_at if isinstance(fail_at, list) else [fail_at] if fail_at else []
        for spec in specs:
            if spec.get("leg") != step.kind or spec.get("phase", "forward") != phase:
                continue
            mode = spec.get("mode")
            if where == "call":
                used = step.attempts if phase == "forward" else step.undo_attempts
                times = spec.get("times")
                if mode == "retryable" and (times is None or used < times):
                    raise InjectedFault(f"injected retryable fault at {step.kind}")
                if mode == "non_retryable":
                    raise NonRetryableError(f"injected at {step.kind}")
                if mode == "manual_review":
                    raise ManualReviewError(f"injected at {step.kind}")
            elif mode == f"crash_{where}" and self.recoveries < spec.get("times", 1):
                os.kill(os.getpid(), signal.SIGKILL)

    # -- the fenced commit --

    def _renew(self) -> None:
        sql = "UPDATE sagas SET lease_until = clock_timestamp() + make_interval(secs => " \
              "%(lease)s) WHERE id = %(id)s"
        if settings.SAGA_FENCING:
            sql += _FENCED
        with connection.cursor() as cur:
            cur.execute(sql, {"lease": settings.SAGA_LEASE_S, "id": self.saga.id,
                              "fence": self.fence, "worker": self.worker})
            if cur.rowcount != 1:
                raise StaleLeaseError(f"saga {self.saga.id}: lease of {self.worker} lost")

    def _commit(self, *, phase: str, step: _Step | None, status: str, release: bool,
                events: list, wake_in: float | None = None, step_status: str | None = None,
                bookings: list | None = None, inject: bool = False,
                crash_name: str | None = None, saga_error: str | None = None,
                next_in: float | None = None, **fields: Any) -> None:
        """One fenced transaction: guard, ledger entries, step row, events. Updates the
        in-memory state only once it committed."""
        new = None
        if step is not None:
            new = _Step(**{**step.__dict__, **fields})
            if step_status is not None:
                new.status = step_status
        name = crash_name or f"saga.{phase}.{step.idx if step else 'end'}"
        with transaction.atomic(), connection.cursor() as cur:
            guard = _Guard(self, cur, status=status, wake_in=wake_in, release=release,
                           error=saga_error)
            if bookings:
                ledger.post_many(entries=bookings, precondition=guard)
            guard()
            self._write(cur, new, events, next_in)
            if release and wake_in is not None and self.dispatch:
                _enqueue_after_commit(self.saga.id, wake_in)
            crash_point(f"{name}.before_commit")
            if inject and step is not None:
                self._inject(step, phase, "before_commit")
        crash_point(f"{name}.after_commit")
        if inject and step is not None:
            self._inject(step, phase, "after_commit")
        self.status = status
        if step is not None:
            step.__dict__.update(new.__dict__)  # callers hold this object: keep it current

    def _write(self, cur, step: _Step | None, events: list, next_in: float | None) -> None:
        params: list[Any] = []
        parts = []
        if step is not None:
            parts.append(
                "WITH step AS (UPDATE saga_steps SET status = %s, attempts = %s, "
                "undo_attempts = %s, intent = %s::jsonb, output = %s::jsonb, "
                "undo_output = %s::jsonb, error = %s, "
                "next_attempt_at = clock_timestamp() + make_interval(secs => %s), "
                "fence = %s, updated_at = clock_timestamp() "
                "WHERE saga_id = %s AND idx = %s) ")
            params += [step.status, step.attempts, step.undo_attempts, _json(step.intent),
                       _json(step.output), _json(step.undo_output), step.error, next_in,
                       self.fence, self.saga.id, step.idx]
        if events:
            parts.append("INSERT INTO saga_events (saga_id, idx, event, detail, worker, fence) "
                         "VALUES " + ", ".join(["(%s, %s, %s, %s::jsonb, %s, %s)"] * len(events)))
            for idx, event, detail in events:
                params += [self.saga.id, idx, event, _json(detail), self.worker, self.fence]
        elif step is not None:
            parts.append("SELECT 1")
        if parts:
            cur.execute("".join(parts), params)
