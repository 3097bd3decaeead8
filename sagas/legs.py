"""The leg contract (DESIGN.md §6):

    Leg:        kind; forward(ctx) -> LegOutcome | Pending;
                compensate(ctx, output) -> LegOutcome | Pending; max_attempts; backoff_ms
    LegOutcome: output (JSON, stored on the step, passed to later legs and to compensate);
                bookings (ledger entries posted in the commit that records the result)
    Pending:    "not yet": rescheduled after retry_after seconds, uses no attempt; the
                leg owns its own deadline (it raises when the wait is over)
    Errors:     any other exception is retryable (max_attempts, backoff_ms doubling);
                NonRetryableError -> compensate now; ManualReviewError -> stop, no
                compensation; StaleLeaseError -> this worker lost the saga

Rules a leg must keep:

- Work outside the database is idempotent under ``ctx.idempotency_key``
  (``{saga_id}:{idx}``, compensations ``{saga_id}:{idx}:undo``): the step, not the
  attempt, is the key (ledger-and-sagas.md §7 rule 2).
- A leg that moves money outside Corridor first commits its intent with
  ``ctx.commit_intent({...})`` (what, to whom, under which reference), then looks for
  the movement by that reference before making it (§1.1 atomic phases, §7 rule 3).
  That costs a second commit; ledger-only legs make exactly one.
- Never swallow ``StaleLeaseError``; call ``ctx.renew_lease()`` during long waits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ledger.services import Line


class NonRetryableError(Exception):
    """A definite failure: no retry can fix it. Forward: compensate the completed legs
    now. In a compensation: the saga goes to manual_review."""


class ManualReviewError(Exception):
    """Stop for a person: money has left Corridor's control (for example an anchor
    failing a payout it was funded for). No retry, no compensation.

    ``bookings``: movements that did happen and are booked in the same commit as the
    stop (an anchor that refunded more than it was paid: the hub holds what arrived,
    so the ledger books it and the excess shows as owed back)."""

    def __init__(self, message: str, *, bookings: Sequence[Booking] = ()) -> None:
        super().__init__(message)
        self.bookings = list(bookings)


class StaleLeaseError(Exception):
    """This worker's fence is no longer the saga's: another worker took the lease over.
    Raised by every fenced commit before it writes anything (ledger-and-sagas.md §1.3)."""


@dataclass(frozen=True)
class Booking:
    """A ledger entry to post with the leg's result. ``reference``: the external
    reference of the movement (a Stellar transaction hash, a SEP-31 id); when set, the
    entry is keyed ``{kind}:{reference}``, otherwise on the step's idempotency key."""

    kind: str
    lines: Sequence[Line]
    reference: str = ""


@dataclass(frozen=True)
class LegOutcome:
    output: dict[str, Any] = field(default_factory=dict)
    bookings: Sequence[Booking] = ()


@dataclass(frozen=True)
class Pending:
    """Not yet: try again in ``retry_after`` seconds, without using an attempt."""

    retry_after: float
    reason: str = ""


@dataclass(frozen=True)
class SagaInfo:
    id: int
    kind: str
    reference: str
    input: dict[str, Any]
    stellar_cursor: str


@dataclass
class LegContext:
    """What a leg sees. ``outputs[i]`` is the output of step i once it is done (None
    before); ``intent`` is what this step committed with ``commit_intent`` in an
    earlier attempt (None if nothing). ``attempt`` counts from 1."""

    saga: SagaInfo
    idx: int
    leg: str
    idempotency_key: str
    outputs: list[dict[str, Any] | None]
    attempt: int
    intent: dict[str, Any] | None
    worker: str
    compensating: bool = False
    step_kinds: list[str] = field(default_factory=list)
    _intent_committed: bool = False
    _renew: Callable[[], None] | None = None
    _commit_intent: Callable[[dict[str, Any]], None] | None = None

    @property
    def stellar_cursor(self) -> str:
        return self.saga.stellar_cursor

    @property
    def faults(self) -> dict[str, Any]:
        return self.saga.input.get("faults") or {}

    def output_of(self, kind: str) -> dict[str, Any] | None:
        """The output of the (first) done step of leg kind ``kind``."""
        for step_kind, output in zip(self.step_kinds, self.outputs, strict=True):
            if step_kind == kind:
                return output
        return None

    def renew_lease(self) -> None:
        """Extend this worker's lease; raises StaleLeaseError if it was lost."""
        if self._renew is not None:
            self._renew()

    def commit_intent(self, intent: dict[str, Any]) -> dict[str, Any]:
        """Commit ``intent`` on the step (fenced; counts an attempt) before an external
        side effect, and return it. A retry finds it in ``ctx.intent``."""
        if self._commit_intent is None:
            raise RuntimeError("commit_intent is for forward legs")
        self._commit_intent(intent)
        self.intent = intent
        return intent


class Leg:
    """Base class of a leg. ``max_attempts``/``backoff_ms`` None -> the settings
    SAGA_DEFAULT_MAX_ATTEMPTS / SAGA_DEFAULT_BACKOFF_MS. Retry n waits
    backoff_ms * 2**(n-1), capped at SAGA_BACKOFF_MAX_S."""

    kind: ClassVar[str] = ""
    max_attempts: ClassVar[int | None] = None
    backoff_ms: ClassVar[int | None] = None

    def forward(self, ctx: LegContext) -> LegOutcome | Pending:
        raise NotImplementedError

    def compensate(self, ctx: LegContext, output: dict[str, Any]) -> LegOutcome | Pending:
        """Undo a completed forward. Default: nothing to undo."""
        return LegOutcome()


@dataclass(frozen=True)
class Plan:
    """A saga kind: its legs, in order."""

    kind: str
    legs: tuple[Leg, ...]
