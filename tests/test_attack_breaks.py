"""Attack (treasury breaks): a break an operator closed (explained / fixed) keeps its key
(``source:kind:reference``) for ever. A balance break's key is the account's, so a NEW
difference on the same account later is written into the closed row and never reaches
the operators' queue: the books disagree with the outside with no open break."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from anchor import stellar
from tests.flows import wait_for
from tests.recon import balance_breaks, compared, superuser
from treasury import operations as treasury_ops
from treasury.models import Break
from treasury.reconcile import open_distribution, reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def recon(settings, clean_sandbox):
    settings.TREASURY_SETTLEMENT_WINDOW_S = 3600.0
    settings.TREASURY_STATEMENT_GRACE_S = 0.0
    settings.RECEIPT_GRACE_S = 0.3
    open_distribution()
    return clean_sandbox



def _fund_hub(sandbox, hub, amount):
    sandbox.http.post("/horizon/sandbox/fund", json={"account": hub, "amount": amount}
                      ).raise_for_status()


def test_a_new_difference_on_an_explained_balance_break_opens_a_break(recon):
    hub = stellar.hub_keypair().public_key
    key = f"horizon:balance_differs:{hub}"
    before = compared(reconcile(), "hub USDC")["difference"]

    # 7 USDC nobody booked: a break, which an operator explains with an adjusting entry.
    _fund_hub(recon, hub, "7")
    wait_for(lambda: reconcile() and balance_breaks("horizon").get(key) == before + 7,
             timeout=10, interval=0.5, what="the hub's break")
    found = Break.objects.get(key=key)
    treasury_ops.break_explain(break_id=found.pk, operator=superuser("attack-ops"),
                               amount=str(found.difference), note="OPS-1: treasury move")
    found.refresh_from_db()
    run = reconcile()
    assert compared(run, "hub USDC")["difference"] == 0
    assert balance_breaks("horizon").get(key) is None

    # Later, 5 more USDC nobody booked: a new, unexplained difference.
    _fund_hub(recon, hub, "5")
    wait_for(lambda: compared(reconcile(), "hub USDC")["difference"] == 5, timeout=10,
             interval=0.5, what="the hub's new difference")

    # The books disagree with Horizon by 5 USDC: that must be an open break.
    assert balance_breaks("horizon").get(key) == Decimal(5), (
        Break.objects.get(key=key).status, Break.objects.get(key=key).difference)

    # ... and explaining it posts an adjusting entry of its own (not a replay of the first).
    again = Break.objects.get(key=key)
    treasury_ops.break_explain(break_id=again.pk, operator=User.objects.get(
        username="attack-ops"), amount="5", note="OPS-2: another treasury move")
    again.refresh_from_db()
    assert again.adjusting_key != found.adjusting_key
    run = reconcile()
    assert compared(run, "hub USDC")["difference"] == 0
    assert balance_breaks("horizon").get(key) is None
