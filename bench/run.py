"""``make bench``: every benchmark part on one embedded PostgreSQL that runs as a
production server would (fsync=on, synchronous_commit=on), and one summary line.

- Services: its own embedded PostgreSQL and Redis (``corridor.devservices`` with
  DEVSERVICES_DIR=.devservices-bench, ports 54339 / 63809 unless set, fsync and
  synchronous_commit on), so it never disturbs ``make run`` or a test run; started
  here and stopped at the end if this call started them.
- Parts: each ``bench/<part>.py`` that exists, in this order: ``saga``, ``periodic``,
  ``ingest``, ``releases``; each runs as ``python -m bench.<part> --rounds N`` in its
  own subprocess with DATABASE_URL (a database of the bench server; a part creates and
  drops its own) and CELERY_BROKER_URL in its environment. A part prints its table
  (figures as median[min-max]) and, as its LAST stdout line, ``<part>: key=value ...``
  with plain medians. A missing or failed part gives ``n/a`` for its keys.
- Last line, keys in this order (``fsync`` as the server reports it, ``ledger_close_s``
  as the releases part ran it)::

    bench: rounds=3 fsync=on saga_steps_per_s=… dbos_steps_per_s=… … pg_commits_per_s=…

Usage: ``python bench/run.py [--rounds N] [--parts saga,ingest]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("saga", "periodic", "ingest", "releases")
KEYS = ("saga_steps_per_s", "dbos_steps_per_s", "saga_ratio_vs_dbos_1w",
        "saga_ratio_vs_dbos_4w", "ratio_vs_dbos", "channels", "ledger_close_s",
        "releases_per_ledger_per_channel", "cpu_ms_per_release", "periodic_1m_vs_1k_max",
        "poller_1m_vs_1k", "reconciler_1m_vs_1k", "ingest_vs_noop", "rss_growth_pct",
        "lock_wait_pct_4w", "commits_per_db_leg", "commits_per_external_leg",
        "commits_per_release", "pg_commits_per_s")
PART_TIMEOUT_S = 15 * 60

os.environ.setdefault("DEVSERVICES_DIR", str(ROOT / ".devservices-bench"))
os.environ.setdefault("DEVSERVICES_PG_PORT", "54339")
os.environ.setdefault("DEVSERVICES_REDIS_PORT", "63809")
os.environ["DEVSERVICES_PG_FSYNC"] = "on"
os.environ["DEVSERVICES_PG_SYNCHRONOUS_COMMIT"] = "on"
# The bench's own services, never a DATABASE_URL / broker from the caller's shell.
for _name in ("DATABASE_URL", "CELERY_BROKER_URL", "SANDBOX_DATABASE_URL"):
    os.environ.pop(_name, None)
sys.path.insert(0, str(ROOT))

from corridor import devservices  # noqa: E402 - reads the DEVSERVICES_* set above


def start_services() -> tuple[bool, bool]:
    """Start the bench's PostgreSQL and Redis; retried, as a port of the ephemeral
    range can be briefly held by a closing connection."""
    for attempt in range(5):
        try:
            pg = devservices.start_postgres()
            break
        except subprocess.CalledProcessError:
            if attempt == 4:
                raise
            time.sleep(15)
    devservices.ensure_database("corridor")
    return pg, devservices.start_redis()


def server_settings(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return {name: conn.execute(f"SELECT current_setting('{name}')").fetchone()[0]
                for name in ("fsync", "synchronous_commit", "server_version")}


def run_part(part: str, rounds: int, env: dict[str, str]) -> dict[str, str] | None:
    """Run one part, echoing its output; its last line's key=value pairs, or None."""
    argv = [sys.executable, "-m", f"bench.{part}", "--rounds", str(rounds)]
    print(f"bench: --- {part}: {' '.join(argv[1:])}", flush=True)
    began = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                            bufsize=1)
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.strip():
                lines.append(line.strip())
        proc.wait(timeout=max(1.0, PART_TIMEOUT_S - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    took = time.monotonic() - began
    print(f"bench: --- {part}: exit {proc.returncode} after {took:.0f} s", flush=True)
    if proc.returncode != 0 or not lines or not lines[-1].startswith(f"{part}:"):
        return None
    pairs = {}
    for word in lines[-1].split(":", 1)[1].split():
        if "=" in word:
            key, value = word.split("=", 1)
            pairs[key] = value
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated parts to run (default: all that exist)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")

    began = time.monotonic()
    pg_started, redis_started = start_services()
    url = devservices.postgres_url("corridor")
    env = {**os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": devservices.redis_url(),
           "SANDBOX_DATABASE_URL": devservices.postgres_url("corridor_sandbox"),
           "PYTHONUNBUFFERED": "1"}
    figures: dict[str, str] = {}
    try:
        server = server_settings(url)
        print(f"bench: PostgreSQL {server['server_version']} on port {devservices.PG_PORT} "
              f"(fsync={server['fsync']}, synchronous_commit={server['synchronous_commit']}), "
              f"Redis on port {devservices.REDIS_PORT}, {os.cpu_count()} CPUs, "
              f"{args.rounds} rounds", flush=True)
        for part in [p for p in args.parts.split(",") if p]:
            if not (ROOT / "bench" / f"{part}.py").exists():
                print(f"bench: --- {part}: bench/{part}.py missing, its keys are n/a")
                continue
            got = run_part(part, args.rounds, env)
            if got is None:
                print(f"bench: --- {part}: no result line, its keys are n/a")
                continue
            for key, value in got.items():
                figures.setdefault(key, value)
        fsync = server_settings(url)["fsync"]
    finally:
        if redis_started:
            devservices.stop_redis()
        if pg_started:
            devservices.stop_postgres()
    print(f"bench: all parts took {time.monotonic() - began:.0f} s", flush=True)
    print(f"bench: rounds={args.rounds} fsync={fsync} "
          + " ".join(f"{key}={figures.get(key, 'n/a')}" for key in KEYS), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
