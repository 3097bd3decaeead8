"""Issue 9, part 2: Corridor confirms with the provider before money moves.

A webhook signed with the webhook secret proves only that its sender knows the secret.
Before a deposit's USDC is released, Corridor fetches the payment itself (``GET
/v1/payments/{id}``) and checks status, amount, currency and order; before a payout is
marked paid, it fetches the payout (``GET /v1/payouts/{id}``). A provider that cannot be
reached delays the release or the payout, never skips the check.

Everything goes over real HTTP: the signed webhooks to Corridor's live server, Corridor's
fetches to the sandbox's Razorpay / RazorpayX, the release to the sandbox's Horizon."""

from __future__ import annotations

import copy
import json
import time
from decimal import Decimal

import httpx
import pytest
from django.conf import settings

from anchor import deposits, reconciler, releases, tasks
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositPayment, DepositRelease, InboundEvent
from payouts import poller
from payouts.models import PayoutAttempt
from sandbox.razorpay.common import hmac_sha256_hex
from tests.conftest import reference_path
from tests.flows import (
    CeleryWorker,
    Customer,
    Wallet,
    ap,
    assert_released_once,
    processing_payout,
    purge_broker,
    sandbox_payouts,
    start_and_pay,
    wait_for,
)
from tests.inbound import applied_outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def post_signed(live_server, path: str, event: dict, event_id: str) -> httpx.Response:
    """What anyone holding the webhook secret can send: correctly signed raw bytes."""
    body = json.dumps(event, separators=(",", ":")).encode()
    return httpx.post(f"{live_server.url}{path}", content=body, timeout=30, headers={
        "Content-Type": "application/json",
        "X-Razorpay-Signature": hmac_sha256_hex(settings.RAZORPAY_WEBHOOK_SECRET, body),
        "X-Razorpay-Event-Id": event_id})


def payment_captured(payment: dict) -> dict:
    return {"entity": "event", "event": "payment.captured", "contains": ["payment"],
            "payload": {"payment": {"entity": payment}}, "created_at": int(time.time())}


def forged_payment(order: DepositOrder, payment_id: str) -> dict:
    """A payment entity that agrees with our order in every field Corridor can check
    without asking Razorpay."""
    return {"id": payment_id, "entity": "payment", "amount": order.amount_in_paise,
            "currency": "INR", "status": "captured", "order_id": order.order_id,
            "method": "upi", "amount_refunded": 0, "captured": True,
            "created_at": int(time.time())}


def drive_like_the_workers(transaction_id: str) -> None:
    """Everything beat and the worker would do for a deposit, run here in order: the
    task the webhook enqueued, the order reconciler (after its age threshold), the AP
    sweep."""
    tasks.deposit_funds_received.apply(args=[transaction_id])
    time.sleep(settings.ORDER_RECONCILER_AGE_S + 0.1)
    reconciler.reconcile_orders()
    reconciler.sweep_ap_deposits()


def assert_nothing_released(wallet, transaction_id):
    assert not DepositRelease.objects.filter(transaction_id=transaction_id).exists()
    assert wallet.usdc_payments() == []
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"


# --- deposits: a forged payment.captured ------------------------------------------------

@pytest.mark.parametrize("which", ["invented_id", "failed_payment_of_the_order"])
def test_a_signed_forged_payment_captured_for_an_unpaid_order_releases_nothing(
        clean_sandbox, live_server, which):
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, order_id = start_and_pay(clean_sandbox, wallet, pay=False)
    order = DepositOrder.objects.get(order_id=order_id)
    payment_id = "pay_FORGED0000001"
    if which == "failed_payment_of_the_order":  # a real payment id, but Razorpay failed it
        payment_id = Customer(clean_sandbox).pay(order_id, outcome="failed")["payment"]["id"]
    # The webhook secret is the default one: anyone who read it can sign this.
    response = post_signed(live_server, "/webhooks/razorpay/payments",
                           payment_captured(forged_payment(order, payment_id)), "evt_forged1")
    assert (response.status_code, response.json()) == (200, {"outcome": "received"})
    assert applied_outcome("razorpay", "evt_forged1") == "recorded"

    drive_like_the_workers(transaction_id)

    assert_nothing_released(wallet, transaction_id)
    payment = DepositPayment.objects.get(payment_id=payment_id)
    assert payment.confirmation == "rejected"
    assert payment.confirmed_at is None and payment.ap_notified_at is None
    expected = "Razorpay has no payment" if which == "invented_id" else \
        "status is 'failed', not 'captured'"
    assert expected in payment.confirmation_error
    assert DepositOrder.objects.get(order_id=order_id).status == "awaiting_payment"
    with pytest.raises(releases.ReleaseRefused):  # AP is not in pending_anchor either
        releases.release_start(transaction_id=transaction_id)


