"""Operator actions on sagas stopped in ``manual_review`` (DESIGN.md §6: "Operators
close these in the admin, and every action is a saga_events row"). Shape and shared
rules: common/console.py.

Each service, in one transaction: a conditional UPDATE of the saga that only succeeds
while it is in ``manual_review`` (no worker can hold a lease then: the engine's
``_ACQUIRE`` only takes running or compensating sagas, so the UPDATE is the lock), the
step change if any, and one ``saga_events`` row (``event`` ``operator.*``, ``worker``
``operator:<username>``, ``detail`` with the operator, the note and what changed, at
the saga's current fence). After the commit the engine drives the saga
(``engine.run``) as any worker would: leases, fencing, reverse compensation and ledger
bookings stay the engine's. If that run is cut short, the beat sweep resumes the saga
(``wake_at`` is now).

Services, their permissions, and what they do:

- ``saga_resume`` (``sagas.resume_saga``): carry on in the direction it stopped.
- ``saga_retry_step`` (``sagas.retry_saga_step``): the same, with a fresh attempt
  budget for the step it stopped at.
- ``saga_compensate`` (``sagas.compensate_saga``): undo the completed steps, last to
  first.
- ``saga_close`` (``sagas.resolve_saga``): end it ``completed`` or ``compensated`` as
  settled outside Corridor; no run, no money, no booking.

Corridor itself acts through the same transactions when money arrives after a saga
stopped waiting for it (sagas/latemoney.py, worker ``system:late-money``):
``saga_auto_compensate`` (``auto.compensate``; also conditional on the reason it read),
``saga_review_evidence`` (``review.evidence``: the reason rewritten with what the chain
and the anchor say now), ``saga_reopen_funded`` (``auto.late_funding``: a late payment
booked in the reopening transaction), ``saga_review_late_money`` (``auto.review``) and
``saga_book_late_money`` (``auto.excess``, ``auto.excess_returned``: a second payment
under a reference, and its return, each booked with its audit row).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction

from common import locks
from common.console import (
    OperationRefused,
    Preview,
    clean_note,
    operator_name,
    require_permission,
)
from ledger import services as ledger
from sagas import engine
from sagas.models import Saga, SagaEvent, SagaStep

log = logging.getLogger(__name__)
S = Saga.Status
T = SagaStep.Status
CLOSE_OUTCOMES = (S.COMPLETED, S.COMPENSATED)

_REOPEN = """
UPDATE sagas SET status = %(status)s,
       wake_at = CASE WHEN %(run)s THEN clock_timestamp() ELSE NULL END,
       lease_owner = '', lease_until = NULL, recoveries = 0,
       error = CASE WHEN %(run)s THEN '' ELSE error END,
       updated_at = clock_timestamp()
 WHERE id = %(id)s AND status = 'manual_review'
RETURNING fence
"""


@dataclass
class _Stop:
    """Where a saga in manual_review stopped: ``direction`` (``running`` or
    ``compensating``), ``step`` (the step it stopped at, or None) and the steps."""

    saga: Saga
    direction: str
    step: SagaStep | None
    steps: list[SagaStep]


def _stop(saga_id: int) -> _Stop:
    saga = Saga.objects.filter(pk=saga_id).first()
    if saga is None:
        raise OperationRefused(f"saga {saga_id} does not exist")
    if saga.status != S.MANUAL_REVIEW:
        raise OperationRefused(f"saga is {saga.status}; operators act on sagas in "
                               "manual_review only")
    steps = list(SagaStep.objects.filter(saga=saga).order_by("idx"))
    compensating = any(s.status in (T.COMPENSATING, T.COMPENSATED) for s in steps) or \
        SagaEvent.objects.filter(saga=saga, event="saga.compensating").exists()
    if compensating:
        undo = [s for s in steps if s.status == T.COMPENSATING]
        return _Stop(saga, S.COMPENSATING, undo[-1] if undo else None, steps)
    forward = next((s for s in steps if s.status != T.DONE), None)
    return _Stop(saga, S.RUNNING, forward, steps)


def _reopen(stop: _Stop, *, status: str, run: bool, event: str, operator, note: str,
            detail: dict, step_sql: tuple[str, list] | None = None,
            system: str | None = None) -> None:
    """The one transaction of every saga action (see the module docstring).
    ``system``: the actor when Corridor itself acts (``system:<name>``, no operator);
    its change also needs the reason it decided on to be the saga's still."""
    idx = stop.step.idx if stop.step is not None else None
    with transaction.atomic(), connection.cursor() as cur:
        sql = _REOPEN if system is None else _REOPEN.replace(
            "AND status = 'manual_review'", "AND status = 'manual_review' AND error = %(was)s")
        cur.execute(sql, {"status": status, "run": run, "id": stop.saga.pk,
                          "was": stop.saga.error})
        row = cur.fetchone()
        if row is None:
            raise OperationRefused("the saga changed since it was checked")
        if step_sql is not None:
            cur.execute(*step_sql)
            if cur.rowcount != 1:
                raise OperationRefused("the step changed since it was checked")
        name = system or operator_name(operator)
        who = {"actor": name} if system else {"operator": name}
        cur.execute(
            "INSERT INTO saga_events (saga_id, idx, event, detail, worker, fence) "
            "VALUES (%s, %s, %s, %s::jsonb, %s, %s)",
            [stop.saga.pk, idx, event,
             json.dumps({**who, "note": note, "from": S.MANUAL_REVIEW,
                         "to": status, "reason": stop.saga.error, **detail},
                        cls=DjangoJSONEncoder),
             system or f"operator:{name}", row[0]])
        if system is not None and run:
            engine._enqueue_after_commit(stop.saga.pk, 0.0)


