"""corridor.failover: a failover to a streaming standby really loses the commits made
after its WAL receipt was cut, and keeps those it received but had not replayed yet
(its ``recovery_min_apply_delay`` ends at promotion). Throwaway servers of their own
(never the suite's), so the kill and the promotion touch nothing else."""

from __future__ import annotations

import psycopg
import pytest

from corridor import failover
from corridor.processes import free_port

pytestmark = pytest.mark.slow


def _rows(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY id").fetchall()]


def _insert(url: str, value: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO t (v) VALUES (%s)", [value])


@pytest.fixture
def primary(tmp_path):
    server = failover.Server(tmp_path / "primary", free_port())
    failover.initdb(server)
    server.start()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE app")
    with psycopg.connect(server.url("app"), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)")
    yield server
    server.stop("immediate")
    failover.Server(tmp_path / "standby", 0).stop("immediate")


def test_a_failover_loses_what_the_standby_had_not_received(primary, tmp_path):
    # given a streaming standby that replays 2 s behind, and a row it has received
    _insert(primary.url("app"), "before")
    standby = failover.standby_start(source=primary, data=tmp_path / "standby",
                                     port=free_port(), apply_delay_s=2)
    _insert(primary.url("app"), "received, not replayed")
    with psycopg.connect(primary.url(), autocommit=True) as conn:
        sent = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    for _ in range(100):  # the standby has it on disk (received), replay waits 2 s
        with psycopg.connect(standby.url(), autocommit=True) as conn:
            if conn.execute("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn",
                            [sent]).fetchone()[0]:
                break
        import time
        time.sleep(0.1)
    assert _rows(standby.url("app")) == ["before"]  # not replayed yet

    # when it is cut, the primary commits one more row and a second, then dies
    report = failover.fail_over(
        source=primary, standby=standby, lose_s=1.0, watch=("app",),
        after_cut=lambda: [_insert(primary.url("app"), v) for v in ("lost 1", "lost 2")])

    # then the server on the primary's port is the promoted standby, without those rows
    assert _rows(primary.url("app")) == ["before", "received, not replayed"]
    with psycopg.connect(primary.url(), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0] is False
    _insert(primary.url("app"), "after")  # and takes writes
    assert report.marks_written >= 5 and report.marks_lost == report.marks_written
    assert report.rows_lost == {"app.t": 2}
    assert report.lost_ids == {"app.t": ["3", "4"]}
    assert not (tmp_path / "primary.discarded").exists()
    assert not (tmp_path / "standby").exists()
