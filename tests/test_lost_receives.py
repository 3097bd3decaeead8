"""A failover that loses the last seconds of commits (issue 25 §2) on the SEP-31 receive
path (payouts/receive.py): a foreign sending anchor sends USDC, Corridor pays INR through
RazorpayX. AP lives on its own database and keeps the transaction; Corridor's rows for
it (the ``withdrawal_requests`` row with our memo, the firm quote's link, the funds
request, the USDC's verification and booking, the payout claim and its attempt key) go
with the commits lost (tests/rewind.py). Chaos seed 2 with one burner ended with two
such receives stranded: ``AP pending_sender, payout None, request None`` and ``AP
pending_receiver, payout None, request None``, nothing ever rebuilding them.

Each test loses those commits at one moment, runs what beat runs (the withdrawal
poller), and checks that the request was rebuilt from AP, the USDC verified on chain and
booked once, and the INR paid exactly once through RazorpayX (a payout it already made
is found again by the derived attempt key, never paid twice).
"""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from anchor import stellar
from anchor.models import Customer, FirmQuote
from ledger import chart
from ledger import services as ledger
from ledger.models import Entry
from payouts import guard, operations, poller, receipts, tasks
from payouts.models import (
    PayoutAttempt,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from sandbox.sender31 import RECEIVER_FIELDS, SendingAnchor
from tests import rewind
from tests.flows import (
    ap,
    sandbox_payouts,
    settle,
    unique_account_number,
    validation_account,
    wait_for,
)
from tests.recon import compared
from treasury.reconcile import open_distribution, reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sa(clean_sandbox, settings):
    settings.RECEIVE_REBUILD = True  # off for the rest of the suite (tests/conftest.py)
    return SendingAnchor(clean_sandbox.url)


def _receiver(account: str = "") -> dict:
    return {**RECEIVER_FIELDS, "bank_account_number": account or unique_account_number()}


def _until(transaction_id: str, *statuses: str, poll: bool = True) -> dict:
    """AP's transaction once it is in one of ``statuses``, the poller run between reads
    as beat runs it (``poll``) or not (AP's own observer moves it)."""
    def reached():
        if poll:
            poller.poll_withdrawals()
        tx = ap(transaction_id)
        return tx if tx["status"] in statuses else None

    return wait_for(reached, timeout=40, interval=0.3,
                    what=f"{transaction_id} in {'/'.join(statuses)}", explain=lambda: (
                        ap(transaction_id)["status"],
                        list(WithdrawalRequest.objects.filter(
                            transaction_id=transaction_id).values("status", "review_reason")),
                        list(WithdrawalPayout.objects.filter(
                            transaction_id=transaction_id).values("status", "last_error"))))


def _rows(transaction_id: str) -> tuple[int, int]:
    """Corridor's request and payout rows of one receive (earlier tests' receives, still
    in the session's sandbox AP, are rebuilt beside it: counted apart)."""
    return (WithdrawalRequest.objects.filter(transaction_id=transaction_id).count(),
            WithdrawalPayout.objects.filter(transaction_id=transaction_id).count())


def _assert_paid_once(sandbox, remittance) -> WithdrawalPayout:
    """One RazorpayX payout of the quote's INR under the derived attempt key, completed,
    AP completed with its UTR; the USDC booked received and the INR booked paid once; the
    quote taken by this transaction."""
    transaction_id = remittance.transaction_id
    _until(transaction_id, "completed")
    payout = settle(transaction_id)
    assert payout is not None, "no payout row: nothing rebuilt the receive"
    quote = FirmQuote.objects.get(quote_id=remittance.quote["id"])
    made = sandbox_payouts(sandbox, transaction_id)
    assert [p["amount"] for p in made] == [int(quote.buy_amount * 100)], made
    assert (payout.status, payout.provider_payout_id) == ("completed", made[0]["id"])
    assert ap(transaction_id)["external_transaction_id"] == payout.reference != ""
    attempt = PayoutAttempt.objects.get(payout=payout)
    assert attempt.idempotency_key == guard.attempt_key(transaction_id=transaction_id,
                                                        number=1)
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert (request.kind, request.status, request.memo) == (
        "receive", "funds_verified", ap(transaction_id)["memo"])
    for key in (chart.received_key("receive", transaction_id),
                chart.paid_key("receive", transaction_id)):
        assert Entry.objects.filter(idempotency_key=key).count() == 1, key
    assert quote.transaction_id == transaction_id and quote.used_at is not None
    return payout


def test_a_receive_lost_while_ap_waits_for_the_sender_is_rebuilt_and_paid_once(
        sa, clean_sandbox):
    # given a remittance Corridor decided and asked the funds for (AP pending_sender)
    remittance = sa.start(amount="20", receiver_fields=_receiver())
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")

    # when the failover loses the decision (the request, our memo, the quote's link)
    rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (0, 0)
    assert FirmQuote.objects.get(quote_id=remittance.quote["id"]).used_at is None
    # and the sending anchor pays afterwards, to the memo AP holds
    sa.finish(remittance)

    # then the poller rebuilds the request from AP, verifies the USDC and pays once
    _assert_paid_once(clean_sandbox, remittance)


def test_a_receive_lost_after_its_usdc_arrived_is_rebuilt_and_paid_once(sa, clean_sandbox):
    # given a remittance whose USDC arrived and AP recorded (pending_receiver)
    remittance = sa.start(amount="21", receiver_fields=_receiver())
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")
    sa.finish(remittance)
    tx = _until(remittance.transaction_id, "pending_receiver", poll=False)
    assert tx.get("transfer_received_at")

    # when the failover loses every commit since the transaction was decided
    rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (0, 0)

    # then the poller rebuilds it from AP and the chain, and pays once
    _assert_paid_once(clean_sandbox, remittance)


@pytest.mark.parametrize("paid", [False, True], ids=["sender not yet", "usdc arrived"])
def test_a_receive_whose_funds_request_mark_was_lost_is_paid_once(
        sa, clean_sandbox, paid):
    """20-seed loaded chaos at 9f7ddba, seed 3 (read from its database): the request row
    of a receive held no ``funds_requested_at`` while AP had taken the funds request (the
    commit of the mark lost, or its worker killed between AP's answer and the update)
    and the sender had paid: the decision saw AP past asking and answered ``not_due``,
    every pass, so the USDC sat unpaid (AP pending_receiver, payout None, request
    awaiting_funds)."""
    # given a remittance Corridor decided and asked the funds for, whose mark was lost
    remittance = sa.start(amount="22", receiver_fields=_receiver())
    _until(remittance.transaction_id, "pending_sender")
    assert WithdrawalRequest.objects.filter(transaction_id=remittance.transaction_id).update(
        funds_requested_at=None) == 1
    if paid:  # and the sending anchor paid before any pass looked again
        sa.finish(remittance)
        _until(remittance.transaction_id, "pending_receiver", poll=False)
    else:
        poller.poll_withdrawals()
        sa.finish(remittance)

    # then the poller takes AP's record as the mark, verifies the USDC and pays once
    _assert_paid_once(clean_sandbox, remittance)


def test_a_receive_payout_lost_after_razorpayx_took_it_is_not_paid_twice(sa, clean_sandbox):
    # given a remittance paid in: RazorpayX took its payout (AP pending_external), no
    # webhook yet
    clean_sandbox.fault("razorpayx.settle_delay", seconds=2.0)
    clean_sandbox.fault("razorpayx.webhook_lose", times=3)
    remittance = sa.start(amount="22", receiver_fields=_receiver())
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")
    sa.finish(remittance)
    _until(remittance.transaction_id, "pending_external")
    assert len(sandbox_payouts(clean_sandbox, remittance.transaction_id)) == 1

    # when the failover loses the request, the verification and the payout claim
    lost = rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (0, 0) and lost["payout_attempts"] >= 1
    assert not Entry.objects.filter(idempotency_key=chart.received_key(
        "receive", remittance.transaction_id)).exists()

    # then the rebuilt request's claim carries the same derived key: RazorpayX answers
    # with the payout it made, and nothing is paid twice
    _assert_paid_once(clean_sandbox, remittance)


def test_a_receive_lost_after_ap_completed_is_rebuilt_and_booked_not_paid_again(
        sa, clean_sandbox):
    # given a remittance paid in full and completed in AP
    remittance = sa.start(amount="23", receiver_fields=_receiver())
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")
    sa.finish(remittance)
    _until(remittance.transaction_id, "completed")
    assert len(sandbox_payouts(clean_sandbox, remittance.transaction_id)) == 1

    # when the failover loses every commit of it (request, booking, payout, its key)
    rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (0, 0)

    # then the poller finds it among the receives AP closed lately, rebuilds the request
    # from AP, books the USDC and records RazorpayX's payout, paying nothing more
    _assert_paid_once(clean_sandbox, remittance)


def test_a_receive_completed_in_ap_whose_payout_was_lost_is_rebuilt_not_paid_again(
        sa, clean_sandbox):
    """Chaos seed 2 (20 seeds, two burners): ``inbound … not final: AP completed, payout
    None, request awaiting_funds``. The request's row survived the failover as it was
    when the funds were asked for; its verification, payout and booking did not, and
    AP's completed receive was looked at by nobody (the lost-closed listing took only
    receives with no request row)."""
    # given a remittance decided and asked the funds for: the mark is after its request
    remittance = sa.start(amount="24", receiver_fields=_receiver())
    _until(remittance.transaction_id, "pending_sender")
    before = rewind.mark()
    sa.finish(remittance)
    _until(remittance.transaction_id, "completed")
    assert len(sandbox_payouts(clean_sandbox, remittance.transaction_id)) == 1

    # when the failover loses everything after the funds request (AP keeps completed)
    rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (1, 0)
    assert WithdrawalRequest.objects.get(
        transaction_id=remittance.transaction_id).status == "awaiting_funds"

    # then the poller records RazorpayX's payout and books the USDC, paying nothing more
    _assert_paid_once(clean_sandbox, remittance)


def test_a_receive_whose_receiver_was_lost_too_is_held_for_a_person_never_paid(
        sa, clean_sandbox, settings):
    # given a remittance whose customers, quote and decision were all in the seconds lost
    before = rewind.mark()
    remittance = sa.start(amount="24", receiver_fields=_receiver())
    _until(remittance.transaction_id, "pending_sender")
    rewind.rewind(before)
    assert not Customer.objects.filter(pk=remittance.receiver_id).exists()
    sa.finish(remittance)  # the sending anchor pays to the memo AP holds

    # when the poller runs
    request = wait_for(lambda: poller.poll_withdrawals() is not None and
                       WithdrawalRequest.objects.filter(
                           transaction_id=remittance.transaction_id).first(),
                       timeout=40, interval=0.3, what="the request rebuilt")

    # then the request is rebuilt in review (no bank account to pay), nothing is paid,
    # and the person's refund sends the USDC back once
    assert request.status == "manual_review"
    assert "receiver" in request.review_reason and "refund" in request.review_reason
    for _ in range(3):
        poller.poll_withdrawals()
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
    assert not WithdrawalPayout.objects.filter(transaction_id=remittance.transaction_id
                                               ).exists()
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    refund = operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                   note="receiver lost in a failover")
    assert refund.status == "completed", refund.last_error
    back = sa.received(remittance.transaction["stellar_memo"])
    assert [(p["hash"], p["amount"]) for p in back] == [
        (refund.tx_hash, Decimal(remittance.transaction["amount_in"]))]
    assert ap(remittance.transaction_id)["status"] == "refunded"