def test_a_real_payment_replayed_onto_another_order_releases_nothing_and_blocks_nothing(
        clean_sandbox, live_server):
    """A ₹1000 payment really captured on order A, claimed in a signed webhook for the
    ₹2000 order B: Razorpay's answer names order A and 100000 paise, so B gets nothing;
    and the forged claim does not keep A's own payment from being recorded."""
    purge_broker()
    payer, victim = Wallet(clean_sandbox), Wallet(clean_sandbox)
    clean_sandbox.fault("razorpay.webhook_lose", times=1)  # A's own webhook is lost
    a_id, a_order = start_and_pay(clean_sandbox, payer, amount="1000")
    b_id, b_order = start_and_pay(clean_sandbox, victim, amount="2000", pay=False)
    [a_payment] = rzp.order_payments(a_order)
    assert a_payment["status"] == "captured"
    claim = forged_payment(DepositOrder.objects.get(order_id=b_order), a_payment["id"])

    response = post_signed(live_server, "/webhooks/razorpay/payments",
                           payment_captured(claim), "evt_replayed")
    assert response.json() == {"outcome": "received"}
    assert applied_outcome("razorpay", "evt_replayed") == "recorded"
    drive_like_the_workers(b_id)

    assert_nothing_released(victim, b_id)
    forged = DepositPayment.objects.get(transaction_id=b_id)
    assert forged.confirmation == "rejected"
    assert f"order_id is '{a_order}', not '{b_order}'" in forged.confirmation_error
    assert "amount is 100000 paise, not 200000" in forged.confirmation_error
    # A's payment was recorded by the order reconciler all the same, and released once.
    purge_broker()
    deposits.funds_received(transaction_id=a_id)
    assert_released_once(payer, a_id)
    assert DepositPayment.objects.get(transaction_id=a_id).confirmation == "confirmed"


# --- deposits: the payments API down ------------------------------------------------------

def test_payments_api_down_delays_the_release_and_it_is_released_once_when_back(
        clean_sandbox):
    purge_broker()
    clean_sandbox.fault("razorpay.payment_fetch_5xx")  # every read, until cleared
    wallet = Wallet(clean_sandbox)
    transaction_id, _ = start_and_pay(clean_sandbox, wallet)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()  # no worker: beat's passes are run by hand

    try:  # what the task runs
        deposits.funds_received(transaction_id=transaction_id)
        refused = None
    except Exception as exc:  # noqa: BLE001 - checked below, after the side effects
        refused = exc
    time.sleep(settings.ORDER_RECONCILER_AGE_S + 0.1)
    counts = reconciler.reconcile_orders()
    reconciler.sweep_ap_deposits()

    assert_nothing_released(wallet, transaction_id)
    assert isinstance(refused, deposits.PaymentUnconfirmed), refused
    assert counts == {"unconfirmed": 1}
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    assert payment.confirmation == "unconfirmed"
    assert "500" in payment.confirmation_error

    clean_sandbox.clear_faults()
    assert reconciler.reconcile_orders() == {"confirmed": 1}
    for _ in range(2):  # later passes find nothing left to do
        assert reconciler.reconcile_orders() == {}
        reconciler.sweep_ap_deposits()

    assert_released_once(wallet, transaction_id)
    payment.refresh_from_db()
    assert (payment.confirmation, payment.confirmation_error) == ("confirmed", "")
    assert DepositOrder.objects.get(transaction_id=transaction_id).status == "paid"


