"""Withdrawals end to end: a wallet pays USDC on the sandbox Horizon, AP's observer
(sandbox) reacts as AP 4.3 does, Corridor's poller verifies the receipt itself and pays
INR through the sandbox RazorpayX at most once (DESIGN.md §5, invariant 1 and 6)."""

from __future__ import annotations

import json
import random
import time
import uuid
from decimal import Decimal

import pytest
from django.conf import settings
from stellar_sdk import Asset

from payouts import poller
from payouts.models import PayoutAttempt, WithdrawalPayout, WithdrawalRequest
from tests.flows import (
    Customer,
    Wallet,
    ap,
    assert_payout_once,
    pay_and_wait_for_ap,
    pending_anchor_withdrawal,
    run_manage,
    sandbox_payouts,
    settle,
    start_withdrawal,
    unapplied_then_stale,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def sbx(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return clean_sandbox


def test_happy_path_from_the_interactive_page_to_ap_completed_with_the_utr(sbx):
    wallet, transaction_id, pay = start_withdrawal(sbx)
    assert pay["destination"] == WithdrawalRequest.objects.get().destination
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"

    pay_and_wait_for_ap(wallet, pay)

    assert settle(transaction_id).status == "completed"
    payout = assert_payout_once(sbx, transaction_id)
    assert PayoutAttempt.objects.get(payout=payout).provider_status == "processed"
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert request.amount_out == (Decimal("10") - settings.WITHDRAW_FEE_USDC) * \
        settings.WITHDRAW_RATE_INR_PER_USDC
    assert "50100123456789" not in request.beneficiary_display


@pytest.mark.parametrize("crash_at", ["after_claim", "after_provider_call", "after_mark_paid",
                                      "after_ap_call"])
def test_worker_killed_at_each_boundary_pays_once(sbx, crash_at):
    _, transaction_id = pending_anchor_withdrawal(sbx)
    if crash_at in ("after_mark_paid", "after_ap_call"):
        # The worker itself must learn "processed" (by polling): no webhook tells us.
        sbx.fault("razorpayx.webhook_lose", times=1)
        assert run_manage("poll_withdrawals").returncode == 0
        wait_for(lambda: sandbox_payouts(sbx, transaction_id)[0]["status"] == "processed",
                 what="payout processed at the provider")

    killed = run_manage("poll_withdrawals", crash_at=crash_at)

    assert killed.returncode == -9, killed.stdout[-1000:] + killed.stderr[-2000:]
    settle(transaction_id)
    assert_payout_once(sbx, transaction_id)


def test_without_the_guard_a_killed_worker_pays_twice(sbx, settings):
    """The guard switched off once: a poller that trusts AP's status pays again."""
    _, transaction_id = pending_anchor_withdrawal(sbx)
    # The payout's webhooks are lost: otherwise one can complete the withdrawal before the
    # unguarded poller runs (CI saw it), and AP's status stops inviting a second payout.
    sbx.fault("razorpayx.webhook_lose", times=1)
    killed = run_manage("poll_withdrawals", crash_at="after_provider_call")
    assert killed.returncode == -9
    settings.PAYOUT_GUARD = False

    poller.poll_withdrawals()

    assert len(sandbox_payouts(sbx, transaction_id)) == 2


def test_a_stale_pending_anchor_after_completion_pays_nothing_more(sbx):
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay)
    settle(transaction_id)
    sbx.fault("ap.stale_status", transaction_ids=[transaction_id])
    assert ap(transaction_id)["status"] == "pending_anchor"  # AP now lies

    for _ in range(3):
        poller.poll_withdrawals()

    assert len(sandbox_payouts(sbx, transaction_id)) == 1
    assert WithdrawalPayout.objects.get(transaction_id=transaction_id).status == "completed"


def test_duplicated_and_early_payout_webhooks_complete_once(sbx):
    sbx.fault("razorpayx.webhook_duplicate", copies=3)
    sbx.fault("razorpayx.webhook_before_create_returns", times=1)
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay)

    settle(transaction_id)
    time.sleep(0.5)

    assert_payout_once(sbx, transaction_id)
    assert PayoutAttempt.objects.count() == 1


