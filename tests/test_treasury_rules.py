"""Every posting rule and every reconciliation rule has a test (issue 13): the rules
ledger/chart.py and treasury/reconcile.py had none asserting them, each driven through
the real flow against the sandbox over HTTP and the real PostgreSQL, the outside's side
of a break injected with the sandbox's fault switches (the reconciliation reads only
what the providers' APIs return).

The sandbox is shared by the whole session: its statement, settlements and chain also
carry other tests' money (absent from this test's database). Each test asserts the
breaks of its own references, and compares a balance's unexplained difference before
and after its own flow."""

from __future__ import annotations

import random
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.utils import timezone

from anchor import razorpay as rzp
from anchor import stellar
from ledger import chart
from ledger import services as ledger
from ledger.models import Entry
from payouts import operations as payout_ops
from payouts import poller, receipts
from payouts import statement as rzpx
from payouts.models import StellarReceipt, WithdrawalPayout, WithdrawalRequest
from tests.flows import (
    NOTE,
    Wallet,
    pay_and_wait_for_ap,
    processing_payout,
    settle,
    start_and_pay,
    start_withdrawal,
    unique_account_number,
    validation_account,
    vpa_fund_account,
    wait_for,
)
from tests.recon import (
    balance_breaks,
    compared,
    entry_lines,
    mine,
    paid_withdrawal,
    superuser,
    unexplained,
)
from tests.sandbox.razorpayx_calls import create_payout, get_payout, status_of
from treasury import operations as treasury_ops
from treasury.models import Break
from treasury.reconcile import open_distribution, reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
INR, USDC = "INR", "USDC"


@pytest.fixture
def recon(settings, clean_sandbox):
    settings.TREASURY_SETTLEMENT_WINDOW_S = 3600.0  # T+2 of 1-second days: well inside
    settings.TREASURY_STATEMENT_GRACE_S = 0.0
    settings.RECEIPT_GRACE_S = 0.3
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    open_distribution()
    return clean_sandbox



def charged(payout: WithdrawalPayout) -> Decimal:
    return chart.rupees(payout.amount_paise + (payout.fees_paise or 0))


def reversed_withdrawal(sandbox) -> WithdrawalPayout:
    """A withdrawal paid, then its payout reversed by the bank (booked paid and
    reversed)."""
    sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.5)
    wallet, transaction_id, pay = start_withdrawal(sandbox)
    pay_and_wait_for_ap(wallet, pay)
    settle(transaction_id)
    return wait_for(lambda: poller.poll_withdrawals() is not None and
                    WithdrawalPayout.objects.filter(transaction_id=transaction_id,
                                                    status="reversed").first(),
                    what="reversed")


def new_utr() -> str:
    return f"NEFTN{random.randrange(10**11, 10**12)}"


# --- posting rules ----------------------------------------------------------------------

def test_a_razorpayx_top_up_and_the_opening_balance_are_booked_as_funding(recon):
    before = reconcile()
    topup = recon.http.post("/razorpay/sandbox/banking_balances/topup",
                            json={"amount": 123456, "mode": "IMPS"})
    topup.raise_for_status()

    run = reconcile()

    assert entry_lines(f"funding:razorpayx:{topup.json()['id']}") == {
        (chart.RAZORPAYX_CURRENT, INR): Decimal("1234.56"),
        (chart.FUNDING, INR): Decimal("-1234.56")}
    rows = rzpx.statement(timezone.now() - timedelta(days=1), timezone.now())
    opening = [r for r in rows if r.kind == "bank_transfer"
               and (r.bank_reference or "").startswith("SBXOPENING")]
    assert len(opening) == 1
    assert entry_lines(f"funding:razorpayx:{opening[0].transaction_id}") == {
        (chart.RAZORPAYX_CURRENT, INR): Decimal("10000000.00"),
        (chart.FUNDING, INR): Decimal("-10000000.00")}
    assert unexplained(run) == unexplained(before)  # the top-up explains the balance
    count = Entry.objects.count()
    reconcile()
    assert Entry.objects.count() == count  # once


