"""The SEP-24 pages in a real browser: Playwright driving Debian's ``chromium`` package
headless, in a phone-sized webview (390x844, touch), against the stack ``make run``
starts (tests/servers.py: gunicorn from Procfile.dev's web line with WhiteNoise serving
the static files, and a sandbox over HTTP whose events and webhooks go to that
gunicorn). A deposit and a withdrawal are walked from the wallet's interactive URL to
``completed``; the error pages are opened on purpose; the admin's login page is opened
to see it styled. Every page is saved as a screenshot under
``test-artifacts/screenshots/`` (``deposit-1-form.png`` ...).

On every page the browser must see no 4xx/5xx for any resource (a deliberate error
page's own status is asserted instead), the stylesheet's rules applied (a computed
style only sep24.css sets, not merely a ``<link>``), and the flag sep24.js sets when it
ran (``<html data-sep24js="ready">``). Those checks, Chromium's options and the phone are
tests/browser.py (shared with the wallet SDK's webview, tests/test_wallet_sdk.py); the
``playwright`` and ``page`` fixtures are in tests/conftest.py.

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; never ``playwright install``,
README "Browser tests"). Without it these tests skip saying so -- except under
``CI=true``, where they fail."""

from __future__ import annotations

import re
import time
from decimal import Decimal

import jwt
import pytest
from django.conf import settings as django_settings

from anchor import deposits, platform, reconciler
from anchor.models import DepositPayment
from payouts import poller
from tests.browser import (
    SHOTS,
    assert_fits_the_phone,
    assert_no_failed_responses,
    assert_page_works,
    expect,
    shot,
    wait_for_status,
)
from tests.flows import Wallet, wait_for
from tests.servers import start_stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ACCOUNT_NUMBER = "50100123456789"


@pytest.fixture(scope="module")
def stack(playwright, django_db_setup, django_db_blocker):
    """gunicorn + its sandbox, once for this module, on the test database; the status
    page refreshes itself every second."""
    with django_db_blocker.unblock():
        running = start_stack(SEP24_STATUS_REFRESH_S="1")
    yield running
    running.stop()


@pytest.fixture
def web(stack, settings):
    """The stack, with this process's settings (the poller, funds_received run here
    as beat would) pointed at its sandbox; faults off before and after."""
    stack.point_settings(settings)
    stack.sandbox.clear_faults()
    yield stack
    stack.sandbox.clear_faults()


def test_a_deposit_from_the_wallets_link_to_completed(page, web):
    wallet = Wallet(web.sandbox)
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
    shot(page, "deposit-2-error", document_status=400)  # the form, with its error

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
    shot(page, "deposit-5-razorpay-checkout", corridor=False)  # the sandbox's page

    # Razorpay's webhooks get lost: Corridor has no payment yet, AP still waits for it.
    web.sandbox.fault("razorpay.webhook_lose", times=1)
    page.locator("#pay").click()
    # Back from Checkout (its signed return, then the bare status URL): never "pay again".
    page.wait_for_url(re.compile(rf"/sep24/transaction/{transaction_id}$"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Your deposit")
    for _ in range(2):  # and not after the page reloads itself either
        expect(page.locator("section.status")).to_have_attribute(
            "data-status", "pending_user_transfer_start")
        expect(page.locator("section.status .status-label")).to_have_text(
            "Payment received, confirming")
        assert page.locator("#action").count() == 0
        assert "with Razorpay" not in page.locator("main").inner_text()
        assert page.locator('meta[http-equiv="refresh"]').count() == 1
        page.wait_for_timeout(1_200)
    assert not DepositPayment.objects.filter(transaction_id=transaction_id).exists()
    shot(page, "deposit-6-status-pending")

    # The worker's part (order reconciler finds the payment -> notify AP -> release), run
    # here as beat would.
    def reconciled() -> bool:
        reconciler.reconcile_orders()
        return DepositPayment.objects.filter(transaction_id=transaction_id).exists()

    wait_for(reconciled, what="order reconciler recorded the payment")
    deposits.funds_received(transaction_id=transaction_id)
    wait_for_status(page, "completed")  # the page reloads itself; the test never does
    expect(page.locator("section.status .status-label")).to_have_text("Completed")
    expect(page.locator("code.hash")).to_have_text(re.compile(r"^[0-9a-f]{64}$"))
    assert page.locator('meta[http-equiv="refresh"]').count() == 0  # final: stops
    assert_fits_the_phone(page)
    shot(page, "deposit-7-status-completed")

    # The status page is guarded: a fresh session sees an error, AP's more_info_url opens it.
    page.context.clear_cookies()
    page.responses.take()
    assert page.goto(f"{web.url}/sep24/transaction/{transaction_id}").status == 403
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "forbidden")
    shot(page, "error-4-no-session", document_status=403)
    token = web.sandbox.http.post("/ap/sep/sandbox-token", json={"account": wallet.address}
                                  ).json()["token"]
    sep_tx = web.sandbox.http.get("/ap/sep/transaction", params={"id": transaction_id},
                                  headers={"Authorization": f"Bearer {token}"}
                                  ).json()["transaction"]
    assert sep_tx["more_info_url"].startswith(f"{web.url}/sep24/more_info?")
    page.goto(sep_tx["more_info_url"])
    expect(page).to_have_url(re.compile(rf"/sep24/transaction/{transaction_id}$"))
    expect(page.locator("section.status")).to_have_attribute("data-status", "completed")
    shot(page, "deposit-8-more-info-status")
    # The status link opens the status page only: the deposit form refuses it.
    assert page.goto(f"{web.url}/sep24/deposit/{transaction_id}").status == 403
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "forbidden")
    assert_page_works(page, document_status=403)