def test_a_failed_webhook_before_a_5xx_create_answer_keeps_the_operators_reason(sbx):
    """Found by ``make chaos`` (seed 7): RazorpayX fails the payout at once and its
    ``payout.failed`` is applied before the create call answers 500. The row is
    ``failed`` with the provider's reason; the late "outcome unknown" note must not
    overwrite the reason the operators' queue shows."""
    from sagas.models import ReviewItem

    sbx.fault("razorpayx.fail_payout", times=1)
    sbx.fault("razorpayx.webhook_before_create_returns", times=1)
    sbx.fault("razorpayx.create_5xx_after_create", times=1)
    _, transaction_id = pending_anchor_withdrawal(sbx)

    poller.poll_withdrawals()

    payout = WithdrawalPayout.objects.get(transaction_id=transaction_id)
    assert payout.status == "failed"
    assert "provider failed" in payout.last_error, payout.last_error
    item = ReviewItem.objects.get(key=f"payout:{payout.pk}")
    assert "outcome unknown" not in item.reason and "failed" in item.reason, item.reason
    assert len(sandbox_payouts(sbx, transaction_id)) == 1


def test_processed_then_reversed_lands_in_the_operators_queue(sbx):
    sbx.fault("razorpayx.processed_then_reversed", after_s=3)  # time to apply processed first
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay)
    settle(transaction_id)

    wait_for(lambda: WithdrawalPayout.objects.get(transaction_id=transaction_id).status
             == "reversed", what="reversal webhook")
    for _ in range(2):
        poller.poll_withdrawals()

    payout = WithdrawalPayout.objects.get(transaction_id=transaction_id)
    assert payout.status == "reversed"  # never retried by itself
    assert "reversed" in payout.last_error
    assert len(sandbox_payouts(sbx, transaction_id)) == 1
    assert ap(transaction_id)["status"] == "completed"  # AP cannot show it (final)


def test_5xx_after_create_is_found_by_reference_and_paid_once(sbx):
    sbx.fault("razorpayx.create_5xx_after_create", times=1)
    # Its webhooks would tell the payout id whenever they happen to arrive (CI once saw
    # one land during the poll); lost, only the guard's own recovery can.
    sbx.fault("razorpayx.webhook_lose", times=1)
    _, transaction_id = pending_anchor_withdrawal(sbx)

    poller.poll_withdrawals()
    first = WithdrawalPayout.objects.get(transaction_id=transaction_id)
    assert (first.status, first.provider_payout_id) == ("processing", "")

    settle(transaction_id)
    assert_payout_once(sbx, transaction_id)
    assert PayoutAttempt.objects.filter(payout=first).count() == 1


@pytest.mark.parametrize("key", ["stored", "fresh"])
def test_5xx_after_create_not_listed_yet_is_replayed_with_the_stored_key(sbx, key):
    """RazorpayX created the payout but answered 500, its webhooks are lost and its list
    by ``reference_id`` does not show it yet (fault ``razorpayx.list_lag``): the retried
    create with the attempt's stored ``X-Payout-Idempotency`` key is what learns the
    payout (NOTES §2.5: same key until processed or failed, never a fresh one while the
    first may be processing). ``fresh`` is that protection switched off: the stored key is
    rewritten before the retry, as code minting a key per call would, and it pays twice."""
    sbx.fault("razorpayx.create_5xx_after_create", times=1)
    sbx.fault("razorpayx.webhook_lose", times=1)
    sbx.fault("razorpayx.list_lag", seconds=300)
    _, transaction_id = pending_anchor_withdrawal(sbx)
    poller.poll_withdrawals()
    first = WithdrawalPayout.objects.get(transaction_id=transaction_id)
    assert (first.status, first.provider_payout_id) == ("processing", "")
    assert len(sandbox_payouts(sbx, transaction_id)) == 1
    if key == "fresh":
        PayoutAttempt.objects.filter(payout=first).update(idempotency_key=uuid.uuid4())

    poller.poll_withdrawals()

    if key == "fresh":
        assert len(sandbox_payouts(sbx, transaction_id)) == 2
        return
    attempt = PayoutAttempt.objects.get(payout=first)
    [created] = sandbox_payouts(sbx, transaction_id)
    assert attempt.provider_payout_id == created["id"]
    assert created["idempotency_key"] == str(attempt.idempotency_key)
    settle(transaction_id)
    assert_payout_once(sbx, transaction_id)


