"""Drivers that act as the outside world does, over real HTTP: a wallet (a Stellar
account on the sandbox Horizon, SEP-24 start on the sandbox AP) and a customer (the
interactive pages on Corridor, the sandbox's Razorpay checkout). Used by the tests and
by ``manage.py demo``. ``sandbox`` is anything with ``.url`` and ``.http`` (an
``httpx.Client`` on the sandbox base URL).

A wallet retries what the network answers only for now (no answer, a 5xx: Horizon's
``504 No ledger closed in time`` on a loaded machine, a 503 while a database restarts)
as a wallet does: :func:`retry_transient`, bounded by ``SANDBOX_DRIVER_RETRIES`` tries
``SANDBOX_DRIVER_RETRY_WAIT_S`` apart, each logged, and first asking whether the last
try landed after all (a 504 may come after the transaction applied: the same signed
envelope is submitted again, never a new one, so it cannot land twice)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar
from urllib.parse import urlparse

import httpx
from django.conf import settings
from stellar_sdk import Asset, Keypair, Server, TransactionBuilder
from stellar_sdk import exceptions as sdk_errors

log = logging.getLogger(__name__)
T = TypeVar("T")


def horizon(sandbox) -> Server:
    return Server(f"{sandbox.url}/horizon")


def transient(exc: BaseException) -> bool:
    """Whether a wallet would try ``exc`` again: no answer, or a 5xx."""
    if isinstance(exc, httpx.TransportError | sdk_errors.ConnectionError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    if isinstance(exc, sdk_errors.BaseHorizonError):
        return (exc.status or 0) >= 500
    return False


def retry_transient(what: str, attempt: Callable[[], T], *,
                    landed: Callable[[], T | None] | None = None) -> T:
    """``attempt()``, tried again after a transient answer (:func:`transient`) up to
    ``SANDBOX_DRIVER_RETRIES`` times, ``SANDBOX_DRIVER_RETRY_WAIT_S`` apart, each retry
    logged; before each retry ``landed()`` (when given) may return the result of a try
    that succeeded after all. Raises the last error (any other error at once)."""
    tries = max(1, settings.SANDBOX_DRIVER_RETRIES)
    for n in range(1, tries + 1):
        try:
            return attempt()
        except Exception as exc:
            if not transient(exc) or n == tries:
                raise
            log.warning("wallet: %s: %s; trying again (%d/%d)", what,
                        " ".join(str(exc).split())[:200], n, tries - 1)
        time.sleep(settings.SANDBOX_DRIVER_RETRY_WAIT_S)
        if landed is not None:
            try:
                done = landed()
            except Exception as exc:  # noqa: BLE001 - the look itself may fail: try again
                if not transient(exc):
                    raise
                done = None
            if done is not None:
                return done
    raise AssertionError("unreachable")


def submit(sandbox, tx) -> dict:
    """Submit a signed transaction as a wallet does: after a transient answer, the
    transaction found by its hash is the answer; else the same envelope again."""
    server = horizon(sandbox)
    tx_hash = tx.hash_hex()

    def landed() -> dict | None:
        found = sandbox.http.get(f"/horizon/transactions/{tx_hash}")
        if found.status_code == 404:
            return None
        found.raise_for_status()
        return found.json()

    return retry_transient(f"submit {tx_hash[:12]}", lambda: server.submit_transaction(tx),
                           landed=landed)


class Wallet:
    """A wallet user's Stellar account, created with friendbot, trusting USDC."""

    def __init__(self, sandbox, *, trust: bool = True):
        self.sandbox = sandbox
        self.keypair = Keypair.random()
        self.address = self.keypair.public_key
        retry_transient("friendbot", lambda: sandbox.http.get(
            "/horizon/friendbot", params={"addr": self.address}).raise_for_status(),
            landed=lambda: self._account() or None)
        if trust:
            self.trust_usdc()

    def _account(self) -> dict:
        """The account as Horizon shows it ({} while it does not exist)."""
        found = self.sandbox.http.get(f"/horizon/accounts/{self.address}")
        if found.status_code == 404:
            return {}
        return found.raise_for_status().json()

    def usdc_balance(self) -> Decimal | None:
        """The account's USDC balance (None without a trustline)."""
        for b in self._account().get("balances", []):
            if b.get("asset_code") == settings.STELLAR_USDC_CODE:
                return Decimal(b["balance"])
        return None

    def trust_usdc(self) -> None:
        server = horizon(self.sandbox)
        account = retry_transient("load account", lambda: server.load_account(self.address))
        tx = (TransactionBuilder(account, settings.STELLAR_NETWORK_PASSPHRASE, 100)
              .append_change_trust_op(Asset(settings.STELLAR_USDC_CODE,
                                            settings.STELLAR_USDC_ISSUER))
              .set_timeout(30).build())
        tx.sign(self.keypair)
        submit(self.sandbox, tx)

    def fund_usdc(self, amount: str) -> None:
        """USDC from the sandbox issuer (the account must trust USDC). After a transient
        answer (the sandbox's 504 ``No ledger closed in time`` on a loaded machine) a
        balance that grew is the funding landing after all."""
        before = self.usdc_balance() or Decimal(0)
        retry_transient("fund USDC", lambda: self.sandbox.http.post(
            "/horizon/sandbox/fund", json={"account": self.address, "amount": amount}
        ).raise_for_status(), landed=lambda: True if (self.usdc_balance() or 0) > before
            else None)

    def pay(self, *, destination: str, amount: str, memo_type: str = "id", memo: str = "",
            asset: Asset | None = None, muxed_id: int | None = None) -> str:
        """Send a payment (USDC unless ``asset``) with a memo, optionally from a muxed
        M... source; returns the transaction hash."""
        from stellar_sdk import Account, MuxedAccount

        server = horizon(self.sandbox)
        account = retry_transient("load account", lambda: server.load_account(self.address))
        if muxed_id is not None:
            account = Account(MuxedAccount(self.address, muxed_id), account.sequence)
        builder = TransactionBuilder(account, settings.STELLAR_NETWORK_PASSPHRASE, 100)
        if memo_type == "id":
            builder.add_id_memo(int(memo))
        elif memo_type == "text":
            builder.add_text_memo(memo)
        usdc = Asset(settings.STELLAR_USDC_CODE, settings.STELLAR_USDC_ISSUER)
        builder.append_payment_op(destination, asset or usdc, amount)
        tx = builder.set_timeout(30).build()
        tx.sign(self.keypair)
        return submit(self.sandbox, tx)["hash"]

    def muxed(self, muxed_id: int) -> str:
        from stellar_sdk import MuxedAccount

        return MuxedAccount(self.address, muxed_id).account_muxed

    def start_withdrawal(self, *, account: str | None = None) -> tuple[str, str]:
        """SEP-24 ``POST /transactions/withdraw/interactive``; (transaction id, URL)."""
        who = account or self.address
        token = self.sandbox.http.post("/ap/sep/sandbox-token", json={"account": who}
                                       ).raise_for_status().json()["token"]
        reply = self.sandbox.http.post(
            "/ap/sep/transactions/withdraw/interactive",
            json={"asset_code": settings.STELLAR_USDC_CODE, "account": who},
            headers={"Authorization": f"Bearer {token}"})
        reply.raise_for_status()
        return reply.json()["id"], reply.json()["url"]

    def usdc_payments(self) -> list[dict]:
        """Every USDC payment received by this account on the sandbox ledger."""
        records = horizon(self.sandbox).payments().for_account(self.address).limit(200).call()
        return [r for r in records["_embedded"]["records"]
                if r.get("type") == "payment" and r.get("to") == self.address
                and r.get("asset_code") == settings.STELLAR_USDC_CODE]

    def start_deposit(self, *, amount: str | None = None, memo: str | None = None,
                      memo_type: str | None = None, account: str | None = None) -> tuple[str, str]:
        """SEP-24 ``POST /transactions/deposit/interactive`` on the sandbox AP; returns
        (transaction id, interactive URL)."""
        token = self.sandbox.http.post("/ap/sep/sandbox-token",
                                       json={"account": account or self.address}
                                       ).raise_for_status().json()["token"]
        body = {"asset_code": settings.STELLAR_USDC_CODE, "account": account or self.address}
        if amount:
            body["amount"] = amount
        if memo is not None:
            body.update(memo=memo, memo_type=memo_type)
        reply = self.sandbox.http.post("/ap/sep/transactions/deposit/interactive", json=body,
                                       headers={"Authorization": f"Bearer {token}"})
        reply.raise_for_status()
        data = reply.json()
        return data["id"], data["url"]


