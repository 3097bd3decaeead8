"""The test database as a promoted standby leaves it: every commit after a point lost.

A failover to an asynchronous standby (corridor/failover.py) keeps a prefix of the
primary's commits. ``mark()`` records every row of the test database; ``rewind(mark)``
puts back exactly those rows (rows inserted since are deleted, rows updated or deleted
since are restored), as a standby cut at the mark would hold them. The outside world (the
sandbox: Horizon, AP, RazorpayX, Razorpay) keeps everything, as it does in a real
failover. Deterministic where the real failover (tests/test_failover.py, ``manage.py
chaos``) is timed; sequences are left where they are (a promoted standby may also be
ahead: sequences are WAL-logged in batches).
"""

from __future__ import annotations

from django.db import connection

Mark = dict[str, dict[str, str]]


def _tables(cursor) -> list[str]:
    cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                   "AND tablename <> 'django_migrations'")
    return [r[0] for r in cursor.fetchall()]


def mark() -> Mark:
    """Every row of every table: md5 of its text -> the row as JSON."""
    with connection.cursor() as cursor:
        out: Mark = {}
        for table in _tables(cursor):
            cursor.execute(f'SELECT md5(t::text), to_jsonb(t)::text FROM "{table}" t')
            out[table] = dict(cursor.fetchall())
        return out


def rewind(to: Mark) -> dict[str, int]:
    """Lose every commit made since ``to``; returns per table how many row versions
    changed (deleted plus restored). Triggers and foreign keys are off while it writes
    (``session_replication_role = replica``), as WAL replay does not run them either."""
    changed: dict[str, int] = {}
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            for table in _tables(cursor):
                cursor.execute(f'SELECT md5(t::text) FROM "{table}" t')
                now = {r[0] for r in cursor.fetchall()}
                then = to.get(table, {})
                for digest in now - then.keys():
                    cursor.execute(f'DELETE FROM "{table}" t WHERE md5(t::text) = %s',
                                   [digest])
                for digest in then.keys() - now:
                    cursor.execute(f'INSERT INTO "{table}" SELECT * FROM '
                                   f'jsonb_populate_record(NULL::"{table}", %s::jsonb)',
                                   [then[digest]])
                n = len(now ^ then.keys())
                if n:
                    changed[table] = n
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
    return changed