def test_a_receive_refunded_in_ap_whose_rows_were_lost_is_rebuilt_not_refunded_again(
        sa, clean_sandbox, settings):
    # given a remittance whose receiver's bank refused the payout: Corridor refunded the
    # USDC itself and AP shows it refunded
    account = unique_account_number()
    validation_account(clean_sandbox, account_number=account,
                       payout_failure="bank_account_invalid").raise_for_status()
    remittance = sa.start(amount="25", receiver_fields=_receiver(account))
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")
    sa.finish(remittance)
    _until(remittance.transaction_id, "refunded")
    memo = remittance.transaction["stellar_memo"]
    sent_back = sa.received(memo)
    assert len(sent_back) == 1

    # when the failover loses every commit of it (request, payout, refund, bookings)
    rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (0, 0)

    # then the poller rebuilds the request in review, and the refund sweep rebuilds the
    # refund from AP's hash on chain: booked, nothing sent again, nothing paid
    request = wait_for(lambda: poller.poll_withdrawals() is not None and
                       WithdrawalRequest.objects.filter(
                           transaction_id=remittance.transaction_id).first(),
                       timeout=40, interval=0.3, what="the request rebuilt")
    assert request.status == "manual_review" and "refunded" in request.review_reason

    def rebuilt():
        time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
        poller.poll_withdrawals()
        tasks.sweep_refunds()
        return WithdrawalRefund.objects.filter(transaction_id=remittance.transaction_id
                                               ).first()

    refund = wait_for(rebuilt, timeout=40, what="the refund rebuilt")
    assert (refund.status, refund.tx_hash) == ("completed", sent_back[0]["hash"])
    assert Entry.objects.filter(idempotency_key=f"refund:{refund.pk}").exists()
    assert sa.received(memo) == sent_back
    assert [p["status"] for p in sandbox_payouts(clean_sandbox, remittance.transaction_id)
            ] == ["failed"]


