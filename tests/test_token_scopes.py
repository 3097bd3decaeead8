"""What each SEP-24 link opens (issue 9, part 5).

AP hands the wallet two links (AP NOTES §4.2): the interactive URL (token signed with
``AP_INTERACTIVE_JWT_SECRET``) and the status link, ``more_info_url`` (token signed with
``AP_MORE_INFO_JWT_SECRET``). The session remembers, per transaction, what the token
allowed: the interactive scope opens the forms (deposit, withdrawal, checkout hand-off)
and the status page; the more-info scope opens the status page only. The transactions
and both links come from the sandbox's Anchor Platform over HTTP."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import urlsplit

import jwt
import pytest

from anchor import platform
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositPayment
from payouts.models import WithdrawalRequest
from tests.conftest import reference_path
from tests.factories import DepositOrderFactory
from tests.flows import Wallet, query

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNT_NUMBER = "50100123456789"
WITHDRAW_FORM = {"amount": "10", "name": "Asha Verma", "method": "bank_account",
                 "account_number": ACCOUNT_NUMBER, "ifsc": "HDFC0001234"}


@dataclass
class Links:
    transaction_id: str
    interactive: str  # path + query of AP's interactive URL
    more_info: str  # path + query of AP's more_info_url


def _local(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def _links(sandbox, wallet: Wallet, transaction_id: str, url: str) -> Links:
    token = sandbox.http.post("/ap/sep/sandbox-token",
                              json={"account": wallet.address}).json()["token"]
    sep_tx = sandbox.http.get("/ap/sep/transaction", params={"id": transaction_id},
                              headers={"Authorization": f"Bearer {token}"}
                              ).json()["transaction"]
    return Links(transaction_id, _local(url), _local(sep_tx["more_info_url"]))


@pytest.fixture(scope="module")
def txs(sandbox) -> dict[str, Links]:
    """Three AP transactions: a deposit, a withdrawal and another deposit (whose links
    are the "wrong transaction" ones)."""
    wallet = Wallet(sandbox)
    made = {}
    for name, start in (("deposit", wallet.start_deposit), ("withdrawal", wallet.start_withdrawal),
                        ("other", wallet.start_deposit)):
        transaction_id, url = start()
        made[name] = _links(sandbox, wallet, transaction_id, url)
    return made


def _expired_token(settings, transaction_id: str) -> str:
    return jwt.encode({"jti": transaction_id, "sub": "GABC", "exp": int(time.time()) - 3600},
                      settings.AP_INTERACTIVE_JWT_SECRET, algorithm="HS256")


def _use_token(client, settings, txs, kind: str, token_type: str) -> None:
    """Open the wallet's link of ``token_type`` for the page's transaction (of ``kind``)
    and check what the entry point itself answered."""
    links = txs[kind]
    if token_type == "interactive":
        assert client.get(links.interactive).status_code == 302
    elif token_type == "more_info":
        assert client.get(links.more_info).status_code == 302
    elif token_type == "expired":
        response = client.get("/sep24/interactive", {
            "transaction_id": links.transaction_id,
            "token": _expired_token(settings, links.transaction_id)})
        assert response.status_code == 403
        assert b'data-reason="expired"' in response.content
    elif token_type == "wrong_transaction":
        other = txs["other"]
        # The other transaction's token on this transaction's entry is refused...
        refused = client.get("/sep24/interactive", {
            "transaction_id": links.transaction_id,
            "token": query(other.interactive)["token"]})
        assert refused.status_code == 403
        # ... and the session it opens for the other transaction opens nothing here.
        assert client.get(other.interactive).status_code == 302
    else:
        assert token_type == "none"


def _order(transaction_id: str) -> DepositOrder:
    return DepositOrderFactory(
        transaction_id=transaction_id, order_id=f"order_scope{transaction_id[:8]}",
        amount_in=Decimal("1000.00"), amount_in_paise=100000, fee=Decimal("10.00"),
        amount_out=Decimal("11.8800000"), rate=Decimal("83.3300"))


# page -> (kind of its transaction, method, what the page shows when it opens)
PAGES = {
    "deposit_form": ("deposit", "GET", b"Deposit rupees, receive USDC"),
    "deposit_quote": ("deposit", "POST", b'id="amount-out"'),
    "checkout": ("deposit", "GET", b'id="to-checkout"'),
    "withdrawal_form": ("withdrawal", "GET", b'name="account_number"'),
    "withdrawal_quote": ("withdrawal", "POST", b'id="amount-out"'),
    "deposit_status": ("deposit", "GET", b'class="status'),
    "withdrawal_status": ("withdrawal", "GET", b'class="status'),
}
TOKENS = ("interactive", "more_info", "expired", "wrong_transaction", "none")
OPENS = {("deposit_status", "interactive"), ("deposit_status", "more_info"),
         ("withdrawal_status", "interactive"), ("withdrawal_status", "more_info"),
         *((page, "interactive") for page in PAGES)}


@pytest.mark.parametrize("token_type", TOKENS)
@pytest.mark.parametrize("page", list(PAGES))
def test_each_page_opens_only_for_the_tokens_scope(client, settings, txs, page, token_type):
    kind, method, shown = PAGES[page]
    links = txs[kind]
    tx_id = links.transaction_id
    url = {"deposit_form": f"/sep24/deposit/{tx_id}", "deposit_quote": f"/sep24/deposit/{tx_id}",
           "withdrawal_form": f"/sep24/withdraw/{tx_id}",
           "withdrawal_quote": f"/sep24/withdraw/{tx_id}",
           "deposit_status": f"/sep24/transaction/{tx_id}",
           "withdrawal_status": f"/sep24/transaction/{tx_id}"}.get(page)
    if page == "checkout":
        url = f"/sep24/checkout/{_order(tx_id).order_id}"
    _use_token(client, settings, txs, kind, token_type)

    if method == "GET":
        response = client.get(url)
    else:
        data = {"amount": "1000"} if kind == "deposit" else WITHDRAW_FORM
        response = client.post(url, data)  # the quote step: no confirm

    if (page, token_type) in OPENS:
        assert response.status_code == 200, response.content[:300]
        assert shown in response.content
    else:
        assert response.status_code == 403
        assert b'data-reason="forbidden"' in response.content
        assert shown not in response.content


@pytest.mark.parametrize("kind", ["deposit", "withdrawal"])
def test_a_status_link_cannot_submit_a_form_or_set_the_payout_account(client, txs, kind):
    links = txs[kind]
    tx_id = links.transaction_id
    assert client.get(links.more_info).status_code == 302

    if kind == "deposit":
        response = client.post(f"/sep24/deposit/{tx_id}", {"amount": "1000", "confirm": "yes"})
    else:
        response = client.post(f"/sep24/withdraw/{tx_id}", {**WITHDRAW_FORM, "confirm": "yes"})

    assert response.status_code == 403
    assert not DepositOrder.objects.filter(transaction_id=tx_id).exists()
    assert not WithdrawalRequest.objects.filter(transaction_id=tx_id).exists()
    assert platform.get_transaction(tx_id)["status"] == "incomplete"  # AP was never asked


def test_the_status_link_shows_no_pay_button_the_interactive_session_does(client, sandbox):
    wallet = Wallet(sandbox)
    links = _links(sandbox, wallet, *wallet.start_deposit())
    status_page = f"/sep24/transaction/{links.transaction_id}"
    assert client.get(links.interactive).status_code == 302
    submitted = client.post(f"/sep24/deposit/{links.transaction_id}",
                            {"amount": "1000", "confirm": "yes"})
    order = DepositOrder.objects.get(transaction_id=links.transaction_id)
    assert submitted["Location"] == f"/sep24/checkout/{order.order_id}"
    pay_link = f'href="/sep24/checkout/{order.order_id}"'.encode()
    assert pay_link in client.get(status_page).content  # the wallet's session may pay

    client.cookies.clear()  # someone else, holding only the status link
    assert client.get(links.more_info).status_code == 302
    seen_by_status_link = client.get(status_page)

    assert seen_by_status_link.status_code == 200
    assert b'data-status="pending_user_transfer_start"' in seen_by_status_link.content
    assert pay_link not in seen_by_status_link.content
    assert b'id="action"' not in seen_by_status_link.content


def test_a_status_link_opened_later_keeps_the_interactive_scope(client, txs):
    links = txs["withdrawal"]
    assert client.get(links.interactive).status_code == 302
    assert client.get(links.more_info).status_code == 302

    assert client.get(f"/sep24/withdraw/{links.transaction_id}").status_code == 200


def _paid_at_checkout(client, sandbox) -> tuple[Links, DepositOrder, str]:
    """A deposit paid at the sandbox's Razorpay Checkout whose webhooks are lost (so
    Corridor has no payment record and AP still says pending_user_transfer_start);
    returns the links, the order and Checkout's redirect back to the status page."""
    wallet = Wallet(sandbox)
    links = _links(sandbox, wallet, *wallet.start_deposit())
    assert client.get(links.interactive).status_code == 302
    client.post(f"/sep24/deposit/{links.transaction_id}", {"amount": "1000", "confirm": "yes"})
    order = DepositOrder.objects.get(transaction_id=links.transaction_id)
    sandbox.fault("razorpay.webhook_lose", times=1)
    paid = sandbox.http.post(f"/razorpay/sandbox/orders/{order.order_id}/pay", json={
        "callback_url": f"http://testserver/sep24/transaction/{links.transaction_id}"})
    paid.raise_for_status()
    return links, order, _local(paid.json()["redirect_url"])


