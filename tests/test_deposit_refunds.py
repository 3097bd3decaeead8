"""Deposit refunds through Razorpay (anchor/refunds.py, issue 13 §3): the sandbox over
real HTTP (AP, Razorpay with its refund webhooks to the live server), the real test
database, no worker (the tests drive the refund as the task and the sweep would).

The safety properties: at most one Razorpay refund per deposit, counted on the sandbox
(``GET /razorpay/sandbox/refunds``); never both a refund and a release; AP's final state
agrees with ours (``refunded`` with our refund id, amount + fee = ``amount_in``)."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest
from django.db import connection

from anchor import operations, platform, refunds, releases, tasks
from anchor.models import ApTransactionEvent, DepositPayment, DepositRefund, InboundEvent
from common.console import OperationRefused
from ledger import chart
from ledger.models import Entry
from sagas.models import ReviewItem
from tests.flows import (
    Customer,
    Wallet,
    ap,
    confirm,
    confirmation_page,
    paid_deposit,
    purge_broker,
    refused,
    sync_groups,
    wait_for,
)
from tests.sandbox.razorpay_calls import sandbox_refunds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = DepositRefund.Status


@pytest.fixture
def sbx(clean_sandbox):
    purge_broker()
    clean_sandbox.fault("razorpay.refund_settle_delay", seconds=0.3)
    yield clean_sandbox
    purge_broker()


@pytest.fixture
def operator(client):
    from django.apps import apps as django_apps
    from django.contrib.auth.models import Group, User

    sync_groups(django_apps, connection.schema_editor())
    user = User.objects.create_user(username="rita", is_staff=True)
    user.groups.add(Group.objects.get(name="operators"))
    client.force_login(user)
    return user


def row(transaction_id: str) -> DepositRefund:
    return DepositRefund.objects.get(transaction_id=transaction_id)


def until(transaction_id: str, *statuses: str) -> DepositRefund:
    return wait_for(lambda: (lambda r: r if r.status in statuses else None)(
        row(transaction_id)), timeout=20, what=f"refund {statuses}")


def deliveries_done(sandbox, refund_id: str) -> bool:
    rows = httpx.get(f"{sandbox.url}/razorpay/sandbox/webhooks",
                     params={"entity_id": refund_id}, timeout=10).json()["items"]
    return bool(rows) and all(r["delivered"] or r["lost"] for r in rows)


def assert_refunded_once(sandbox, transaction_id: str) -> DepositRefund:
    """One Razorpay refund of the whole payment, our row completed, AP ``refunded`` with
    that refund, amount + fee = amount_in."""
    refund = row(transaction_id)
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    made = sandbox_refunds(sandbox, payment.payment_id)
    assert [(r["id"], r["amount"], r["receipt"]) for r in made] == [
        (refund.refund_id, payment.amount_paise, transaction_id)]
    assert refund.status == S.COMPLETED
    tx = ap(transaction_id)
    assert tx["status"] == "refunded"
    assert [p["id"] for p in tx["refunds"]["payments"]] == [refund.refund_id]
    paid = tx["refunds"]["payments"][0]
    amount_in = amount(tx["amount_in"])
    assert amount(paid["amount"]) == Decimal(payment.amount_paise) / 100
    assert amount(paid["amount"]) + amount(paid["fee"]) == amount_in
    assert amount(tx["refunds"]["amount_refunded"]) == amount_in
    return refund


def amount(value) -> Decimal:
    """An AP amount: ``{"amount": "10", "asset": ...}`` or a plain string."""
    return Decimal(str(value["amount"] if isinstance(value, dict) else value))


def drive_to_the_end(transaction_id: str) -> DepositRefund:
    """Drive the refund as the task's retries and the beat sweep would, until final."""
    pk = row(transaction_id).pk
    return wait_for(lambda: (lambda r: r if r.status in (
        S.COMPLETED, S.FAILED, S.MANUAL_REVIEW) else None)(refunds.refund_drive(refund_id=pk)),
        timeout=20, interval=0.3, what="refund final")


def test_operator_refund_is_one_razorpay_refund_and_ap_refunded(sbx, operator):
    transaction_id = paid_deposit(sbx, Wallet(sbx))

    claimed = operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                                        note="customer cancelled, ticket OPS-7")
    refund = drive_to_the_end(transaction_id)

    assert claimed.receipt == transaction_id and claimed.status == S.REQUESTED
    assert refund.status == S.COMPLETED and refund.attempts == 1
    assert_refunded_once(sbx, transaction_id)
    audit = ApTransactionEvent.objects.get(transaction_id=transaction_id)
    assert (audit.event, audit.operator, audit.note) == (
        "deposit.refund", "rita", "customer cancelled, ticket OPS-7")
    with pytest.raises(releases.ReleaseRefused, match="refunded"):
        releases.release_start(transaction_id=transaction_id)
    with pytest.raises(OperationRefused, match="refunded already"):
        operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                                  note="again")
    _assert_booked_back(transaction_id, refund)


def _assert_booked_back(transaction_id: str, refund) -> None:
    """The books (ledger/chart.py): the refund's entry clears what the capture owed, in
    the transaction of its move to processed (found by the second new-user trial: the
    INR went back and owed:deposits still showed it)."""
    entry = Entry.objects.get(idempotency_key=f"deposit_refund:{refund.pk}")
    lines = {(p.account.code, p.account.currency, p.amount) for p in entry.postings.all()}
    rupees = chart.rupees(refund.amount_paise)
    assert lines == {("owed:deposits", "INR", rupees), ("razorpay:pending", "INR", -rupees)}
    assert chart.owed_amount(account="owed:deposits", currency="INR",
                             reference=transaction_id) == 0


