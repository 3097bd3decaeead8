"""Stellar's TypeScript wallet SDK (``@stellar/typescript-wallet-sdk`` 1.10.0, installed
by ``npm ci`` from package-lock.json; README) against the sandbox AP and Corridor (issue
14), as published: only its documented options (``allowHttp`` on the anchor, a Horizon
server built with ``allowHttp``), no patches. The node script is
tests/wallet/sdk_flow.mjs; it prints one JSON object per step and this test plays the
rest of the world between the steps.

Both flows start with SEP-1, SEP-10 with a fresh account and SEP-24 info, then the
wallet's own account (funded and trusting USDC) authenticates by SEP-10 and:

- **deposit**: ``sep24.deposit`` starts it, ``getTransactionBy`` and
  ``getTransactionsForAsset`` read it back; the customer plays the webview in Chromium
  (the interactive URL the SDK got, the amount, the quote, the sandbox's Razorpay
  Checkout and its Pay button, back to the status page); the test runs Corridor's
  release as its worker would; the SDK's ``watchOneTransaction`` sees ``completed`` with
  the release's hash, and so does the status page.
- **withdrawal**: ``sep24.withdraw`` starts it; the customer fills Corridor's withdrawal
  form in Chromium (amount, name, bank account, IFSC, quote, confirm: the pay page shows
  the account and memo); the SDK's watcher sees ``pending_user_transfer_start``
  and the wallet pays on chain with the SDK (``stellar().transaction`` +
  ``transferWithdrawalTransaction``, which takes ``withdraw_anchor_account``,
  ``withdraw_memo`` and ``amount_in`` from the transaction; signed with the wallet's
  keypair, ``stellar().submitTransaction``); the sandbox AP's observer sees the payment,
  the test runs Corridor's withdrawal poller as beat would (the RazorpayX payout); the
  watcher sees ``completed`` with the payment's hash, the status page the UTR. One
  payout, one payment.

The webview is the browser test machinery (tests/browser.py, the ``page`` fixture of
tests/conftest.py: Debian's Chromium headless through Playwright, a phone-sized page),
against the session's live server and sandbox; every page is checked as
tests/test_browser.py checks them and saved as ``sdk-*.png`` under
``test-artifacts/screenshots/``.

The SDK's watcher polls every ``WATCH_POLL_MS`` and gives up after ``WATCH_TIMEOUT_S``
(module constants passed to the script). Skips with the reason when node or the SDK is
absent, or Chromium; fails instead under CI=true."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.conf import settings

from anchor import deposits, releases
from anchor.models import DepositPayment, DepositRelease
from payouts.models import WithdrawalRequest
from tests.browser import assert_fits_the_phone, expect, shot
from tests.conftest import ROOT
from tests.flows import (
    Wallet,
    ap,
    assert_payout_once,
    horizon,
    purge_broker,
    settle,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)
SDK = ROOT / "node_modules" / "@stellar" / "typescript-wallet-sdk"
WATCH_POLL_MS = 300  # the SDK watcher's poll interval
WATCH_TIMEOUT_S = 45  # the SDK watcher's deadline for a final status
EXIT_TIMEOUT_S = 15  # node's exit once it printed its last step
ACCOUNT_NUMBER = "50100123456789"


def _node() -> str:
    node = shutil.which("node")
    missing = ("node is not installed (apt-get install nodejs npm)" if node is None else
               "the wallet SDK is not installed (npm ci)" if not SDK.exists() else "")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} (CI=true: this test never skips)")
        pytest.skip(missing)
    return node


def _run_sdk(flow: str, sandbox, wallet: Wallet,
             on_step: Callable[[dict, dict], None]) -> dict:
    """Run sdk_flow.mjs for ``flow``; ``on_step(step, steps)`` for each step it prints
    (the test's part of the world runs there); returns the steps by event name."""
    process = subprocess.Popen(
        [_node(), str(ROOT / "tests" / "wallet" / "sdk_flow.mjs")], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "SANDBOX_URL": sandbox.url, "WALLET_SECRET": wallet.keypair.secret,
             "NETWORK_PASSPHRASE": settings.STELLAR_NETWORK_PASSPHRASE, "FLOW": flow,
             "USDC_ISSUER": settings.STELLAR_USDC_ISSUER,
             "WATCH_POLL_MS": str(WATCH_POLL_MS), "WATCH_TIMEOUT_S": str(WATCH_TIMEOUT_S)})
    steps, output = {}, []
    try:
        for line in process.stdout:
            output.append(line)
            if not line.startswith("{"):
                continue
            step = json.loads(line)
            steps[step["event"]] = step
            if step["event"] in ("done", "error"):
                break
            on_step(step, steps)
        process.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        process.kill()
    assert "done" in steps, "".join(output)[-4000:]
    return steps