def test_a_receipt_no_withdrawal_counted_goes_through_owed_receipts_when_sent_back(recon):
    wallet = Wallet(recon)
    wallet.fund_usdc("20")
    memo = str(random.randrange(10**12, 10**13))  # no withdrawal has it
    tx_hash = wallet.pay(destination=receipts.withdraw_account(), amount="4", memo=memo)
    time.sleep(settings.RECEIPT_GRACE_S + 0.1)
    receipt = wait_for(lambda: poller.poll_withdrawals() is not None and
                       StellarReceipt.objects.filter(tx_hash=tx_hash).first(),
                       timeout=10, what="the receipt scanned")

    refund = payout_ops.receipt_refund_on_chain(receipt_id=receipt.pk, operator=superuser(),
                                                note="ticket OPS-42: unknown memo")

    assert refund.status == "completed"
    assert entry_lines(f"receipt:{receipt.pk}:received") == {
        (chart.DISTRIBUTION, USDC): Decimal("4"), (chart.OWED_RECEIPTS, USDC): Decimal("-4")}
    assert entry_lines(f"refund:{refund.pk}") == {
        (chart.OWED_RECEIPTS, USDC): Decimal("4"), (chart.DISTRIBUTION, USDC): Decimal("-4")}
    assert Entry.objects.get(idempotency_key=f"refund:{refund.pk}").reference == \
        f"receipt:{receipt.pk}"
    assert ledger.balance(account=chart.OWED_RECEIPTS, currency=USDC) == 0
    assert ledger.trial_balance().ok


def test_a_second_payment_after_the_verification_stays_out_of_the_books_until_sent_back(
        recon):
    """Chaos seed 7 (a CI run of stop 23): the customer paid twice under one memo, the
    second payment after the verification and before the payout existed (here the bank's
    validation of the beneficiary is pending). The poller's later pass rewrote the
    request's ``chain_evidence`` and ``received_amount`` with both payments while rule 3
    had booked the first only, so the reconciliation counted the second as booked: a
    10 USDC ``balance_differs`` on the distribution account (and its refund would have
    been booked against ``owed:withdrawal``). The verified row keeps what rule 3 booked."""
    number = unique_account_number()
    validation_account(recon, account_number=number, pending_s=8).raise_for_status()
    wallet, transaction_id, pay = start_withdrawal(recon, account_number=number)
    first = wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    wait_for(lambda: poller.poll_withdrawals().get("beneficiary_pending"), timeout=20,
             what="verified, the payout waiting for the bank's validation")
    key = "stellar:distribution USDC"
    before = compared(reconcile(), key)["difference"]  # earlier tests' receipts: see recon

    second = wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    wait_for(lambda: poller.poll_withdrawals() is not None and
             StellarReceipt.objects.filter(tx_hash=second).exists(), what="second scanned")
    poller.poll_withdrawals()  # a later pass over the verified request

    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert request.status == "funds_verified"
    assert [e["tx_hash"] for e in request.chain_evidence] == [first]
    assert request.received_amount == Decimal("10")
    assert compared(reconcile(), key)["difference"] == before
    assert not WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists(), \
        "the validation answered too early for this test's window"

    wait_for(lambda: poller.poll_withdrawals() is not None and WithdrawalPayout.objects.filter(
        transaction_id=transaction_id).exists(), timeout=20, interval=0.5,
        what="the payout once the bank answered")
    assert settle(transaction_id).status == "completed"
    receipt = wait_for(lambda: poller.poll_withdrawals() is not None and
                       StellarReceipt.objects.filter(tx_hash=second).exclude(
                           review_reason="").first(), timeout=10, what="second raised")
    refund = payout_ops.receipt_refund_on_chain(receipt_id=receipt.pk, operator=superuser(),
                                                note="ticket OPS-43: paid twice")

    assert refund.status == "completed"
    assert entry_lines(f"refund:{refund.pk}") == {
        (chart.OWED_RECEIPTS, USDC): Decimal("10"), (chart.DISTRIBUTION, USDC): Decimal("-10")}
    assert chart.owed_amount(account=chart.owed("withdrawal"), currency=USDC,
                             reference=transaction_id) == 0
    assert compared(reconcile(), key)["difference"] == before
    assert ledger.trial_balance().ok


# --- Razorpay settlements -----------------------------------------------------------------

