"""Body of ``make run``: runs inside ``corridor.devservices run`` (services up, URLs in
the environment). Prepares the database, then hands over to honcho (Procfile.dev).
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
    return subprocess.call(honcho_argv(), env=env)


if __name__ == "__main__":
    sys.exit(main())
