"""SEP-31 receiving, when the rupees cannot be paid (issue 12 §3; SEP31-RECEIVE.md §3.2,
§3.3, §4 step 4): the USDC goes back to the sending anchor on chain, in full, to AP's
``refund_memo``, through the withdrawal refund outbox, and AP is moved as 4.x allows
(error -> recovery -> ``notify_refund_sent`` from ``pending_external``; straight
``notify_refund_sent`` from ``pending_receiver``; an ``error`` naming the refund for a
short payment; nothing from ``completed``). Corridor refunds by itself only when the
receiver's bank says the account cannot take the credit; everything else waits for a
person. Never both INR paid and USDC refunded. Real HTTP against the sandbox, real
PostgreSQL."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from anchor import stellar
from anchor.models import CustomerVolume
from common.console import AUTOMATIC, OperationRefused
from payouts import guard, operations, poller
from payouts.models import PayoutEvent, WithdrawalPayout, WithdrawalRefund, WithdrawalRequest
from sandbox.sender31 import RECEIVER_FIELDS, Payment, SendingAnchor
from tests.flows import ap, sandbox_payouts, unique_account_number, validation_account, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
NOTE = "OPS-31 the receiver's bank name differs from the KYC name"


@pytest.fixture
def sa(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return SendingAnchor(clean_sandbox.url)


def _operator() -> User:
    return User.objects.create_superuser("olga-ops", "olga@example.com", "pw")


def _receiver(account: str | None = None) -> dict:
    return {**RECEIVER_FIELDS, "bank_account_number": account or unique_account_number()}


def _polled_until(what: str, predicate, timeout: float = 40):
    return wait_for(lambda: poller.poll_withdrawals() is not None and predicate(),
                    timeout=timeout, interval=0.3, what=what)


def _refund(transaction_id: str) -> WithdrawalRefund | None:
    return WithdrawalRefund.objects.filter(transaction_id=transaction_id).first()


def _funds_requested(remittance) -> None:
    _polled_until(f"{remittance.transaction_id} pending_sender",
                  lambda: ap(remittance.transaction_id)["status"] == "pending_sender")


def _paid_in(sa, remittance, payment: Payment | None = None) -> dict:
    _funds_requested(remittance)
    sa.finish(remittance, payment or Payment())
    return remittance.transaction


def _paid_to_a_bank_that(sa, sandbox, amount: str, **bank):
    """A remittance of ``amount`` USDC to a fresh account whose bank answers as ``bank``
    says (``validation_account``: ``payout_failure``, ``account_status``,
    ``registered_name``), paid in by the SA; returns (remittance, the SA's view)."""
    account = unique_account_number()
    validation_account(sandbox, account_number=account, **bank).raise_for_status()
    remittance = sa.start(amount=amount, receiver_fields=_receiver(account))
    return remittance, _paid_in(sa, remittance)


def _assert_refunded_to_the_sender(sa, remittance, amount: Decimal) -> WithdrawalRefund:
    refund = _refund(remittance.transaction_id)
    assert refund is not None and refund.status == "completed", refund and refund.last_error
    memo = remittance.transaction["stellar_memo"]
    back = sa.received(memo)
    assert [(p["hash"], p["amount"]) for p in back] == [(refund.tx_hash, amount)], back
    assert back[0]["from"] == stellar.distribution_keypair().public_key
    assert (refund.destination, refund.memo, refund.memo_type) == (sa.account, memo, "id")
    return refund


def test_a_payout_the_receivers_bank_refuses_is_refunded_in_full_and_ap_refunded(
        sa, clean_sandbox):
    """The account validates (penny drop) but the bank refuses the credit: the payout
    fails with ``bank_account_invalid``, Corridor refunds by itself, and AP goes
    pending_external -> error -> pending_receiver -> refunded with our hash."""
    remittance, txn = _paid_to_a_bank_that(sa, clean_sandbox, "30",
                                             payout_failure="bank_account_invalid")

    tx = _polled_until("refunded in AP", lambda: (ap(remittance.transaction_id)["status"]
                                                   == "refunded") and ap(
        remittance.transaction_id))

    refund = _assert_refunded_to_the_sender(sa, remittance, Decimal(txn["amount_in"]))
    assert [p["status"] for p in sandbox_payouts(clean_sandbox, remittance.transaction_id)] \
        == ["failed"]
    assert WithdrawalPayout.objects.get(transaction_id=remittance.transaction_id).status \
        == "failed"
    payments = tx["refunds"]["payments"]
    assert [(p["id"], Decimal(p["amount"]["amount"])) for p in payments] == [
        (refund.tx_hash, Decimal(txn["amount_in"]))]
    assert Decimal(tx["refunds"]["amount_refunded"]["amount"]) == Decimal(
        tx["amount_in"]["amount"])
    event = PayoutEvent.objects.get(transaction_id=remittance.transaction_id,
                                    event="receive.refund")
    assert event.operator == AUTOMATIC and "bank_account_invalid" in event.note
    assert not CustomerVolume.objects.filter(transaction_id=remittance.transaction_id,
                                             released_at__isnull=True).exists()
    with pytest.raises(OperationRefused, match="refund"):
        operations.payout_new_attempt(
            payout_id=WithdrawalPayout.objects.get(transaction_id=refund.transaction_id).pk,
            operator=_operator(), note="OPS-34 try the payout again")
    # Nothing more happens on later passes: no second refund, no new payout.
    for _ in range(3):
        poller.poll_withdrawals()
    assert len(sa.received(txn["stellar_memo"])) == 1
    assert len(sandbox_payouts(clean_sandbox, remittance.transaction_id)) == 1


def test_an_account_the_validation_finds_invalid_is_refunded_before_any_payout(
        sa, clean_sandbox):
    remittance, txn = _paid_to_a_bank_that(sa, clean_sandbox, "25",
                                             account_status="invalid")

    _polled_until("refunded in AP",
                  lambda: ap(remittance.transaction_id)["status"] == "refunded")

    _assert_refunded_to_the_sender(sa, remittance, Decimal(txn["amount_in"]))
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
    assert not WithdrawalPayout.objects.filter(
        transaction_id=remittance.transaction_id).exists()


def test_a_name_mismatch_waits_for_an_operator_who_refunds_it(sa, clean_sandbox):
    remittance, txn = _paid_to_a_bank_that(sa, clean_sandbox, "20",
                                             registered_name="Rahul Mehta")
    request = _polled_until("the mismatch in review", lambda: WithdrawalRequest.objects.filter(
        transaction_id=remittance.transaction_id, status="manual_review").first())
    assert "name mismatch" in request.review_reason
    for _ in range(3):  # a mismatch is a person's call: Corridor refunds nothing itself
        poller.poll_withdrawals()
    assert _refund(remittance.transaction_id) is None
    assert ap(remittance.transaction_id)["status"] == "pending_receiver"

    refund = operations.withdrawal_refund_on_chain(request_id=request.pk,
                                                   operator=_operator(), note=NOTE)

    assert refund.status == "completed", refund.last_error
    _assert_refunded_to_the_sender(sa, remittance, Decimal(txn["amount_in"]))
    assert ap(remittance.transaction_id)["status"] == "refunded"
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
    with pytest.raises(OperationRefused, match="refunded already"):
        operations.withdrawal_refund_on_chain(request_id=request.pk,
                                              operator=User.objects.get(), note=NOTE)
    # A worker that read the request before the refund (found by the attacker trial):
    # even with the request written back to funds_verified, the claim is refused.
    WithdrawalRequest.objects.filter(pk=request.pk).update(status="funds_verified")
    with pytest.raises(guard.NotPayable, match="refund"):
        guard.payout_claim(request=request)
    assert not WithdrawalPayout.objects.filter(
        transaction_id=remittance.transaction_id).exists()


def test_a_short_payment_ap_never_saw_is_told_to_ap_then_refunded_in_full(
        sa, clean_sandbox, settings):
    """AP's observer is down and the SA pays short: AP still shows ``pending_sender``
    (no refund can be recorded there), the payment is held for review, the operator
    refunds what arrived; Corridor tells AP of the USDC first (amount_in = what arrived)
    and AP ends ``refunded`` by exactly that: a full refund, never the partial-refund
    dead end (SEP31-RECEIVE.md §3.3)."""
    settings.WITHDRAW_SHORT_GRACE_S = 0.5
    remittance = sa.start(amount="40", receiver_fields=_receiver())
    short = Decimal(remittance.quote["sell_amount"]) - Decimal("0.5")
    _funds_requested(remittance)
    clean_sandbox.fault("ap.observer_off", times=None)
    sa.finish(remittance, Payment(amount=str(short)))
    request = _polled_until("the short payment in review", lambda: (
        WithdrawalRequest.objects.filter(transaction_id=remittance.transaction_id,
                                         status="manual_review").first()))
    assert ap(remittance.transaction_id)["status"] == "pending_sender"

    refund = operations.withdrawal_refund_on_chain(request_id=request.pk,
                                                   operator=_operator(), note=NOTE)

    assert refund.status == "completed", refund.last_error
    refund = _assert_refunded_to_the_sender(sa, remittance, short)
    tx = ap(remittance.transaction_id)
    assert tx["status"] == "refunded", tx
    assert Decimal(tx["amount_in"]["amount"]) == short
    assert [p["id"] for p in tx["refunds"]["payments"]] == [refund.tx_hash]


def test_a_payout_reversed_after_ap_completed_is_refunded_on_chain_and_ap_stays_completed(
        sa, clean_sandbox):
    clean_sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.5,
                        reason="beneficiary_bank_offline")
    remittance = sa.start(amount="22", receiver_fields=_receiver())
    txn = _paid_in(sa, remittance)
    payout = _polled_until("the reversal", lambda: WithdrawalPayout.objects.filter(
        transaction_id=remittance.transaction_id, status="reversed").first())
    assert ap(remittance.transaction_id)["status"] == "completed"
    assert _refund(remittance.transaction_id) is None  # a reversal is a person's call

    refund = operations.withdrawal_refund_on_chain(
        request_id=WithdrawalRequest.objects.get(transaction_id=payout.transaction_id).pk,
        operator=_operator(), note="OPS-32 the bank sent the rupees back; the SA asked")

    assert refund.status == "completed" and "completed" in refund.last_error
    _assert_refunded_to_the_sender(sa, remittance, Decimal(txn["amount_in"]))
    assert ap(remittance.transaction_id)["status"] == "completed"


