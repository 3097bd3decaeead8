"""Issue 10 part 2: nothing owed is left without an owner (corridor/stranded.py).

A paid deposit whose AP notify died is re-notified by the sweeper until AP moves, then
releases exactly once; USDC no withdrawal consumed (a second payment after completion,
an overpayment's excess, an unknown memo) is raised in the review queue with its
on-chain evidence and refunded on chain once by an operator. Every stranded query is
served by its partial index. The sandbox over real HTTP, the real test database."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from stellar_sdk import Keypair

from anchor import deposits, platform, reconciler
from anchor.models import Customer as KycCustomer
from anchor.models import DepositPayment, DepositRefund, DepositRelease
from corridor.stranded import KINDS, stranded_counts, stranded_queries, stranded_thresholds
from payouts import operations as payout_ops
from payouts import poller, receipts
from payouts.models import (
    PayoutEvent,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from sagas.models import ReviewItem, Saga
from tests.conftest import free_port
from tests.factories import (
    CustomerFactory,
    DepositPaymentFactory,
    DepositRefundFactory,
    DepositReleaseFactory,
    SagaFactory,
    StellarReceiptFactory,
    WithdrawalPayoutFactory,
    WithdrawalRefundFactory,
    WithdrawalRequestFactory,
)
from tests.flows import (
    Customer,
    Wallet,
    assert_payout_once,
    assert_released_once,
    confirm,
    confirmation_page,
    purge_broker,
    refused,
    sandbox_payouts,
    settle,
    start_and_pay,
    start_withdrawal,
    sync_groups,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

ZERO = dict.fromkeys(KINDS, 0)


@pytest.fixture
def operator(client):
    """A staff member of the ``operators`` group as the migrations make it."""
    from django.apps import apps as django_apps
    from django.contrib.auth.models import Group, User

    sync_groups(django_apps, connection.schema_editor())
    user = User.objects.create_user(username="alice", is_staff=True)
    user.groups.add(Group.objects.get(name="operators"))
    client.force_login(user)
    return user


@pytest.fixture
def fast(settings):
    settings.AP_NOTIFY_SWEEP_AGE_S = 0.3
    settings.AP_NOTIFY_BACKOFF_MAX_S = 0.6
    settings.STRANDED_NOTIFY_S = 0.5
    settings.RECEIPT_GRACE_S = 0.3
    settings.STRANDED_RECEIPT_S = 0.5
    return settings


def notify_dies(sandbox, wallet, **fault) -> str:
    """A deposit paid and confirmed whose ``notify_offchain_funds_received`` dies with
    -32603 beyond the task's handling (RpcError is not retried: the task ends)."""
    sandbox.fault("ap.rpc_32603", methods=["notify_offchain_funds_received"], **fault)
    purge_broker()
    transaction_id, _ = start_and_pay(sandbox, wallet)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()  # no worker: the test is the task
    with pytest.raises(platform.RpcError):
        deposits.funds_received(transaction_id=transaction_id)
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    assert (payment.confirmation, payment.ap_notified_at) == ("confirmed", None)
    assert platform.get_transaction(transaction_id)["status"] == "pending_user_transfer_start"
    return transaction_id


# --- (1) a notify that died is re-driven until AP moves --------------------------------------

def test_a_dead_notify_is_stranded_then_renotified_and_released_once(clean_sandbox, fast):
    wallet = Wallet(clean_sandbox)
    transaction_id = notify_dies(clean_sandbox, wallet)
    time.sleep(fast.STRANDED_NOTIFY_S + 0.1)

    # AP still refuses: the sweeper retries, stores the refusal, pays nothing.
    assert reconciler.sweep_unnotified() == {"notified": 0, "refused": 1, "raised": 0}
    # Backoff: not tried again before notify_next_at (swept at once: the backoff is
    # AP_NOTIFY_SWEEP_AGE_S, short enough for the checks below to outlast it).
    assert reconciler.sweep_unnotified() == {"notified": 0, "refused": 0, "raised": 0}
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    assert payment.notify_attempts == 1
    assert "-32603" in payment.notify_error and "modified by another request" in \
        payment.notify_error
    assert payment.notify_next_at > timezone.now() - timedelta(seconds=1)
    assert stranded_counts() == {**ZERO, "captured_not_notified": 1}
    assert not DepositRelease.objects.exists()
    assert wallet.usdc_payments() == []

    clean_sandbox.clear_faults()  # AP is back
    time.sleep(0.4)
    assert reconciler.sweep_unnotified() == {"notified": 1, "refused": 0, "raised": 0}

    assert_released_once(wallet, transaction_id)
    assert reconciler.sweep_unnotified() == {"notified": 0, "refused": 0, "raised": 0}
    assert len(wallet.usdc_payments()) == 1
    assert stranded_counts() == ZERO


