"""Declared status machines for the outbox and guard tables (issue 10 §5).

A model that mixes in :class:`StatusMachine` declares ``TRANSITIONS = {from: {to, ...}}``
and changes ``status`` only through :meth:`StatusMachine.transition`: the pair (from,
to) is checked against the table before the database is touched (a pair not in the
table raises :class:`IllegalTransition`), then one conditional ``UPDATE ... WHERE pk =
%s AND status IN (from...)`` moves the row, and its row count says whether it moved
(STYLE.md "write as if another copy runs at the same moment": no read-modify-write on
a stale copy). Importable from ``anchor`` and ``payouts`` alike (the import arrow
``sagas -> payouts -> anchor -> ledger``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from django.db.models import Q
from django.utils import timezone


class IllegalTransition(ValueError):
    """A status change the model's ``TRANSITIONS`` table does not allow; raised before
    anything is written."""


class TransitionLost(RuntimeError):
    """A required transition moved no row: the status changed underneath (another
    worker or an operator got there first), so nothing was written."""


class StatusMachine:
    """Mixin for a model with a ``status`` field, a ``TRANSITIONS`` table and (by
    convention) an ``updated_at`` column, which every transition stamps.
    ``RESET_ON_TRANSITION`` names fields set to the given value by every transition
    unless the caller passes them (for example a failure code that belongs to one
    status only)."""

    TRANSITIONS: ClassVar[Mapping[str, frozenset[str]]] = {}
    RESET_ON_TRANSITION: ClassVar[Mapping[str, Any]] = {}
    # Statuses whose ``last_error`` is the reason the operators' queue shows
    # (sagas.ReviewItem): :meth:`note` never writes over it.
    REASON_STATUSES: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def note(cls, pk: int, error: str) -> bool:
        """Record on row ``pk`` why a drive stopped (``last_error``, cut to 2000
        characters; ``updated_at`` bumped, so an age-based sweep looks again later),
        unless the row is in one of ``REASON_STATUSES``: a late note, from a call that
        began before the row went there, must not replace the reason a person reads
        (``make chaos`` found a failed payout shown as "outcome unknown"). Returns
        whether it wrote."""
        rows = cls.objects.filter(pk=pk).exclude(status__in=cls.REASON_STATUSES)
        return rows.update(last_error=error[:2000], updated_at=timezone.now()) == 1

    @classmethod
    def check_transition(cls, from_statuses: Iterable[str], to: str) -> tuple[str, ...]:
        """The ``from_statuses`` as a tuple once every (from, to) is in the table.
        Raises IllegalTransition naming the first pair that is not."""
        sources = (from_statuses,) if isinstance(from_statuses, str) else tuple(from_statuses)
        if not sources:
            raise IllegalTransition(f"{cls.__name__}: no from status given for -> {to}")
        for source in sources:
            if to not in cls.TRANSITIONS.get(source, ()):
                raise IllegalTransition(
                    f"{cls.__name__}: {source} -> {to} is not a declared transition "
                    f"(allowed from {source}: {sorted(cls.TRANSITIONS.get(source, ())) or 'none'})")
        return sources

    @classmethod
    def sources_of(cls, to: str) -> tuple[str, ...]:
        """Every status the table lets move to ``to``."""
        return tuple(s for s, targets in cls.TRANSITIONS.items() if to in targets)

    @classmethod
    def transition(cls, pk: int, from_statuses: Iterable[str] | str, to: str, *,
                   where: Q | None = None, require: bool = False, **fields: Any) -> bool:
        """Move row ``pk`` from one of ``from_statuses`` to ``to`` with one conditional
        UPDATE, also writing ``fields`` (values or expressions such as ``F()``) and
        ``updated_at``; ``where`` adds conditions (for example the stored hash).
        Returns True when the row moved, False when it did not (its status or a
        ``where`` condition no longer held: nothing was written). Raises
        IllegalTransition (before any write) for a pair not in ``TRANSITIONS``, and
        TransitionLost instead of returning False when ``require``."""
        sources = cls.check_transition(from_statuses, to)
        values = {**cls.RESET_ON_TRANSITION, **fields, "status": to}
        values.setdefault("updated_at", timezone.now())
        rows = cls.objects.filter(pk=pk, status__in=sources)
        if where is not None:
            rows = rows.filter(where)
        moved = rows.update(**values) == 1
        if require and not moved:
            raise TransitionLost(f"{cls.__name__} {pk}: not in {list(sources)} any more; "
                                 f"{to} not applied")
        return moved