def test_back_from_a_successful_checkout_the_status_page_never_offers_to_pay_again(
        client, clean_sandbox):
    links, order, back = _paid_at_checkout(client, clean_sandbox)
    status_page = f"/sep24/transaction/{links.transaction_id}"

    returned = client.get(back)
    assert returned.status_code == 302
    assert returned["Location"] == status_page  # the signature does not stay in the URL
    for _ in range(3):  # every refresh until the webhook or the order reconciler lands
        page = client.get(status_page)
        assert page.status_code == 200
        assert b'data-status="pending_user_transfer_start"' in page.content  # AP's
        assert b"Payment received, confirming" in page.content
        assert b"with Razorpay" not in page.content
        assert f"/sep24/checkout/{order.order_id}".encode() not in page.content
    assert platform.get_transaction(links.transaction_id)["status"] == \
        "pending_user_transfer_start"
    assert client.get(f"/sep24/checkout/{order.order_id}")["Location"] == status_page
    assert client.get(f"/sep24/deposit/{links.transaction_id}")["Location"] == \
        f"/sep24/checkout/{order.order_id}"  # ... which sends it to the status page


def test_back_from_a_failed_checkout_the_status_page_says_so_once_and_offers_to_pay(
        client, clean_sandbox):
    wallet = Wallet(clean_sandbox)
    links = _links(clean_sandbox, wallet, *wallet.start_deposit())
    assert client.get(links.interactive).status_code == 302
    client.post(f"/sep24/deposit/{links.transaction_id}", {"amount": "1000", "confirm": "yes"})
    order = DepositOrder.objects.get(transaction_id=links.transaction_id)
    failed = clean_sandbox.http.post(f"/razorpay/sandbox/orders/{order.order_id}/pay", json={
        "outcome": "failed",
        "callback_url": f"http://testserver/sep24/transaction/{links.transaction_id}"})
    failed.raise_for_status()
    status_page = f"/sep24/transaction/{links.transaction_id}"

    returned = client.get(_local(failed.json()["redirect_url"]))

    assert returned.status_code == 302 and returned["Location"] == status_page
    page = client.get(status_page).content.decode()
    assert "Your payment did not go through" in page  # was: "Waiting for your payment"
    assert f"/sep24/checkout/{order.order_id}" in page  # still payable
    assert "Your payment did not go through" not in client.get(status_page).content.decode()
    assert not DepositPayment.objects.filter(transaction_id=links.transaction_id).exists()