def test_inr_captured_after_the_deposit_expired_is_raised_at_once(clean_sandbox, fast):
    """Found by the money-path attacker: INR captured after AP expired the deposit was
    retried with backoff for AP_NOTIFY_REVIEW_S (an hour) before anyone saw it; AP's
    refusal in a final status is permanent, so the payment goes to the queue at once
    (a person refunds the INR), and nothing is released."""
    fast.AP_NOTIFY_REVIEW_S = 3600
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, order_id = start_and_pay(clean_sandbox, wallet, pay=False)
    platform.rpc("notify_transaction_expired", {"transaction_id": transaction_id,
                                                "message": "abandoned"})
    Customer(clean_sandbox).pay(order_id)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()  # no worker: the test is the sweeper
    deposits.payment_confirm(transaction_id=transaction_id)
    time.sleep(fast.AP_NOTIFY_SWEEP_AGE_S + 0.1)

    # Issue 13 §3: the INR goes back by itself (anchor/refunds.py); the refund, not the
    # notify, is what the queue shows once Razorpay processed it (AP cannot be moved).
    assert reconciler.sweep_unnotified() == {"notified": 0, "refused": 1, "raised": 0}
    refund = DepositRefund.objects.get(transaction_id=transaction_id)
    assert refund.trigger == "expired"
    assert not ReviewItem.objects.filter(kind="notify", reference=transaction_id).exists()
    assert not DepositRelease.objects.exists()
    assert wallet.usdc_payments() == []
    # Never notified, never released, yet not stranded: its refund owns it (make chaos
    # found both counts stuck at 1 for a late payment whose refund Razorpay failed).
    fast.STRANDED_NOTIFY_S = 0
    for status in (DepositRefund.Status.FAILED, DepositRefund.Status.MANUAL_REVIEW):
        DepositRefund.objects.filter(pk=refund.pk).update(status=status)
        assert stranded_counts()["captured_not_notified"] == 0


def test_ap_down_past_the_retries_is_renotified_once_ap_is_back(clean_sandbox, fast):
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, _ = start_and_pay(clean_sandbox, wallet)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()
    ap_url = fast.AP_PLATFORM_URL
    fast.AP_PLATFORM_URL = f"http://127.0.0.1:{free_port()}/ap/platform"  # AP is down
    with pytest.raises(platform.PlatformError):
        deposits.funds_received(transaction_id=transaction_id)  # the task's last retry
    time.sleep(fast.STRANDED_NOTIFY_S + 0.1)

    assert reconciler.sweep_unnotified() == {"notified": 0, "refused": 1, "raised": 0}
    assert stranded_counts() == {**ZERO, "captured_not_notified": 1}
    assert "PlatformError" in DepositPayment.objects.get().notify_error

    fast.AP_PLATFORM_URL = ap_url  # AP is back
    time.sleep(0.4)
    assert reconciler.sweep_unnotified()["notified"] == 1
    assert_released_once(wallet, transaction_id)
    assert stranded_counts() == ZERO


def test_a_notify_refused_past_the_review_time_is_raised_and_still_retried(clean_sandbox,
                                                                            fast):
    fast.AP_NOTIFY_REVIEW_S = 0.5
    wallet = Wallet(clean_sandbox)
    transaction_id = notify_dies(clean_sandbox, wallet)
    time.sleep(0.6)

    assert reconciler.sweep_unnotified() == {"notified": 0, "refused": 1, "raised": 1}

    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    item = ReviewItem.objects.get(key=f"notify:{payment.pk}")
    assert (item.kind, item.reference, item.amount, item.currency) == (
        "notify", transaction_id, Decimal(payment.amount_paise) / 100, "INR")
    assert "refused notify_offchain_funds_received 1 times" in item.reason
    assert "-32603" in item.reason
    # Raised: it has an owner now (a person), so it is not stranded; retries go on.
    assert stranded_counts()["captured_not_notified"] == 0
    clean_sandbox.clear_faults()
    time.sleep(0.7)
    assert reconciler.sweep_unnotified()["notified"] == 1
    assert_released_once(wallet, transaction_id)
    assert not ReviewItem.objects.filter(kind="notify").exists()


