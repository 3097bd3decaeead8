"""The books of the deposit and withdrawal paths (issue 13 §1; ledger/chart.py): each
state change posts its entry in its own transaction, idempotent by the external
reference, through ``ledger.services.post``. Real flows against the sandbox over HTTP
and the real PostgreSQL: the entries and their lines after the flow, a replay of the
state change posts nothing new, a rollback of it leaves no entry, the owed:* accounts
end at zero, and ``stellar:distribution`` moves as the sandbox Horizon shows."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.conf import settings
from django.db import transaction

from anchor import deposits, releases, stellar
from anchor.models import DepositOrder, DepositPayment, DepositRelease
from ledger import chart
from ledger import services as ledger
from ledger.models import Entry
from payouts import guard, operations, poller, refunds
from payouts.models import WithdrawalPayout, WithdrawalRefund, WithdrawalRequest
from sandbox.sender31 import RECEIVER_FIELDS, Payment, SendingAnchor
from tests.flows import (
    Wallet,
    ap,
    horizon,
    paid_deposit,
    pay_and_wait_for_ap,
    purge_broker,
    sandbox_payouts,
    settle,
    start_and_pay,
    start_withdrawal,
    unique_account_number,
    validation_account,
    wait_for,
)
from tests.recon import superuser

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
USDC, INR = "USDC", "INR"


@pytest.fixture
def sbx(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return clean_sandbox


def lines(key: str) -> dict[tuple[str, str], Decimal]:
    """The postings of entry ``key``: (account, currency) -> summed amount."""
    out: dict[tuple[str, str], Decimal] = {}
    for p in Entry.objects.get(idempotency_key=key).postings.select_related("account"):
        k = (p.account.code, p.account.currency)
        out[k] = out.get(k, Decimal(0)) + p.amount
    return out


def keys(reference: str) -> list[str]:
    return sorted(Entry.objects.filter(reference=reference)
                  .values_list("idempotency_key", flat=True))


def distribution_moved(reference: str) -> Decimal:
    """The sum of the ``stellar:distribution`` postings of the entries of ``reference``."""
    return sum((v for key in keys(reference) for (code, _), v in lines(key).items()
                if code == chart.DISTRIBUTION), Decimal(0))


def chain_moved(sandbox, hashes: set[str]) -> Decimal:
    """What the sandbox Horizon shows the distribution account receive (+) and send (-)
    in the transactions ``hashes``: USDC payments only."""
    account = stellar.distribution_keypair().public_key
    records = horizon(sandbox).payments().for_account(account).limit(200).call()
    total = Decimal(0)
    for r in records["_embedded"]["records"]:
        if r.get("type") != "payment" or r["transaction_hash"] not in hashes or \
                r.get("asset_code") != settings.STELLAR_USDC_CODE:
            continue
        if r["to"] == account:
            total += Decimal(r["amount"])
        if r["from"] == account:
            total -= Decimal(r["amount"])
    return total


def owed_balances() -> dict[str, Decimal]:
    return {code: ledger.balance(account=code, currency=ccy)
            for code, ccy, _ in chart.ACCOUNTS if code.startswith("owed:")}



# --- deposits ---------------------------------------------------------------------------

def test_a_deposit_books_its_capture_and_release_once_and_owes_nothing_at_the_end(
        clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    order = DepositOrder.objects.get(transaction_id=transaction_id)
    captured = f"deposit:{payment.payment_id}:captured"
    assert lines(captured) == {("razorpay:pending", INR): order.amount_in,
                               ("owed:deposits", INR): -order.amount_in}
    assert not Entry.objects.filter(kind="deposit.released").exists()  # not landed yet

    releases.release_start(transaction_id=transaction_id)
    release = settle(transaction_id)

    assert release.status == "completed"
    released = f"deposit:{transaction_id}:released"
    assert lines(released) == {
        ("owed:deposits", INR): order.amount_in, ("revenue:fees", INR): -order.fee,
        ("fx", INR): order.fee - order.amount_in, ("fx", USDC): order.amount_out,
        ("stellar:distribution", USDC): -order.amount_out}
    assert keys(transaction_id) == sorted([captured, released])
    assert owed_balances()["owed:deposits"] == 0
    assert distribution_moved(transaction_id) == chain_moved(clean_sandbox, {release.tx_hash}) \
        == -order.amount_out
    assert ledger.trial_balance().ok

    # Replays of both state changes: nothing new.
    count = Entry.objects.count()
    deposits.payment_confirm(transaction_id=transaction_id)
    releases._mark_submitted(DepositRelease.objects.get(pk=release.pk))
    releases.release_drive(release_id=release.pk, redrive=True)
    assert Entry.objects.count() == count
    again = chart.deposit_released(transaction_id=transaction_id, payment_id=payment.payment_id,
                                   amount_in=order.amount_in, fee=order.fee,
                                   amount_out=order.amount_out)
    assert again.replayed and Entry.objects.count() == count


def test_a_rolled_back_confirmation_leaves_no_capture_entry(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, _ = start_and_pay(clean_sandbox, wallet)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    payment.refresh_from_db()
    if payment.confirmation == "confirmed":
        pytest.skip("a worker confirmed it first")

    with pytest.raises(RuntimeError), transaction.atomic():
        deposits.payment_confirm(transaction_id=transaction_id)
        assert Entry.objects.filter(kind="deposit.captured").exists()  # inside: posted
        raise RuntimeError("the caller's transaction fails after the confirmation")

    assert DepositPayment.objects.get(pk=payment.pk).confirmation == "unconfirmed"
    assert not Entry.objects.filter(reference=transaction_id).exists()
    deposits.payment_confirm(transaction_id=transaction_id)  # the retry books it once
    assert keys(transaction_id) == [f"deposit:{payment.payment_id}:captured"]


# --- withdrawals ------------------------------------------------------------------------

def test_a_withdrawal_books_received_and_paid_with_razorpayx_fees_and_owes_nothing(sbx):
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay)

    payout = settle(transaction_id)

    assert payout.status == "completed" and payout.ap_completed_at
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    provider = sandbox_payouts(sbx, transaction_id)[0]
    assert (payout.fees_paise, payout.tax_paise) == (provider["fees"], provider["tax"])
    assert provider["fees"] > provider["tax"] > 0
    assert lines(f"withdrawal:{transaction_id}:received") == {
        ("stellar:distribution", USDC): Decimal("10"), ("owed:withdrawals", USDC): Decimal("-10")}
    fee = chart.rupees(provider["fees"] - provider["tax"])
    tax = chart.rupees(provider["tax"])
    assert lines(f"withdrawal:{transaction_id}:paid") == {
        ("owed:withdrawals", USDC): request.amount_in, ("revenue:fees", USDC): -request.fee,
        ("fx", USDC): request.fee - request.amount_in, ("fx", INR): request.amount_out,
        ("razorpayx:current", INR): -(request.amount_out + fee + tax),
        ("expense:provider_fees", INR): fee, ("expense:taxes", INR): tax}
    assert all(v == 0 for v in owed_balances().values()), owed_balances()
    receipts = {r["tx_hash"] for r in request.chain_evidence}
    assert distribution_moved(transaction_id) == chain_moved(sbx, receipts) == Decimal("10")
    assert ledger.trial_balance().ok

    # The poller again, and the provider's state applied again: one entry each.
    count = Entry.objects.count()
    for _ in range(2):
        poller.poll_withdrawals()
    guard.payout_apply_status(payout=payout, state=guard.provider().fetch(
        payout.provider_payout_id))
    assert Entry.objects.count() == count


def test_a_rolled_back_payout_completion_leaves_no_paid_entry(sbx):
    wallet, transaction_id, pay = start_withdrawal(sbx)
    sbx.fault("razorpayx.webhook_lose", times=1)
    pay_and_wait_for_ap(wallet, pay)
    payout = wait_for(lambda: poller.poll_withdrawals() is not None and
                      WithdrawalPayout.objects.filter(transaction_id=transaction_id)
                      .exclude(provider_payout_id="").first(), what="payout created")
    state = wait_for(lambda: (s := guard.provider().fetch(payout.provider_payout_id))
                     .status == "processed" and s, what="processed at the provider")
    payout.refresh_from_db()
    if payout.status != "processing":
        pytest.skip("the poller applied processed first")

    with pytest.raises(RuntimeError), transaction.atomic():
        guard.payout_apply_status(payout=payout, state=state, complete_ap=False)
        assert Entry.objects.filter(idempotency_key=f"withdrawal:{transaction_id}:paid").exists()
        raise RuntimeError("the caller's transaction fails after the transition")

    assert WithdrawalPayout.objects.get(pk=payout.pk).status == "processing"
    assert not Entry.objects.filter(idempotency_key=f"withdrawal:{transaction_id}:paid").exists()
    assert settle(transaction_id).status == "completed"
    assert Entry.objects.filter(reference=transaction_id, kind="withdrawal.paid").count() == 1


def test_a_reversed_payout_credits_razorpayx_back_holds_the_rupees_and_repays_them(sbx):
    sbx.fault("razorpayx.processed_then_reversed", times=1, after_s=1)
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay)
    settle(transaction_id)
    payout = wait_for(lambda: poller.poll_withdrawals() is not None and
                      WithdrawalPayout.objects.filter(transaction_id=transaction_id,
                                                      status="reversed").first(),
                      what="reversed")

    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    fee = chart.rupees(payout.fees_paise - payout.tax_paise)
    tax = chart.rupees(payout.tax_paise)
    assert lines(f"withdrawal:{transaction_id}:reversed") == {
        ("razorpayx:current", INR): request.amount_out + fee + tax,
        ("expense:provider_fees", INR): -fee, ("expense:taxes", INR): -tax,
        ("owed:reversed", INR): -request.amount_out}
    assert ledger.balance(account="razorpayx:current", currency=INR) == 0
    assert ledger.balance(account="expense:provider_fees", currency=INR) == 0
    assert ledger.balance(account="owed:reversed", currency=INR) == -request.amount_out
    assert ledger.balance(account="owed:withdrawals", currency=USDC) == 0
    count = Entry.objects.count()
    poller.poll_withdrawals()
    guard.payout_apply_status(payout=payout, state=guard.provider().fetch(
        payout.provider_payout_id))
    assert Entry.objects.count() == count

    # An operator confirms it paid after all (paid again outside Corridor, new UTR): the
    # rupees held again left the current account, once.
    operations.payout_confirm_paid(payout_id=payout.pk, utr="NEFTN20240517001",
                                   operator=superuser(), note="OPS-51 paid by NEFT")
    assert lines(f"withdrawal:{transaction_id}:repaid") == {
        ("owed:reversed", INR): request.amount_out,
        ("razorpayx:current", INR): -request.amount_out}
    assert ledger.balance(account="owed:reversed", currency=INR) == 0
    assert ledger.balance(account="razorpayx:current", currency=INR) == -request.amount_out
    assert all(v == 0 for v in owed_balances().values()), owed_balances()
    count = Entry.objects.count()
    chart.payout_repaid(kind="withdrawal", transaction_id=transaction_id,
                        amount_out=request.amount_out)
    assert Entry.objects.count() == count
    assert ledger.trial_balance().ok


# --- SEP-31 receives and refunds ----------------------------------------------------------

@pytest.fixture
def sa(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return SendingAnchor(clean_sandbox.url)


def _paid_in(sa, amount: str, account: str | None = None):
    remittance = sa.start(amount=amount, receiver_fields={
        **RECEIVER_FIELDS, "bank_account_number": account or unique_account_number()})
    wait_for(lambda: poller.poll_withdrawals() is not None and
             ap(remittance.transaction_id)["status"] == "pending_sender",
             timeout=40, interval=0.3, what="pending_sender")
    sa.finish(remittance, Payment())
    return remittance


def test_a_receive_refunded_after_its_payout_failed_books_received_and_refund(
        sa, clean_sandbox):
    account = unique_account_number()
    validation_account(clean_sandbox, account_number=account,
                       payout_failure="bank_account_invalid").raise_for_status()
    remittance = _paid_in(sa, "30", account)
    tid = remittance.transaction_id
    refund = wait_for(lambda: poller.poll_withdrawals() is not None and
                      WithdrawalRefund.objects.filter(transaction_id=tid,
                                                      status="completed").first(),
                      timeout=40, interval=0.3, what="refund completed")

    request = WithdrawalRequest.objects.get(transaction_id=tid)
    assert request.kind == "receive"
    received = request.received_amount
    assert lines(f"receive:{tid}:received") == {
        ("stellar:distribution", USDC): received, ("owed:receives", USDC): -received}
    assert lines(f"refund:{refund.pk}") == {
        ("owed:receives", USDC): refund.amount, ("stellar:distribution", USDC): -refund.amount}
    assert not Entry.objects.filter(reference=tid, kind="receive.paid").exists()
    assert ledger.balance(account="owed:receives", currency=USDC) == 0
    hashes = {r["tx_hash"] for r in request.chain_evidence} | {refund.tx_hash}
    assert distribution_moved(tid) == chain_moved(clean_sandbox, hashes) == 0
    count = Entry.objects.count()
    refunds._landed(refund, {"successful": True})  # the landing replayed
    refunds.refund_drive(refund_id=refund.pk, resumed=True)
    assert Entry.objects.count() == count


def test_a_receive_refunded_after_a_reversal_buys_the_rupees_back(sa, clean_sandbox):
    clean_sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.5,
                        reason="beneficiary_bank_offline")
    remittance = _paid_in(sa, "22")
    tid = remittance.transaction_id
    wait_for(lambda: poller.poll_withdrawals() is not None and WithdrawalPayout.objects.filter(
        transaction_id=tid, status="reversed").exists(), timeout=40, interval=0.3,
        what="reversed")
    request = WithdrawalRequest.objects.get(transaction_id=tid)

    refund = operations.withdrawal_refund_on_chain(
        request_id=request.pk, operator=superuser(), note="OPS-32 the bank sent it back")

    assert refund.status == "completed"
    assert lines(f"refund:{refund.pk}:reconverted") == {
        ("owed:reversed", INR): request.amount_out, ("fx", INR): -request.amount_out,
        ("fx", USDC): request.amount_in - request.fee, ("revenue:fees", USDC): request.fee,
        ("owed:receives", USDC): -request.amount_in}
    assert set(keys(tid)) == {f"receive:{tid}:received", f"receive:{tid}:paid",
                              f"receive:{tid}:reversed", f"refund:{refund.pk}:reconverted",
                              f"refund:{refund.pk}"}
    assert all(v == 0 for v in owed_balances().values()), owed_balances()
    for code, ccy in [("fx", INR), ("fx", USDC), ("revenue:fees", USDC),
                      ("razorpayx:current", INR), ("expense:provider_fees", INR),
                      ("expense:taxes", INR)]:
        assert ledger.balance(account=code, currency=ccy) == 0, code
    hashes = {r["tx_hash"] for r in request.chain_evidence} | {refund.tx_hash}
    assert distribution_moved(tid) == chain_moved(clean_sandbox, hashes) == 0
    assert ledger.trial_balance().ok