def test_lost_answer_is_recovered_by_listing_never_a_second_refund(sbx, operator):
    transaction_id = paid_deposit(sbx, Wallet(sbx))
    sbx.fault("razorpay.refund_create_5xx_after_create", times=1)
    sbx.fault("razorpay.refund_webhook_lose", times=1)  # only the API can tell
    operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                              note="limits exceeded after capture")

    first = refunds.refund_drive(refund_id=row(transaction_id).pk)

    assert (first.status, first.refund_id, first.attempts) == (S.REQUESTED, None, 1)
    assert "not answered" in first.last_error
    refund = drive_to_the_end(transaction_id)
    assert refund.attempts == 1  # found by receipt: no second create was sent
    assert_refunded_once(sbx, transaction_id)


def test_duplicated_and_reordered_webhooks_move_the_row_forward_once(sbx, operator):
    transaction_id = paid_deposit(sbx, Wallet(sbx))
    sbx.fault("razorpay.refund_webhook_reorder", times=1)
    sbx.fault("razorpay.refund_webhook_duplicate", times=1, copies=3)
    operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                              note="duplicate deposit")

    refunds.refund_drive(refund_id=row(transaction_id).pk)
    processed = until(transaction_id, S.PROCESSED)  # moved by the webhook alone
    wait_for(lambda: deliveries_done(sbx, processed.refund_id), what="all deliveries")

    again = row(transaction_id)
    assert again.status == S.PROCESSED and again.processed_at == processed.processed_at
    events = InboundEvent.objects.filter(source="razorpay", event_type__startswith="refund.")
    assert sorted(events.values_list("event_type", flat=True)) == [
        "refund.created", "refund.processed"]
    assert events.get(event_type="refund.created").outcome == "refund processed->processed"
    refunds.refund_drive(refund_id=again.pk)
    assert_refunded_once(sbx, transaction_id)


def test_refund_failed_at_razorpay_waits_in_the_queue_and_ap_is_not_told(sbx, operator):
    transaction_id = paid_deposit(sbx, Wallet(sbx))
    sbx.fault("razorpay.refund_fail", times=1)
    operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                              note="customer asked")

    refund = drive_to_the_end(transaction_id)

    assert refund.status == S.FAILED and refund.provider_status == "failed"
    assert ap(transaction_id)["status"] == "pending_anchor"
    item = ReviewItem.objects.get(key=f"refund:{refund.pk}")
    assert (item.kind, item.status, item.reference) == ("refund", "failed", transaction_id)
    with pytest.raises(releases.ReleaseRefused):
        releases.release_start(transaction_id=transaction_id)


def test_payment_captured_after_ap_expired_is_refunded_and_queued(sbx):
    wallet = Wallet(sbx)
    transaction_id, url = wallet.start_deposit()
    customer = Customer(sbx)
    order_id = customer.submit_amount(url, "1000")
    platform.rpc("notify_transaction_expired", {"transaction_id": transaction_id,
                                                "message": "no payment in time"})
    customer.pay(order_id)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment recorded")

    tasks.deposit_funds_received.apply(args=(transaction_id,))

    refund = row(transaction_id)
    assert (refund.trigger, refund.operator, refund.ap_status_at_claim) == (
        "expired", "corridor (automatic)", "expired")
    refund = drive_to_the_end(transaction_id)
    assert refund.status == S.MANUAL_REVIEW
    assert "expired" in refund.last_error and refund.refund_id in refund.last_error
    assert refund.provider_status == "processed" and refund.processed_at is not None
    made = sandbox_refunds(sbx, refund.payment_id)
    assert [r["id"] for r in made] == [refund.refund_id]
    assert ap(transaction_id)["status"] == "expired"
    kinds = set(ReviewItem.objects.filter(reference=transaction_id)
                .values_list("kind", flat=True))
    assert kinds == {"refund"}
    _assert_booked_back(transaction_id, refund)


def test_an_operator_cannot_refund_a_released_deposit(sbx, operator, client):
    wallet = Wallet(sbx)
    transaction_id = paid_deposit(sbx, wallet)
    release = releases.release_start(transaction_id=transaction_id)
    assert release.status == "completed" and wallet.usdc_payments()
    payment = DepositPayment.objects.get(transaction_id=transaction_id)

    page = confirmation_page(client, "anchor_depositpayment", "refund_inr", payment.pk)
    shown = confirm(client, "anchor_depositpayment", "refund_inr", payment.pk)

    assert "USDC was sent or may still land" in page or "completed" in page
    assert refused(shown)
    assert not DepositRefund.objects.filter(transaction_id=transaction_id).exists()
    assert sandbox_refunds(sbx, payment.payment_id) == []


def test_without_the_guard_a_lost_answer_is_not_recovered(sbx, operator, settings):
    """The protection off (DEPOSIT_REFUND_GUARD = False): the retry mints a new key and
    does not list, so the refund Razorpay made is never adopted: Razorpay refuses the
    second full refund, the row goes to manual_review and AP is never told -- the
    assertions of the guarded test above fail."""
    settings.DEPOSIT_REFUND_GUARD = False
    transaction_id = paid_deposit(sbx, Wallet(sbx))
    sbx.fault("razorpay.refund_create_5xx_after_create", times=1)
    sbx.fault("razorpay.refund_webhook_lose", times=1)  # only the API can tell
    operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                              note="limits exceeded after capture")
    refunds.refund_drive(refund_id=row(transaction_id).pk)

    refund = drive_to_the_end(transaction_id)

    with pytest.raises(AssertionError):
        assert refund.status == S.COMPLETED
        assert_refunded_once(sbx, transaction_id)
    assert refund.status == S.MANUAL_REVIEW and refund.refund_id is None, refund.last_error
    assert "Razorpay refused" in refund.last_error
    assert ap(transaction_id)["status"] == "pending_anchor"
