"""PostgreSQL advisory locks shared by the outboxes (releases, refunds)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def try_session_lock(name: str) -> Iterator[bool]:
    """Try a session-level advisory lock on ``name``; yields whether it was taken and
    releases it on exit. Used to keep two drives of one outbox row apart across
    processes while HTTP calls run outside any transaction."""
    key = zlib.crc32(name.encode())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        got = cursor.fetchone()[0]
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