# --- (5) the protection switched off ---------------------------------------------------------

def test_without_the_sweeper_a_dead_notify_stays_stranded(clean_sandbox, fast):
    fast.STRANDED_SWEEPERS = False
    wallet = Wallet(clean_sandbox)
    transaction_id = notify_dies(clean_sandbox, wallet)
    clean_sandbox.clear_faults()  # AP is back, nobody tells it
    time.sleep(fast.STRANDED_NOTIFY_S + 0.1)

    for _ in range(2):
        reconciler.sweep_unnotified()
        reconciler.sweep_ap_deposits()
        reconciler.reconcile_orders()
        reconciler.reconcile_releases()

    assert platform.get_transaction(transaction_id)["status"] == "pending_user_transfer_start"
    assert wallet.usdc_payments() == []
    assert stranded_counts()["captured_not_notified"] == 1


# --- (2) (3) USDC no withdrawal consumed -------------------------------------------------------

@pytest.fixture
def sbx(clean_sandbox):
    """The sandbox whose ledger earlier tests wrote to: their payments into our account
    are read and marked settled first (a real deployment's cursor is past them)."""
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    receipts.scan()
    StellarReceipt.objects.update(settled_at=timezone.now())
    return clean_sandbox


def refunds_to(wallet) -> list[tuple[str, str]]:
    distribution = receipts.withdraw_account()
    return [(p["transaction_hash"], p["amount"]) for p in wallet.usdc_payments()
            if p["from"] == distribution]


def completed_withdrawal(sandbox, amount_paid="10"):
    wallet, transaction_id, pay = start_withdrawal(sandbox)
    wallet.pay(destination=pay["destination"], amount=amount_paid, memo=pay["memo"])
    assert settle(transaction_id).status == "completed"
    assert_payout_once(sandbox, transaction_id)
    return wallet, transaction_id, pay


def classify(fast):
    time.sleep(fast.RECEIPT_GRACE_S + 0.1)
    poller.poll_withdrawals()  # scans Horizon, then classifies the receipts


def test_a_second_payment_after_completion_is_raised_and_refunded_once(sbx, fast, operator,
                                                                        client):
    wallet, transaction_id, pay = completed_withdrawal(sbx)
    second = wallet.pay(destination=pay["destination"], amount="3", memo=pay["memo"])
    classify(fast)

    first = StellarReceipt.objects.exclude(tx_hash=second).get(memo=pay["memo"])
    assert (first.consumed_amount, first.transaction_id) == (Decimal("10"), transaction_id)
    assert first.settled_at is not None
    receipt = StellarReceipt.objects.get(tx_hash=second)
    assert (receipt.consumed_amount, receipt.settled_at) == (Decimal("0"), None)
    item = ReviewItem.objects.get(key=f"receipt:{receipt.pk}")
    assert (item.kind, item.status, item.reference, item.amount, item.currency) == (
        "receipt", "unconsumed", second, Decimal("3"), "USDC")
    assert item.reason.startswith(f"second payment: withdrawal {transaction_id} was already "
                                  "paid out for 10.0000000 USDC (payout completed)")
    for evidence in (second, wallet.address, "3.0000000 USDC", f"memo id {pay['memo']}",
                     "ledger time"):
        assert evidence in item.reason
    assert stranded_counts() == ZERO  # raised: a person owns it
    queue = client.get("/admin/sagas/reviewitem/?kind__exact=receipt")
    assert queue.status_code == 200 and f"receipt {second}" in queue.content.decode()

    page = confirmation_page(client, "payouts_stellarreceipt", "refund_on_chain", receipt.pk)
    assert f"Send 3.0000000 USDC from the distribution account back to {wallet.address}" in page
    assert refunds_to(wallet) == []  # the confirmation page sends nothing
    shown = confirm(client, "payouts_stellarreceipt", "refund_on_chain", receipt.pk)
    again = confirm(client, "payouts_stellarreceipt", "refund_on_chain", receipt.pk)

    refund = WithdrawalRefund.objects.get()
    assert shown == [f"Refund of 3.0000000 USDC to {wallet.address}: completed."]
    assert refused(again)
    assert (refund.receipt_id, refund.transaction_id, refund.request_id) == (
        receipt.pk, f"receipt:{receipt.pk}", None)
    assert refunds_to(wallet) == [(refund.tx_hash, "3.0000000")]
    events = list(PayoutEvent.objects.all())
    assert [(e.transaction_id, e.event, e.operator) for e in events] == [
        (f"receipt:{receipt.pk}", "receipt.refund", operator.username)]
    assert events[0].detail["receipt"]["tx_hash"] == second
    receipt.refresh_from_db()
    assert receipt.settled_at is not None
    assert not ReviewItem.objects.filter(kind="receipt").exists()
    # The withdrawal itself is untouched: still one INR payout, AP still completed.
    assert len(sandbox_payouts(sbx, transaction_id)) == 1
    assert platform.get_transaction(transaction_id)["status"] == "completed"
    poller.poll_withdrawals()
    assert len(refunds_to(wallet)) == 1
    assert stranded_counts() == ZERO


