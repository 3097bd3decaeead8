"""The SEP-24 pages in a real browser: Playwright driving Debian's ``chromium`` package
headless, in a phone-sized webview (390x844, touch), against Corridor's live server and
the sandbox. A deposit and a withdrawal are walked from the wallet's interactive URL to
``completed``; the error pages are opened on purpose. Every page is saved as a
screenshot under ``test-artifacts/screenshots/`` (``deposit-1-form.png`` ...).

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; never ``playwright install``,
README "Browser tests"). Without it these tests skip saying so -- except under
``CI=true``, where they fail."""

from __future__ import annotations

import os
import re
import time
from decimal import Decimal
from pathlib import Path

import jwt
import pytest
from django.conf import settings as django_settings

from anchor import deposits, platform
from anchor.models import DepositPayment
from payouts import poller
from tests.conftest import ARTIFACTS
from tests.flows import Wallet, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
# The machine's closed network refuses Chromium's background connections: keep it from
# making any (python.md, "Known to work").
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2,
         "is_mobile": True, "has_touch": True, "locale": "en-IN"}
SHOTS = ARTIFACTS / "screenshots"
ACCOUNT_NUMBER = "50100123456789"


def _unavailable(message: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: browser tests never skip)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def playwright():
    """Playwright's sync API, with the Django ORM allowed beside it: Playwright keeps
    its event loop marked running in this thread between calls, which Django would
    otherwise take for async code (the test itself is plain sync code)."""
    if not CHROMIUM.exists():
        _unavailable(f"browser tests need Debian's chromium at {CHROMIUM}: "
                     "apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("browser tests need playwright: pip install -r requirements-dev.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as p:
            yield p


@pytest.fixture
def page(playwright, tmp_path, settings):
    """A phone-sized page in a fresh Chromium profile (its own user-data-dir)."""
    settings.SEP24_STATUS_REFRESH_S = 1  # the status page refreshes itself every second
    context = playwright.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
        args=CHROMIUM_ARGS, **PHONE)
    context.set_default_timeout(15_000)
    page = context.pages[0] if context.pages else context.new_page()
    yield page
    context.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def expect(locator):
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def assert_fits_the_phone(page) -> None:
    """No sideways scrolling in a 390 px webview."""
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def wait_for_status(page, status: str, *, tick=None, timeout: float = 30.0) -> None:
    """Wait for the status page (refreshing itself) to show ``status``; ``tick`` runs
    between looks, as beat would run the poller."""
    deadline = time.monotonic() + timeout
    while not page.locator(f'section.status[data-status="{status}"]').count():
        if time.monotonic() > deadline:
            raise AssertionError(f"status page never showed {status}: "
                                 f"{page.locator('section.status').inner_text()}")
        if tick:
            tick()
        page.wait_for_timeout(300)