def _drive(saga_id: int, operator) -> Saga:
    """Run the saga now, as a worker would (outside any transaction)."""
    worker = f"operator:{operator_name(operator)}:{uuid.uuid4().hex[:12]}"
    try:
        engine.run(saga_id, worker)
    except Exception:  # the sweep resumes it; the operator's change is committed
        log.exception("saga %s: run after an operator action failed", saga_id)
    return Saga.objects.get(pk=saga_id)


def _evidence(stop: _Stop) -> list[tuple[str, object]]:
    saga = stop.saga
    return [("saga", f"{saga.pk} {saga.kind} {saga.reference}"), ("reason", saga.error),
            ("stopped while", "compensating" if stop.direction == S.COMPENSATING
             else "running forward"),
            ("at step", f"{stop.step.idx} {stop.step.kind} ({stop.step.status}, "
                        f"{stop.step.attempts} attempts, {stop.step.undo_attempts} undo "
                        f"attempts): {stop.step.error}" if stop.step else "(none)"),
            ("intent", stop.step.intent if stop.step and stop.step.intent else "(none)"),
            ("steps", [f"{s.idx} {s.kind} {s.status}" for s in stop.steps])]


def _intent_warning(stop: _Stop) -> str:
    step = stop.step
    if stop.direction == S.RUNNING and step is not None and step.intent is not None:
        return (f"Step {step.idx} ({step.kind}) committed an intent before it stopped: its "
                "money may have moved. Make sure it did not (or was returned) first.")
    return ""


def _preview(saga_id: int, will: list[str]) -> tuple[Preview, _Stop | None]:
    preview = Preview(will=will)
    try:
        stop = _stop(saga_id)
    except OperationRefused as exc:
        preview.refusal = str(exc)
        return preview, None
    preview.evidence = _evidence(stop)
    return preview, stop


# --- resume ----------------------------------------------------------------------------

def saga_resume_preview(*, saga_id: int) -> Preview:
    preview, stop = _preview(saga_id, [])
    direction = stop.direction if stop else "running"
    preview.will = [
        f"Set the saga back to {direction} (lease free, due now) and write one saga_events "
        "row with your name and note, in one transaction.",
        ("Then the engine compensates what is left, last to first." if direction ==
         S.COMPENSATING else "Then the engine runs the step it stopped at again, with the "
         "attempts it has left (its intent is kept: the leg looks for its own movement "
         "before making it), and carries on."),
    ]
    if stop and (warning := _intent_warning(stop)):
        preview.will.insert(0, warning)
    return preview


def saga_resume(*, saga_id: int, operator, note: str) -> Saga:
    """Carry on in the direction the saga stopped (forward, or compensating), steps as
    they are: ``manual_review`` -> ``running``/``compensating``, recoveries reset to 0
    (a saga stopped for too many takeovers gets a new budget), then ``engine.run``.
    Money moves only as the plan's legs move it. Raises OperationRefused."""
    require_permission(operator, "sagas.resume_saga")
    note = clean_note(note)
    stop = _stop(saga_id)
    _reopen(stop, status=stop.direction, run=True, event="operator.resume",
            operator=operator, note=note, detail={})
    return _drive(saga_id, operator)