def test_an_overpayment_and_an_unknown_memo_are_raised_and_refunded_exactly(sbx, fast,
                                                                            operator):
    wallet, transaction_id, pay = completed_withdrawal(sbx, amount_paid="12.5")
    unknown = wallet.pay(destination=pay["destination"], amount="4", memo="987654321012")
    classify(fast)

    over = StellarReceipt.objects.get(memo=pay["memo"])
    stray = StellarReceipt.objects.get(tx_hash=unknown)
    items = {i.key: i for i in ReviewItem.objects.filter(kind="receipt")}
    assert set(items) == {f"receipt:{over.pk}", f"receipt:{stray.pk}"}
    assert items[f"receipt:{over.pk}"].amount == Decimal("2.5")
    assert items[f"receipt:{over.pk}"].reason.startswith(
        f"overpaid: 2.5000000 USDC above the 10.0000000 USDC withdrawal {transaction_id}")
    assert items[f"receipt:{stray.pk}"].amount == Decimal("4")
    assert items[f"receipt:{stray.pk}"].reason.startswith(
        "unknown memo: no withdrawal has id memo 987654321012")

    for receipt in (over, stray):
        payout_ops.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                           note="ticket OPS-42: refund")
        with pytest.raises(payout_ops.OperationRefused):
            payout_ops.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                               note="ticket OPS-42: again")

    amounts = sorted(amount for _, amount in refunds_to(wallet))
    assert amounts == ["2.5000000", "4.0000000"]
    assert WithdrawalRefund.objects.filter(status="completed").count() == 2
    assert PayoutEvent.objects.filter(event="receipt.refund").count() == 2
    assert not ReviewItem.objects.filter(kind="receipt").exists()
    assert len(sandbox_payouts(sbx, transaction_id)) == 1
    assert stranded_counts() == ZERO


def test_a_memo_shared_by_two_withdrawals_is_raised_and_refunded_once(sbx, fast, operator):
    memo = str(random.randrange(10**12, 10**13))  # fresh: the sandbox ledger is shared
    sbx.fault("ap.next_withdraw_memo", times=2, memo=memo)
    wallet, first, pay = start_withdrawal(sbx)
    _, second, _ = start_withdrawal(sbx)
    paid = wallet.pay(destination=pay["destination"], amount="10", memo=memo)
    for _ in range(2):
        classify(fast)

    receipt = StellarReceipt.objects.get(tx_hash=paid)
    item = ReviewItem.objects.get(key=f"receipt:{receipt.pk}")
    assert item.amount == Decimal("10")
    assert item.reason.startswith("memo shared by withdrawals ")
    assert first in item.reason and second in item.reason
    # The withdrawals themselves cannot refund it (whose is it?), this receipt can:
    assert WithdrawalRequest.objects.get(transaction_id=first).status == "manual_review"
    refund = payout_ops.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                                note="ticket OPS-42: shared memo")
    assert refund.status == "completed"
    assert refunds_to(wallet) == [(refund.tx_hash, "10.0000000")]
    assert sandbox_payouts(sbx, first) == sandbox_payouts(sbx, second) == []
    assert stranded_counts() == ZERO


