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

import pytest

from anchor.models import FirmQuote
from ledger import chart
from ledger.models import Entry
from payouts import guard, poller
from payouts.models import PayoutAttempt, WithdrawalPayout, WithdrawalRequest
from sandbox.sender31 import RECEIVER_FIELDS, SendingAnchor
from tests import rewind
from tests.flows import ap, sandbox_payouts, settle, unique_account_number, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sa(clean_sandbox, settings):
    settings.RECEIVE_REBUILD = True  # off for the rest of the suite (tests/conftest.py)
    return SendingAnchor(clean_sandbox.url)


def _receiver() -> dict:
    return {**RECEIVER_FIELDS, "bank_account_number": unique_account_number()}


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
