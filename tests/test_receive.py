"""SEP-31 receiving end to end (payouts/receive.py): the sandbox's foreign sending anchor
(sandbox/sender31.py) registers its sender and receiver through the sandbox AP's SEP-12
(forwarded to Corridor's callbacks), takes a firm quote (Corridor's GET /rate), creates
the transaction and pays USDC on the sandbox Horizon; Corridor's poller (as beat runs
it) decides, asks for the funds, verifies them and pays the INR once through RazorpayX.
All over real HTTP against real PostgreSQL."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from stellar_sdk import Keypair

from anchor import customers, platform, stellar
from anchor.models import Customer, FirmQuote
from common.console import AUTOMATIC
from payouts import guard, poller, receipts, receive
from payouts.models import (
    PayoutEvent,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from payouts.providers.base import Beneficiary
from sandbox.sender31 import (
    RECEIVER_FIELDS,
    SENDER_FIELDS,
    Payment,
    SenderError,
    SendingAnchor,
    new_memo,
)
from tests.factories import (
    PayoutAttemptFactory,
    WithdrawalPayoutFactory,
    WithdrawalRequestFactory,
)
from tests.flows import ap, sandbox_payouts, settle, unique_account_number, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sa(clean_sandbox):
    return SendingAnchor(clean_sandbox.url)


def receiver(**changes) -> dict:
    return {**RECEIVER_FIELDS, "bank_account_number": unique_account_number(), **changes}


def until_status(transaction_id: str, *statuses: str) -> dict:
    def reached():
        poller.poll_withdrawals()
        tx = ap(transaction_id)
        return tx if tx["status"] in statuses else None

    return wait_for(reached, timeout=40, interval=0.3,
                    what=f"{transaction_id} in {'/'.join(statuses)}")


def test_a_remittance_is_decided_funded_verified_and_paid_once(sa, clean_sandbox):
    remittance = sa.start(amount="100", receiver_fields=receiver())

    until_status(remittance.transaction_id, "pending_sender")
    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)
    assert (request.kind, request.memo_type, request.funds_requested_at is not None) == (
        "receive", "id", True)
    assert not WithdrawalPayout.objects.exists()  # nothing paid before the USDC
    sa.finish(remittance)
    tx = until_status(remittance.transaction_id, "completed")
    settle(remittance.transaction_id)

    quote = FirmQuote.objects.get(quote_id=remittance.quote["id"])
    payouts = sandbox_payouts(clean_sandbox, remittance.transaction_id)
    assert [p["amount"] for p in payouts] == [int(quote.buy_amount * 100)]
    assert quote.transaction_id == remittance.transaction_id
    payout = WithdrawalPayout.objects.get(transaction_id=remittance.transaction_id)
    assert payout.status == "completed" and tx["external_transaction_id"] == payout.reference
    assert Customer.objects.get(pk=remittance.receiver_id).used_at is not None


def test_a_receiver_registered_by_another_anchor_is_refused(sa, clean_sandbox):
    stranger = Customer.objects.create(account="GOTHERANCHOR", memo="1", memo_type="id",
                                       type="sep31-receiver")
    remittance = sa.start(amount="20", receiver_fields=receiver())
    sa.authenticate()
    sender_id = remittance.sender_id
    quote = sa.firm_quote("20")
    transaction_id = sa.create_transaction(amount=quote["sell_amount"], sender_id=sender_id,
                                           receiver_id=stranger.id, quote_id=quote["id"])

    tx = until_status(transaction_id, "error")

    assert "not a customer you registered" in tx.get("message", "")
    assert not WithdrawalRequest.objects.filter(transaction_id=transaction_id).exists()


def test_a_receiver_missing_fields_waits_for_the_sending_anchor(sa, clean_sandbox):
    fields = receiver()
    del fields["bank_number"]
    remittance = sa.start(amount="20", receiver_fields=fields)

    waiting = until_status(remittance.transaction_id, "pending_customer_info_update")
    assert "bank_number" in waiting.get("message", "")
    assert not WithdrawalRequest.objects.exists()
    sa.put_customer(type="sep31-receiver", memo=None, customer_id=remittance.receiver_id,
                    fields={"bank_number": "HDFC0001234"})

    until_status(remittance.transaction_id, "pending_sender")


def test_a_pass_on_a_read_from_before_the_info_request_does_not_strand_it(sa, clean_sandbox):
    """make demo, issue 25 §3: a pass (the poller's listing, an event's task) read AP in
    ``pending_receiver`` and went on after another pass had asked for the IFSC and the
    sending anchor had given it; ``request_onchain_funds`` was refused (AP is in
    ``pending_customer_info_update``) and the refusal was taken as done. Nothing then
    ever moved the transaction: it waited for information it already had."""
    fields = receiver()
    del fields["bank_number"]
    remittance = sa.start(amount="20", receiver_fields=fields)
    before = ap(remittance.transaction_id)
    assert before["status"] == "pending_receiver"
    until_status(remittance.transaction_id, "pending_customer_info_update")
    sa.put_customer(type="sep31-receiver", memo=None, customer_id=remittance.receiver_id,
                    fields={"bank_number": "HDFC0001234"})

    outcome = None
    with contextlib.suppress(platform.RpcError):
        outcome = receive.decide(ap_tx=before)  # the first pass goes on, on its old read

    assert outcome != "funds_requested"  # AP did not ask for the funds
    assert not WithdrawalRequest.objects.filter(funds_requested_at__isnull=False).exists()
    tx = until_status(remittance.transaction_id, "pending_sender")
    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)
    assert (tx["memo"], request.funds_requested_at is not None) == (request.memo, True)
    assert Customer.objects.get(pk=remittance.receiver_id).info_wanted_at is None


def test_one_quote_backs_one_transaction_only(sa, clean_sandbox):
    first = sa.start(amount="30", receiver_fields=receiver())
    until_status(first.transaction_id, "pending_sender")
    # AP 4.3.0 lets a quote back any number of transactions (#1935): Corridor refuses.
    again = sa.create_transaction(amount=first.quote["sell_amount"],
                                  sender_id=first.sender_id, receiver_id=first.receiver_id,
                                  quote_id=first.quote["id"])

    tx = until_status(again, "error")

    assert "was used by" in tx.get("message", "")
    assert WithdrawalRequest.objects.filter(quote_id=first.quote["id"]).count() == 1


def test_a_short_payment_is_held_for_review_and_never_paid(sa, clean_sandbox, settings):
    settings.WITHDRAW_SHORT_GRACE_S = 0.5
    remittance = sa.start(amount="40", receiver_fields=receiver())
    until_status(remittance.transaction_id, "pending_sender")

    sa.finish(remittance, Payment(amount="39.5"))

    request = wait_for(lambda: poller.poll_withdrawals() and WithdrawalRequest.objects.filter(
        transaction_id=remittance.transaction_id, status="manual_review").first(),
        timeout=40, interval=0.3, what="short receive in review")
    assert "short" in request.review_reason
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
    assert request.received_amount == Decimal("39.5")


def test_the_sending_anchor_memo_is_ours_and_unique(sa, clean_sandbox):
    a = sa.start(amount="10", receiver_fields=receiver())
    b = sa.start(amount="10", receiver_fields=receiver())
    for r in (a, b):
        until_status(r.transaction_id, "pending_sender")

    memos = {sa.transaction(r.transaction_id)["stellar_memo"] for r in (a, b)}
    assert len(memos) == 2 and all(m.isdigit() and int(m) < 2**64 for m in memos)
    assert new_memo() not in memos


# --- found by an attacker trial, 2026-12-04 -------------------------------------------

def test_one_receiver_under_two_memos_does_not_get_the_daily_limit_twice(sa, clean_sandbox,
                                                                         settings):
    """The same person (same name, PAN, bank account) registered by the SA under two
    memos (sa.start makes a fresh memo per remittance, as a custodial SA does) is two
    customers, so each remittance sees an empty daily limit."""
    settings.LIMIT_DAILY_INR = Decimal("10000")  # 100 USDC is about 8300 INR
    person = {**RECEIVER_FIELDS, "bank_account_number": unique_account_number()}
    first = sa.start(amount="100", receiver_fields=person)
    until_status(first.transaction_id, "pending_sender", "error")
    second = sa.start(amount="100", receiver_fields=person)
    second_tx = until_status(second.transaction_id, "pending_sender", "error")

    requested = WithdrawalRequest.objects.filter(
        transaction_id__in=[first.transaction_id, second.transaction_id],
        funds_requested_at__isnull=False)
    total = sum(r.amount_out for r in requested)
    assert total <= settings.LIMIT_DAILY_INR, (
        f"one bank account got INR {total} funded today over a daily limit of "
        f"{settings.LIMIT_DAILY_INR}: receivers "
        f"{first.receiver_id} / {second.receiver_id}, second tx {second_tx['status']}")


def test_a_rejected_receiver_deleted_and_registered_again_is_not_paid(sa, clean_sandbox):
    """An operator rejects a receiver (sanctions). The SA deletes it through SEP-12 and
    registers the very same person again: a fresh, auto-accepted customer, and the
    next remittance is funded and paid."""
    person = {**RECEIVER_FIELDS, "bank_account_number": unique_account_number()}
    sa.ensure_account()
    sa.authenticate()
    memo = "424242"
    receiver_id = sa.put_customer(type="sep31-receiver", memo=memo, fields=person)
    customers.review(customer_id=receiver_id, decision="reject", note="OPS-9 sanctions hit",
                     operator=User.objects.create_superuser("olga-ops"))

    gone = sa.http.request("DELETE", f"/ap/sep/sep12/customer/{sa.account}",
                           json={"memo": memo, "memo_type": "id"}, headers=sa._headers())
    assert gone.status_code == 200, gone.text
    again_id = sa.put_customer(type="sep31-receiver", memo=memo, fields=person)
    sender_id = sa.put_customer(type="sep31-sender", memo="434343",
                                fields=SENDER_FIELDS)
    quote = sa.firm_quote("20")
    transaction_id = sa.create_transaction(amount=quote["sell_amount"], sender_id=sender_id,
                                           receiver_id=again_id, quote_id=quote["id"])
    tx = until_status(transaction_id, "pending_sender", "error")

    assert tx["status"] == "error", (
        f"receiver {receiver_id} was rejected; re-registered as {again_id} "
        f"(review {Customer.objects.get(pk=again_id).review}) and the remittance "
        f"reached {tx['status']} with funds requested")


def test_an_expired_quote_expires_the_transaction_and_a_late_payment_is_raised(
        sa, clean_sandbox, settings):
    """SEP31-RECEIVE.md §10 item 18 (found by an attacker trial: INR was paid at a quote
    that had expired 6 hours before the USDC arrived). AP expires nothing: Corridor
    does, and USDC paid after that is raised for a refund, never paid out."""
    settings.RECEIPT_GRACE_S = 0.0
    remittance = sa.start(amount="50", receiver_fields={
        **RECEIVER_FIELDS, "bank_account_number": unique_account_number()})
    until_status(remittance.transaction_id, "pending_sender")
    txn = sa.transaction(remittance.transaction_id)
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(
        expires_at=timezone.now() - timedelta(hours=6))

    until_status(remittance.transaction_id, "expired")
    sa.pay(txn)  # late: the memo of an expired transaction

    receipt = wait_for(lambda: poller.poll_withdrawals() is not None and
                       StellarReceipt.objects.filter(memo=txn["stellar_memo"],
                                                     review_reason__contains="expired").first(),
                       timeout=40, interval=0.3, what="the late receipt raised")
    assert receipt.consumed_amount == 0
    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)
    assert request.status == "expired"
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []


def test_an_on_time_payment_hidden_by_a_lagging_horizon_does_not_expire_the_receive(
        sa, clean_sandbox):
    """Issue 25 §1: the SA paid before the quote expired, but Horizon's history lagged
    (``horizon.lookup_lag``) past the expiry, so Corridor's scan (and AP's observer) saw
    nothing: the expiry took "no receipt" as proof, expired the transaction at AP and
    left the on-time USDC to an operator's refund. Now it expires only on a scan whose
    history reaches the quote's expiry; Horizon catching up pays the receiver."""
    remittance = sa.start(amount="50", receiver_fields=receiver())
    until_status(remittance.transaction_id, "pending_sender")
    txn = sa.transaction(remittance.transaction_id)
    clean_sandbox.fault("horizon.lookup_lag", ledgers=100_000)
    try:  # on time: its ledger closes before the quote expires
        sa.pay(txn)
    except SenderError:  # applied, unseen by the lagging node: tx_bad_seq (stellar/go #2628)
        pass
    time.sleep(1.1)  # ledger close times are whole seconds
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(expires_at=timezone.now())

    for _ in range(5):  # passes behind the lagging Horizon, all past the expiry
        poller.poll_withdrawals()
        time.sleep(0.2)
    assert ap(remittance.transaction_id)["status"] == "pending_sender"
    assert WithdrawalRequest.objects.get(
        transaction_id=remittance.transaction_id).status == "awaiting_funds"
    clean_sandbox.clear_faults()  # Horizon caught up

    until_status(remittance.transaction_id, "completed")
    assert len(sandbox_payouts(clean_sandbox, remittance.transaction_id)) == 1