def test_a_settled_payment_the_books_do_not_know_is_missing_in_books(recon):
    recon.fault("razorpay.webhook_lose", times=1)  # Corridor never hears of the payment
    transaction_id, order_id = start_and_pay(recon, Wallet(recon))
    payment = wait_for(lambda: [p for p in rzp.order_payments(order_id)
                                if p["status"] == "captured"], what="captured")[0]

    wait_for(lambda: reconcile() and mine(payment["id"]), timeout=15, interval=0.5,
             what="the settled payment seen")

    assert mine(payment["id"]) == [("razorpay", "missing_in_books", payment["id"])]
    found = Break.objects.get(reference=payment["id"])
    assert found.difference == chart.rupees(payment["amount"])
    assert found.books == {"payment": None} and found.outside["entity_id"] == payment["id"]
    assert not chart.posted(chart.settled_key(payment["id"]))  # nothing booked for it


# --- RazorpayX statement and balance ------------------------------------------------------

def test_a_payout_the_books_do_not_know_is_missing_in_books_and_explains_the_balance(recon):
    before = reconcile()
    payout, _ = create_payout(recon, vpa_fund_account(recon), amount=50000)

    run = reconcile()

    assert mine(payout["id"]) == [("razorpayx", "missing_in_books", payout["id"])]
    found = Break.objects.get(reference=payout["id"])
    assert found.difference == -chart.rupees(payout["amount"] + payout["fees"])
    assert found.books == {"payout": None}
    assert unexplained(run) == unexplained(before)  # the row break explains the balance


def test_a_row_break_an_operator_explained_explains_the_balance_no_more(recon):
    """Its adjusting entry is in the books now: counting the break again as well would
    leave a balance difference of its amount."""
    before = reconcile()
    payout, _ = create_payout(recon, vpa_fund_account(recon), amount=30000)
    reconcile()
    found = Break.objects.get(reference=payout["id"])
    treasury_ops.break_explain(break_id=found.pk, operator=superuser(),
                               amount=str(found.difference),
                               note="ticket OPS-7: paid from the dashboard by hand")

    run = reconcile()

    found.refresh_from_db()
    assert found.status == "explained"
    assert unexplained(run) == unexplained(before)


def test_a_reversal_of_a_payout_the_books_do_not_know_is_missing_in_books(recon):
    before = reconcile()
    recon.fault("razorpayx.processed_then_reversed", times=1, after_s=0.2)
    payout, _ = create_payout(recon, vpa_fund_account(recon), amount=40000)
    status_of(recon, payout["id"], "reversed")

    run = reconcile()

    reference = f"reversal:{payout['id']}"
    assert mine(payout["id"], reference) == [
        ("razorpayx", "missing_in_books", payout["id"]),
        ("razorpayx", "missing_in_books", reference)]
    back = Break.objects.get(reference=reference)
    assert back.difference == chart.rupees(payout["amount"] + payout["fees"])
    assert back.books == {"payout": None} and back.outside["source"]["entity"] == "reversal"
    assert unexplained(run) == unexplained(before)


def test_a_utr_the_statement_shows_otherwise_is_a_utr_break(recon):
    recon.fault("razorpayx.statement_utr_mismatch", times=1)
    before = reconcile()

    payout = paid_withdrawal(recon)
    run = reconcile()

    assert mine(payout.provider_payout_id) == [
        ("razorpayx", "utr_differs", payout.provider_payout_id)]
    found = Break.objects.get(reference=payout.provider_payout_id)
    assert found.books["utr"] == payout.reference
    assert found.outside["source"]["utr"] == f"STMT{payout.reference}"
    assert found.difference == 0
    assert unexplained(run) == unexplained(before)  # no money in it


def test_a_payout_booked_paid_the_statement_lacks_is_missing_outside_after_the_grace(
        recon, settings):
    settings.TREASURY_STATEMENT_GRACE_S = 3600.0
    before = reconcile()
    recon.fault("razorpayx.statement_omit_payout", times=1)  # never debited

    payout = paid_withdrawal(recon)
    reconcile()
    assert mine(payout.provider_payout_id) == []  # inside the grace: the statement may lag

    settings.TREASURY_STATEMENT_GRACE_S = 0.0
    run = reconcile()

    assert mine(payout.provider_payout_id) == [
        ("razorpayx", "missing_outside", payout.provider_payout_id)]
    found = Break.objects.get(reference=payout.provider_payout_id)
    assert found.difference == charged(payout)
    assert found.outside == {"statement_row": None}
    assert unexplained(run) == unexplained(before)  # the row break explains the balance


