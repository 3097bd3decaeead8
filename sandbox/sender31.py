"""A foreign SEP-31 *sending* anchor (SA) that uses the sandbox AP's SEP-31 receiving, over
real HTTP, as one does in production (SEP31-RECEIVE.md §1, §3.1): it imports nothing from
Corridor and reaches AP, Horizon and (through AP) Corridor's callbacks only by URL.

Its path (:meth:`SendingAnchor.send`, or the steps one by one):

1. :meth:`~SendingAnchor.ensure_account`: its own Stellar account
   (``sandbox.keys.SENDER31``), created on first use with friendbot, a USDC trustline and
   USDC from the sandbox issuer (the sandbox's world is rebuilt on reset, so this is
   checked on every run);
2. :meth:`~SendingAnchor.authenticate`: the sandbox SEP-10 token as a custodial client
   (``client_name``, ``client_domain``);
3. :meth:`~SendingAnchor.put_customer` twice: the sender (``sep31-sender``) and the
   receiver (``sep31-receiver``), each under its own id memo, through AP's SEP-12;
4. :meth:`~SendingAnchor.firm_quote`: ``POST /sep38/quote`` with ``context: sep31``,
   selling USDC for INR;
5. :meth:`~SendingAnchor.create_transaction`: ``POST /sep31/transactions`` with that
   ``quote_id``;
6. :meth:`~SendingAnchor.wait_for_status` ``pending_sender`` (the receiving anchor's
   ``request_onchain_funds``), then :meth:`~SendingAnchor.pay` ``stellar_account_id``
   with ``stellar_memo``.

Faults are per call, not global switches (so the chaos campaign's catalogue is
unchanged): :class:`Payment` says how the SA pays: ``amount`` (default: the transaction's
``amount_in``; pay less or more), ``times`` (0 = never pays, 2 = pays twice), ``memo``
(another memo than AP gave), ``asset`` (``native`` = XLM instead of USDC),
``destination`` (another account).

HTTP trigger for the demo: ``POST /ap/sandbox/sender31/send`` (sandbox/ap/views.py).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from decimal import Decimal

import httpx
from django.conf import settings
from stellar_sdk import Asset, Keypair, Server, TransactionBuilder

from common.http import tls_context
from sandbox import keys
from sandbox.drivers import retry_transient, submit

INR = "iso4217:INR"
FUNDED_USDC = Decimal("100000")
SENDER_FIELDS = {"first_name": "Maria", "last_name": "Garcia", "address_country_code": "ESP",
                 "birth_date": "1985-04-12", "city": "Madrid"}
RECEIVER_FIELDS = {"first_name": "Asha", "last_name": "Verma",
                   "bank_account_number": "50100123456789", "bank_number": "HDFC0001234",
                   "bank_account_type": "savings"}


class SenderError(RuntimeError):
    """A step of the SA's path failed: ``status`` and ``body`` of the refusing answer."""

    def __init__(self, message: str, status: int | None = None, body=None):
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Payment:
    """How the SA pays once it sees ``pending_sender`` (the per-call fault options)."""

    amount: str | None = None       # None: the transaction's amount_in
    times: int = 1                  # 0: never pays; 2: pays twice
    memo: str | None = None         # None: stellar_memo as AP gave it
    asset: str = "usdc"             # usdc | native
    destination: str | None = None  # None: stellar_account_id


@dataclass
class Remittance:
    """What one :meth:`SendingAnchor.send` did: ids, the quote, the hashes it paid."""

    transaction_id: str
    sender_id: str
    receiver_id: str
    quote: dict
    transaction: dict = field(default_factory=dict)
    hashes: list[str] = field(default_factory=list)


def _usdc() -> Asset:
    return Asset(settings.STELLAR_USDC_CODE, keys.USDC_ISSUER.public_key)


def new_memo() -> str:
    """A fresh id memo for a customer of this SA."""
    return str(secrets.randbelow(2**63 - 1) + 1)