def test_usdc_a_lagging_horizon_hid_from_an_operators_expiry_is_raised(sbx, fast, operator):
    """Found by the stale-read attacker: the operator's "expire" of a withdrawal proves
    "no funds arrived" with one Horizon history read, which lags behind the ledger
    (``horizon.lookup_lag``; AP's observer missed the payment too, ``ap.observer_off``,
    so AP still shows pending_user_transfer_start). The expiry went through with the
    customer's 10 USDC already on our account. AP is ``expired`` (never listed by the
    poller again) while our request stayed ``awaiting_funds``, which owns the receipts
    under its memo (``awaits_payout``): the classifier waited on the USDC for ever, the
    stranded count did not see it, and nobody paid or refunded it. The expiry marks
    the request ``expired`` now, so the late receipt is raised for a refund."""
    sbx.fault("ap.observer_off")  # AP's observer misses the payment (NOTES §4.4)
    wallet, transaction_id, pay = start_withdrawal(sbx)
    paid = wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    sbx.fault("horizon.lookup_lag", ledgers=100_000)  # history has not ingested it yet
    assert platform.get_transaction(transaction_id)["status"] == "pending_user_transfer_start"

    payout_ops.ap_transaction_expire(transaction_id=transaction_id, operator=operator,
                                     note="ticket OPS-7: abandoned")
    assert platform.get_transaction(transaction_id)["status"] == "expired"
    assert not StellarReceipt.objects.filter(tx_hash=paid).exists()  # the read lagged

    sbx.clear_faults()  # Horizon caught up
    for _ in range(2):
        classify(fast)
    time.sleep(fast.STRANDED_RECEIPT_S + 0.1)

    receipt = StellarReceipt.objects.get(tx_hash=paid)
    assert receipt.settled_at is None
    assert receipt.review_reason != "", "the late USDC is owned by nobody"
    item = ReviewItem.objects.get(key=f"receipt:{receipt.pk}")
    assert (item.amount, item.currency) == (Decimal("10"), "USDC")
    assert transaction_id in item.reason
    assert sandbox_payouts(sbx, transaction_id) == []  # never paid in INR
    assert stranded_counts() == ZERO
    refund = payout_ops.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                                note="ticket OPS-7: refund")
    assert refund.status == "completed"
    assert refunds_to(wallet) == [(refund.tx_hash, "10.0000000")]


def test_the_receipt_of_a_withdrawal_whose_payout_failed_is_not_stranded(sbx, fast):
    """Found by ``make chaos`` (seed 10): the payout failed at the bank, so the
    withdrawal's own flow (its payout, raised in the queue) still owns the USDC under
    its memo; the classifier waits on it, and so must the stranded count."""
    sbx.fault("razorpayx.fail_payout")
    wallet, transaction_id, pay = start_withdrawal(sbx)
    wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    grace, fast.RECEIPT_GRACE_S = fast.RECEIPT_GRACE_S, 60  # classified after the failure
    assert settle(transaction_id).status == "failed"
    fast.RECEIPT_GRACE_S = grace
    time.sleep(max(fast.STRANDED_RECEIPT_S, fast.RECEIPT_GRACE_S) + 0.1)
    poller.poll_withdrawals()

    receipt = StellarReceipt.objects.get(memo=pay["memo"])
    assert (receipt.settled_at, receipt.review_reason) == (None, "")
    assert stranded_counts() == ZERO


@pytest.mark.django_db
def test_a_payout_just_past_the_window_is_the_pollers_until_two_polls_later(settings):
    """Found by ``make chaos``: the poller raises a payout still ``processing`` once the
    settlement window passed, on its next pass; a stranded threshold equal to the window
    counted one the poller was about to raise. Stranded starts two polls later."""
    settings.PAYOUT_SETTLEMENT_WINDOW_S = 20.0
    settings.WITHDRAW_POLL_PERIOD_S = 1.0
    payout = WithdrawalPayoutFactory(status="processing")

    def aged(seconds: float) -> int:
        then = timezone.now() - timedelta(seconds=seconds)
        WithdrawalPayout.objects.filter(pk=payout.pk).update(created_at=then,
                                                             clock_started_at=then)
        return stranded_counts()["payout_processing"]

    assert aged(20.5) == 0  # past the window: the poller's next pass raises it
    assert aged(22.5) == 1  # two polls later and still processing: nobody has it


@pytest.mark.django_db
@pytest.mark.parametrize(("request_memo_type", "owned"), [
    ("id", True), ("", True),  # the same memo_type, or none (AP's default "id")
    ("text", False), (None, False)])  # another memo_type, or no withdrawal at all