class Customer:
    """A person in the wallet's webview: follows the interactive URL, fills the form,
    pays at the (sandbox) Razorpay checkout."""

    def __init__(self, sandbox):
        self.sandbox = sandbox
        self.http = httpx.Client(timeout=30, follow_redirects=False)

    def open(self, url: str) -> httpx.Response:
        return self.http.get(url)

    def submit_amount(self, interactive_url: str, amount: str) -> str:
        """Open the link, ask for a quote, confirm; returns the Razorpay order id."""
        response = self.open(interactive_url)
        assert response.status_code == 302, response.text[:500]
        form_url = str(response.url.join(response.headers["location"]))
        page = self.http.get(form_url)
        assert page.status_code == 200, page.text[:500]
        quote = self.http.post(form_url, data={"amount": amount, **self._csrf(page)})
        assert quote.status_code == 200, quote.text[:500]
        done = self.http.post(form_url, data={"amount": amount, "confirm": "yes",
                                              **self._csrf(quote)})
        assert done.status_code == 302, done.text[:500]
        return self.order_id_from(done.headers["location"])

    def submit_withdrawal(self, interactive_url: str, amount: str, **beneficiary) -> dict:
        """Open the link, fill the withdrawal form, confirm; returns what the pay page
        shows: {"destination", "memo"}."""
        fields = {"amount": amount, "name": "Asha Verma", "method": "bank_account",
                  "account_number": "50100123456789", "ifsc": "HDFC0001234", **beneficiary}
        response = self.open(interactive_url)
        assert response.status_code == 302, response.text[:500]
        form_url = str(response.url.join(response.headers["location"]))
        page = self.http.get(form_url)
        assert page.status_code == 200, page.text[:500]
        quote = self.http.post(form_url, data={**fields, **self._csrf(page)})
        assert quote.status_code == 200, quote.text[:800]
        done = self.http.post(form_url, data={**fields, "confirm": "yes", **self._csrf(quote)})
        assert done.status_code == 200, done.text[:800]
        destination = re.search(r'<code class="account">([^<]*)</code>', done.text).group(1)
        memo = re.search(r'<code class="memo">([^<]*)</code>', done.text).group(1)
        return {"destination": destination, "memo": memo}

    def _csrf(self, page: httpx.Response) -> dict:
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        return {"csrfmiddlewaretoken": match.group(1)} if match else {}

    @staticmethod
    def order_id_from(checkout_url: str) -> str:
        path = urlparse(checkout_url).path
        return path.rstrip("/").rsplit("/", 1)[-1]

    def pay(self, order_id: str, **body) -> dict:
        """Pay at checkout; after a transient answer, "already been paid" is that try
        having landed ({"status": "paid_before"})."""
        tried: list[int] = []

        def attempt() -> dict:
            again = bool(tried)
            tried.append(1)
            reply = self.sandbox.http.post(f"/razorpay/sandbox/orders/{order_id}/pay",
                                           json=body)
            if again and reply.status_code == 400 and "already been paid" in reply.text:
                return {"status": "paid_before"}
            reply.raise_for_status()
            return reply.json()

        return retry_transient(f"pay order {order_id}", attempt)
