"""Attacks on the SEP-31 refund path (commit e2fefb3): a remittance must never end with
the rupees recorded paid and the USDC refunded, and no USDC may be left with no owner
(nothing paid, nothing sent back, nothing in the operators' queue). Real HTTP against
the sandbox, real PostgreSQL, as tests/test_receive_refunds.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from anchor import stellar
from common.console import OperationRefused
from payouts import operations, poller
from payouts.models import StellarReceipt, WithdrawalPayout, WithdrawalRefund, WithdrawalRequest
from sagas.models import ReviewItem
from sandbox.sender31 import RECEIVER_FIELDS, Payment, SendingAnchor
from tests.flows import ap, unique_account_number, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sa(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return SendingAnchor(clean_sandbox.url)


def _operator() -> User:
    return User.objects.create_superuser("atk-ops", "atk@example.com", "pw")


def _receiver() -> dict:
    return {**RECEIVER_FIELDS, "bank_account_number": unique_account_number()}


def _polled_until(what: str, predicate, timeout: float = 40):
    return wait_for(lambda: poller.poll_withdrawals() is not None and predicate(),
                    timeout=timeout, interval=0.3, what=what)


def _paid_in(sa, remittance, payment: Payment | None = None) -> dict:
    _polled_until(f"{remittance.transaction_id} pending_sender",
                  lambda: ap(remittance.transaction_id)["status"] == "pending_sender")
    sa.finish(remittance, payment or Payment())
    return remittance.transaction


def _reversed(sa, clean_sandbox, payment: Payment | None = None):
    clean_sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.5,
                        reason="beneficiary_bank_offline")
    remittance = sa.start(amount="22", receiver_fields=_receiver())
    txn = _paid_in(sa, remittance, payment)
    payout = _polled_until("the reversal", lambda: WithdrawalPayout.objects.filter(
        transaction_id=remittance.transaction_id, status="reversed").first())
    return remittance, txn, payout


def test_a_reversal_refunded_to_the_sa_cannot_then_be_confirmed_paid(sa, clean_sandbox):
    """e2fefb3 lets a SEP-31 ``reversed`` payout be refunded on chain; the console also
    lets an operator confirm a ``reversed`` payout paid (the receiver was paid again
    outside Corridor). Nothing stops both: the USDC went back to the SA and the payout
    is then recorded ``completed`` with a UTR -- INR paid and USDC refunded for one
    remittance, its limits released meanwhile."""
    remittance, txn, payout = _reversed(sa, clean_sandbox)
    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)
    refund = operations.withdrawal_refund_on_chain(
        request_id=request.pk, operator=_operator(),
        note="OPS-60 the bank sent the rupees back; the SA asked for its USDC")
    assert refund.status == "completed", refund.last_error
    assert len(sa.received(txn["stellar_memo"])) == 1

    with pytest.raises(OperationRefused, match="refund"):
        operations.payout_confirm_paid(
            payout_id=payout.pk, utr="HDFC00012345678", operator=User.objects.get(),
            note="OPS-61 the receiver was paid again by NEFT from the bank portal")
    assert WithdrawalPayout.objects.get(pk=payout.pk).status == "reversed"


def test_a_receipt_refund_that_never_left_is_not_counted_as_sent_back(
        sa, clean_sandbox, settings, monkeypatch):
    """The SA pays twice; the second payment is raised in the receipt queue and its own
    refund is refused on chain (``manual_review``: nothing left). The remittance's
    refund (its payout reversed) subtracts that refund as if it had been sent, sends back
    only one payment and settles both receipts: the second payment leaves every queue
    with nothing sent back -- USDC with no owner."""
    settings.RECEIPT_GRACE_S = 0.0
    remittance, txn, payout = _reversed(sa, clean_sandbox, Payment(times=2))
    memo = txn["stellar_memo"]
    amount_in = Decimal(txn["amount_in"])
    second = _polled_until("the second payment raised", lambda: StellarReceipt.objects.filter(
        memo=memo).exclude(review_reason="").first())
    assert second.unconsumed == amount_in

    real_submit = stellar.submit
    monkeypatch.setattr(stellar, "submit", lambda xdr: stellar.SubmitResult(
        "failed", tx_code="tx_failed", op_codes=["op_no_trust"], detail="400 refused"))
    own = operations.receipt_refund_on_chain(receipt_id=second.pk, operator=_operator(),
                                             note="OPS-62 the SA paid twice")
    monkeypatch.setattr(stellar, "submit", real_submit)
    assert own.status == "manual_review", own.status  # refused: nothing left on chain

    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)

    def remittance_refund():  # once the refused envelope's channel lease has run out
        try:
            return operations.withdrawal_refund_on_chain(
                request_id=request.pk, operator=User.objects.get(),
                note="OPS-63 the bank sent the rupees back; refund the SA")
        except OperationRefused as exc:
            if "no refund envelope could be built" in str(exc):
                return None
            return exc  # refusing while the receipt's own refund is unresolved is safe

    wait_for(remittance_refund, timeout=20, interval=0.5, what="a free channel")
    for _ in range(2):
        poller.poll_withdrawals()

    back = sum((p["amount"] for p in sa.received(memo)), Decimal(0))
    owed = 2 * amount_in - back
    assert owed >= 0
    if owed:
        # What was not sent back must still be waiting for a person somewhere.
        receipt_items = ReviewItem.objects.filter(kind="receipt", object_id=second.pk)
        remittance_items = ReviewItem.objects.filter(
            reference=remittance.transaction_id, kind__in=("payout", "withdrawal"))
        assert receipt_items.exists() or remittance_items.exists(), (
            f"{owed} USDC received, not paid, not sent back and in no queue: refunds "
            f"{list(WithdrawalRefund.objects.values_list('transaction_id', 'status', 'amount'))}")
