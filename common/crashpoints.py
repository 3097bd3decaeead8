"""Test-only crash points: ``CORRIDOR_CRASH_AT=<name>`` makes the process SIGKILL
itself when it reaches that boundary, as a worker dying mid-flight would. Unset in
production; reading an environment variable is all it costs."""

import os
import signal


def crash_point(name: str) -> None:
    """SIGKILL this process if ``CORRIDOR_CRASH_AT`` equals ``name``; else nothing."""
    if os.environ.get("CORRIDOR_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
