"""One dedupe-and-apply service for at-least-once deliveries (issue 10 §5): AP's events
go through :func:`record` (the outcome is known without reading the database); the
Razorpay payment webhooks (anchor/callbacks.py) and the RazorpayX payout webhooks
(payouts/views.py) through :func:`store` (issue 11 §3): the verified body is stored in
one INSERT and the drain applies it, in its claim transaction, once (below);
:func:`record_and_apply` applies in the caller's transaction.

The dedupe row (``inbound_events``, unique on source + event id, DESIGN.md §3) and the
event's effect commit in ONE transaction: a crash or an exception between the two
rolls both back, so the sender's redelivery is applied (never taken for a
duplicate), and a replay finds the row and applies nothing. A concurrent duplicate
blocks on the unique index until the first delivery commits (then it is a
duplicate) or rolls back (then it applies). ``apply`` therefore runs with that row
locked: it may make bounded outbound calls (every client has a timeout).

**The row is the queue** (issue 11 §3). What the effect hands to a worker (release a
deposit, confirm a payment) is asked for with :func:`follow_up`, which stores the task
on the delivery's own row (``follow_ups``) in the same transaction, instead of a
Celery publish on the request's path. After the commit the request only sets a flag:
a per-process thread (:func:`wake`) publishes one ``anchor.tasks.inbound_drain``
wake-up at most every ``INBOUND_WAKE_MIN_INTERVAL_S``, on Celery's pooled broker
connection. The drain (:func:`drain`) claims waiting rows with ``FOR UPDATE SKIP
LOCKED``, publishes their follow-ups and marks them ``processed_at`` in one
transaction, so each row's follow-ups go out once however many drains run. The beat
runs the drain every ``INBOUND_SWEEP_PERIOD_S`` too: a lost wake-up (process killed
after the 2xx, broker down) delays a follow-up by one period, never loses it.
A crash between the publish and the drain's commit publishes again: every follow-up
task is idempotent (release claim, payment confirmation), as Celery tasks must be.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from anchor.models import InboundEvent

log = logging.getLogger(__name__)

DUPLICATE = "duplicate"

# The follow-ups of the delivery being applied (None outside record_and_apply and the
# drain's apply of a stored webhook).
_follow_ups: ContextVar[list | None] = ContextVar("inbound_follow_ups", default=None)


_TASK_NAMES: dict[int, tuple[object, str]] = {}


def _task_name(task) -> str:
    """``task.name``, looked up once per task object: a module's ``shared_task`` is a
    proxy that resolves the task through the app on every attribute read (a tenth of
    an AP callback's time). The entry keeps the object, so its id is never reused."""
    if isinstance(task, str):  # a task of an app above anchor, named (DESIGN.md §2)
        return task
    entry = _TASK_NAMES.get(id(task))
    if entry is None or entry[0] is not task:
        entry = _TASK_NAMES[id(task)] = (task, task.name)
    return entry[1]


def follow_up(task, *args) -> None:
    """Ask for ``task(*args)`` once the current transaction commits. Inside
    :func:`record_and_apply`, or a stored webhook's apply run by :func:`drain`, the task
    is stored on the delivery's row and dispatched by the drain; anywhere else it is
    published after commit (``transaction.on_commit``), as before. ``task``: a Celery
    task; ``args``: JSON-serialisable (ids). Call it after the writes it follows, in the same
    (sub)transaction: a follow-up stored before a savepoint that then rolls back
    stays asked for (the task must, and does, check the rows it acts on)."""
    pending = _follow_ups.get()
    if pending is None:
        transaction.on_commit(lambda: task.delay(*args))
    else:
        pending.append([_task_name(task), list(args)])


_INSERT = (
    "INSERT INTO inbound_events (source, event_id, event_type, received_at, outcome, "
    "reason, follow_ups, body) VALUES (%s, %s, %s, %s, %s, '', %s::jsonb, %s) "
    "ON CONFLICT (source, event_id) DO NOTHING RETURNING id")


def _insert(*, source: str, event_id: str, event_type: str, outcome: str,
            follow_ups: list | None, body: str | None = None) -> int | None:
    """One INSERT, no savepoint: the id, or None when (source, event_id) is already
    recorded (committed; an in-flight one is waited for by PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(_INSERT, [source, event_id, event_type, timezone.now(),
                                 str(outcome)[:200],
                                 json.dumps(follow_ups) if follow_ups else None, body])
        found = cursor.fetchone()
    return found[0] if found else None


def record(*, source: str, event_id: str, event_type: str, outcome: str,
           follow_ups: list[tuple] = (), body: str | None = None) -> str:
    """Record delivery ``(source, event_id)`` whose outcome does not depend on the
    database (an AP event: ``release_scheduled`` or ``ignored``), with its follow-ups
    (``(task, *args)`` tuples), in ONE statement (``INSERT ... ON CONFLICT DO
    NOTHING``): in autocommit it is durable when this returns. Returns ``outcome``, or
    ``"duplicate"`` (and stores nothing) when the delivery was recorded before."""
    stored = [[_task_name(task), list(args)] for task, *args in follow_ups]
    if _insert(source=source, event_id=event_id, event_type=event_type, outcome=outcome,
               follow_ups=stored, body=body) is None:
        return DUPLICATE
    if stored:
        transaction.on_commit(wake)
    return outcome


# A stored follow-up named APPLY + "<module>.<function>" is not a task: the drain
# calls ``function(event)`` (the parsed stored body) itself, in its claim transaction.
APPLY = "apply:"
RECEIVED = "received"


def store(*, source: str, event_id: str, event_type: str, body: bytes, apply: str) -> str:
    """Record a verified provider webhook for the drain to apply: ONE ``INSERT ... ON
    CONFLICT DO NOTHING`` of the row with its raw ``body`` (already verified, strict
    JSON whose fields fit their columns) and the follow-up ``APPLY + apply`` (the
    dotted path of ``function(event) -> outcome``, which may ask for follow-ups with
    :func:`follow_up` and may raise to be tried again by a later drain). Durable when
    this returns (autocommit). Returns ``"received"``, or ``"duplicate"`` when the
    delivery was recorded before."""
    return record(source=source, event_id=event_id, event_type=event_type,
                  outcome=RECEIVED, follow_ups=[(APPLY + apply,)],
                  body=body.decode("utf-8"))


def record_and_apply(*, source: str, event_id: str, event_type: str,
                     apply: Callable[[], str]) -> str:
    """Record delivery ``(source, event_id)`` and run ``apply()`` in one transaction.

    ``source``: an ``InboundEvent.Source`` value (ap, razorpay, razorpayx);
    ``event_id``, ``event_type``: already checked to fit their columns
    (``callbacks.event_id_checked``). ``apply`` returns the outcome (text, kept in
    ``inbound_events.outcome``, cut to 200 characters) and asks for work after the
    commit with :func:`follow_up`. Returns ``"duplicate"`` without calling ``apply``
    when the delivery was recorded before, else the outcome. Whatever ``apply`` raises
    propagates and leaves no row. Call it outside any open transaction: inside one, a
    rollback of the caller would also drop the row."""
    pending: list = []
    token = _follow_ups.set(pending)
    try:
        with transaction.atomic():
            pk = _insert(source=source, event_id=event_id, event_type=event_type,
                         outcome="received", follow_ups=None)
            if pk is None:
                return DUPLICATE
            outcome = apply()
            with connection.cursor() as cursor:  # by primary key, no ORM compile
                cursor.execute("UPDATE inbound_events SET outcome = %s, follow_ups = "
                               "%s::jsonb WHERE id = %s",
                               [str(outcome)[:200],
                                json.dumps(pending) if pending else None, pk])
            if pending:
                transaction.on_commit(wake)
    finally:
        _follow_ups.reset(token)
    return outcome


def _dispatch(name: str, args: list, producer=None) -> None:
    """Publish one stored follow-up (Celery's routes apply, by task name), on
    ``producer`` when given (one pooled broker connection for a whole batch)."""
    from celery import current_app

    current_app.send_task(name, args=args, producer=producer)


def waiting_events():
    """The rows whose follow-ups wait for a drain, oldest first (through
    ``inbound_events_waiting_idx``; the periodic registry checks its plan)."""
    return InboundEvent.objects.filter(follow_ups__isnull=False,
                                       processed_at__isnull=True).order_by("id")


class _ApplyFailed(Exception):
    """Internal: an apply raised; the batch's transaction is rolled back and claimed
    again without that row."""


def drain(*, batch: int | None = None) -> int:
    """Dispatch every waiting follow-up once: claim up to ``batch`` (default
    ``INBOUND_DRAIN_BATCH``) rows with follow-ups and no ``processed_at`` (``FOR
    UPDATE SKIP LOCKED``, oldest first, through the partial index), apply the stored
    webhooks among them (:func:`store`), publish their tasks, and in ONE UPDATE mark
    them processed, with each applied row's outcome and the follow-ups its effect asked
    for; commit; repeat until none waits. The effects and the rows' processing commit
    together, once. Rows another drain holds are skipped, not waited for. An apply that
    raises (RazorpayX unreachable, ...) rolls the batch back, and the batch is claimed
    again without that row, which waits, untouched, for a later drain (the beat
    sweep). Returns the number of rows dispatched. A publish that raises (broker down)
    rolls the batch back: it waits for the next drain, its applies with it."""
    from celery import current_app

    batch = batch or settings.INBOUND_DRAIN_BATCH
    done = 0
    failed: set[int] = set()
    while True:
        try:
            with transaction.atomic():
                waiting = waiting_events()
                if failed:
                    waiting = waiting.exclude(pk__in=failed)
                if settings.INBOUND_DRAIN_CLAIM:
                    waiting = waiting.select_for_update(skip_locked=True)
                rows = list(waiting.values_list("id", "source", "event_id", "follow_ups",
                                                "body")[:batch])
                ready: list[tuple[int, list, str | None]] = []
                for pk, source, event_id, follow_ups, body in rows:
                    outcome = None
                    if any(name.startswith(APPLY) for name, _args in follow_ups):
                        outcome, follow_ups = _apply_stored(pk, source, event_id,
                                                            follow_ups, body)
                    ready.append((pk, follow_ups, outcome))
                if ready:
                    # One broker connection for the batch, and its messages sent in
                    # one Redis pipeline (kombu's Producer.batch: flushed when the
                    # block exits, discarded if it raises), not one LPUSH each.
                    with current_app.producer_or_acquire() as producer, \
                            _publish_batch(producer):
                        for _pk, follow_ups, _outcome in ready:
                            for name, args in follow_ups:
                                _dispatch(name, args, producer)
                    _mark_processed(ready)
        except _ApplyFailed as exc:
            failed.add(exc.args[0])
            continue
        done += len(ready)
        if len(rows) < batch:
            return done


def _publish_batch(producer):
    """``producer.batch()`` where kombu offers it (5.7+; immediate publishes on
    transports without batches), else a no-op context."""
    import contextlib

    batch = getattr(producer, "batch", None)
    return batch(max_size=settings.INBOUND_DRAIN_BATCH * 4) if batch else \
        contextlib.nullcontext()


def _mark_processed(ready: list[tuple[int, list, str | None]]) -> None:
    """ONE UPDATE: every row of ``ready`` processed now; an applied one (outcome not
    None) with its outcome and the follow-ups its effect asked for."""
    values = ", ".join(["(%s::bigint, %s::text, %s::jsonb)"] * len(ready))
    params: list = []
    for pk, follow_ups, outcome in ready:
        params += [pk, None if outcome is None else str(outcome)[:200],
                   None if outcome is None else json.dumps(follow_ups)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE inbound_events AS e SET processed_at = %s, "
            f"outcome = coalesce(v.outcome, e.outcome), "
            f"follow_ups = coalesce(v.follow_ups, e.follow_ups) "
            f"FROM (VALUES {values}) AS v (id, outcome, follow_ups) WHERE e.id = v.id",
            [timezone.now(), *params])


def _apply_stored(pk: int, source: str, event_id: str, follow_ups: list,
                  body: str | None) -> tuple[str, list]:
    """Apply the stored webhook of row ``pk`` (its ``APPLY`` follow-ups) inside the
    drain's transaction. Returns (outcome, the follow-ups to publish: the row's other
    ones and those the effect asked for). Raises _ApplyFailed (logged) when the apply
    raised: the caller rolls the batch back and the row waits for a later drain."""
    from django.utils.module_loading import import_string
    from structlog import contextvars

    pending: list = []
    token = _follow_ups.set(pending)
    # An apply may bind log context (transaction_id): for its own lines only.
    saved = contextvars.get_contextvars()
    contextvars.bind_contextvars(inbound_source=source, inbound_event_id=event_id)
    try:
        event = json.loads(body or "{}")
        outcome = ""
        for name, args in follow_ups:
            if name.startswith(APPLY):
                outcome = import_string(name[len(APPLY):])(event)
            else:
                pending.append([name, args])
        log.info("webhook applied", extra={"source": source, "outcome": str(outcome)})
    except Exception as exc:
        log.warning("stored %s event %s not applied yet (%s: %s); a later drain tries "
                    "again", source, event_id, type(exc).__name__, exc)
        raise _ApplyFailed(pk) from exc
    finally:
        _follow_ups.reset(token)
        contextvars.clear_contextvars()
        contextvars.bind_contextvars(**saved)
    return outcome, pending


class _Waker:
    """The per-process publisher of drain wake-ups (a daemon thread, started on first
    use in each process, so a forked gunicorn worker gets its own). ``wake()`` only
    sets a flag; the thread publishes at most one wake-up per
    ``INBOUND_WAKE_MIN_INTERVAL_S`` however many requests set it meanwhile."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = None
        self._flag = threading.Event()

    def wake(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._flag = threading.Event()
                    threading.Thread(target=self._run, args=(self._flag,),
                                     name="inbound-wake", daemon=True).start()
                    self._pid = os.getpid()
        self._flag.set()

    @staticmethod
    def _run(flag: threading.Event) -> None:
        from anchor import tasks

        while True:
            flag.wait()
            flag.clear()
            try:
                tasks.inbound_drain.apply_async(ignore_result=True)
            except Exception as exc:  # the beat sweep drains anyway
                log.warning("inbound drain wake-up not published: %s", exc)
            time.sleep(settings.INBOUND_WAKE_MIN_INTERVAL_S)


_waker = _Waker()


def wake() -> None:
    """Ask a worker to drain soon; returns at once (no I/O on the caller's thread)."""
    _waker.wake()