@pytest.mark.parametrize("forgery", ["signature", "order", "payment"])
def test_a_forged_checkout_return_changes_nothing(client, clean_sandbox, forgery):
    links, order, back = _paid_at_checkout(client, clean_sandbox)
    params = query(back)
    if forgery == "signature":
        params["razorpay_signature"] = "0" * 64
    elif forgery == "order":
        params["razorpay_order_id"] = "order_someoneelse0"
    else:
        params["razorpay_payment_id"] = "pay_someoneelse000"
    status_page = f"/sep24/transaction/{links.transaction_id}"

    client.get(status_page, params)
    page = client.get(status_page)

    assert b"Payment received, confirming" not in page.content
    assert f"Pay ₹{order.amount_in} with Razorpay".encode() in page.content


def test_checkout_signature_matches_razorpays_published_vector(settings):
    vectors = json.loads(reference_path("razorpay", "signature_vectors.json").read_text())
    vector = vectors["checkout_payment_signature"][0]
    settings.RAZORPAY_KEY_SECRET = vector["secret"]

    assert rzp.verify_checkout_signature(order_id=vector["order_id"],
                                         payment_id=vector["payment_id"],
                                         signature=vector["expected_hex"])
    assert not rzp.verify_checkout_signature(order_id=vector["payment_id"],
                                             payment_id=vector["order_id"],
                                             signature=vector["expected_hex"])
    assert not rzp.verify_checkout_signature(order_id=vector["order_id"],
                                             payment_id=vector["payment_id"], signature="")


def test_one_secret_for_both_links_is_refused_at_startup(settings):
    from django.core import checks

    settings.AP_MORE_INFO_JWT_SECRET = settings.AP_INTERACTIVE_JWT_SECRET

    errors = [e for e in checks.run_checks(tags=[checks.Tags.security])
              if e.id == "anchor.E001"]

    assert len(errors) == 1 and errors[0].level == checks.ERROR
    settings.AP_MORE_INFO_JWT_SECRET = "another-secret-for-the-status-link-000000000"
    assert not [e for e in checks.run_checks(tags=[checks.Tags.security])
                if e.id == "anchor.E001"]
