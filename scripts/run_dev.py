"""Body of ``make run``: runs inside ``corridor.devservices run`` (services up, URLs in
the environment). Prepares the database, then hands over to honcho (Procfile.dev);
once the sandbox answers, opens the treasury's books as ``make demo`` does
(``manage.py treasury_open``, :func:`open_books`).
honcho stops every process it started on Ctrl-C; devservices then stops PostgreSQL
and Redis.

Ports come from one place (corridor/ports.py): ``PORT`` and ``SANDBOX_PORT`` from the
environment or ``.env`` (defaults there). honcho gives each process its own
``PORT`` (the first, ``web``, gets the base port, the next ones +100, +200 ...), so
:func:`honcho_env` also fixes ``CORRIDOR_URL`` and ``SANDBOX_URL`` (unless set) for every
process: the worker, beat and the sandbox then derive the same URLs as the web server
whatever ``PORT`` honcho hands them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))

from corridor import ports  # noqa: E402 - after the path is set


def honcho_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment honcho starts Procfile.dev with: ``environ`` plus ``PORT``,
    ``SANDBOX_PORT``, ``CORRIDOR_URL`` and ``SANDBOX_URL`` (each kept when already set),
    ``DJANGO_DEBUG=true`` unless set, and this virtualenv first on ``PATH``."""
    env = dict(environ)
    port, sandbox_port = ports.port(env), ports.sandbox_port(env)
    env["PORT"], env["SANDBOX_PORT"] = str(port), str(sandbox_port)
    env.setdefault("CORRIDOR_URL", ports.local_url(port))
    env.setdefault("SANDBOX_URL", ports.local_url(sandbox_port))
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # make run is the one place DEBUG defaults to on (settings default it off).
    env.setdefault("DJANGO_DEBUG", "true")
    return env


def honcho_argv() -> list[str]:
    # `.env` is already in our environment (read below, variables set in the shell
    # win, as in the settings); honcho must not re-read it with the opposite precedence.
    return [str(BIN / "honcho"), "start", "-f", "Procfile.dev", "-e", os.devnull]


def open_books(env: Mapping[str, str], *, wait_s: float = 120.0) -> int:
    """Open the treasury's books as ``make demo`` does, once the sandbox answers:
    ``manage.py treasury_open`` (the distribution account's opening USDC and RazorpayX's
    opening balance, each booked once), so the treasury page is right from the start
    rather than after the first reconciliation. Returns its exit code (1 when the
    sandbox never answered within ``wait_s``)."""
    import httpx

    url = f"{env['SANDBOX_URL']}/sandbox/faults"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            print(f"run_dev: the sandbox did not answer at {url}; books not opened "
                  "(run: python manage.py treasury_open)", file=sys.stderr)
            return 1
        time.sleep(0.5)
    try:
        return subprocess.run([str(BIN / "python"), "manage.py", "treasury_open"], cwd=ROOT,
                              env=dict(env), timeout=wait_s).returncode
    except subprocess.TimeoutExpired:
        print("run_dev: treasury_open timed out", file=sys.stderr)
        return 1


def main() -> int:
    import environ

    os.chdir(ROOT)
    environ.Env.read_env(ROOT / ".env", overwrite=False)
    env = honcho_env(os.environ)
    python = str(BIN / "python")
    subprocess.run([python, "manage.py", "migrate", "--noinput"], check=True, env=env)
    subprocess.run([python, "manage.py", "setup_periodic_tasks"], check=True, env=env)
    # Ctrl-C reaches honcho too, which stops its processes; we just wait for it.
    signal.signal(signal.SIGINT, lambda *_: None)
    honcho = subprocess.Popen(honcho_argv(), env=env)
    # The books open once the sandbox (started by honcho) answers.
    threading.Thread(target=open_books, args=(env,), daemon=True).start()
    return honcho.wait()


if __name__ == "__main__":
    sys.exit(main())
