"""PostgreSQL advisory locks: the one implementation every Corridor process uses
(the release and refund outboxes, the hub's one-payment-at-a-time turn, the sandbox
Horizon's ledger close).

A lock is named by a string or by a fixed integer key. ``lock_key`` turns a name into
the signed 64-bit key PostgreSQL takes (``pg_advisory_lock(bigint)``); an int is used
as it is. Two kinds (PostgreSQL docs, "Advisory Locks"):

- session level (``try_session_lock``, ``wait_session_lock``): held by the connection
  until released, across transactions, so that a drive whose HTTP calls run outside
  any transaction keeps other processes out; released on exit from the ``with``.
- transaction level (``xact_lock``): released by PostgreSQL at the transaction's
  commit or rollback; must be taken inside ``transaction.atomic``.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections


def lock_key(name: str | int) -> int:
    """The advisory-lock key of ``name``: an int is returned as it is (it must fit a
    signed bigint); a string maps to its CRC-32 (the key every outbox has used, so
    processes of two releases keep each other out during a deploy). A collision of two
    names only makes one of them wait or skip a turn, never run twice."""
    if isinstance(name, int):
        if not -(2 ** 63) <= name < 2 ** 63:
            raise ValueError(f"advisory-lock key {name} does not fit a bigint")
        return name
    return zlib.crc32(name.encode())


def _select(using: str, function: str, key: int):
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s)", [key])
        return cursor.fetchone()[0]


def _unlock(using: str, key: int) -> None:
    _select(using, "pg_advisory_unlock", key)


@contextmanager
def try_session_lock(name: str | int, *, using: str = DEFAULT_DB_ALIAS) -> Iterator[bool]:
    """Try a session-level advisory lock on ``name`` without waiting; yields whether it
    was taken and, if so, releases it on exit. Used to keep two drives of one outbox
    row apart across processes while HTTP calls run outside any transaction."""
    key = lock_key(name)
    got = bool(_select(using, "pg_try_advisory_lock", key))
    try:
        yield got
    finally:
        if got:
            _unlock(using, key)


class LockTimeout(Exception):
    """``wait_session_lock`` did not get the lock within its ``timeout``."""


@contextmanager
def wait_session_lock(name: str | int, *, timeout: float, poll: float = 0.05,
                      while_waiting: Callable[[], None] | None = None,
                      using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Take a session-level advisory lock on ``name``, polling ``pg_try_advisory_lock``
    every ``poll`` s for at most ``timeout`` s (then raises ``LockTimeout``), calling
    ``while_waiting()`` between tries (a saga renews its lease there, so waiting never
    costs it its fence); released on exit. Polling rather than ``pg_advisory_lock``
    keeps the wait bounded and the caller's lease alive."""
    key = lock_key(name)
    deadline = time.monotonic() + timeout
    while not _select(using, "pg_try_advisory_lock", key):
        if time.monotonic() > deadline:
            raise LockTimeout(f"advisory lock {name!r} not taken within {timeout}s")
        if while_waiting is not None:
            while_waiting()
        time.sleep(poll)
    try:
        yield
    finally:
        _unlock(using, key)


def xact_lock(name: str | int, *, shared: bool = False,
              using: str = DEFAULT_DB_ALIAS) -> None:
    """Wait for a transaction-level advisory lock on ``name`` (``shared``: many holders
    at once, none while an exclusive holder has it); PostgreSQL releases it at the end
    of the current transaction, so call it inside ``transaction.atomic(using=...)``."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    _select(using, function, lock_key(name))