# --- retry a step ------------------------------------------------------------------------

def saga_retry_step_preview(*, saga_id: int) -> Preview:
    preview, stop = _preview(saga_id, [])
    step = f"step {stop.step.idx} ({stop.step.kind})" if stop and stop.step else "the step"
    compensating = stop is not None and stop.direction == S.COMPENSATING
    preview.will = [
        f"Give {step} a fresh attempt budget ({'undo ' if compensating else ''}attempts "
        "to 0, error cleared, intent kept), set the saga back to "
        f"{'compensating' if compensating else 'running'} and write one saga_events row "
        "with your name and note, in one transaction.",
        f"Then the engine {'compensates' if compensating else 'runs'} {step} again and "
        "carries on.",
    ]
    if stop and stop.step is None:
        preview.refusal = "the saga did not stop at a step"
    if stop and (warning := _intent_warning(stop)):
        preview.will.insert(0, warning)
    return preview


def saga_retry_step(*, saga_id: int, operator, note: str, idx: int | None = None) -> Saga:
    """Retry the step the saga stopped at with a fresh attempt budget: forward, its
    ``attempts`` go back to 0 (status ``running`` if it committed an intent, which is
    kept so the leg finds its own movement first, DESIGN.md §6, else ``pending``);
    compensating, its ``undo_attempts`` go back to 0. ``idx``, when given, must be that
    step. Then as ``saga_resume``. Raises OperationRefused."""
    require_permission(operator, "sagas.retry_saga_step")
    note = clean_note(note)
    stop = _stop(saga_id)
    step = stop.step
    if step is None:
        raise OperationRefused("the saga did not stop at a step")
    if idx is not None and idx != step.idx:
        raise OperationRefused(f"the saga stopped at step {step.idx}, not {idx}")
    if stop.direction == S.COMPENSATING:
        sql = ("UPDATE saga_steps SET undo_attempts = 0, error = '', next_attempt_at = NULL, "
               "updated_at = clock_timestamp() "
               "WHERE saga_id = %s AND idx = %s AND status = %s AND undo_attempts = %s",
               [saga_id, step.idx, step.status, step.undo_attempts])
    else:
        status = T.RUNNING if step.intent is not None else T.PENDING
        sql = ("UPDATE saga_steps SET status = %s, attempts = 0, error = '', "
               "next_attempt_at = NULL, updated_at = clock_timestamp() "
               "WHERE saga_id = %s AND idx = %s AND status = %s AND attempts = %s",
               [status, saga_id, step.idx, step.status, step.attempts])
    _reopen(stop, status=stop.direction, run=True, event="operator.retry_step",
            operator=operator, note=note, step_sql=sql,
            detail={"idx": step.idx, "kind": step.kind, "step_status": step.status,
                    "attempts": step.attempts, "undo_attempts": step.undo_attempts,
                    "error": step.error})
    return _drive(saga_id, operator)


# --- compensate ----------------------------------------------------------------------------

def saga_compensate_preview(*, saga_id: int) -> Preview:
    preview, stop = _preview(saga_id, [])
    done = [f"{s.idx} {s.kind}" for s in (stop.steps if stop else [])
            if s.status in (T.DONE, T.COMPENSATING)]
    preview.will = [
        "Set the saga to compensating and write one saga_events row with your name and "
        "note, in one transaction.",
        "Then the engine undoes the completed steps last to first ("
        + (", ".join(reversed(done)) or "none: it ends compensated") + "), each with its "
        "own ledger booking. A step that did not complete is not undone.",
    ]
    if stop and (warning := _intent_warning(stop)):
        preview.will.insert(0, warning)
    return preview


def saga_compensate(*, saga_id: int, operator, note: str) -> Saga:
    """``manual_review`` -> ``compensating``: the engine undoes the steps that completed
    (``done``, or ``compensating`` after a failed undo), strictly last to first
    (invariant 4), each compensation booked under ``{saga_id}:{idx}:undo``. The step
    that stopped the saga is not undone: if it committed an intent, the operator must
    have made sure its money did not move. Raises OperationRefused."""
    require_permission(operator, "sagas.compensate_saga")
    note = clean_note(note)
    stop = _stop(saga_id)
    _reopen(stop, status=S.COMPENSATING, run=True, event="operator.compensate",
            operator=operator, note=note, detail={"stopped_while": stop.direction})
    return _drive(saga_id, operator)


# --- close as resolved ---------------------------------------------------------------------