def test_a_receive_expired_in_ap_whose_rows_were_lost_returns_late_usdc_once(
        sa, clean_sandbox, settings):
    # given a remittance Corridor expired (its quote ran out before any USDC came)
    settings.RECEIPT_GRACE_S = 0.0
    remittance = sa.start(amount="26", receiver_fields=_receiver())
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")
    txn = sa.transaction(remittance.transaction_id)
    expired = timezone.now() - timedelta(hours=6)
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(expires_at=expired)
    _until(remittance.transaction_id, "expired")

    # when the failover loses its commits (the decision and the expiry), and the sending
    # anchor pays anyway, late
    rewind.rewind(before)
    assert _rows(remittance.transaction_id) == (0, 0)
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(expires_at=expired)
    hashes = sa.pay(txn)

    # then the request is rebuilt expired and the late USDC goes back to its sender once
    def returned():
        poller.poll_withdrawals()
        tasks.sweep_refunds()
        refund = WithdrawalRefund.objects.filter(receipt__tx_hash=hashes[0]).first()
        return refund if refund is not None and refund.status == "completed" else None

    refund = wait_for(returned, timeout=40, interval=0.3, what="the late USDC returned")
    assert WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id
                                         ).status == "expired"
    assert [(p["hash"], p["amount"]) for p in sa.received(txn["stellar_memo"])] == [
        (refund.tx_hash, Decimal(txn["amount_in"]))]
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []


def test_usdc_raised_as_an_unknown_memo_before_the_rebuild_is_consumed_by_the_payout(
        sa, clean_sandbox, settings):
    # given a receive whose decision was lost, its USDC paid and raised by the receipt
    # classifier as an unknown memo before any pass rebuilt the request
    settings.RECEIPT_GRACE_S = 0.0
    remittance = sa.start(amount="27", receiver_fields=_receiver())
    before = rewind.mark()
    _until(remittance.transaction_id, "pending_sender")
    rewind.rewind(before)
    hashes = sa.finish(remittance).hashes
    settings.RECEIVE_REBUILD = False
    raised = wait_for(lambda: poller.poll_withdrawals() is not None and
                      StellarReceipt.objects.filter(tx_hash=hashes[0],
                                                    review_reason__startswith="unknown memo"
                                                    ).first(),
                      timeout=20, interval=0.3, what="the receipt raised")

    # when the poller rebuilds the request and pays it
    settings.RECEIVE_REBUILD = True
    _assert_paid_once(clean_sandbox, remittance)

    # then the receipt is consumed by that payout and leaves the queue: no receipt refund
    # can send the USDC back beside the INR
    poller.poll_withdrawals()
    receipt = StellarReceipt.objects.get(pk=raised.pk)
    assert (receipt.review_reason, receipt.consumed_amount) == ("", receipt.amount)
    assert receipt.settled_at is not None


