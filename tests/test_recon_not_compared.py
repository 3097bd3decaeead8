"""Issue 25 §4: a comparison that did not run is not a comparison that found nothing.
A reconciliation run that could not compare an account or a row (the account busy with
money in flight, a payout still inside the statement's grace, a payment older than the
look-back) leaves that subject's breaks as they were: never cleared, closed or archived
as "no longer seen". Real reconciliation runs against the sandbox over HTTP and the
real PostgreSQL; the rows that make an account busy are written as fixtures."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from anchor import stellar
from payouts.models import WithdrawalPayout
from tests.factories import DepositPaymentFactory, DepositReleaseFactory, SagaFactory
from tests.flows import wait_for
from treasury.models import Break
from treasury.reconcile import open_distribution, reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def recon(settings, clean_sandbox):
    settings.TREASURY_SETTLEMENT_WINDOW_S = 3600.0
    settings.TREASURY_STATEMENT_GRACE_S = 0.0
    open_distribution()
    return clean_sandbox


def _status(key: str) -> str:
    return Break.objects.get(key=key).status


def _fund(sandbox, account: str, amount: str) -> None:
    sandbox.http.post("/horizon/sandbox/fund", json={"account": account, "amount": amount}
                      ).raise_for_status()


def test_a_busy_account_keeps_its_balance_break_open(recon):
    distribution = stellar.distribution_keypair().public_key
    hub = stellar.hub_keypair().public_key
    keys = {f"horizon:balance_differs:{distribution}", f"horizon:balance_differs:{hub}"}
    _fund(recon, distribution, "3")
    _fund(recon, hub, "4")
    wait_for(lambda: reconcile() and {k for k in keys if Break.objects.filter(
        key=k, status="open").exists()} == keys, timeout=10, interval=0.5,
        what="both accounts' breaks")

    # A release in flight on the distribution account, a saga running on the hub: the
    # run compares neither balance.
    DepositReleaseFactory(status="submitted")
    SagaFactory(status="running")
    run = reconcile()

    assert run.balances["hub USDC"]["compared"] is False
    assert run.balances["stellar:distribution USDC"]["compared"] is False
    assert {k: _status(k) for k in keys} == {k: "open" for k in keys}


def test_a_paid_payout_the_run_did_not_compare_keeps_its_break(recon, settings):
    payout = WithdrawalPayout.objects.create(
        transaction_id="tx-not-compared", status="completed", amount_paise=50000,
        fund_account_id="fa_x", provider_payout_id="pout_notinstatement", reference="UTR1")
    key = "razorpayx:missing_outside:pout_notinstatement"
    reconcile()
    assert _status(key) == "open"

    # Touched just now (AP told): inside the statement's grace, not compared this run.
    settings.TREASURY_STATEMENT_GRACE_S = 600.0
    WithdrawalPayout.objects.filter(pk=payout.pk).update(updated_at=timezone.now())
    reconcile()
    assert _status(key) == "open"

    # Older than the look-back: not read either.
    settings.TREASURY_STATEMENT_GRACE_S = 0.0
    WithdrawalPayout.objects.filter(pk=payout.pk).update(
        updated_at=timezone.now() - timedelta(days=settings.TREASURY_RECON_LOOKBACK_DAYS + 2))
    reconcile()
    assert _status(key) == "open"


def test_a_payment_older_than_the_look_back_keeps_its_break(recon, settings):
    settings.TREASURY_RECON_LOOKBACK_DAYS = 3
    payment = DepositPaymentFactory(confirmation="confirmed",
                                    captured_at=timezone.now() - timedelta(days=2),
                                    amount_paise=12345)
    key = f"razorpay:missing_outside:{payment.payment_id}"
    reconcile()
    assert _status(key) == "open"
    assert Break.objects.get(key=key).difference == Decimal("-123.45")

    settings.TREASURY_RECON_LOOKBACK_DAYS = 0  # the run no longer reads its days
    reconcile()

    assert _status(key) == "open"


def test_a_release_waiting_for_a_trustline_does_not_keep_the_distribution_uncompared(recon):
    """Attacker (issue 25 §4, the other side of the coverage rule): a release whose
    payment landed as failed ``op_no_trust`` waits, ``failed``, for the customer's
    trustline, for days or for ever; its envelope is spent (its sequence used), so
    nothing is in flight until it is resubmitted (``submitting`` first). The run called
    the distribution account busy while any release was ``failed``: one customer who
    never adds the trustline kept the account uncompared for ever, its break open after
    the books were put right (and no new difference ever found)."""
    from ledger import chart

    distribution = stellar.distribution_keypair().public_key
    key = f"horizon:balance_differs:{distribution}"
    _fund(recon, distribution, "3")
    wait_for(lambda: reconcile() and Break.objects.filter(key=key, status="open").exists(),
             timeout=10, interval=0.5, what="the distribution's break")
    DepositReleaseFactory(status="failed", failure_code="op_no_trust")
    chart.funded(key="attacker:distribution:topup", account=chart.DISTRIBUTION,
                 currency="USDC", amount=Decimal("3"), reference="put right")

    run = reconcile()

    assert run.balances["stellar:distribution USDC"]["compared"] is True
    assert _status(key) == "cleared"
    DepositReleaseFactory(status="failed")  # refused, its envelope perhaps still alive
    _fund(recon, distribution, "2")
    run = reconcile()
    assert run.balances["stellar:distribution USDC"]["compared"] is False