def review_without_payout(sbx, transaction_id, reason_part):
    for _ in range(6):
        poller.poll_withdrawals()
        time.sleep(0.3)
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert request.status == "manual_review", request.review_reason
    assert reason_part in request.review_reason
    assert request.chain_evidence  # what was found on chain, for the operator
    assert sandbox_payouts(sbx, transaction_id) == []
    assert not WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists()


def test_wrong_asset_with_the_right_memo_is_never_paid(sbx):
    wallet, transaction_id, pay = start_withdrawal(sbx)

    pay_and_wait_for_ap(wallet, pay, asset=Asset.native())

    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP accepts it")
    review_without_payout(sbx, transaction_id, "wrong asset")


def test_a_short_payment_waits_its_grace_then_goes_to_review(sbx, settings):
    settings.WITHDRAW_SHORT_GRACE_S = 60.0
    wallet, transaction_id, pay = start_withdrawal(sbx)

    pay_and_wait_for_ap(wallet, pay, amount="9.5")

    for _ in range(3):
        poller.poll_withdrawals()
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert (request.status, request.received_amount) == ("awaiting_funds", Decimal("9.5"))
    settings.WITHDRAW_SHORT_GRACE_S = 0.5  # the grace period runs out
    time.sleep(0.6)
    review_without_payout(sbx, transaction_id, "short")


def test_a_split_payment_5_plus_5_is_summed_and_paid_once(sbx):
    wallet, transaction_id, pay = start_withdrawal(sbx)

    pay_and_wait_for_ap(wallet, pay, amount="5")
    pay_and_wait_for_ap(wallet, pay, amount="5")

    settle(transaction_id)
    assert_payout_once(sbx, transaction_id)
    assert WithdrawalRequest.objects.get(transaction_id=transaction_id).received_amount == 10


def test_excess_decimals_on_a_2_decimal_asset_is_never_paid(sbx, settings):
    asset = f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
    sbx.fault("ap.asset_decimals", asset=asset, decimals=2)
    settings.WITHDRAW_ASSET_DECIMALS = 2
    wallet, transaction_id, pay = start_withdrawal(sbx)

    pay_and_wait_for_ap(wallet, pay, amount="10.1234567")

    time.sleep(0.5)
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"  # AP stuck
    review_without_payout(sbx, transaction_id, "decimals")


def test_two_withdrawals_sharing_one_memo_are_never_paid(sbx):
    memo = str(random.randrange(10**12, 10**13))  # fresh: the sandbox ledger is shared
    sbx.fault("ap.next_withdraw_memo", times=2, memo=memo)
    wallet, first, pay = start_withdrawal(sbx)
    _, second, pay2 = start_withdrawal(sbx)
    assert pay["memo"] == pay2["memo"] == memo

    pay_and_wait_for_ap(wallet, pay)

    review_without_payout(sbx, first, "memo shared")
    assert sandbox_payouts(sbx, second) == []


def test_a_memo_id_above_2_63_round_trips(sbx):
    # Near 2^64 - 1, fresh per run: the sandbox ledger outlives a test, and an old
    # payment under the same memo would (rightly) stop this one for review.
    memo = str(2**64 - 1 - random.randrange(10**9))
    sbx.fault("ap.next_withdraw_memo", times=1, memo=memo)
    wallet, transaction_id, pay = start_withdrawal(sbx)
    assert pay["memo"] == memo and int(memo) > 2**63

    pay_and_wait_for_ap(wallet, pay)

    settle(transaction_id)
    assert_payout_once(sbx, transaction_id)