def test_no_refund_while_the_provider_may_still_pay(sa, clean_sandbox):
    """One way a remittance could be paid twice (INR and the USDC back): a refund while a
    payout is still ``processing`` at RazorpayX, believed failed by our row, is refused
    on what RazorpayX says now. (The other, a new attempt after a refund, is refused in
    the first test.)"""
    clean_sandbox.fault("razorpayx.payout_stuck_processing", times=1)
    remittance = sa.start(amount="21", receiver_fields=_receiver())
    _paid_in(sa, remittance)
    payout = _polled_until("a payout at RazorpayX", lambda: WithdrawalPayout.objects.filter(
        transaction_id=remittance.transaction_id).exclude(provider_payout_id="").first())
    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)
    WithdrawalRequest.objects.filter(pk=request.pk).update(status="manual_review")
    WithdrawalPayout.objects.filter(pk=payout.pk).update(status="failed")  # a wrong belief

    with pytest.raises(OperationRefused, match="still holds"):
        operations.withdrawal_refund_on_chain(request_id=request.pk, operator=_operator(),
                                              note=NOTE)
    assert _refund(remittance.transaction_id) is None
    assert sa.received(remittance.transaction["stellar_memo"]) == []


def test_a_transient_bank_failure_is_not_refunded_and_an_operator_can_pay_again(
        sa, clean_sandbox):
    account = unique_account_number()
    validation_account(clean_sandbox, account_number=account,
                       payout_failure="beneficiary_bank_offline").raise_for_status()
    remittance = sa.start(amount="23", receiver_fields=_receiver(account))
    _paid_in(sa, remittance)
    payout = _polled_until("the failed payout", lambda: WithdrawalPayout.objects.filter(
        transaction_id=remittance.transaction_id, status="failed").first())
    for _ in range(3):
        poller.poll_withdrawals()
    assert _refund(remittance.transaction_id) is None
    # An operator's words are not the bank's (found by the attacker trial): a note that
    # ends in a reason Corridor refunds for must not start a refund.
    WithdrawalPayout.objects.filter(pk=payout.pk).update(
        last_error="marked failed by olga-ops: OPS-35: bank_account_closed")
    poller.poll_withdrawals()
    assert _refund(remittance.transaction_id) is None
    validation_account(clean_sandbox, account_number=account).raise_for_status()  # back up

    again = operations.payout_new_attempt(payout_id=payout.pk, operator=_operator(),
                                          note="OPS-33 the bank is back online")

    assert again.attempts == 2
    _polled_until("AP completed", lambda: ap(remittance.transaction_id)["status"]
                  == "completed")
    assert [p["status"] for p in sandbox_payouts(clean_sandbox, remittance.transaction_id)] \
        == ["failed", "processed"]
    with pytest.raises(OperationRefused):
        operations.withdrawal_refund_on_chain(request_id=WithdrawalRequest.objects.get(
            transaction_id=remittance.transaction_id).pk, operator=User.objects.get(),
            note=NOTE)