def test_a_deposit_from_the_wallets_link_to_completed(page, clean_sandbox, live_server):
    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()

    page.goto(url)
    expect(page).to_have_url(re.compile(rf"/sep24/deposit/{transaction_id}$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Deposit rupees, receive USDC")
    assert_fits_the_phone(page)
    shot(page, "deposit-1-form")

    page.get_by_label("Amount in rupees").fill("50")
    page.get_by_role("button", name="See what I receive").click()
    expect(page.locator(".field:has(#amount) #amount-error")).to_have_text(
        "The minimum deposit is ₹100.00.")
    expect(page.locator("#amount")).to_have_attribute("aria-invalid", "true")
    shot(page, "deposit-2-error")

    page.get_by_label("Amount in rupees").fill("1000")
    page.get_by_role("button", name="See what I receive").click()
    q = deposits.quote(Decimal("1000"))
    expect(page.locator("#amount-out")).to_have_text(f"{q.amount_out} USDC")
    expect(page.locator("#amount")).to_have_attribute("readonly", "")
    shot(page, "deposit-3-quote")

    page.get_by_role("button", name="Pay ₹1000.00 with Razorpay").click()
    expect(page).to_have_url(re.compile(r"/sep24/checkout/order_\w+$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Pay ₹1000.00")
    assert_fits_the_phone(page)
    shot(page, "deposit-4-checkout-handoff")

    page.get_by_role("link", name="Continue to Razorpay").click()
    expect(page.locator("#pay")).to_be_visible()  # the sandbox's Razorpay Checkout
    expect(page.locator("#amount")).to_contain_text("1,000")
    shot(page, "deposit-5-razorpay-checkout")

    page.locator("#pay").click()
    page.wait_for_url(re.compile(rf"/sep24/transaction/{transaction_id}\?"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Your deposit")
    assert page.locator('meta[http-equiv="refresh"]').count() == 1
    shot(page, "deposit-6-status-pending")

    # The worker's part (payment recorded -> notify AP -> release), run here as beat would.
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    deposits.funds_received(transaction_id=transaction_id)
    wait_for_status(page, "completed")  # the page reloads itself; the test never does
    expect(page.locator("section.status .status-label")).to_have_text("Completed")
    expect(page.locator("code.hash")).to_have_text(re.compile(r"^[0-9a-f]{64}$"))
    assert page.locator('meta[http-equiv="refresh"]').count() == 0  # final: stops
    assert_fits_the_phone(page)
    shot(page, "deposit-7-status-completed")

    # The status page is guarded: a fresh session sees an error, AP's more_info_url opens it.
    page.context.clear_cookies()
    page.goto(f"{live_server.url}/sep24/transaction/{transaction_id}")
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "forbidden")
    shot(page, "error-4-no-session")
    token = clean_sandbox.http.post("/ap/sep/auth", json={"account": wallet.address}
                                    ).json()["token"]
    sep_tx = clean_sandbox.http.get("/ap/sep/transaction", params={"id": transaction_id},
                                    headers={"Authorization": f"Bearer {token}"}
                                    ).json()["transaction"]
    page.goto(sep_tx["more_info_url"])
    expect(page).to_have_url(re.compile(rf"/sep24/transaction/{transaction_id}$"))
    expect(page.locator("section.status")).to_have_attribute("data-status", "completed")
    shot(page, "deposit-8-more-info-status")


def test_a_withdrawal_with_form_errors_to_completed(page, clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet = Wallet(clean_sandbox)
    wallet.fund_usdc("100")
    transaction_id, url = wallet.start_withdrawal()

    page.goto(url)
    expect(page).to_have_url(re.compile(rf"/sep24/withdraw/{transaction_id}$"))
    expect(page.locator("#account_number")).to_be_visible()
    expect(page.locator("#vpa")).to_be_hidden()  # UPI field shows only for UPI
    assert_fits_the_phone(page)
    shot(page, "withdrawal-1-form")
    page.get_by_role("radio", name="UPI ID").check()
    expect(page.locator("#vpa")).to_be_visible()
    expect(page.locator("#account_number")).to_be_hidden()
    shot(page, "withdrawal-2-form-upi")
    page.get_by_role("radio", name="Bank account").check()

    page.get_by_label("Amount in USDC").fill("abc")
    page.get_by_label("Account holder's name").fill("A")
    page.get_by_label("Bank account number").fill("12")
    page.get_by_label("IFSC").fill("BAD")
    page.get_by_role("button", name="See what I receive").click()
    errors = {"amount": "Enter an amount in USDC, for example 25 or 25.50.",
              "name": "Enter the account holder's name (3-50 letters).",
              "account_number": "Enter the bank account number (5-35 letters or digits).",
              "ifsc": "Enter the 11-character IFSC, such as HDFC0001234."}
    for field, message in errors.items():  # each error inside its own field's box
        expect(page.locator(f".field:has(#{field}) #{field}-error")).to_have_text(message)
        expect(page.locator(f"#{field}")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#form-errors")).to_contain_text("Check the 4 fields")
    shot(page, "withdrawal-3-errors")

    page.get_by_label("Amount in USDC").fill("10")
    page.get_by_label("Account holder's name").fill("Asha Verma")
    page.get_by_label("Bank account number").fill(ACCOUNT_NUMBER)
    page.get_by_label("IFSC").fill("HDFC0001234")
    page.get_by_role("button", name="See what I receive").click()
    expect(page.locator("#amount-out")).to_have_text("₹798.00")
    expect(page.locator(".field-error")).to_have_count(0)
    shot(page, "withdrawal-4-quote")

    page.get_by_role("button", name="Confirm withdrawal").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Send 10 USDC")
    memo = page.locator("code.memo").inner_text()
    destination = page.locator("code.account").inner_text()
    assert re.fullmatch(r"\d+", memo) and destination.startswith("G")
    assert ACCOUNT_NUMBER not in page.content()  # masked: ****6789
    assert_fits_the_phone(page)
    shot(page, "withdrawal-5-pay")

    wallet.pay(destination=destination, amount="10", memo=memo)  # the wallet pays on chain
    page.get_by_role("link", name="Track this withdrawal").click()
    expect(page).to_have_url(re.compile(rf"/sep24/transaction/{transaction_id}$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Your withdrawal")
    shot(page, "withdrawal-6-status-pending")

    wait_for_status(page, "completed", tick=poller.poll_withdrawals)
    expect(page.locator("code.utr")).not_to_be_empty()
    expect(page.locator("section.status .status-message")).to_have_text(
        "The rupees have been paid to your account.")
    assert_fits_the_phone(page)
    shot(page, "withdrawal-7-status-completed")


def test_error_pages_expired_link_provider_down_and_wrong_state(page, clean_sandbox,
                                                                live_server, settings):
    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()
    expired = jwt.encode({"jti": transaction_id, "sub": wallet.address,
                          "exp": int(time.time()) - 3600},
                         django_settings.AP_INTERACTIVE_JWT_SECRET, algorithm="HS256")

    response = page.goto(f"{live_server.url}/sep24/interactive?"
                         f"transaction_id={transaction_id}&token={expired}")
    assert response.status == 403
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "expired")
    expect(page.get_by_role("heading", level=1)).to_have_text("This link has expired")
    assert_fits_the_phone(page)
    shot(page, "error-1-expired-link")

    page.goto(url)
    page.get_by_label("Amount in rupees").fill("1000")
    page.get_by_role("button", name="See what I receive").click()
    real_razorpay = settings.RAZORPAY_API_URL
    settings.RAZORPAY_API_URL = "http://127.0.0.1:9/razorpay"  # nothing listens there
    with page.expect_response(re.compile(r"/sep24/deposit/")) as answer:
        page.get_by_role("button", name="Pay ₹1000.00 with Razorpay").click()
    assert answer.value.status == 503
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "unavailable")
    shot(page, "error-2-provider-down")

    settings.RAZORPAY_API_URL = real_razorpay
    page.get_by_role("link", name="Try again").click()  # back to the form, nothing kept
    expect(page.get_by_label("Amount in rupees")).to_be_editable()
    platform.rpc_once("notify_transaction_expired",
                      {"transaction_id": transaction_id, "message": "test: expired"},
                      reached=lambda tx: tx["status"] == "expired")
    page.get_by_label("Amount in rupees").fill("1000")
    page.get_by_role("button", name="See what I receive").click()
    page.get_by_role("button", name="Pay ₹1000.00 with Razorpay").click()
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "wrong_state")
    expect(page.locator(".error")).to_have_text("This deposit is already expired.")
    shot(page, "error-3-wrong-state")

    page.get_by_role("link", name="See the transaction's status").click()
    expect(page.locator("section.status")).to_have_attribute("data-status", "expired")
    assert page.locator('meta[http-equiv="refresh"]').count() == 0
    shot(page, "error-5-status-expired")