def _assert_common_steps(steps: dict, sandbox) -> None:
    from sandbox.ap import sep10

    assert steps["sep1"]["signingKey"] == sep10.SIGNING_KEY.public_key
    assert steps["sep1"]["webAuthEndpoint"] == f"{sandbox.url}/ap/sep/auth"
    assert steps["sep1"]["currencies"] == ["USDC"]
    assert steps["sep10"]["account"].startswith("G")
    assert steps["sep24_info"] == {"event": "sep24_info", "deposit": ["USDC"],
                                   "withdraw": ["USDC"]}


def _deposit_webview(page, url: str, transaction_id: str) -> None:
    """The customer in the wallet's webview: amount, quote, Razorpay Checkout, Pay."""
    page.goto(url)
    expect(page).to_have_url(re.compile(rf"/sep24/deposit/{transaction_id}$"))
    assert_fits_the_phone(page)
    shot(page, "sdk-deposit-1-form")
    page.get_by_label("Amount in rupees").fill("1000")
    page.get_by_role("button", name="See what I receive").click()
    expect(page.locator("#amount-out")).to_have_text(re.compile(r"^[\d.]+ USDC$"))
    shot(page, "sdk-deposit-2-quote")
    page.get_by_role("button", name="Pay ₹1000.00 with Razorpay").click()
    expect(page).to_have_url(re.compile(r"/sep24/checkout/order_\w+$"))
    shot(page, "sdk-deposit-3-checkout-handoff")
    page.get_by_role("link", name="Continue to Razorpay").click()
    expect(page.locator("#pay")).to_be_visible()  # the sandbox's Razorpay Checkout
    shot(page, "sdk-deposit-4-razorpay-checkout", corridor=False)
    page.locator("#pay").click()
    page.wait_for_url(re.compile(rf"/sep24/transaction/{transaction_id}$"))
    shot(page, "sdk-deposit-5-status-pending")


def test_the_typescript_wallet_sdk_deposits_to_completed(clean_sandbox, page):
    sandbox = clean_sandbox
    wallet = Wallet(sandbox)

    def world(step, steps):
        if step["event"] == "deposit_listed":  # the webview, then Corridor's release
            transaction_id = steps["deposit_started"]["id"]
            purge_broker()
            _deposit_webview(page, steps["deposit_started"]["url"], transaction_id)
            wait_for(lambda: DepositPayment.objects.filter(
                transaction_id=transaction_id).exists(), what="payment recorded")
            purge_broker()  # no worker here: the test runs what it would
            deposits.notify_funds_received(transaction_id=transaction_id)
            releases.release_start(transaction_id=transaction_id)
            settle(transaction_id)

    steps = _run_sdk("deposit", sandbox, wallet, world)

    _assert_common_steps(steps, sandbox)
    started = steps["deposit_started"]
    assert started["type"] == "interactive_customer_info_needed"
    assert (steps["deposit_read"]["id"], steps["deposit_read"]["kind"]) == (
        started["id"], "deposit")
    assert steps["deposit_listed"]["ids"] == [started["id"]]
    final = steps["deposit_final"]
    assert final["status"] == "completed", final
    release = DepositRelease.objects.get(transaction_id=started["id"])
    assert final["stellar_transaction_id"] == release.tx_hash
    assert [p["transaction_hash"] for p in wallet.usdc_payments()] == [release.tx_hash]
    page.reload()  # the webview's status page, as the customer sees it now
    expect(page.locator("section.status")).to_have_attribute("data-status", "completed")
    expect(page.locator("code.hash")).to_have_text(release.tx_hash)
    shot(page, "sdk-deposit-6-status-completed")