def test_a_payment_the_books_made_from_razorpayx_that_it_never_debited_is_a_positive_break(
        recon):
    """A reversed payout an operator confirms paid: the books say the rupees left the
    current account again (``payout_repaid``), RazorpayX shows no such debit: the
    balance there is higher than the books by the payout's amount."""
    payout = reversed_withdrawal(recon)
    before = reconcile()
    assert mine(payout.provider_payout_id, f"reversal:{payout.provider_payout_id}") == []

    payout_ops.payout_confirm_paid(payout_id=payout.pk, utr=new_utr(), operator=superuser(),
                                   note=NOTE)
    run = reconcile()

    key = f"razorpayx:balance_differs:{chart.RAZORPAYX_CURRENT}"
    assert unexplained(run) - unexplained(before) == chart.rupees(payout.amount_paise) > 0
    assert balance_breaks("razorpayx")[key] == unexplained(run)
    # The statement's row keeps the reversed payment's UTR; the operator's is the new one's.
    assert mine(payout.provider_payout_id, f"reversal:{payout.provider_payout_id}") == []


def test_a_reversed_payout_whose_statement_fees_differ_leaves_no_balance_difference(recon):
    """RazorpayX's reversal credits back what its debit row took (amount + the row's
    fees, TREASURY §5), the books what they paid (amount + the payout entity's fees): a
    debit row that took 1 INR more is given back 1 INR more, so the pair nets to nothing
    on both sides. Found by chaos (seed 4): the payout row's -1.00 amount_differs stayed
    counted after the reversal gave the rupee back, and the balance was 1.00 INR off for
    good."""
    recon.fault("razorpayx.statement_fee_mismatch", times=1, fees_extra=100, tax_extra=0)
    before = reconcile()

    payout = reversed_withdrawal(recon)
    run = reconcile()

    assert unexplained(run) == unexplained(before)
    # Each row its own break, as an operator explains each with its own entry.
    reference = f"reversal:{payout.provider_payout_id}"
    assert mine(payout.provider_payout_id, reference) == [
        ("razorpayx", "amount_differs", payout.provider_payout_id),
        ("razorpayx", "amount_differs", reference)]
    assert Break.objects.get(reference=payout.provider_payout_id).difference == Decimal("-1")
    back = Break.objects.get(reference=reference)
    assert back.difference == Decimal("1")
    assert back.outside["credit"] == payout.amount_paise + payout.fees_paise + 100


def test_payouts_debited_but_not_booked_paid_are_netted_as_in_flight(recon):
    before = reconcile()
    stuck = processing_payout(recon, "razorpayx.payout_stuck_processing")
    failed = processing_payout(recon, "razorpayx.fail_payout")
    status_of(recon, failed.provider_payout_id, "failed")

    run = reconcile()

    assert not chart.posted(chart.paid_key("withdrawal", stuck.transaction_id))
    assert not chart.posted(chart.paid_key("withdrawal", failed.transaction_id))
    # the failed one's debit and its reversal net out; the stuck one's debit is in flight
    # (amount and fees as RazorpayX charged them: Corridor has no fees before processed)
    debited = get_payout(recon, stuck.provider_payout_id)
    assert compared(run)["in_flight"] - compared(before)["in_flight"] == chart.rupees(
        debited["amount"] + debited["fees"]) > 0
    assert mine(stuck.provider_payout_id, failed.provider_payout_id,
                f"reversal:{failed.provider_payout_id}") == []
    assert unexplained(run) == unexplained(before)


# --- Horizon -------------------------------------------------------------------------------

def test_usdc_the_books_do_not_know_is_a_break_on_the_hub(recon):
    hub = stellar.hub_keypair().public_key
    key = f"horizon:balance_differs:{hub}"
    before = compared(reconcile(), "hub USDC")
    assert balance_breaks("horizon").get(key, Decimal(0)) == before["difference"]

    # The issuer pays 7 USDC to the hub (a treasury move nobody booked).
    recon.http.post("/horizon/sandbox/fund", json={"account": hub, "amount": "7"}
                    ).raise_for_status()
    wait_for(lambda: reconcile() and balance_breaks("horizon").get(key) ==
             before["difference"] + 7, timeout=10, interval=0.5, what="the hub's break")

    found = Break.objects.get(key=key)
    assert (found.account, found.currency) == ("hub", USDC)
    assert Decimal(found.outside["balance"]) == before["outside"] + 7
