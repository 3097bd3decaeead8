"""Test drivers that act as the outside world does: a wallet (Stellar account, SEP-24
start), a customer (the interactive pages, Razorpay checkout), and worker processes.
Everything goes over real HTTP to the sandbox and to Corridor's live server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from django.conf import settings
from django.db import connection

from sandbox.drivers import Customer, Wallet, horizon  # noqa: F401 - re-exported for tests
from tests.conftest import ARTIFACTS, FAST_TIMINGS, ROOT


def wait_for(predicate, *, timeout: float = 30.0, interval: float = 0.2, what: str = ""):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a Corridor process that must see what the test process sees:
    the test database, the sandbox URLs and the fast timings."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SANDBOX_URL": settings.SANDBOX_URL,
        "HORIZON_URL": settings.HORIZON_URL,
        "AP_PLATFORM_URL": settings.AP_PLATFORM_URL,
        "RAZORPAY_API_URL": settings.RAZORPAY_API_URL,
        **{name: str(value) for name, value in FAST_TIMINGS.items()},
    }
    env.pop("CORRIDOR_CRASH_AT", None)
    env.update(extra)
    return env


def run_manage(*args: str, crash_at: str | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``manage.py`` in a separate process (a worker), optionally SIGKILLing itself
    at a named crash point."""
    extra = {"CORRIDOR_CRASH_AT": crash_at} if crash_at else {}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                          env=subprocess_env(**extra), capture_output=True, text=True,
                          timeout=timeout)


class CeleryWorker:
    """A real Celery worker process on the test broker and database."""

    def __init__(self, name: str = "worker", concurrency: int = 4, **extra_env: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path: Path = ARTIFACTS / f"celery-{name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "corridor", "worker", "--pool", "threads",
             "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "-n", f"{name}-{os.getpid()}@test"],
            cwd=ROOT, env=subprocess_env(**extra_env), stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: "ready." in self.log_path.read_text() or self.proc.poll() is not None,
                 timeout=60, what="celery worker ready")
        if self.proc.poll() is not None:
            raise RuntimeError(self.log_path.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def purge_broker() -> None:
    from corridor.celery import app

    app.control.purge()


def decimal(value) -> Decimal:
    return Decimal(str(value))


def query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