class SendingAnchor:
    """The SA, against the sandbox at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, *, keypair: Keypair = keys.SENDER31,
                 client_name: str = "foreignSender",
                 client_domain: str = "sender.example.com", timeout: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.keypair = keypair
        self.account = keypair.public_key
        self.client_name = client_name
        self.client_domain = client_domain
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, verify=tls_context())
        self.token: str | None = None

    # ------------------------------------------------------------------ helpers

    @property
    def url(self) -> str:
        return self.base_url

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One HTTP call, a transient answer tried again as a wallet would
        (``sandbox.drivers.retry_transient``); the last answer is returned either way
        (``_checked`` turns an error answer into SenderError). Only for calls a repeat
        cannot double (reads, the SEP-12 PUT, a token, a quote)."""
        def attempt() -> httpx.Response:
            response = self.http.request(method, path, **kwargs)
            if response.status_code >= 500:
                response.raise_for_status()
            return response

        try:
            return retry_transient(f"{method} {path}", attempt)
        except httpx.HTTPStatusError as exc:
            return exc.response

    def _horizon(self) -> Server:
        return Server(f"{self.base_url}/horizon")

    def _headers(self) -> dict:
        if self.token is None:
            self.authenticate()
        return {"Authorization": f"Bearer {self.token}"}

    @staticmethod
    def _checked(response: httpx.Response, what: str, *expected: int):
        if response.status_code not in (expected or (200,)):
            try:
                body = response.json()
            except ValueError:
                body = response.text
            raise SenderError(f"{what}: HTTP {response.status_code} {body}",
                              response.status_code, body)
        return response.json() if response.content else {}

    # ------------------------------------------------------------------ steps

    def ensure_account(self, minimum_usdc: Decimal = Decimal("10000")) -> None:
        """Create the SA's account (friendbot, USDC trustline) if missing and top its
        USDC up to :data:`FUNDED_USDC` when below ``minimum_usdc``."""
        found = self._request("GET", f"/horizon/accounts/{self.account}")
        if found.status_code == 404:
            self._checked(self._request("GET", "/horizon/friendbot",
                                        params={"addr": self.account}), "friendbot")
            found = self._request("GET", f"/horizon/accounts/{self.account}")
        balances = self._checked(found, "load account")["balances"]
        usdc = next((b for b in balances if b.get("asset_code") == settings.STELLAR_USDC_CODE
                     and b.get("asset_issuer") == keys.USDC_ISSUER.public_key), None)
        if usdc is None:
            server = self._horizon()
            account = retry_transient("load account",
                                      lambda: server.load_account(self.account))
            tx = (TransactionBuilder(account, settings.STELLAR_NETWORK_PASSPHRASE, 100)
                  .append_change_trust_op(_usdc()).set_timeout(30).build())
            tx.sign(self.keypair)
            submit(self, tx)
            balance = Decimal(0)
        else:
            balance = Decimal(usdc["balance"])
        if balance < minimum_usdc:
            self._checked(self._request("POST", "/horizon/sandbox/fund", json={
                "account": self.account, "amount": str(FUNDED_USDC - balance)}), "fund USDC")

    def authenticate(self) -> str:
        """The sandbox SEP-10 token of the SA (a custodial client: no memo)."""
        body = self._checked(self._request("POST", "/ap/sep/sandbox-token", json={
            "account": self.account, "client_name": self.client_name,
            "client_domain": self.client_domain}), "SEP-10")
        self.token = body["token"]
        return self.token

    def put_customer(self, *, type: str, memo: str | None, fields: dict,  # noqa: A002
                     files: dict[str, bytes] | None = None, customer_id: str | None = None,
                     encoding: str = "json") -> str:
        """SEP-12 ``PUT /customer`` (``encoding`` json | form; files force multipart);
        returns the customer id AP answers with (202)."""
        body = {"type": type, **fields}
        if memo is not None:
            body.update(memo=memo, memo_type="id")
        if customer_id is not None:
            body["id"] = customer_id
        if files:
            response = self._request("PUT", "/ap/sep/sep12/customer", headers=self._headers(),
                                     data=body, files={k: (k, v) for k, v in files.items()})
        elif encoding == "form":
            response = self._request("PUT", "/ap/sep/sep12/customer", headers=self._headers(),
                                     data=body)
        else:
            response = self._request("PUT", "/ap/sep/sep12/customer", headers=self._headers(),
                                     json=body)
        return self._checked(response, f"PUT customer {type}", 202)["id"]

    def get_customer(self, **params) -> dict:
        """SEP-12 ``GET /customer``."""
        return self._checked(self._request("GET", "/ap/sep/sep12/customer", params=params,
                                           headers=self._headers()), "GET customer")

    def firm_quote(self, sell_amount: str, *, buy_delivery_method: str | None = "IMPS") -> dict:
        """SEP-38 ``POST /quote``, ``context: sep31``, USDC -> INR."""
        body = {"sell_asset": f"stellar:{_usdc().code}:{_usdc().issuer}", "buy_asset": INR,
                "sell_amount": sell_amount, "context": "sep31"}
        if buy_delivery_method:
            body["buy_delivery_method"] = buy_delivery_method
        return self._checked(self._request("POST", "/ap/sep/sep38/quote", json=body,
                                            headers=self._headers()), "firm quote", 201)

    def create_transaction(self, *, amount: str, sender_id: str, receiver_id: str,
                           quote_id: str | None, funding_method: str = "IMPS") -> str:
        """SEP-31 ``POST /transactions``; returns the id (201)."""
        body = {"amount": amount, "asset_code": _usdc().code, "asset_issuer": _usdc().issuer,
                "destination_asset": INR, "sender_id": sender_id, "receiver_id": receiver_id,
                "funding_method": funding_method, "fields": {"transaction": {}}}
        if quote_id:
            body["quote_id"] = quote_id
        return self._checked(self.http.post("/ap/sep/sep31/transactions", json=body,
                                            headers=self._headers()), "POST transaction",
                             201)["id"]

    def transaction(self, transaction_id: str) -> dict:
        """SEP-31 ``GET /transactions/:id``: the ``transaction`` object."""
        return self._checked(self._request("GET", f"/ap/sep/sep31/transactions/{transaction_id}",
                                           headers=self._headers()), "GET transaction"
                             )["transaction"]

    def wait_for_status(self, transaction_id: str, statuses: tuple[str, ...] = (
            "pending_sender",), *, timeout: float = 30.0, interval: float = 0.2) -> dict:
        """Poll ``GET /transactions/:id`` until its status is one of ``statuses``.
        Raises SenderError on timeout (with the last status seen)."""
        deadline = time.monotonic() + timeout
        while True:
            txn = self.transaction(transaction_id)
            if txn["status"] in statuses:
                return txn
            if time.monotonic() > deadline:
                raise SenderError(f"{transaction_id} still {txn['status']} after {timeout}s, "
                                  f"not {' / '.join(statuses)}")
            time.sleep(interval)

    def pay(self, txn: dict, payment: Payment = Payment()) -> list[str]:
        """Pay ``txn`` (the SA's view, in ``pending_sender``) as ``payment`` says; returns
        the hashes, one per payment made. Raises SenderError when AP named no account or
        memo, or a payment was refused."""
        destination = payment.destination or txn.get("stellar_account_id")
        memo = payment.memo if payment.memo is not None else txn.get("stellar_memo")
        if not destination or memo is None:
            raise SenderError(f"{txn['id']}: no stellar_account_id / stellar_memo to pay")
        amount = payment.amount or txn["amount_in"]
        asset = Asset.native() if payment.asset == "native" else _usdc()
        server = self._horizon()
        hashes = []
        for _ in range(payment.times):
            builder = TransactionBuilder(
                retry_transient("load account", lambda: server.load_account(self.account)),
                settings.STELLAR_NETWORK_PASSPHRASE, 100)
            builder.add_id_memo(int(memo))
            builder.append_payment_op(destination, asset, str(Decimal(amount)))
            tx = builder.set_timeout(30).build()
            tx.sign(self.keypair)
            try:
                hashes.append(submit(self, tx)["hash"])
            except Exception as exc:  # stellar_sdk's BadRequestError and friends
                raise SenderError(f"{txn['id']}: payment refused: {exc}") from exc
        return hashes

    def sent(self, memo: str) -> list[dict]:
        """USDC payments out of the SA's account whose transaction carries the id memo
        ``memo``: whether the SA's own payment landed, whatever AP's status says (after
        a 504 its status may still be ``pending_sender``, or already past it, or
        ``refunded``). Each: ``hash``, ``to``, ``amount`` (Decimal). Raises SenderError."""
        return [{"hash": r["hash"], "to": r["to"], "amount": r["amount"]}
                for r in self._payments(memo, incoming=False)]

    def _payments(self, memo: str, *, incoming: bool) -> list[dict]:
        records = self._checked(self._request("GET",
            f"/horizon/accounts/{self.account}/payments",
            params={"order": "desc", "limit": 200, "join": "transactions"}),
            "GET payments")["_embedded"]["records"]
        side = "to" if incoming else "from"
        return [{"hash": r["transaction_hash"], "from": r["from"], "to": r["to"],
                 "amount": Decimal(r["amount"])} for r in records
                if r.get("type") == "payment" and r.get(side) == self.account
                and r.get("asset_code") == "USDC"
                and (r.get("transaction") or {}).get("memo") == str(memo)]

    def received(self, memo: str) -> list[dict]:
        """USDC payments into the SA's account whose transaction carries the id memo
        ``memo``, newest first: what a receiving anchor sent back (its refund carries the
        refund memo, which AP 4.3.0 sets to the payment's memo, SEP31-RECEIVE.md §3.3).
        Each: ``hash``, ``from``, ``to``, ``amount`` (Decimal). Raises SenderError."""
        return self._payments(memo, incoming=True)

    # ------------------------------------------------------------------ the whole path

    def start(self, *, amount: str = "100", sender_fields: dict | None = None,
              receiver_fields: dict | None = None) -> Remittance:
        """Steps 1-5: account, token, both customers, a firm quote, the transaction
        (``pending_receiver``)."""
        self.ensure_account()
        self.authenticate()
        sender_id = self.put_customer(type="sep31-sender", memo=new_memo(),
                                      fields=sender_fields or SENDER_FIELDS)
        receiver_id = self.put_customer(type="sep31-receiver", memo=new_memo(),
                                        fields=receiver_fields or RECEIVER_FIELDS)
        quote = self.firm_quote(amount)
        transaction_id = self.create_transaction(amount=quote["sell_amount"],
                                                 sender_id=sender_id,
                                                 receiver_id=receiver_id,
                                                 quote_id=quote["id"])
        return Remittance(transaction_id, sender_id, receiver_id, quote)

    def finish(self, remittance: Remittance, payment: Payment = Payment(), *,
               timeout: float = 30.0) -> Remittance:
        """Step 6: wait for ``pending_sender``, then pay as ``payment`` says."""
        txn = self.wait_for_status(remittance.transaction_id, timeout=timeout)
        remittance.transaction = txn
        remittance.hashes = self.pay(txn, payment)
        return remittance

    def send(self, *, amount: str = "100", payment: Payment = Payment(),
             timeout: float = 30.0) -> Remittance:
        """The whole path; needs the receiving anchor to call ``request_onchain_funds``
        within ``timeout`` seconds."""
        return self.finish(self.start(amount=amount), payment, timeout=timeout)
