"""A failover that loses the last seconds of commits (issue 25 §2), one outbox at a time.

Each test lets money leave (a Stellar payment, a RazorpayX payout) and then loses the
commits that recorded it (tests/rewind.py: the database as a standby cut just before
them holds it), while the outside world (the sandbox) keeps everything. Then it runs
what beat runs, and checks that nothing was paid twice and the lost row was rebuilt
from the chain or the provider:

- withdrawal payout -> RazorpayX, by the attempt's key (derived from the withdrawal,
  so a re-claimed payout replays it) and by reference;
- deposit release, AP still ``pending_anchor`` -> the chain, by the release's memo
  and destination from the distribution account;
- deposit release, AP ``completed`` -> AP's hash, checked on the chain;
- deposit order, the customer paid it -> Razorpay's order by receipt and AP's amounts.
A saga leg's lost hub payment: tests/test_remittances.py (found on chain, not paid
again, stopped for review).
"""

from __future__ import annotations

import time

import pytest

from anchor import reconciler
from anchor.models import DepositOrder, DepositPayment, DepositRelease
from payouts import poller
from payouts.models import WithdrawalPayout
from tests import rewind
from tests.flows import (
    Customer,
    Wallet,
    ap,
    assert_payout_once,
    assert_released_once,
    paid_deposit,
    pending_anchor_withdrawal,
    purge_broker,
    run_manage,
    sandbox_payouts,
    settle,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_payout_whose_claim_was_lost_after_razorpayx_took_it_pays_once(clean_sandbox):
    # given a verified withdrawal whose payout RazorpayX accepted (no webhook yet)
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.5)
    clean_sandbox.fault("razorpayx.webhook_lose", times=3)
    _, transaction_id = pending_anchor_withdrawal(clean_sandbox)
    before = rewind.mark()
    poller.poll_withdrawals()
    assert len(sandbox_payouts(clean_sandbox, transaction_id)) == 1

    # when the failover loses every commit since (the claim, the attempt's key)
    lost = rewind.rewind(before)
    assert lost["withdrawal_payouts"] == 1 and lost["payout_attempts"] == 1
    assert not WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists()

    # then the poller's next passes rebuild the payout from RazorpayX, paying nothing more
    settle(transaction_id)
    assert_payout_once(clean_sandbox, transaction_id)


def test_a_release_whose_claim_was_lost_after_it_was_submitted_pays_once(clean_sandbox):
    # given a paid deposit whose release was submitted, its worker killed before it
    # told AP (AP still pending_anchor)
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    before = rewind.mark()
    killed = run_manage("release_deposit", transaction_id, crash_at="after_submit")
    assert killed.returncode == -9, killed.stderr[-2000:]
    wait_for(lambda: len(wallet.usdc_payments()) == 1, what="the release on chain")

    # when the failover loses the claim (the envelope, its hash, the channel's sequence)
    lost = rewind.rewind(before)
    assert lost["deposit_releases"] == 1
    assert ap(transaction_id)["status"] == "pending_anchor"

    # then the sweep that finds AP pending_anchor adopts the payment on chain
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_a_release_lost_after_ap_completed_is_rebuilt_from_ap_and_the_chain(clean_sandbox):
    # given a deposit released and completed in AP
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    before = rewind.mark()
    assert settle(transaction_id).status == "completed"
    assert ap(transaction_id)["status"] == "completed"

    # when the failover loses every commit of the release
    lost = rewind.rewind(before)
    assert lost["deposit_releases"] == 1
    assert DepositPayment.objects.get(transaction_id=transaction_id).release_claimed_at is None

    # then the reconciler rebuilds the release from AP's hash, found on the chain
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)
    assert DepositRelease.objects.get(transaction_id=transaction_id).tx_hash == \
        ap(transaction_id)["stellar_transactions"][0]["id"]


def test_a_deposit_order_lost_after_the_customer_paid_it_is_rebuilt_and_released_once(
        clean_sandbox, settings):
    # given a deposit whose order Corridor stored and AP took (pending_user_transfer_start)
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, url = wallet.start_deposit()
    before = rewind.mark()
    customer = Customer(clean_sandbox)
    order_id = customer.submit_amount(url, "1000")
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"

    # when the failover loses the order, and the customer pays it at Razorpay
    lost = rewind.rewind(before)
    assert lost["deposit_orders"] == 1
    customer.pay(order_id)
    purge_broker()  # no worker: the webhook found no order ("unknown_order")
    assert not DepositPayment.objects.exists()

    # then the order reconciler rebuilds the order and records the payment (earlier
    # tests' deposits, still waiting in the session's sandbox, are rebuilt too)
    settings.DEPOSIT_ORDER_REBUILD = True
    assert reconciler.reconcile_orders().get("order_rebuilt", 0) >= 1
    assert DepositOrder.objects.get(transaction_id=transaction_id).order_id == order_id

    def confirmed() -> bool:  # the order reconciler's passes, as beat runs them
        time.sleep(settings.ORDER_RECONCILER_AGE_S + 0.1)
        reconciler.reconcile_orders()
        return DepositPayment.objects.filter(transaction_id=transaction_id,
                                             confirmation="confirmed").exists()

    wait_for(confirmed, timeout=60, what="payment recorded and confirmed")
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)