def test_a_receipt_is_owned_by_an_open_withdrawal_with_its_memo(settings, request_memo_type,
                                                                 owned):
    """The two ways a withdrawal awaiting its payout owns a receipt under its memo; a
    withdrawal that has its payout owns none (``awaits_payout`` false)."""
    settings.STRANDED_RECEIPT_S = 1.0
    old = timezone.now() - timedelta(seconds=5)
    StellarReceiptFactory(memo="77001", memo_type="id", created_at=old,
                          from_account=Keypair.random().public_key,
                          to_account=receipts.withdraw_account(), asset=receipts.usdc_asset())
    if request_memo_type is not None:
        WithdrawalRequestFactory(memo="77001", memo_type=request_memo_type)
    assert stranded_counts()["receipt_unconsumed"] == (0 if owned else 1)

    if owned:  # its payout claimed: the withdrawal no longer owns the receipt
        request = WithdrawalRequest.objects.get(memo="77001")
        WithdrawalPayoutFactory(transaction_id=request.transaction_id, status="processing")
        assert stranded_counts()["receipt_unconsumed"] == 1


def test_without_the_classifier_an_unknown_memo_is_stranded(sbx, fast):
    fast.STRANDED_SWEEPERS = False
    wallet = Wallet(sbx)
    wallet.fund_usdc("10")
    wallet.pay(destination=receipts.withdraw_account(), amount="4", memo="55501")
    time.sleep(fast.STRANDED_RECEIPT_S + 0.1)
    poller.poll_withdrawals()

    assert StellarReceipt.objects.filter(settled_at__isnull=True).count() == 1
    assert not ReviewItem.objects.filter(kind="receipt").exists()
    assert stranded_counts() == {**ZERO, "receipt_unconsumed": 1}


# --- (4) each query is served by its partial index ------------------------------------------------

INDEXES = {
    "captured_not_notified": ("deposit_payments", "deposit_payments_unnot_idx"),
    "confirmed_not_released": ("deposit_payments", "deposit_payments_unrel_idx"),
    "release_open": ("deposit_releases", "deposit_releases_open_idx"),
    "payout_processing": ("withdrawal_payouts", "withdrawal_payouts_open_idx"),
    "refund_open": ("withdrawal_refunds", "withdrawal_refunds_open_idx"),
    "deposit_refund_open": ("deposit_refunds", "deposit_refunds_open_idx"),
    "saga_unleased": ("sagas", "sagas_due_idx"),
    "receipt_unconsumed": ("stellar_receipts", "stellar_receipts_open_idx"),
    "receive_info_unread": ("customers", "customers_info_wanted_idx"),
}


def _big_tables(n: int = 3000) -> None:
    """n settled rows in each table a stranded query reads, and a few open ones."""
    now = datetime.now(UTC)
    DepositPayment.objects.bulk_create(DepositPaymentFactory.build_batch(
        n, captured_at=now, confirmation="confirmed", confirmed_at=now, ap_notified_at=now,
        release_claimed_at=now))
    DepositReleaseFactory.create_batch(n)
    DepositReleaseFactory.create_batch(3, status=DepositRelease.Status.SUBMITTING)
    WithdrawalPayout.objects.bulk_create(WithdrawalPayoutFactory.build_batch(
        n, status="completed", amount_paise=1000))
    rows = StellarReceipt.objects.bulk_create(
        StellarReceiptFactory.build(memo=str(i), amount=Decimal(1), created_at=now,
                                    consumed_amount=Decimal(1), settled_at=now)
        for i in range(n))
    WithdrawalRefund.objects.bulk_create(
        WithdrawalRefundFactory.build(request=None, receipt=r, transaction_id=f"receipt:{r.pk}",
                                      status="completed", amount=Decimal(1), sequence=1,
                                      max_time=now)
        for r in rows)
    Saga.objects.bulk_create(SagaFactory.build_batch(n, status="completed"))
    DepositRefund.objects.bulk_create(DepositRefundFactory.build_batch(n))
    KycCustomer.objects.bulk_create(CustomerFactory.build_batch(n))
    with connection.cursor() as cursor:
        for table in {t for t, _ in INDEXES.values()}:
            cursor.execute(f"ANALYZE {table}")  # noqa: S608


