"""Drivers that act as the outside world does, over real HTTP: a wallet (a Stellar
account on the sandbox Horizon, SEP-24 start on the sandbox AP) and a customer (the
interactive pages on Corridor, the sandbox's Razorpay checkout). Used by the tests and
by ``manage.py demo``. ``sandbox`` is anything with ``.url`` and ``.http`` (an
``httpx.Client`` on the sandbox base URL)."""

from __future__ import annotations

import re
from urllib.parse import urlparse

import httpx
from django.conf import settings
from stellar_sdk import Asset, Keypair, Server, TransactionBuilder


def horizon(sandbox) -> Server:
    return Server(f"{sandbox.url}/horizon")


class Wallet:
    """A wallet user's Stellar account, created with friendbot, trusting USDC."""

    def __init__(self, sandbox, *, trust: bool = True):
        self.sandbox = sandbox
        self.keypair = Keypair.random()
        self.address = self.keypair.public_key
        sandbox.http.get("/horizon/friendbot", params={"addr": self.address}).raise_for_status()
        if trust:
            self.trust_usdc()

    def trust_usdc(self) -> None:
        server = horizon(self.sandbox)
        account = server.load_account(self.address)
        tx = (TransactionBuilder(account, settings.STELLAR_NETWORK_PASSPHRASE, 100)
              .append_change_trust_op(Asset(settings.STELLAR_USDC_CODE,
                                            settings.STELLAR_USDC_ISSUER))
              .set_timeout(30).build())
        tx.sign(self.keypair)
        server.submit_transaction(tx)

    def fund_usdc(self, amount: str) -> None:
        """USDC from the sandbox issuer (the account must trust USDC)."""
        self.sandbox.http.post("/horizon/sandbox/fund", json={"account": self.address,
                                                              "amount": amount}
                               ).raise_for_status()

    def pay(self, *, destination: str, amount: str, memo_type: str = "id", memo: str = "",
            asset: Asset | None = None, muxed_id: int | None = None) -> str:
        """Send a payment (USDC unless ``asset``) with a memo, optionally from a muxed
        M... source; returns the transaction hash."""
        from stellar_sdk import Account, MuxedAccount

        server = horizon(self.sandbox)
        account = server.load_account(self.address)
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
        return server.submit_transaction(tx)["hash"]

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
        reply = self.sandbox.http.post(f"/razorpay/sandbox/orders/{order_id}/pay", json=body)
        reply.raise_for_status()
        return reply.json()
