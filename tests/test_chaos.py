"""``manage.py chaos``: a short fixed-seed campaign on a loaded machine (three seeds, one
CPU burner beside it: timings that hold only on an idle machine are defects; the
20-seed loaded campaign is ``make chaos``, the README's figures) finds no violation
with every protection on; tests/test_chaos_guard_off.py finds one with a protection
off (so the checker can fail). A file each: pytest-xdist (``--dist
loadfile``) runs the two campaigns on different workers.

Each run is a real campaign: the sandbox, gunicorn, two Celery workers and beat as
processes, sandbox faults from the whole catalogue, SIGKILLs, a Redis restart and a
PostgreSQL immediate restart, under an embedded PostgreSQL and Redis of its own
(tests/campaign.py).
"""

from __future__ import annotations

import re

import pytest

from corridor.management.commands.chaos import PROCESS_FAULTS
from tests.campaign import campaign, violations

pytestmark = pytest.mark.slow

SEEDS = 3  # issue 25 §3: CI runs three fixed seeds with one burner


@pytest.mark.timeout(1500)  # three seeds and a burner on CI's 2 cores: 716 s at stop 33
@pytest.mark.xfail(strict=False, reason=(
    "issue 25 open: the 20-seed loaded campaign has not printed violations=0 yet (stop 34: "
    "at ddb9ea8 seeds 1-14 clean, seed 15 the sandbox's Horizon saturated by the late-money "
    "look, since fixed; at 6756f1d seed 8 a lost refunded payment never recorded, since "
    "fixed). Strict again once it prints violations=0"))
def test_fixed_seeds_on_a_loaded_machine_find_no_violation():
    out, found = campaign("--seeds", str(SEEDS), "--seed", "7", "--cpu-burners", "1",
                          timeout=1200)

    assert found == 0, violations(out)
    last = out.strip().splitlines()[-1]
    for key in ("double_payments=0", "double_payouts=0", "stranded=0", "ap_mismatches=0",
                "ledger_matches_chain=yes", "books_match_outside=yes"):
        assert key in last, last
    assert f"process_kills={SEEDS * len(PROCESS_FAULTS)}" in last, last
    assert "cpu_burners=1" in out, out[:2000]
    fired = re.search(r"fault_types=(\d+)", last).group(1)
    catalogue = re.search(r"catalogue=(\d+) faults", out).group(1)
    unreachable = out.count("switched on but cannot fire here:") + \
        out.count("no traffic drives it yet:")
    sometimes = out.count("traffic may not meet it:")
    assert sometimes == 7, out[:4000]  # the deposit refunds' faults
    assert int(catalogue) - unreachable - sometimes <= int(fired) <= \
        int(catalogue) - unreachable, out[-4000:]
    # The late deposits' INR goes back once (or its refund failed at Razorpay: queued).
    late = re.search(r" late_deposits=(\d+) refunds_inr=(\d+) double_refunds=0 ", last)
    assert late and int(late.group(1)) == 2 * SEEDS and int(late.group(2)) <= 2 * SEEDS, last