@pytest.mark.django_db(transaction=False)
def test_each_stranded_query_is_served_by_its_partial_index():
    _big_tables()

    queries = stranded_queries()

    assert set(queries) == set(INDEXES) == set(stranded_thresholds())
    for kind, query in queries.items():
        table, index = INDEXES[kind]
        plan = query.explain()
        assert index in plan, (kind, plan)
        assert f"Seq Scan on {table}" not in plan, (kind, plan)
    assert stranded_counts() == ZERO


@pytest.mark.django_db(transaction=False)
def test_a_customer_changed_after_the_last_look_and_not_looked_at_since_is_stranded(settings):
    """A SEP-31 transaction waiting for information its customer already gave (issue 25
    §3): the customer changed after the last decision that waited on it, and no
    decision looked since (payouts/receive.py stamps ``info_wanted_at`` on each look)."""
    settings.STRANDED_RECEIVE_INFO_S = 60
    now = timezone.now()
    CustomerFactory(info_wanted_at=now - timedelta(minutes=10),
                    updated_at=now - timedelta(minutes=5))  # stranded
    CustomerFactory(info_wanted_at=now - timedelta(minutes=4),
                    updated_at=now - timedelta(minutes=5))  # looked at after the change
    CustomerFactory(info_wanted_at=now - timedelta(minutes=10),
                    updated_at=now - timedelta(seconds=10))  # the next look's, not yet due
    CustomerFactory(info_wanted_at=None, updated_at=now - timedelta(minutes=5))  # no wait

    assert stranded_counts() == {**ZERO, "receive_info_unread": 1}


# --- the operator-facing surfaces ----------------------------------------------------

@pytest.mark.django_db(transaction=False)
def test_stranded_is_on_ready_metrics_and_the_command(client, settings, capsys):
    settings.STRANDED_NOTIFY_S = 0
    now = timezone.now()
    DepositPaymentFactory(payment_id="pay_x", order_id="order_x", transaction_id="t1",
                          captured_at=now, confirmation="confirmed",
                          confirmed_at=now - timedelta(1))

    metrics = client.get("/metrics").content.decode()
    call_command("stranded")
    printed = capsys.readouterr().out

    assert 'corridor_stranded{kind="captured_not_notified"} 1.0' in metrics
    assert 'corridor_stranded{kind="receipt_unconsumed"} 0.0' in metrics
    assert "captured_not_notified count=1 threshold_s=0" in printed
    assert printed.strip().endswith("stranded: total=1")
    assert client.get("/health/").json() == {"status": "ok"}  # liveness: no I/O, no count


def test_ready_carries_the_stranded_counts(client, clean_sandbox):
    body = client.get("/health/ready").json()

    assert body["stranded"] == ZERO


@pytest.mark.django_db(transaction=False)
def test_an_open_deposit_refund_past_its_threshold_is_stranded(settings):
    settings.STRANDED_REFUND_S = 60
    refund = DepositRefundFactory(status=DepositRefund.Status.REQUESTED, refund_id=None)
    DepositRefundFactory(status=DepositRefund.Status.COMPLETED)
    assert stranded_counts()["deposit_refund_open"] == 0  # touched just now

    DepositRefund.objects.filter(pk=refund.pk).update(
        updated_at=timezone.now() - timedelta(seconds=61))

    assert stranded_counts() == {**ZERO, "deposit_refund_open": 1}


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("refund_status", ["completed", "failed", "manual_review", "requested"])
def test_a_deposit_refunded_in_rupees_before_any_release_is_not_stranded(settings,
                                                                         refund_status):
    """Issue 25 §4: money with an owner is not stranded. A paid, notified deposit whose
    INR went back through Razorpay before any release: the refund owns it (open:
    ``deposit_refund_open`` counts it once past its own threshold; failed or in review:
    the queue; completed: settled), never ``confirmed_not_released`` for ever."""
    settings.STRANDED_RELEASE_S = 60
    settings.STRANDED_REFUND_S = 3600
    long_ago = timezone.now() - timedelta(hours=2)
    payment = DepositPaymentFactory(confirmation="confirmed", confirmed_at=long_ago,
                                    ap_notified_at=long_ago)
    assert stranded_counts() == {**ZERO, "confirmed_not_released": 1}

    DepositRefundFactory(transaction_id=payment.transaction_id,
                         payment_id=payment.payment_id, status=refund_status)

    assert stranded_counts() == ZERO
