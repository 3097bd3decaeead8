"""Count the database commits that wrote something, on this thread's connection.

A write outside ``atomic`` is its own commit; writes inside one transaction count once,
and only if that transaction committed (``txid_status``). Reads never count."""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection

WRITES = ("INSERT", "UPDATE", "DELETE")


@contextmanager
def count_write_commits():
    state = {"autocommit_writes": 0, "xids": set()}

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().split(None, 1)[0].upper() in WRITES:
            conn = context["connection"]
            if not conn.in_atomic_block:
                state["autocommit_writes"] += 1
            else:
                with conn.connection.cursor() as raw:
                    raw.execute("SELECT txid_current_if_assigned()")
                    xid = raw.fetchone()[0]
                if xid is not None:
                    state["xids"].add(xid)
        return result

    counter = {"commits": 0}
    with connection.execute_wrapper(wrapper):
        yield counter
    committed = 0
    with connection.cursor() as cursor:
        for xid in state["xids"]:
            cursor.execute("SELECT txid_status(%s)", [xid])
            committed += cursor.fetchone()[0] == "committed"
    counter["commits"] = state["autocommit_writes"] + committed