def test_the_worker_retries_an_unreachable_payments_api_and_releases_once(clean_sandbox):
    purge_broker()
    clean_sandbox.fault("razorpay.payment_fetch_5xx")
    worker = CeleryWorker(name="confirm", RELEASE_RETRY_DELAY_S="0.5")  # 20 tries: 10 s
    try:
        wallet = Wallet(clean_sandbox)
        transaction_id, _ = start_and_pay(clean_sandbox, wallet)
        wait_for(lambda: DepositPayment.objects.filter(
            transaction_id=transaction_id, confirmation_error__contains="500").exists(),
            what="a failed confirmation")
        time.sleep(1.0)  # a few task retries, all refused by the provider

        assert_nothing_released(wallet, transaction_id)

        clean_sandbox.clear_faults()
        wait_for(lambda: ap(transaction_id)["status"] == "completed", timeout=60,
                 what="AP completed")
    finally:
        worker.stop()
        purge_broker()
    assert_released_once(wallet, transaction_id)


# --- deposits: the comparison itself, on the reference payload ------------------------------

def reference_payment() -> dict:
    path = reference_path("razorpay", "webhook_payment_captured_upi.json")
    return json.loads(path.read_text())["payload"]["payment"]["entity"]


def reference_order(entity: dict) -> DepositOrder:
    return DepositOrder(transaction_id="tx", order_id=entity["order_id"],
                        amount_in=Decimal("1.00"), amount_in_paise=entity["amount"],
                        fee=Decimal(0), amount_out=Decimal(0), rate=Decimal(84))


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(("change", "reason"), [
    ({}, None),
    ({"status": "authorized", "captured": False}, "status is 'authorized', not 'captured'"),
    ({"status": "refunded"}, "status is 'refunded', not 'captured'"),
    ({"amount_refunded": 50}, "50 paise refunded"),
    ({"order_id": "order_SomeoneElses1"},
     "order_id is 'order_SomeoneElses1', not 'order_DESxiijbl9xjDB'"),
    ({"amount": 10000}, "amount is 10000 paise, not 100"),
    ({"amount": "100"}, "amount is '100' paise, not 100"),
    ({"amount": 100.0}, "amount is 100.0 paise, not 100"),
    ({"currency": "USD"}, "currency is 'USD', not 'INR'"),
    ({"id": "pay_Other00000000"}, "Razorpay answered for payment 'pay_Other00000000'"),
])
def test_the_payment_razorpay_returns_must_match_our_order_in_every_field(change, reason):
    entity = reference_payment()
    order = reference_order(entity)
    fetched = {**copy.deepcopy(entity), **change}

    assert deposits.payment_mismatch(fetched=fetched, order=order,
                                     payment_id=entity["id"]) == reason


# --- the sandbox's read faults ------------------------------------------------------------

def test_the_sandbox_read_faults_answer_500_until_cleared(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    _, order_id = start_and_pay(clean_sandbox, wallet)
    api = httpx.Client(base_url=settings.RAZORPAY_API_URL, timeout=10,
                       auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET))
    payment_id = api.get(f"/v1/orders/{order_id}/payments").json()["items"][0]["id"]
    clean_sandbox.fault("razorpay.payment_fetch_5xx")
    clean_sandbox.fault("razorpayx.payout_fetch_5xx")

    for url in (f"/v1/payments/{payment_id}", f"/v1/orders/{order_id}/payments",
                "/v1/payouts/pout_00000000000000"):
        answer = api.get(url)
        assert answer.status_code == 500, url
        assert answer.json()["error"]["code"] == "SERVER_ERROR"

    clean_sandbox.clear_faults()
    assert api.get(f"/v1/payments/{payment_id}").json()["status"] == "captured"
    assert api.get("/v1/payouts/pout_00000000000000").status_code == 400  # no such payout


# --- payouts: a forged payout.processed -------------------------------------------------