def _withdrawal_webview(page, url: str, transaction_id: str) -> dict:
    """The customer in the wallet's webview fills the withdrawal form and confirms;
    returns what the pay page shows: {"destination", "memo"}."""
    page.goto(url)
    expect(page).to_have_url(re.compile(rf"/sep24/withdraw/{transaction_id}$"))
    assert_fits_the_phone(page)
    shot(page, "sdk-withdrawal-1-form")
    page.get_by_label("Amount in USDC").fill("10")
    page.get_by_label("Account holder's name").fill("Asha Verma")
    page.get_by_label("Bank account number").fill(ACCOUNT_NUMBER)
    page.get_by_label("IFSC").fill("HDFC0001234")
    page.get_by_role("button", name="See what I receive").click()
    expect(page.locator("#amount-out")).to_have_text(re.compile(r"^₹[\d,.]+$"))
    shot(page, "sdk-withdrawal-2-quote")
    page.get_by_role("button", name="Confirm withdrawal").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Send 10 USDC")
    shot(page, "sdk-withdrawal-3-pay")
    return {"destination": page.locator("code.account").inner_text(),
            "memo": page.locator("code.memo").inner_text()}


def test_the_typescript_wallet_sdk_withdraws_to_completed(clean_sandbox, page):
    sandbox = clean_sandbox
    sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet = Wallet(sandbox)
    wallet.fund_usdc("100")
    shown = {}

    def world(step, steps):
        if step["event"] == "withdrawal_started":  # the customer fills the form
            purge_broker()
            shown.update(_withdrawal_webview(page, step["url"], step["id"]))
        elif step["event"] == "withdrawal_paid":  # Corridor's poller, as beat runs it
            purge_broker()
            settle(steps["withdrawal_started"]["id"])

    steps = _run_sdk("withdrawal", sandbox, wallet, world)

    _assert_common_steps(steps, sandbox)
    started = steps["withdrawal_started"]
    transaction_id = started["id"]
    assert started["type"] == "interactive_customer_info_needed"
    # What the SDK paid is what Corridor's pay page showed the customer.
    waiting = steps["withdrawal_pending_user_transfer_start"]
    assert (waiting["withdraw_anchor_account"], waiting["withdraw_memo"],
            waiting["withdraw_memo_type"]) == (shown["destination"], shown["memo"], "id")
    assert Decimal(waiting["amount_in"]) == Decimal("10")
    paid_hash = steps["withdrawal_paid"]["hash"]
    final = steps["withdrawal_final"]
    assert final["status"] == "completed", final
    assert final["seen"][0] == "incomplete" and "pending_user_transfer_start" in final["seen"]
    assert final["stellar_transaction_id"] == paid_hash
    # One USDC payment from the wallet, the one the SDK submitted, to AP's account.
    sent = [r for r in horizon(sandbox).payments().for_account(wallet.address).limit(200)
            .call()["_embedded"]["records"]
            if r.get("type") == "payment" and r.get("from") == wallet.address]
    assert [(p["transaction_hash"], p["to"], Decimal(p["amount"])) for p in sent] == [
        (paid_hash, shown["destination"], Decimal("10"))]
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert paid_hash in {e.get("tx_hash") for e in request.chain_evidence}
    payout = assert_payout_once(sandbox, transaction_id)  # RazorpayX paid once
    assert final["external_transaction_id"] == payout.reference
    assert [st["id"] for st in ap(transaction_id)["stellar_transactions"]] == [paid_hash]
    page.get_by_role("link", name="Track this withdrawal").click()  # the webview again
    expect(page.locator("section.status")).to_have_attribute("data-status", "completed")
    expect(page.locator("code.utr")).to_have_text(payout.reference)
    shot(page, "sdk-withdrawal-4-status-completed")