def saga_close_preview(*, saga_id: int) -> Preview:
    preview, _ = _preview(saga_id, [
        "End the saga with the outcome you choose (completed: its effect happened; "
        "compensated: the money went back), settled outside Corridor. Nothing runs, no "
        "money moves and no ledger entry is written: book any correction separately.",
        "Write one saga_events row with your name, the outcome and your note, in the same "
        "transaction.",
    ])
    return preview


def saga_close(*, saga_id: int, outcome: str, operator, note: str) -> Saga:
    """Close a saga in ``manual_review`` as resolved outside Corridor: status
    ``outcome`` (``completed`` or ``compensated``), lease free, never due again; the
    audit row records that an operator, not the engine, ended it. Moves no money and
    books nothing. Raises OperationRefused."""
    require_permission(operator, "sagas.resolve_saga")
    note = clean_note(note)
    if outcome not in CLOSE_OUTCOMES:
        raise OperationRefused(f"outcome must be one of {', '.join(CLOSE_OUTCOMES)}")
    stop = _stop(saga_id)
    _reopen(stop, status=outcome, run=False, event="operator.close", operator=operator,
            note=note, detail={"outcome": outcome,
                               "steps": {s.idx: s.status for s in stop.steps}})
    return Saga.objects.get(pk=saga_id)


# --- Corridor itself: money that arrived after the saga stopped waiting -------------------

def saga_auto_compensate(*, saga_id: int, actor: str, reason_was: str, note: str,
                         evidence: dict) -> bool:
    """``manual_review`` -> ``compensating`` by Corridor itself (``actor``, e.g.
    ``system:late-money``), as ``saga_compensate`` does for an operator: one conditional
    UPDATE that succeeds only while the saga is still in manual_review for the very
    reason ``reason_was`` that the evidence resolves, and one ``saga_events`` row
    (``auto.compensate``, worker ``actor``, detail: the note, the reason and
    ``evidence``), in one transaction; its run is enqueued after the commit (the resume
    sweep picks it up otherwise). An operator who acted first wins: False, nothing
    written."""
    try:
        stop = _stop(saga_id)
        if stop.saga.error != reason_was:
            return False
        _reopen(stop, status=S.COMPENSATING, run=True, event="auto.compensate",
                operator=None, note=note, system=actor,
                detail={"stopped_while": stop.direction, "evidence": evidence})
    except OperationRefused:
        return False
    return True


def saga_review_evidence(*, saga_id: int, actor: str, reason_was: str, reason: str,
                         evidence: dict, bookings: list[ledger.EntrySpec] | None = None
                         ) -> bool:
    """Replace the review reason of a saga in ``manual_review`` with ``reason`` (what
    the evidence says now, so the queue never states what the chain contradicts), only
    while it is still ``reason_was``; one ``saga_events`` row ``review.evidence``
    (worker ``actor``, detail: both reasons and ``evidence``) and ``bookings`` (money
    that did arrive, keyed on its hash: a later compensation replays the same keys) in
    the same transaction. The saga stays where it is. False (nothing written) when the
    saga moved on."""
    if reason == reason_was:
        return False
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE sagas SET error = %s WHERE id = %s AND status = 'manual_review' "
                    "AND error = %s RETURNING fence", [reason, saga_id, reason_was])
        row = cur.fetchone()
        if row is None:
            return False
        if bookings:
            ledger.post_many(entries=bookings)
        cur.execute(
            "INSERT INTO saga_events (saga_id, idx, event, detail, worker, fence) "
            "VALUES (%s, NULL, 'review.evidence', %s::jsonb, %s, %s)",
            [saga_id, json.dumps({"actor": actor, "from": reason_was, "to": reason,
                                  "evidence": evidence}, cls=DjangoJSONEncoder),
             actor, row[0]])
    return True