def test_a_funds_request_read_back_without_a_memo_shows_no_pay_page(sbx, monkeypatch):
    """Chaos seed 7 (stop 22's CI): ``request_onchain_funds`` answered -32603 before
    touching the transaction, and the re-read that decides "did it land?" showed a stale
    ``pending_anchor``, with no memo: Corridor took it as funds requested and showed a
    pay page with an empty memo (the wallet could not pay it; AP stayed ``incomplete``).
    Now the customer gets a retry page, and the retry makes the real request."""
    armed = unapplied_then_stale(monkeypatch, sbx, "request_onchain_funds")
    wallet = Wallet(sbx)
    wallet.fund_usdc("100")
    transaction_id, url = wallet.start_withdrawal()
    customer = Customer(sbx)
    opened = customer.open(url)
    form_url = str(opened.url.join(opened.headers["location"]))
    fields = {"amount": "10", "name": "Asha Verma", "method": "bank_account",
              "account_number": "50100123456789", "ifsc": "HDFC0001234"}
    quote = customer.http.post(form_url, data={**fields,
                                               **customer._csrf(customer.http.get(form_url))})
    confirm = {**fields, "confirm": "yes", **customer._csrf(quote)}

    first = customer.http.post(form_url, data=confirm)

    assert armed, "the faults were never switched on"
    assert first.status_code == 503 and 'class="memo"' not in first.text, \
        (first.status_code, first.text[:600])
    assert "The anchor is not answering right now" in first.text, first.text[:600]
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert request.funds_requested_at is None and request.memo == ""
    assert ap(transaction_id)["status"] == "incomplete"

    again = customer.http.post(form_url, data=confirm)

    assert again.status_code == 200, again.text[:600]
    request.refresh_from_db()
    tx = ap(transaction_id)
    assert tx["status"] == "pending_user_transfer_start" and tx["memo"]
    assert request.memo == tx["memo"] and request.funds_requested_at is not None
    assert f'<code class="memo">{tx["memo"]}</code>' in again.text
    pay_and_wait_for_ap(wallet, {"destination": request.destination, "memo": request.memo})
    settle(transaction_id)
    assert_payout_once(sbx, transaction_id)


def test_a_wallet_paying_from_a_muxed_address(sbx):
    wallet = Wallet(sbx)
    wallet.fund_usdc("100")
    transaction_id, url = wallet.start_withdrawal(account=wallet.muxed(77))
    pay = Customer(sbx).submit_withdrawal(url, "10", method="vpa", vpa="asha@okhdfc")
    assert ap(transaction_id)["source_account"].startswith("M")

    wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"], muxed_id=77)

    settle(transaction_id)
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert request.status != "manual_review", (request.review_reason, request.chain_evidence)
    assert_payout_once(sbx, transaction_id)
    assert WithdrawalPayout.objects.get(transaction_id=transaction_id).mode == "UPI"


def test_a_forged_payout_webhook_changes_nothing(sbx, client):
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay)
    sbx.fault("razorpayx.payout_stuck_processing")
    settle(transaction_id, rounds=3)
    payout = WithdrawalPayout.objects.get(transaction_id=transaction_id)
    assert payout.status == "processing"
    body = json.dumps({"entity": "event", "event": "payout.processed", "payload": {"payout": {
        "entity": {"id": payout.provider_payout_id, "amount": payout.amount_paise,
                   "status": "processed", "utr": "FORGED123", "reference_id": transaction_id}}}}
                      ).encode()

    response = client.post("/webhooks/razorpay/payouts", body, content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE="0" * 64, HTTP_X_RAZORPAY_EVENT_ID="e1")

    assert response.status_code == 400
    payout.refresh_from_db()
    assert (payout.status, payout.reference) == ("processing", "")
    assert ap(transaction_id)["status"] != "completed"
