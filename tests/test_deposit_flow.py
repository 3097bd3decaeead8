"""Deposits end to end: the sandbox over real HTTP (Horizon, AP, Razorpay), Corridor's
live server receiving events and webhooks, worker processes, the real test database.

The safety property is invariant 1 of DESIGN.md §8: at most one on-chain payment per
deposit, counted on the sandbox's Stellar ledger, and invariant 6: AP ends
``completed`` with the hash Corridor stored."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection

from anchor import deposits, platform, reconciler, releases
from anchor.models import DepositOrder, DepositPayment, DepositRelease, InboundEvent
from tests.dbcount import count_write_commits
from tests.flows import (
    CeleryWorker,
    Customer,
    Wallet,
    ap,
    assert_released_once,
    horizon,
    paid_deposit,
    purge_broker,
    run_manage,
    settle,
    start_and_pay,
    unapplied_then_stale,
    wait_for,
)
from tests.inbound import applied_outcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def worker(clean_sandbox):
    purge_broker()
    w = CeleryWorker()
    yield w
    w.stop()
    purge_broker()


def test_happy_path_from_the_interactive_page_to_ap_completed(worker, clean_sandbox):
    wallet = Wallet(clean_sandbox)

    transaction_id, _ = start_and_pay(clean_sandbox, wallet, memo="exchange-user-42",
                                      memo_type="text")

    wait_for(lambda: ap(transaction_id)["status"] == "completed", timeout=60,
             what="AP completed")
    release = assert_released_once(wallet, transaction_id)
    tx = horizon(clean_sandbox).transactions().transaction(release.tx_hash).call()
    assert (tx["memo_type"], tx["memo"]) == ("text", "exchange-user-42")
    assert DepositPayment.objects.get(transaction_id=transaction_id).amount_paise == 100000
    assert ap(transaction_id)["external_transaction_id"].startswith("pay_")


@pytest.mark.parametrize(("memo_type", "memo"), [
    ("id", "18446744073709551615"),
    ("hash", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="),
])
def test_the_wallets_memo_rides_on_the_payment(clean_sandbox, memo_type, memo):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet, memo=memo, memo_type=memo_type)

    release = releases.release_start(transaction_id=transaction_id)

    tx = horizon(clean_sandbox).transactions().transaction(release.tx_hash).call()
    assert (tx["memo_type"], tx["memo"]) == (memo_type, memo)
    assert_released_once(wallet, transaction_id)


def test_happy_release_path_costs_three_commits(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)

    with count_write_commits() as counted:
        release = releases.release_start(transaction_id=transaction_id)

    assert release.status == "completed"
    assert counted["commits"] == 3


@pytest.mark.parametrize("crash_at", ["after_claim", "after_submit", "after_mark_submitted",
                                      "after_notify"])
def test_worker_killed_at_each_boundary_pays_once(clean_sandbox, crash_at):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)

    killed = run_manage("release_deposit", transaction_id, crash_at=crash_at)

    assert killed.returncode == -9, killed.stderr[-2000:]
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_without_the_chain_check_a_killed_worker_pays_twice(clean_sandbox, settings):
    """The protection switched off once: a re-drive that rebuilds instead of looking
    for the stored hash on chain pays the customer a second time."""
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    killed = run_manage("release_deposit", transaction_id, crash_at="after_submit")
    assert killed.returncode == -9
    settings.RELEASE_CHAIN_CHECK = False

    time.sleep(settings.RECONCILER_AGE_S + 0.1)
    reconciler.reconcile_releases()

    assert len(wallet.usdc_payments()) == 2


def test_horizon_504_after_apply_is_adopted_not_repaid(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)

    first = releases.release_start(transaction_id=transaction_id)

    assert first.status == "submitting"
    assert "unknown" in first.last_error
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_ap_32603_on_the_first_notify_retries_the_notify_not_the_payment(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("ap.rpc_32603_unindexed_hash", times=1)

    first = releases.release_start(transaction_id=transaction_id)

    assert first.status == "submitted"
    assert "-32603" in first.last_error
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_events_delivered_three_times_and_out_of_order_release_once(worker, clean_sandbox):
    clean_sandbox.fault("ap.event_duplicate", copies=3)
    clean_sandbox.fault("ap.event_reorder")
    wallet = Wallet(clean_sandbox)

    transaction_id, _ = start_and_pay(clean_sandbox, wallet)

    wait_for(lambda: ap(transaction_id)["status"] == "completed", timeout=60,
             what="AP completed")
    time.sleep(1.0)  # let the redeliveries arrive
    assert_released_once(wallet, transaction_id)
    assert InboundEvent.objects.filter(source="ap").count() >= 3


def test_a_lost_event_and_a_lost_task_are_recovered_by_the_sweep(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    clean_sandbox.fault("ap.event_lose", times=10)
    transaction_id = paid_deposit(clean_sandbox, wallet)  # its task purged, events lost
    assert not DepositRelease.objects.filter(transaction_id=transaction_id).exists()

    counts = reconciler.sweep_ap_deposits()

    assert counts["started"] == 1
    assert_released_once(wallet, transaction_id)


def test_a_lost_payment_webhook_is_recovered_by_the_order_reconciler(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    clean_sandbox.fault("razorpay.webhook_lose", times=1)
    purge_broker()
    transaction_id, _ = start_and_pay(clean_sandbox, wallet)
    time.sleep(settings.ORDER_RECONCILER_AGE_S + 0.5)
    assert not DepositPayment.objects.filter(transaction_id=transaction_id).exists()

    counts = reconciler.reconcile_orders()

    assert counts == {"recorded": 1}
    purge_broker()
    deposits.funds_received(transaction_id=transaction_id)
    assert_released_once(wallet, transaction_id)


def test_replayed_webhooks_credit_once(worker, clean_sandbox):
    clean_sandbox.fault("razorpay.webhook_replay", copies=3)
    wallet = Wallet(clean_sandbox)

    transaction_id, _ = start_and_pay(clean_sandbox, wallet)

    wait_for(lambda: ap(transaction_id)["status"] == "completed", timeout=60,
             what="AP completed")
    time.sleep(1.0)
    assert DepositPayment.objects.filter(transaction_id=transaction_id).count() == 1
    # payment.captured and order.paid, three deliveries each: six receipts, one credit.
    assert InboundEvent.objects.filter(source="razorpay").count() == 2
    assert_released_once(wallet, transaction_id)


def test_ap_pending_anchor_without_our_payment_releases_nothing(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id, _ = start_and_pay(clean_sandbox, wallet, pay=False)
    # Someone moves AP forward without any INR reaching us.
    platform.rpc("notify_offchain_funds_received", {
        "transaction_id": transaction_id, "external_transaction_id": "forged"})
    assert ap(transaction_id)["status"] == "pending_anchor"

    with pytest.raises(releases.ReleaseRefused):
        releases.release_start(transaction_id=transaction_id)
    counts = reconciler.sweep_ap_deposits()

    assert counts["started"] == 0
    assert not DepositRelease.objects.exists()
    assert wallet.usdc_payments() == []


def test_destination_without_a_trustline_waits_for_it(clean_sandbox):
    wallet = Wallet(clean_sandbox, trust=False)
    transaction_id = paid_deposit(clean_sandbox, wallet)

    assert releases.release_start(transaction_id=transaction_id) is None
    assert ap(transaction_id)["status"] == "pending_trust"
    assert reconciler.sweep_ap_deposits()["started"] == 0

    wallet.trust_usdc()
    counts = reconciler.sweep_ap_deposits()

    assert counts["trust_set"] == 1
    assert_released_once(wallet, transaction_id)


@pytest.mark.parametrize("stale_reads", [1, 2, 3])
def test_a_stale_read_after_a_lost_notify_answer_is_not_ap_refusing_it(clean_sandbox,
                                                                       monkeypatch,
                                                                       stale_reads):
    """Found by the stale-read attacker: AP applied ``notify_onchain_funds_sent`` but its
    answer was lost (a timeout); the reconciler's repeat got -32600 (AP is completed),
    and the re-read lagged behind AP (``ap.stale_status``: the pre-notify
    ``pending_anchor``). Corridor took that one read as AP refusing the notify for good
    and sent the paid, completed deposit to manual_review (a refusal AP would never
    give from the status it showed). A -32600 that the read contradicts is a stale
    read: the notify is asked again later, as after -32603, and the release completes.
    Two stale reads (the review of stop 25): the refusal's re-read lagged, a second read
    by the contradiction check did not (completed), and that second read sent the
    release to manual_review; one re-read now decides both."""
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    real_rpc = platform.rpc
    lost: list[str] = []

    def rpc(method, params):
        result = real_rpc(method, params)
        if method == "notify_onchain_funds_sent" and not lost:
            lost.append(method)
            raise platform.PlatformError(f"{method}: ReadTimeout: the answer was lost")
        return result

    monkeypatch.setattr(platform, "rpc", rpc)
    first = releases.release_start(transaction_id=transaction_id)
    assert first.status == "submitted" and "answer was lost" in first.last_error
    assert ap(transaction_id)["status"] == "completed"  # AP applied it

    clean_sandbox.fault("ap.stale_status", times=stale_reads, transaction_ids=[transaction_id])
    again = releases.release_drive(release_id=first.pk, redrive=True)

    assert again.status != "manual_review", again.last_error
    if stale_reads > 1:  # every read of this drive lagged: asked again later
        assert again.status == "submitted" and "stale read" in again.last_error
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


@pytest.mark.parametrize("contradiction_check", [True, False])
def test_a_lost_notify_answer_behind_lagging_reads_completes_the_release(
        clean_sandbox, settings, contradiction_check):
    """The same, from the sandbox's own fault (``ap.rpc_answer_lost``: AP applies the
    notify, its answer is lost, the next reads lag behind it), as ``make chaos`` meets
    it. With the contradiction check off (``--protection-off notify_contradiction``)
    the paid deposit goes to manual_review: the check is what keeps it out."""
    settings.RELEASE_NOTIFY_CONTRADICTION = contradiction_check
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("ap.rpc_answer_lost", times=1)  # the next 3 reads lag

    first = releases.release_start(transaction_id=transaction_id)
    if first.status == "submitting":  # a loaded machine: the submit's answer came late
        first = wait_for(lambda: (lambda r: r if r.status != "submitting" else None)(
            releases.release_drive(release_id=first.pk, redrive=True)), timeout=30,
            what="the payment landed")
    assert first.status == "submitted", first.last_error
    again = releases.release_drive(release_id=first.pk, redrive=True)

    if not contradiction_check:
        assert again.status == "manual_review"
        assert "AP refused notify_onchain_funds_sent" in again.last_error
        return
    assert again.status != "manual_review", again.last_error
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_a_concurrent_start_that_read_a_lagging_horizon_does_not_strand_the_release(
        clean_sandbox):
    """Found by ``make chaos`` (seed 8, under load): two starts of one deposit (the
    task after the webhook and the AP sweep) raced; one claimed, paid and was about to
    tell AP, the other read the destination from a Horizon node behind the trustline,
    saw none and asked AP for it (``request_trust``: pending_anchor -> pending_trust).
    AP then refused ``notify_onchain_funds_sent`` in pending_trust and the paid release
    went to manual review. The landed payment proves the trustline: the release takes
    AP back (``notify_trust_set``) and completes."""
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    killed = run_manage("release_deposit", transaction_id, crash_at="after_mark_submitted")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert DepositRelease.objects.get(transaction_id=transaction_id).status == "submitted"
    # The other start, on its stale read of the destination account:
    platform.rpc("request_trust", {"transaction_id": transaction_id})
    assert ap(transaction_id)["status"] == "pending_trust"

    release = settle(transaction_id)

    assert release.status == "completed", release.last_error
    assert_released_once(wallet, transaction_id)


def test_a_horizon_behind_the_destinations_creation_delays_the_release(clean_sandbox,
                                                                       settings):
    """Found by the money-path attacker: a node behind the wallet's creation answers 404
    for the account, which sent a normal deposit to manual review ("does not exist on
    Stellar"). A 404 proves nothing until DESTINATION_MISSING_REVIEW_S has passed: the
    release is not started, and the AP sweep starts it once Horizon caught up."""
    settings.DESTINATION_MISSING_REVIEW_S = 30
    wallet = Wallet(clean_sandbox)
    clean_sandbox.fault("horizon.ingest_behind", ledgers=200)  # the wallet is newer
    transaction_id = paid_deposit(clean_sandbox, wallet)

    with pytest.raises(releases.ReleaseRefused, match="not found on Stellar yet"):
        releases.release_start(transaction_id=transaction_id)
    assert not DepositRelease.objects.exists()
    clean_sandbox.clear_faults()
    assert reconciler.sweep_ap_deposits()["started"] == 1
    assert_released_once(wallet, transaction_id)


def test_a_destination_missing_past_the_review_time_goes_to_an_operator(clean_sandbox,
                                                                         settings):
    settings.DESTINATION_MISSING_REVIEW_S = 0.5
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.ingest_behind", ledgers=200)
    time.sleep(0.6)

    release = releases.release_start(transaction_id=transaction_id)

    assert release.status == "manual_review"
    assert release.last_error.startswith("destination account does not exist on Stellar")
    assert wallet.usdc_payments() == []


def test_twenty_concurrent_releases_from_one_source_account(clean_sandbox, settings):
    assert not settings.STELLAR_CHANNEL_SECRETS  # the distribution account alone

    def one(_) -> tuple[Wallet, str]:
        try:
            wallet = Wallet(clean_sandbox)
            return wallet, paid_deposit(clean_sandbox, wallet, amount="500")
        finally:
            connection.close()

    # Twenty paid deposits, four made at a time (their set-up waits on ledger closes and
    # webhooks); no worker runs yet, so no release starts before the tasks below.
    with ThreadPoolExecutor(max_workers=4) as pool:
        wallets, ids = (list(column) for column in zip(*pool.map(one, range(20)),
                                                       strict=True))
    purge_broker()  # what one deposit's events queued while another's was being made
    from anchor import tasks

    swept = [time.monotonic()]

    def all_completed() -> bool:
        # The beat's AP sweep, as `make run` has it: with one channel, a release task
        # can use up its retries (20 x RELEASE_RETRY_DELAY_S) behind the others on a
        # slow machine, and the sweep is what starts it then (stop 25's full run: 19
        # of 20 completed, one task out of retries, no beat here, a 300 s timeout).
        if time.monotonic() - swept[0] > settings.AP_SWEEP_PERIOD_S:
            reconciler.sweep_ap_deposits()
            swept[0] = time.monotonic()
        return DepositRelease.objects.filter(status="completed").count() == 20

    w = CeleryWorker(name="concurrent", concurrency=8)
    try:
        for transaction_id in ids:
            tasks.deposit_release.delay(transaction_id)
        wait_for(all_completed, timeout=300, what="20 releases completed")
    finally:
        w.stop()
    for wallet, transaction_id in zip(wallets, ids, strict=True):
        assert_released_once(wallet, transaction_id)
    errors = list(DepositRelease.objects.values_list("last_error", flat=True))
    assert not any("tx_bad_seq" in e for e in errors)
    assert set(DepositRelease.objects.values_list("attempts", flat=True)) == {1}


def test_an_abandoned_deposit_expires_before_funds_arrive(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id, _ = start_and_pay(clean_sandbox, wallet, pay=False)
    assert reconciler.expire_abandoned() == 0  # younger than DEPOSIT_EXPIRY_S

    time.sleep(settings.DEPOSIT_EXPIRY_S + 0.2)
    assert reconciler.expire_abandoned() == 1

    assert ap(transaction_id)["status"] == "expired"
    assert DepositOrder.objects.get(transaction_id=transaction_id).status == "expired"
    assert reconciler.expire_abandoned() == 0


def test_payment_failed_then_captured_credits_once(worker, clean_sandbox):
    clean_sandbox.fault("razorpay.payment_failed_then_captured", times=1)
    wallet = Wallet(clean_sandbox)

    transaction_id, _ = start_and_pay(clean_sandbox, wallet)

    wait_for(lambda: ap(transaction_id)["status"] == "completed", timeout=60,
             what="AP completed")
    assert DepositPayment.objects.filter(transaction_id=transaction_id).count() == 1
    assert_released_once(wallet, transaction_id)


def test_a_signed_webhook_with_the_wrong_amount_credits_nothing(clean_sandbox, client):
    import hashlib
    import hmac
    import json

    wallet = Wallet(clean_sandbox)
    transaction_id, order_id = start_and_pay(clean_sandbox, wallet, pay=False)
    order = DepositOrder.objects.get(order_id=order_id)
    for wrong in (order.amount_in_paise // 100, order.amount_in_paise + 1):
        body = json.dumps({"entity": "event", "event": "payment.captured", "payload": {
            "payment": {"entity": {"id": f"pay_wrong{wrong}", "order_id": order_id,
                                   "amount": wrong, "currency": "INR", "status": "captured",
                                   "created_at": int(time.time())}}}},
                          separators=(",", ":")).encode()
        signature = hmac.new(settings.RAZORPAY_WEBHOOK_SECRET.encode(), body,
                             hashlib.sha256).hexdigest()

        response = client.post("/webhooks/razorpay/payments", body,
                               content_type="application/json",
                               HTTP_X_RAZORPAY_SIGNATURE=signature,
                               HTTP_X_RAZORPAY_EVENT_ID=f"evt_wrong{wrong}")

        assert (response.status_code, response.json()["outcome"]) == (200, "received")
        assert applied_outcome("razorpay", f"evt_wrong{wrong}") == "amount_mismatch"
    assert not DepositPayment.objects.exists()
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"


def test_a_replayed_interactive_link_after_submission_sends_no_second_request(
        clean_sandbox, monkeypatch):
    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()
    customer = Customer(clean_sandbox)
    order_id = customer.submit_amount(url, "1000")

    def ap_events():  # one event per successful status RPC (AP NOTES §1.4)
        events = clean_sandbox.http.get("/ap/sandbox/events").json()["events"]
        return [e["id"] for e in events if e["transaction_id"] == transaction_id]

    events_before = ap_events()
    assert len(events_before) == 2  # transaction_created, request_offchain_funds
    calls = []  # every RPC the live server sends from here on, refused ones included
    real_rpc = platform.rpc
    monkeypatch.setattr(platform, "rpc", lambda method, params: calls.append(method)
                        or real_rpc(method, params))

    replay = customer.open(url)
    form = customer.http.get(str(replay.url.join(replay.headers["location"])))

    assert form.status_code == 302  # straight back to the same checkout
    assert Customer.order_id_from(form.headers["location"]) == order_id
    assert DepositOrder.objects.filter(transaction_id=transaction_id).count() == 1
    assert ap_events() == events_before
    assert calls == []
    # A second submit of the form (double click, back button) asks nothing of AP either.
    deposits.deposit_submit(transaction_id=transaction_id, amount_in=Decimal("1000"))
    assert calls == []


def test_a_funds_request_read_back_without_amounts_opens_no_checkout(clean_sandbox,
                                                                    monkeypatch):
    """The deposit twin of chaos seed 7's withdrawal: ``request_offchain_funds`` answers
    -32603 before touching the transaction and the re-read shows a stale
    ``pending_anchor`` with no amounts. That is not AP taking the request: no checkout
    for a deposit AP still holds ``incomplete``; the customer's retry asks AP again."""
    armed = unapplied_then_stale(monkeypatch, clean_sandbox, "request_offchain_funds")
    transaction_id, url = Wallet(clean_sandbox).start_deposit()
    customer = Customer(clean_sandbox)
    opened = customer.open(url)
    form_url = str(opened.url.join(opened.headers["location"]))
    quote = customer.http.post(form_url, data={
        "amount": "1000", **customer._csrf(customer.http.get(form_url))})
    confirm = {"amount": "1000", "confirm": "yes", **customer._csrf(quote)}

    first = customer.http.post(form_url, data=confirm)

    assert armed, "the faults were never switched on"
    assert first.status_code == 503, (first.status_code, first.text[:600])
    assert DepositOrder.objects.get(transaction_id=transaction_id).funds_requested_at is None
    assert ap(transaction_id)["status"] == "incomplete"
    # The retry's first read is stale too: still "try again", not "already pending_anchor"
    # (which would forget the stored order's submission).
    clean_sandbox.fault("ap.stale_status", times=1, transaction_ids=[transaction_id])
    stale = customer.http.post(form_url, data=confirm)
    assert stale.status_code == 503, (stale.status_code, stale.text[:600])
    assert "The anchor is not answering right now" in stale.text, stale.text[:600]

    again = customer.http.post(form_url, data=confirm)

    assert again.status_code == 302 and "/checkout/" in again.headers["location"], \
        again.text[:600]
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"
    assert DepositOrder.objects.get(transaction_id=transaction_id).funds_requested_at


def test_a_contract_destination_goes_to_manual_review_unpaid(clean_sandbox):
    from stellar_sdk import StrKey

    wallet = Wallet(clean_sandbox)
    contract = StrKey.encode_contract(bytes(range(32)))
    transaction_id = paid_deposit(clean_sandbox, wallet, account=contract, memo="7",
                                  memo_type="id")

    release = releases.release_start(transaction_id=transaction_id)

    assert release.status == "manual_review"
    assert "contract" in release.last_error
    assert release.tx_hash is None
    assert ap(transaction_id)["status"] == "pending_anchor"