@pytest.fixture
def sbx(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return clean_sandbox


def payout_event(name: str, entity: dict) -> dict:
    return {"entity": "event", "event": name, "contains": ["payout"],
            "payload": {"payout": {"entity": entity}}, "created_at": int(time.time())}


def test_a_signed_forged_payout_processed_for_a_payout_still_processing_changes_nothing(
        sbx, live_server):
    payout = processing_payout(sbx, "razorpayx.payout_stuck_processing")
    transaction_id = payout.transaction_id
    time.sleep(0.5)  # past the settle delay: RazorpayX still says processing
    assert sandbox_payouts(sbx, transaction_id)[0]["status"] == "processing"
    forged = {"id": payout.provider_payout_id, "entity": "payout",
              "amount": payout.amount_paise, "currency": "INR", "status": "processed",
              "utr": "FORGED123456", "reference_id": transaction_id, "status_details": {}}

    response = post_signed(live_server, "/webhooks/razorpay/payouts",
                           payout_event("payout.processed", forged), "evt_pout_forged")

    assert (response.status_code, response.json()) == (200, {"outcome": "received"})
    assert applied_outcome("razorpayx", "evt_pout_forged") == "processing->processing"
    payout.refresh_from_db()
    assert (payout.status, payout.reference, payout.ap_completed_at) == ("processing", "", None)
    assert PayoutAttempt.objects.get(payout=payout).provider_status == "processing"
    time.sleep(0.5)  # an AP notify enqueued or run by mistake would have landed by now
    assert ap(transaction_id)["status"] == "pending_external"
    assert "FORGED123456" not in json.dumps(ap(transaction_id))


def test_a_payout_processed_webhook_acts_on_what_razorpayx_says_failed(sbx, live_server):
    payout = processing_payout(sbx, "razorpayx.fail_payout")
    transaction_id = payout.transaction_id
    wait_for(lambda: sandbox_payouts(sbx, transaction_id)[0]["status"] == "failed",
             what="payout failed at the provider")
    forged = {"id": payout.provider_payout_id, "entity": "payout",
              "amount": payout.amount_paise, "currency": "INR", "status": "processed",
              "utr": "FORGED123456", "reference_id": transaction_id, "status_details": {}}

    response = post_signed(live_server, "/webhooks/razorpay/payouts",
                           payout_event("payout.processed", forged), "evt_pout_lie")

    assert response.json() == {"outcome": "received"}
    assert applied_outcome("razorpayx", "evt_pout_lie") == "processing->failed"
    payout.refresh_from_db()
    assert (payout.status, payout.reference) == ("failed", "")
    assert ap(transaction_id)["status"] != "completed"


def test_a_payout_webhook_while_razorpayx_is_down_waits_and_a_later_drain_completes_it(
        sbx, live_server):
    payout = processing_payout(sbx)
    transaction_id = payout.transaction_id
    settled = wait_for(lambda: [p for p in sandbox_payouts(sbx, transaction_id)
                                if p["status"] == "processed"], what="payout processed")
    utr = settled[0]["utr"]
    assert utr
    entity = {"id": payout.provider_payout_id, "entity": "payout",
              "amount": payout.amount_paise, "currency": "INR", "status": "processed",
              "utr": utr, "reference_id": transaction_id, "status_details": {}}
    event = payout_event("payout.processed", entity)
    sbx.fault("razorpayx.payout_fetch_5xx")

    first = post_signed(live_server, "/webhooks/razorpay/payouts", event, "evt_pout_real")
    poller.poll_withdrawals()  # the poller cannot confirm either while it is down

    # Durable before the 2xx; the drain could not ask RazorpayX: the row waits.
    assert (first.status_code, first.json()) == (200, {"outcome": "received"})
    assert applied_outcome("razorpayx", "evt_pout_real") == "received"
    assert InboundEvent.objects.get(event_id="evt_pout_real").processed_at is None
    payout.refresh_from_db()
    assert (payout.status, payout.reference) == ("processing", "")

    sbx.clear_faults()
    retry = post_signed(live_server, "/webhooks/razorpay/payouts", event, "evt_pout_real")

    assert retry.json() == {"outcome": "duplicate"}
    assert applied_outcome("razorpayx", "evt_pout_real") == "processing->completed"
    wait_for(lambda: ap(transaction_id)["status"] == "completed", what="AP completed")
    payout.refresh_from_db()
    assert (payout.status, payout.reference) == ("completed", utr)
    assert ap(transaction_id)["external_transaction_id"] == utr
    assert len(sandbox_payouts(sbx, transaction_id)) == 1


# --- operators: a re-drive needs a confirmed payment too -----------------------------------

@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(("confirmation", "refused"), [("unconfirmed", True), ("rejected", True),
                                                       ("confirmed", False)])
def test_an_operator_redrive_needs_a_payment_razorpay_confirmed(confirmation, refused,
                                                                monkeypatch):
    from anchor import operations
    from tests.factories import DepositPaymentFactory, DepositReleaseFactory

    release = DepositReleaseFactory(status="manual_review", last_error="attempts exhausted")
    DepositPaymentFactory(transaction_id=release.transaction_id, confirmation=confirmation)
    # Past the payment check the re-drive reads Horizon: stop there, we only need to know
    # whether the payment check let it through.
    monkeypatch.setattr(releases, "release_chain_check",
                        lambda r: (_ for _ in ()).throw(RuntimeError("reached the chain")))

    if refused:
        preview = operations.release_redrive_preview(release_id=release.pk)
        assert preview.refusal == ("Corridor holds no captured payment for this deposit that "
                                   "Razorpay confirmed")
    else:
        with pytest.raises(RuntimeError, match="reached the chain"):
            operations.release_redrive_preview(release_id=release.pk)


def test_a_late_failed_event_of_an_old_attempt_never_fails_the_live_attempt(sbx, live_server):
    """Found by the money-path attacker: attempt 1 failed, an operator minted attempt 2,
    then attempt 1's (true) ``payout.failed`` arrives late (RazorpayX retries for 24 h).
    Only the current attempt moves the row: attempt 2's ``processed`` completes it and
    AP, and the old event changes nothing but attempt 1's own record."""
    import importlib

    from django.apps import apps as django_apps
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from payouts import operations

    importlib.import_module("sagas.migrations.0004_operator_groups").sync_groups(
        django_apps, connection.schema_editor())
    op = User.objects.create_user(username="alice", is_staff=True)
    op.groups.add(Group.objects.get(name="operators"))
    payout = processing_payout(sbx, "razorpayx.fail_payout")
    tx, first = payout.transaction_id, payout.provider_payout_id
    wait_for(lambda: sandbox_payouts(sbx, tx)[0]["status"] == "failed", what="attempt 1 failed")
    poller.poll_withdrawals()
    payout.refresh_from_db()
    assert payout.status == "failed"
    sbx.fault("razorpayx.webhook_lose", times=1)
    sbx.fault("razorpayx.payout_stuck_processing", times=1)
    operations.payout_new_attempt(payout_id=payout.pk, operator=op, note="ticket OPS-1: retry")
    second = PayoutAttempt.objects.get(payout=payout, number=2).provider_payout_id

    # when attempt 1's payout.failed arrives late, under a fresh event id
    entity = {"id": first, "entity": "payout", "amount": payout.amount_paise,
              "currency": "INR", "status": "failed", "utr": None, "reference_id": tx,
              "status_details": {"reason": "beneficiary_bank_rejected"}}
    late = post_signed(live_server, "/webhooks/razorpay/payouts",
                       payout_event("payout.failed", entity), "evt_late_attempt1_failed")

    # then the row is still processing, and attempt 2's settlement completes it
    assert late.status_code == 200
    payout.refresh_from_db()
    assert (payout.status, payout.attempts) == ("processing", 2), payout.last_error
    sbx.http.post(f"/razorpay/sandbox/payouts/{second}/settle", json={"status": "processed"})
    wait_for(lambda: any(p["status"] == "processed" for p in sandbox_payouts(sbx, tx)),
             what="attempt 2 processed")

    def completed():
        poller.poll_withdrawals()
        payout.refresh_from_db()
        return payout.status == "completed"

    wait_for(completed, timeout=15, what="the payout completed by attempt 2")
    assert ap(tx)["status"] == "completed"
    assert ap(tx)["external_transaction_id"] == payout.reference
    assert [p["status"] for p in sandbox_payouts(sbx, tx)].count("processed") == 1