def test_a_late_receipt_refund_lost_after_it_landed_is_adopted_not_sent_again(
        sa, clean_sandbox, settings):
    """USDC that arrived after its receive expired went back to its sender by itself
    (``late_receipt_refund``, the refund ``receipt:<id>``), and the failover lost the
    refund's row, audit row and booking, and the receipt's settlement. The receipt was
    raised, unsettled and unrefunded again: the poller's next pass returned the USDC a
    second time, and the books missed the first refund on chain."""
    # given a receive that expired before its USDC came, the late USDC scanned and
    # raised, then returned to the sending anchor by the poller
    settings.RECEIPT_GRACE_S = 0.0
    open_distribution()
    remittance = sa.start(amount="28", receiver_fields=_receiver())
    _until(remittance.transaction_id, "pending_sender")
    txn = sa.transaction(remittance.transaction_id)
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(
        expires_at=timezone.now() - timedelta(hours=6))
    _until(remittance.transaction_id, "expired")
    since = timezone.now() - timedelta(seconds=2)  # ledger close times are whole seconds
    hashes = sa.pay(txn)
    receipt = wait_for(lambda: (receipts.scan(), receipts.classify_receipts()) and
                       StellarReceipt.objects.filter(tx_hash=hashes[0]).exclude(
                           review_reason="").first(), timeout=20, what="the late USDC raised")
    # (the session's earlier receipts come with the scan; the sweep rebuilds the
    # refunds of those it finds on chain now, not during the test's own flow)
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    tasks.sweep_refunds()
    books_before = compared(reconcile(), "stellar:distribution USDC")["difference"]
    before = rewind.mark()
    done = wait_for(lambda: poller.poll_withdrawals() is not None and
                    WithdrawalRefund.objects.filter(receipt=receipt, status="completed").first(),
                    timeout=20, interval=0.3, what="the late USDC returned")

    # when the failover loses every commit of the refund
    lost = rewind.rewind(before)
    assert lost["withdrawal_refunds"] == 1
    assert receipt in receipts.late_for_expired_receives()  # raised, unrefunded again

    # then the poller's next passes find the refund on chain and adopt it, the refund
    # sweep rebuilds nothing more, and the operator's "refund on chain" is refused
    for _ in range(3):
        poller.poll_withdrawals()
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    tasks.sweep_refunds()
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    with pytest.raises(operations.OperationRefused, match="refunded already"):
        operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                           note="late USDC: sent back")
    distribution = stellar.distribution_keypair().public_key
    sent = [t.tx_hash for t in stellar.transfers_since(sa.account, since)
            if t.source == distribution and t.amount == receipt.amount]
    assert sent == [done.tx_hash]
    assert [p["hash"] for p in sa.received(txn["stellar_memo"])] == [done.tx_hash]
    refund = WithdrawalRefund.objects.get(receipt=receipt)
    assert (refund.status, refund.tx_hash) == ("completed", done.tx_hash), refund.last_error
    for key in (f"refund:{refund.pk}", f"receipt:{receipt.pk}:received"):
        assert Entry.objects.filter(idempotency_key=key).count() == 1, key
    assert StellarReceipt.objects.get(pk=receipt.pk).settled_at is not None
    assert ledger.trial_balance().ok
    assert compared(reconcile(), "stellar:distribution USDC")["difference"] == books_before
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