def test_usdc_paid_after_a_receive_expired_goes_back_to_its_sender_once(
        sa, clean_sandbox, settings):
    """Issue 25 §1: money that arrives after Corridor stopped waiting is returned to
    whoever sent it, exactly once, through the shared outbox. The receive expired
    legitimately (nothing paid by the quote's expiry); the SA's USDC then arrives under
    its memo: Corridor refunds it on chain to the payment's sender by itself (the
    withdrawal-refund outbox, one refund per receipt), audited as Corridor's act; it was
    left in the operators' queue before."""
    settings.RECEIPT_GRACE_S = 0.0
    remittance = sa.start(amount="50", receiver_fields=receiver())
    until_status(remittance.transaction_id, "pending_sender")
    txn = sa.transaction(remittance.transaction_id)
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(
        expires_at=timezone.now() - timedelta(hours=6))
    until_status(remittance.transaction_id, "expired")
    sa.pay(txn)  # late: the memo of an expired transaction

    refund = wait_for(lambda: poller.poll_withdrawals() is not None and
                      WithdrawalRefund.objects.filter(receipt__memo=txn["stellar_memo"],
                                                      status="completed").first(),
                      timeout=40, interval=0.3, what="the late USDC refunded")
    for _ in range(3):
        poller.poll_withdrawals()

    receipt = StellarReceipt.objects.get(memo=txn["stellar_memo"])
    assert (refund.destination, refund.amount) == (sa.account, Decimal(txn["amount_in"]))
    assert receipt.settled_at is not None and receipt.consumed_amount == 0
    assert WithdrawalRefund.objects.filter(receipt__memo=txn["stellar_memo"]).count() == 1
    event = PayoutEvent.objects.get(transaction_id=f"receipt:{receipt.pk}")
    assert (event.event, event.operator) == ("receipt.refund", AUTOMATIC)
    assert remittance.transaction_id in event.note
    distribution = receipts.withdraw_account()
    back = [(p["transaction_hash"], Decimal(p["amount"])) for p in stellar.server().payments()
            .for_account(sa.account).join("transactions").order(desc=True).limit(200).call()
            ["_embedded"]["records"] if p.get("from") == distribution and
            p["transaction"].get("memo") == txn["stellar_memo"]]  # under the payment's memo
    assert back == [(refund.tx_hash, Decimal(txn["amount_in"]))]
    request = WithdrawalRequest.objects.get(transaction_id=remittance.transaction_id)
    assert request.status == "expired"
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []


def test_usdc_that_arrived_after_the_quote_expired_is_not_paid_at_it(sa, clean_sandbox):
    """The race the expiry sweep cannot close: the payment lands after the quote's
    expiry and before any pass expired the transaction."""
    remittance = sa.start(amount="50", receiver_fields={
        **RECEIVER_FIELDS, "bank_account_number": unique_account_number()})
    until_status(remittance.transaction_id, "pending_sender")
    # Ledger close times are whole seconds: expire it clearly before the payment.
    FirmQuote.objects.filter(quote_id=remittance.quote["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=2))
    sa.finish(remittance)

    # Either the receipt is seen first (held for review) or the expiry sweep runs
    # first (expired at AP; the receipt is then raised for a refund): never paid.
    request = wait_for(lambda: poller.poll_withdrawals() is not None and
                       WithdrawalRequest.objects.filter(transaction_id=remittance.transaction_id,
                                                        status__in=["manual_review",
                                                                    "expired"]).first(),
                       timeout=40, interval=0.3, what="the late USDC held or expired")

    assert ("after the firm quote" in request.review_reason if request.status ==
            "manual_review" else "expired before the USDC" in request.review_reason)
    for _ in range(3):
        poller.poll_withdrawals()
    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
    assert not WithdrawalPayout.objects.filter(transaction_id=remittance.transaction_id).exists()


# --- issue 25 §4: a right checked when a thing is used, not only when it was made ------

def test_a_quote_given_to_one_anchor_is_not_redeemed_by_another(sa, clean_sandbox):
    """SEP31-RECEIVE.md §10 item 3 (AP #2019: no owner check on redemption). SA-B reads
    SA-A's quote id (a log, a shared integrator) and backs its own transaction with it:
    AP 4.3.0 accepts; Corridor refuses, and the quote stays A's to use."""
    sa.ensure_account()
    sa.authenticate()
    quote = sa.firm_quote("25")
    other = SendingAnchor(clean_sandbox.url, keypair=Keypair.random(),
                          client_name="otherSender", client_domain="other.example.com")
    other.ensure_account()
    other.authenticate()
    sender_id = other.put_customer(type="sep31-sender", memo=new_memo(), fields=SENDER_FIELDS)
    receiver_id = other.put_customer(type="sep31-receiver", memo=new_memo(),
                                     fields=receiver())
    transaction_id = other.create_transaction(amount=quote["sell_amount"],
                                              sender_id=sender_id, receiver_id=receiver_id,
                                              quote_id=quote["id"])

    tx = until_status(transaction_id, "pending_sender", "error")

    assert tx["status"] == "error", f"SA-B redeemed SA-A's quote: {tx['status']}"
    assert "was given to another party" in tx.get("message", "")
    stored = FirmQuote.objects.get(quote_id=quote["id"])
    assert (stored.used_at, stored.transaction_id) == (None, "")
    assert not WithdrawalRequest.objects.filter(transaction_id=transaction_id).exists()


def test_a_receiver_rejected_after_acceptance_is_not_paid(sa, clean_sandbox):
    """The operator's confirmation page says "no payout to it will be made"
    (customers.review_preview). The receiver was ACCEPTED when the transaction was
    decided and funds requested; an operator rejects it before the USDC arrives: the
    USDC is verified and booked, and the INR is never paid (a person refunds)."""
    remittance = sa.start(amount="40", receiver_fields=receiver())
    until_status(remittance.transaction_id, "pending_sender")
    customers.review(customer_id=remittance.receiver_id, decision="reject",
                     note="OPS-25 sanctions hit after acceptance",
                     operator=User.objects.create_superuser("rita-ops"))
    sa.finish(remittance)

    request = wait_for(lambda: poller.poll_withdrawals() is not None and
                       WithdrawalRequest.objects.filter(
                           transaction_id=remittance.transaction_id,
                           status__in=["manual_review"]).first() or
                       WithdrawalPayout.objects.filter(
                           transaction_id=remittance.transaction_id).first(),
                       timeout=40, interval=0.3, what="the receive held or paid")
    for _ in range(3):
        poller.poll_withdrawals()

    assert sandbox_payouts(clean_sandbox, remittance.transaction_id) == []
    assert not WithdrawalPayout.objects.filter(transaction_id=remittance.transaction_id).exists()
    assert "REJECTED" in request.review_reason


def test_a_payout_replayed_after_its_receiver_was_rejected_is_not_sent(clean_sandbox):
    """The guard's replay of an unknown outcome (same key, nothing found by reference)
    and an operator's new attempt are payments too: each re-checks the receiver."""
    receiver_row = Customer.objects.create(account="GSA", memo="7", memo_type="id",
                                           type="sep31-receiver", review="rejected",
                                           message="sanctions")
    _, fund_account_id = guard.provider().register_beneficiary(
        beneficiary=Beneficiary(name="Asha Verma", kind="bank_account",
                                account_number=unique_account_number(), ifsc="HDFC0001234"),
        reference="replay-after-reject")
    request = WithdrawalRequestFactory(kind="receive", customer_id=receiver_row.id,
                                       status="funds_verified", fund_account_id=fund_account_id)
    payout = WithdrawalPayoutFactory(transaction_id=request.transaction_id,
                                     status="processing", amount_paise=request.amount_out_paise,
                                     fund_account_id=fund_account_id)
    PayoutAttemptFactory(payout=payout, number=1, provider_payout_id="")

    after = guard.payout_resume(payout=payout)

    assert sandbox_payouts(clean_sandbox, request.transaction_id) == []
    assert after.status == "manual_review" and "REJECTED" in after.last_error


@pytest.mark.django_db(transaction=False)
def test_an_operator_cannot_pay_a_rejected_receiver_again():
    """An operator's new attempt after a failed payout is a payment too: refused, with
    the reason on the confirmation page, while the receiver is rejected."""
    from common.console import OperationRefused
    from payouts import operations

    receiver_row = Customer.objects.create(account="GSA", memo="8", memo_type="id",
                                           type="sep31-receiver", review="rejected",
                                           message="sanctions")
    request = WithdrawalRequestFactory(kind="receive", customer_id=receiver_row.id,
                                       status="funds_verified")
    payout = WithdrawalPayoutFactory(transaction_id=request.transaction_id, status="failed")
    PayoutAttemptFactory(payout=payout, number=1, provider_status="failed")

    preview = operations.payout_new_attempt_preview(payout_id=payout.pk)
    with pytest.raises(OperationRefused, match="may not be paid"):
        operations.payout_new_attempt(payout_id=payout.pk, note="OPS-25 retry",
                                      operator=User.objects.create_superuser("nina-ops"))

    assert "REJECTED" in preview.refusal
    assert WithdrawalPayout.objects.get(pk=payout.pk).attempts == 1