def saga_reopen_funded(*, saga_id: int, actor: str, idx: int, output: dict,
                       booking: ledger.EntrySpec, evidence: dict) -> bool:
    """A saga that ended ``compensated`` because step ``idx`` never saw its money (an
    expired ``bridge.fill``) whose money arrived later: in ONE transaction, book the
    arrival (``booking``, keyed on its hash), mark the step ``done`` with ``output``,
    set the saga ``compensating`` (due now, lease free) and write one ``saga_events``
    row ``auto.late_funding`` (worker ``actor``, detail: ``evidence``); the engine then
    compensates the step as it would any (the refund to the sender goes through the
    hub's outbox, once). Conditional on the saga still being ``compensated`` and the
    step ``failed``; a booking already made (its key replayed) changes nothing. Returns
    whether it reopened the saga."""
    fence: list[int] = []
    try:
        with transaction.atomic(), connection.cursor() as cur:
            def reopen(balances=None) -> None:
                cur.execute(
                    "UPDATE sagas SET status = 'compensating', wake_at = clock_timestamp(), "
                    "lease_owner = '', lease_until = NULL, recoveries = 0, error = '', "
                    "updated_at = clock_timestamp() WHERE id = %s AND status = 'compensated' "
                    "RETURNING fence", [saga_id])
                row = cur.fetchone()
                if row is None:
                    raise OperationRefused("the saga changed since it was checked")
                fence.append(row[0])

            ledger.post_many(entries=[booking], precondition=reopen)
            if not fence:
                raise OperationRefused(f"{booking.idempotency_key} is booked already")
            cur.execute(
                "UPDATE saga_steps SET status = 'done', output = %s::jsonb, error = '', "
                "updated_at = clock_timestamp() WHERE saga_id = %s AND idx = %s "
                "AND status = 'failed'",
                [json.dumps(output, cls=DjangoJSONEncoder), saga_id, idx])
            if cur.rowcount != 1:
                raise OperationRefused("the step changed since it was checked")
            cur.execute(
                "INSERT INTO saga_events (saga_id, idx, event, detail, worker, fence) "
                "VALUES (%s, %s, 'auto.late_funding', %s::jsonb, %s, %s)",
                [saga_id, idx, json.dumps({"actor": actor, "from": S.COMPENSATED,
                                           "to": S.COMPENSATING, "evidence": evidence},
                                          cls=DjangoJSONEncoder), actor, fence[0]])
            engine._enqueue_after_commit(saga_id, 0.0)
    except OperationRefused:
        return False
    return True


def saga_review_late_money(*, saga_id: int, actor: str, reason: str, evidence: dict) -> bool:
    """A ``compensated`` saga whose money arrived later in a way Corridor cannot match
    on its own: ``manual_review`` with ``reason`` (the arrival's evidence), one
    ``saga_events`` row ``auto.review`` (worker ``actor``), in one transaction.
    Conditional on the saga still being ``compensated``; returns whether it moved."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE sagas SET status = 'manual_review', error = %s, wake_at = NULL, "
                    "updated_at = clock_timestamp() WHERE id = %s AND status = 'compensated' "
                    "RETURNING fence", [reason, saga_id])
        row = cur.fetchone()
        if row is None:
            return False
        cur.execute(
            "INSERT INTO saga_events (saga_id, idx, event, detail, worker, fence) "
            "VALUES (%s, NULL, 'auto.review', %s::jsonb, %s, %s)",
            [saga_id, json.dumps({"actor": actor, "from": S.COMPENSATED,
                                  "to": S.MANUAL_REVIEW, "reason": reason,
                                  "evidence": evidence}, cls=DjangoJSONEncoder),
             actor, row[0]])
    return True


def saga_book_late_money(*, saga_id: int, actor: str, event: str,
                         booking: ledger.EntrySpec, evidence: dict) -> bool:
    """Book money that moved beside a saga's own flow (``booking``, keyed on the
    payment's hash: e.g. a second payment under its reference, ``remittance.excess``, or
    its return, ``remittance.excess_return``) and one ``saga_events`` row ``event``
    (worker ``actor``, detail: ``evidence``, at the saga's current fence) in ONE
    transaction. The saga's status is not touched (the money is not the saga's).
    Returns whether it booked: False when the key was booked already (a replay: nothing
    written, the event included)."""
    booked: list[bool] = []
    with transaction.atomic(), connection.cursor() as cur:
        # Two sweeps on one payment: the second waits here, then finds the key booked
        # and writes no second audit row (tests/test_remittances.py two sweeps at once).
        locks.xact_lock(f"late-money:{booking.idempotency_key}")

        def audit(balances=None) -> None:
            cur.execute(
                "INSERT INTO saga_events (saga_id, idx, event, detail, worker, fence) "
                "SELECT id, NULL, %s, %s::jsonb, %s, fence FROM sagas WHERE id = %s",
                [event, json.dumps({"actor": actor, "booking": booking.idempotency_key,
                                    "evidence": evidence}, cls=DjangoJSONEncoder),
                 actor, saga_id])
            booked.append(cur.rowcount == 1)

        ledger.post_many(entries=[booking], precondition=audit)
    return bool(booked)
