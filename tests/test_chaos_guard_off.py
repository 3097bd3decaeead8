"""``manage.py chaos`` with the payout guard off finds a violation, so the checker that
tests/test_chaos.py relies on can fail. A file of its own: pytest-xdist (``--dist
loadfile``) runs it on the other worker than that file's loaded three-seed campaign
(tests/campaign.py: its own embedded PostgreSQL and Redis)."""

from __future__ import annotations

import re

import pytest

from tests.campaign import campaign, violations

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # beside the loaded campaign on CI's two cores (stop 33: 468 s)
def test_campaign_with_the_payout_guard_off_finds_a_violation():
    # withdrawals only, the money path the guard protects, and no mop-up of other kinds
    # (1m47s on an idle machine; beside the loaded campaign on CI it passed 460 s)
    out, found = campaign("--seeds", "1", "--seed", "7", "--protection-off", "payout_guard",
                          "--deposits", "0", "--remittances", "0", "--inbound", "0",
                          "--late-deposits", "0", "--withdrawals", "4", timeout=800)

    # A driver error or a slow settle would count as a violation too; what this checker
    # must catch with the guard off is the money failure itself: a withdrawal paid twice.
    assert found > 0, out[-4000:]
    last = out.strip().splitlines()[-1]
    double_payouts = int(re.search(r"double_payouts=(\d+)", last).group(1))
    assert double_payouts > 0, violations(out)
