"""The server stack ``make run`` uses, started for the browser tests: gunicorn with the
command line of ``Procfile.dev``'s ``web`` line (same workers, threads, timeout; only the
bind address changes) serving Corridor from the test database with its real static
handling (WhiteNoise), and a ``manage.py sandbox`` of its own (own database, so it can
run beside the session's sandbox that talks to the in-process live server) whose AP
events, Razorpay webhooks and SEP-24 links all point at that gunicorn.

A test that needs Corridor's settings to match (the poller, ``deposits.funds_received``
run in the test process as beat would) points them at :attr:`Stack.sandbox` with
:meth:`Stack.point_settings`."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from corridor.processes import free_port
from tests.conftest import ARTIFACTS, FAST_TIMINGS, ROOT, SANDBOX_TIMINGS, Sandbox

START_TIMEOUT_S = 60


def procfile_web_argv(bind: str, procfile: Path = ROOT / "Procfile.dev") -> list[str]:
    """``Procfile.dev``'s ``web`` command as an argv for this interpreter's gunicorn,
    with ``--bind`` (whatever it says there, ports from the environment included)
    replaced by ``bind``."""
    line = next(raw for raw in procfile.read_text().splitlines() if raw.startswith("web:"))
    words = shlex.split(line.split(":", 1)[1])
    if words[0] != "gunicorn":
        raise RuntimeError(f"Procfile.dev's web line does not start gunicorn: {line}")
    argv, skip = [sys.executable, "-m", "gunicorn"], False
    for i, word in enumerate(words[1:], start=1):
        if skip:
            skip = False
        elif word in ("--bind", "-b"):
            skip = True
        elif not word.startswith(("--bind=", "-b=")):
            argv.append(word)
        if i == len(words) - 1 and skip:
            raise RuntimeError(f"Procfile.dev's web line ends in --bind: {line}")
    return [*argv, "--bind", bind]


@dataclass
class Process:
    name: str
    proc: subprocess.Popen
    log_path: Path
    _log: object = field(repr=False, default=None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()


def spawn(name: str, argv: list[str], env: dict[str, str]) -> Process:
    """Start ``argv`` in its own process group, output to test-artifacts/<name>.log."""
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / (f"{name}{os.environ.get('TEST_DB_SUFFIX', '')}"
                            f"{os.environ.get('PYTEST_XDIST_WORKER', '')}.log")
    log = open(log_path, "w")  # noqa: SIM115 - closed by Process.stop
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return Process(name, proc, log_path, log)


def wait_http(process: Process, url: str, ok=(200,)) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.proc.poll() is not None:
            raise RuntimeError(f"{process.name} exited early:\n{process.log_path.read_text()}")
        try:
            if httpx.get(url, timeout=2).status_code in ok:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.stop()
            raise RuntimeError(f"{process.name} did not answer {url}; see {process.log_path}")
        time.sleep(0.2)


def _pg_url(db: dict, name: str) -> str:
    return f"postgresql://{db.get('USER') or 'postgres'}@{db.get('HOST')}:{db.get('PORT')}/{name}"


@dataclass
class Stack:
    """gunicorn (``url``) and its sandbox (``sandbox``), as ``make run`` wires them."""

    url: str
    sandbox: Sandbox
    corridor_env: dict[str, str]
    processes: list[Process]

    @property
    def sandbox_settings(self) -> dict[str, str]:
        base = self.sandbox.url
        return {"SANDBOX_URL": base, "HORIZON_URL": f"{base}/horizon",
                "AP_PLATFORM_URL": f"{base}/ap/platform", "RAZORPAY_API_URL": f"{base}/razorpay"}

    def point_settings(self, settings) -> None:
        """Point this process's Corridor settings (pytest-django's ``settings``
        fixture, restored after the test) at the stack's sandbox."""
        for name, value in self.sandbox_settings.items():
            setattr(settings, name, value)

    def gunicorn(self, name: str, **env: str) -> tuple[str, Process]:
        """Another gunicorn like the stack's, with ``env`` on top (e.g. a payment
        provider nobody answers at); the caller stops it."""
        port = free_port()
        process = spawn(name, procfile_web_argv(f"127.0.0.1:{port}"),
                        {**self.corridor_env, **env})
        url = f"http://127.0.0.1:{port}"
        wait_http(process, f"{url}/health/", ok=(200, 503))
        return url, process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


def start_stack(*, debug: bool = True, **extra_env: str) -> Stack:
    """Start the browser sandbox and gunicorn against the current (test) databases.
    ``debug`` mirrors ``make run`` (scripts/run_dev.py sets DJANGO_DEBUG=true)."""
    from django.conf import settings

    web_port, sandbox_port = free_port(), free_port()
    web_url, sandbox_url = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{sandbox_port}"
    default, sandbox_db = settings.DATABASES["default"], settings.DATABASES["sandbox"]
    # Its own world: the session's sandbox (tests/conftest.py) keeps the _test one.
    sandbox_db_url = _pg_url(sandbox_db, f"{sandbox_db['TEST']['NAME']}_browser")
    wiring = {
        "CORRIDOR_URL": web_url,
        "SANDBOX_CALLBACK_URL": f"{web_url}/callbacks",
        "SANDBOX_INTERACTIVE_URL": f"{web_url}/sep24/interactive",
        "SANDBOX_WEBHOOK_URL": f"{web_url}/webhooks/razorpay",
        "SANDBOX_MORE_INFO_URL": f"{web_url}/sep24/more_info",
        "SANDBOX_DATABASE_URL": sandbox_db_url,
        "SANDBOX_URL": sandbox_url,
        "HORIZON_URL": f"{sandbox_url}/horizon",
        "AP_PLATFORM_URL": f"{sandbox_url}/ap/platform",
        "RAZORPAY_API_URL": f"{sandbox_url}/razorpay",
    }
    base_env = {k: v for k, v in os.environ.items() if k != "CORRIDOR_CRASH_AT"}
    sandbox_env = {**base_env, **SANDBOX_TIMINGS, **wiring}
    corridor_env = {
        **base_env, **wiring,
        "DATABASE_URL": _pg_url(default, default["NAME"]),
        **{name: str(value) for name, value in FAST_TIMINGS.items()},
        "DJANGO_DEBUG": "true" if debug else "false",
        **extra_env,
    }
    processes: list[Process] = []
    try:
        processes.append(spawn("sandbox-browser", [
            sys.executable, str(ROOT / "manage.py"), "sandbox", "--addr",
            f"127.0.0.1:{sandbox_port}", "--reset"], sandbox_env))
        processes.append(spawn("gunicorn", procfile_web_argv(f"127.0.0.1:{web_port}"),
                               corridor_env))
        wait_http(processes[0], f"{sandbox_url}/sandbox/faults")
        wait_http(processes[1], f"{web_url}/health/", ok=(200, 503))
    except BaseException:
        for process in reversed(processes):
            process.stop()
        raise
    return Stack(web_url, Sandbox(sandbox_url, processes[0].log_path), corridor_env, processes)