def test_a_withdrawal_with_form_errors_to_completed(page, web):
    web.sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet = Wallet(web.sandbox)
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
    shot(page, "withdrawal-3-errors", document_status=400)

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


def test_error_pages_expired_link_provider_down_and_wrong_state(page, web):
    wallet = Wallet(web.sandbox)
    transaction_id, url = wallet.start_deposit()
    expired = jwt.encode({"jti": transaction_id, "sub": wallet.address,
                          "exp": int(time.time()) - 3600},
                         django_settings.AP_INTERACTIVE_JWT_SECRET, algorithm="HS256")

    response = page.goto(f"{web.url}/sep24/interactive?"
                         f"transaction_id={transaction_id}&token={expired}")
    assert response.status == 403
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "expired")
    expect(page.get_by_role("heading", level=1)).to_have_text("This link has expired")
    assert_fits_the_phone(page)
    shot(page, "error-1-expired-link", document_status=403)

    page.goto(url)  # the wallet's link opens the session (a cookie for 127.0.0.1, any port)
    assert_page_works(page)
    # The same server, but its payment provider does not answer (nothing listens on :9).
    down_url, down = web.gunicorn("gunicorn-provider-down",
                                  RAZORPAY_API_URL="http://127.0.0.1:9/razorpay")
    try:
        page.goto(f"{down_url}/sep24/deposit/{transaction_id}")
        page.get_by_label("Amount in rupees").fill("1000")
        page.get_by_role("button", name="See what I receive").click()
        with page.expect_response(re.compile(r"/sep24/deposit/")) as answer:
            page.get_by_role("button", name="Pay ₹1000.00 with Razorpay").click()
        assert answer.value.status == 503
        expect(page.locator("section.error-page")).to_have_attribute("data-reason",
                                                                     "unavailable")
        shot(page, "error-2-provider-down", document_status=503)
        retry = page.get_by_role("link", name="Try again").get_attribute("href")
        assert retry == f"/sep24/deposit/{transaction_id}"
    finally:
        down.stop()

    page.goto(f"{web.url}{retry}")  # try again once the provider is back: nothing kept
    expect(page.get_by_label("Amount in rupees")).to_be_editable()
    assert_page_works(page)
    platform.rpc_once("notify_transaction_expired",
                      {"transaction_id": transaction_id, "message": "test: expired"},
                      reached=lambda tx: tx["status"] == "expired")
    page.get_by_label("Amount in rupees").fill("1000")
    page.get_by_role("button", name="See what I receive").click()
    with page.expect_response(re.compile(r"/sep24/deposit/")) as answer:
        page.get_by_role("button", name="Pay ₹1000.00 with Razorpay").click()
    assert answer.value.status == 409
    expect(page.locator("section.error-page")).to_have_attribute("data-reason", "wrong_state")
    expect(page.locator(".error")).to_have_text("This deposit is already expired.")
    shot(page, "error-3-wrong-state", document_status=409)

    page.get_by_role("link", name="See the transaction's status").click()
    expect(page.locator("section.status")).to_have_attribute("data-status", "expired")
    assert page.locator('meta[http-equiv="refresh"]').count() == 0
    shot(page, "error-5-status-expired")


def test_the_admin_login_page_is_styled_under_gunicorn(page, web):
    response = page.goto(f"{web.url}/admin/login/")

    assert response.status == 200
    expect(page.locator("#id_username")).to_be_visible()
    styles = page.evaluate("""() => ({
        primary: getComputedStyle(document.documentElement).getPropertyValue('--primary').trim(),
        header: getComputedStyle(document.querySelector('#header')).display,
        fontSize: getComputedStyle(document.body).fontSize,
    })""")
    assert styles == {"primary": "#79aec8", "header": "flex", "fontSize": "14px"}
    assert_no_failed_responses(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "admin-1-login.png"), full_page=True)


def test_the_review_queue_fits_a_laptop_and_the_treasury_a_phone(page, web):
    """static/corridor/admin.css under gunicorn and WhiteNoise: a saga in the review
    queue with a 128-character reference and an error without spaces made the queue's
    table 1619 px wide in its 717 px box on a 1366 px screen; the treasury page's floats
    table made the whole page 1064 px wide on a phone."""
    from django.contrib.auth.models import User

    from sagas.models import Saga

    User.objects.create_superuser("walker", password="Walk-the-pages-2026")
    Saga.objects.create(kind="remittance", reference="remit-" + "7f3a9c" * 20,
                        status="manual_review", input={"amount": "2500", "currency": "USDC"},
                        error="anchor31 POST /sep31/transactions -> 422 "
                              + '{"error":"receiver_rejected","detail":"' + "ab12" * 30 + '"}')
    page.goto(f"{web.url}/admin/login/?next=/admin/sagas/reviewitem/")
    page.get_by_label("Username").fill("walker")
    page.get_by_label("Password").fill("Walk-the-pages-2026")
    page.get_by_role("button", name="Log in").click()
    page.set_viewport_size({"width": 1366, "height": 768})
    expect(page.locator("#result_list tbody tr")).to_have_count(1)

    box = page.evaluate("""() => { const r = document.querySelector('#changelist-form .results');
        return [r.scrollWidth, r.clientWidth, document.documentElement.scrollWidth]; }""")
    assert box[0] <= box[1] and box[2] <= 1366, box
    assert_no_failed_responses(page)
    page.screenshot(path=str(SHOTS / "admin-2-review-queue.png"), full_page=True)

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{web.url}/admin/treasury/reconrun/treasury/")
    expect(page.locator("table.floats")).to_be_visible()
    assert_fits_the_phone(page)
    assert_no_failed_responses(page)
    page.screenshot(path=str(SHOTS / "admin-3-treasury.png"), full_page=True)
