"""Bench part ``periodic`` (issue 11 §2): every periodic query costs the same at 1M
finished rows as at 1K.

Two fresh databases on the server in DATABASE_URL, ``corridor_bench_periodic_small``
and ``corridor_bench_periodic_large``, migrated once (the second is a copy of the
first), loaded with ``--small`` (1K) and ``--large`` (1M) terminal rows per table plus
the same few open rows (tests/bulkrows.py), then VACUUM ANALYZE. Every query of the
registry (corridor/periodic.py: the very queries the beat tasks and the stranded
count run, compiled by Django once) is run under ``EXPLAIN (ANALYZE, BUFFERS)`` in
both databases, interleaved (small, large, large, small, ...) over ``--rounds``
rounds after one warm-up pass, each in a transaction rolled back.

Figures per query: shared buffers (hit + read, the whole plan) and execution time (ms),
median [min-max] over the rounds, and the large / small ratio of each. Buffers are the
cost measure of the headline ratios (they count the pages the plan touched and do not
depend on what else runs on this 2-core machine); times are printed beside them.
``sweep`` queries are the ones that must be flat; ``lookup`` queries (one row by a
unique key) are a B-tree descent, logarithmic by nature, and are reported apart.

Last line (plain medians)::

    periodic: periodic_1m_vs_1k_max=… poller_1m_vs_1k=… reconciler_1m_vs_1k=…
              periodic_time_1m_vs_1k_max=… lookup_1m_vs_1k_max=… queries=… rounds=…

Usage: ``python -m bench.periodic --rounds 3`` (DATABASE_URL: the server; under
``python -m corridor.devservices run --`` for the embedded one). Drops its databases at
the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from bench.common import admin_connection, spread, with_name  # noqa: E402

SMALL_DB = "corridor_bench_periodic_small"
LARGE_DB = "corridor_bench_periodic_large"


def _drop(url: str, *names: str) -> None:
    with admin_connection(url) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _measure(conn, sql: str, params: list) -> tuple[int, float]:
    """(shared buffers hit + read, execution ms) of one EXPLAIN ANALYZE, rolled back."""
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        document = cur.fetchone()[0][0]
    plan = document["Plan"]
    return (plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
            float(document["Execution Time"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=1_000, help="terminal rows, small")
    parser.add_argument("--large", type=int, default=1_000_000, help="terminal rows, large")
    parser.add_argument("--open-rows", type=int, default=60, help="open rows per state")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases")
    args = parser.parse_args()
    started = time.monotonic()

    base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:54329/corridor"
    small_url, large_url = with_name(base, SMALL_DB), with_name(base, LARGE_DB)
    _drop(base, SMALL_DB, LARGE_DB)
    with admin_connection(base) as conn:
        conn.execute(f'CREATE DATABASE "{SMALL_DB}"')
    os.environ.update({"DATABASE_URL": small_url, "DJANGO_SETTINGS_MODULE": "corridor.settings",
                       "LOG_LEVEL": "WARNING"})
    import django

    django.setup()
    import psycopg
    from django.core.management import call_command
    from django.db import connection

    from corridor import periodic
    from payouts import receipts
    from tests import bulkrows

    call_command("migrate", verbosity=0)
    queries = periodic.registry()
    compiled = {name: periodic.sql_of(q) for name, q in queries.items()}
    account, usdc = receipts.withdraw_account(), receipts.usdc_asset()
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
        fsync, sync = cur.fetchone()
    connection.close()
    with admin_connection(base) as conn:
        conn.execute(f'CREATE DATABASE "{LARGE_DB}" TEMPLATE "{SMALL_DB}"')
    print(f"periodic: {len(queries)} queries; fsync={fsync} synchronous_commit={sync}; "
          f"{args.small} vs {args.large} terminal rows per table "
          f"({len(bulkrows.TABLES)} tables), {args.open_rows} open rows per state",
          flush=True)

    conns = {}
    for label, url, rows in (("small", small_url, args.small), ("large", large_url, args.large)):
        t0 = time.monotonic()
        conn = psycopg.connect(url, cursor_factory=psycopg.ClientCursor)
        with conn.transaction(), conn.cursor() as cur:
            bulkrows.load(cur, terminal=rows, open_rows=args.open_rows, tag=label[0],
                          account=account, usdc=usdc, rebuild_indexes=rows > 100_000)
        conn.autocommit = True
        for table in bulkrows.TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
        conn.autocommit = False
        conns[label] = conn
        print(f"periodic: loaded {label} ({rows} rows per table) in "
              f"{time.monotonic() - t0:.1f}s", flush=True)

    samples = {name: {"small": [], "large": []} for name in queries}
    for sql, params in compiled.values():  # warm-up, not counted
        for label in ("small", "large"):
            _measure(conns[label], sql, params)
    for r in range(args.rounds):
        order = ("small", "large") if r % 2 == 0 else ("large", "small")
        for name, (sql, params) in compiled.items():
            for label in order:
                samples[name][label].append(_measure(conns[label], sql, params))

    header = (f"{'query':34} {'kind':6} {'buffers 1K':>16} {'buffers 1M':>16} "
              f"{'ratio':>17} {'ms 1K':>20} {'ms 1M':>20} {'ms ratio':>17}")
    print(header)
    buf_ratio: dict[str, float] = {}
    time_ratio: dict[str, float] = {}
    for name, query in queries.items():
        small, large = samples[name]["small"], samples[name]["large"]
        b_s, b_l = [float(b) for b, _ in small], [float(b) for b, _ in large]
        t_s, t_l = [t for _, t in small], [t for _, t in large]
        ratios_b = [lb / max(sb, 1.0) for sb, lb in zip(b_s, b_l, strict=True)]
        ratios_t = [lt / max(st, 1e-3) for st, lt in zip(t_s, t_l, strict=True)]
        buf_ratio[name] = statistics.median(ratios_b)
        time_ratio[name] = statistics.median(ratios_t)
        print(f"{name:34} {query.kind:6} {spread(b_s, '.0f', sep=''):>16} "
              f"{spread(b_l, '.0f', sep=''):>16} {spread(ratios_b, sep=''):>17} "
              f"{spread(t_s, '.3f', sep=''):>20} {spread(t_l, '.3f', sep=''):>20} "
              f"{spread(ratios_t, sep=''):>17}")
    for conn in conns.values():
        conn.close()
    if not args.keep:
        _drop(base, SMALL_DB, LARGE_DB)

    sweeps = [n for n, q in queries.items() if q.kind == periodic.SWEEP]
    lookups = [n for n, q in queries.items() if q.kind == periodic.LOOKUP]
    worst = max(sweeps, key=buf_ratio.__getitem__)
    print(f"periodic: worst sweep {worst} (buffers x{buf_ratio[worst]:.2f}); "
          f"ratios are shared buffers hit+read, 1M / 1K; part took "
          f"{time.monotonic() - started:.0f}s", flush=True)
    print(f"periodic: periodic_1m_vs_1k_max={buf_ratio[worst]:.2f} "
          f"poller_1m_vs_1k={buf_ratio['poller']:.2f} "
          f"reconciler_1m_vs_1k={buf_ratio['reconciler']:.2f} "
          f"periodic_time_1m_vs_1k_max={max(time_ratio[n] for n in sweeps):.2f} "
          f"lookup_1m_vs_1k_max={max(buf_ratio[n] for n in lookups):.2f} "
          f"queries={len(queries)} rounds={args.rounds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
