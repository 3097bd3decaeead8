"""``corridor.processes.CpuBurners`` (``manage.py chaos --cpu-burners N``): the burners
spin while the campaign runs and never outlive it, whether it ends, fails or is
SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from corridor.processes import CpuBurners
from tests.conftest import ROOT


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not running
        return f.read().split(") ", 1)[1][0] != "Z"


def _cpu_ticks(pid: int) -> int:
    """User CPU time of ``pid`` so far, in clock ticks (``/proc/<pid>/stat`` utime)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ", 1)[1].split()[11])


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_burners_spin_while_the_block_runs_and_stop_when_it_fails():
    pids: list[int] = []
    try:
        with CpuBurners(2) as burners:
            pids = burners.pids
            deadline = time.monotonic() + 30  # a loaded machine starts them late
            while True:
                busy = [_cpu_ticks(p) for p in pids]
                if all(busy) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            raise RuntimeError("the campaign failed")
    except RuntimeError:
        pass

    assert len(pids) == 2 and all(t > 0 for t in busy), busy
    assert _gone_within(pids, 2), pids


def test_a_sigkilled_campaign_leaves_no_burner_behind():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from corridor.processes import CpuBurners\n"
         "with CpuBurners(2) as b:\n    print(*b.pids, flush=True)\n    time.sleep(60)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)

    parent.send_signal(signal.SIGKILL)
    parent.wait(5)

    assert _gone_within(pids, 3), [p for p in pids if _alive(p)]
