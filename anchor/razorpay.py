"""Razorpay pay-in client: Orders API, webhook signatures, and the settlement reads a
reconciler compares our books with (razorpay/TREASURY.md §3).

Amounts are integer paise at this boundary (razorpay/NOTES.md §0 rule 1). Webhook
signatures are verified over the raw request bytes (NOTES §1.5, §5 bugs 1-3) with the
``razorpay`` package's HMAC helper, never over re-serialised JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx
import razorpay
from django.conf import settings

from common.http import tls_context


class RazorpayError(Exception):
    """Razorpay answered an error or could not be reached."""


class SettlementNotFound(RazorpayError):
    """Razorpay holds no settlement under this id for our key (400/404 to ``GET
    /v1/settlements/{id}``)."""


class PaymentNotFound(RazorpayError):
    """Razorpay holds no such payment for our key: a 400 or 404 to ``GET
    /v1/payments/{id}`` (Razorpay answers 400 BAD_REQUEST_ERROR "The id provided does
    not exist"; a GET by id has no body that could be invalid, so any 400/404 means
    the id is not ours). A definite answer, unlike a 5xx, 401 or timeout."""


def rupees_to_paise(amount: Decimal) -> int:
    """Exact Decimal rupees -> integer paise (₹19.99 -> 1999). Raises ValueError for a
    fraction of a paisa; never goes through float (NOTES §5 bug 10)."""
    paise = amount * 100
    if paise != paise.to_integral_value():
        raise ValueError(f"₹{amount} is not a whole number of paise")
    return int(paise)


def paise_to_rupees(paise: int) -> Decimal:
    return (Decimal(paise) / 100).quantize(Decimal("0.01"))


def _client() -> httpx.Client:
    return httpx.Client(base_url=settings.RAZORPAY_API_URL.rstrip("/"),
                        auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET),
                        timeout=settings.HTTP_TIMEOUT_S, verify=tls_context())


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise RazorpayError(f"Razorpay {response.status_code}: {response.text[:300]}")
    return response.json()


def create_order(*, amount_paise: int, currency: str, receipt: str,
                 notes: dict[str, str]) -> dict[str, Any]:
    """``POST /v1/orders``; receipt <= 40 characters (the AP transaction id), unique.
    A repeat after a lost answer finds the first order by its receipt instead of
    failing on "receipt should be unique" (razorpay/NOTES.md §1.1)."""
    try:
        with _client() as client:
            response = client.post("/v1/orders", json={
                "amount": amount_paise, "currency": currency, "receipt": receipt[:40],
                "notes": notes})
            if response.status_code == 400 and "receipt" in response.text.lower():
                found = _json(client.get("/v1/orders", params={"receipt": receipt[:40]}))
                for order in found.get("items", []):
                    if order.get("amount") == amount_paise and order.get("currency") == currency:
                        return order
            return _json(response)
    except httpx.HTTPError as exc:
        raise RazorpayError(f"create_order: {type(exc).__name__}: {exc}") from exc


def orders_by_receipt(receipt: str) -> list[dict[str, Any]]:
    """``GET /v1/orders?receipt=``: the orders whose receipt is ``receipt`` (Razorpay
    docs api/orders/fetch-all, query parameter ``receipt``), newest first."""
    try:
        with _client() as client:
            return _json(client.get("/v1/orders", params={"receipt": receipt[:40],
                                                          "count": 100})).get("items", [])
    except httpx.HTTPError as exc:
        raise RazorpayError(f"orders_by_receipt: {type(exc).__name__}: {exc}") from exc


def order_payments(order_id: str) -> list[dict[str, Any]]:
    """``GET /v1/orders/{id}/payments``: the payment entities of one order."""
    try:
        with _client() as client:
            return _json(client.get(f"/v1/orders/{order_id}/payments")).get("items", [])
    except httpx.HTTPError as exc:
        raise RazorpayError(f"order_payments: {type(exc).__name__}: {exc}") from exc


def fetch_payment(payment_id: str) -> dict[str, Any]:
    """``GET /v1/payments/{id}``: the payment entity as Razorpay holds it now (amount in
    paise, ``status`` created | authorized | captured | refunded | failed, ``order_id``,
    ``currency``; razorpay/NOTES.md §1.3, §1.6: the server-side fetch is what makes a
    webhook's claim true). Raises PaymentNotFound (definite: no such payment) or
    RazorpayError (5xx, 401, 429, timeout: ask again later)."""
    try:
        with _client() as client:
            response = client.get(f"/v1/payments/{quote(payment_id, safe='')}")
    except httpx.HTTPError as exc:
        raise RazorpayError(f"fetch_payment: {type(exc).__name__}: {exc}") from exc
    if response.status_code in (400, 404):
        raise PaymentNotFound(f"Razorpay {response.status_code}: {response.text[:300]}")
    try:
        entity = _json(response)
    except ValueError as exc:
        raise RazorpayError(f"fetch_payment: not JSON: {response.text[:100]!r}") from exc
    if not isinstance(entity, dict):
        raise RazorpayError("fetch_payment: the answer is not a payment entity")
    return entity


def checkout_url(*, order_id: str, callback_url: str) -> str:
    """Where the customer pays. The sandbox serves a checkout page; against real
    Razorpay this is our own page embedding Checkout (RAZORPAY_CHECKOUT_URL)."""
    base = getattr(settings, "RAZORPAY_CHECKOUT_URL", "") or (
        settings.RAZORPAY_API_URL.rstrip("/") + "/sandbox/checkout")
    return str(httpx.URL(f"{base}/{order_id}", params={"callback_url": callback_url}))


def verify_checkout_signature(*, order_id: str, payment_id: str, signature: str) -> bool:
    """True when ``signature`` is Checkout's success signature (NOTES §1.6): hex
    HMAC-SHA256 under the API key secret of ``order_id|payment_id``, where ``order_id``
    must be the one stored on our server, never the one the browser sent. The callback
    is only a hint: it never records a payment (only the webhook or the order
    reconciler does), it only keeps the pages from offering to pay again."""
    if not (order_id and payment_id and signature) or not signature.isascii():
        return False  # hmac.compare_digest raises TypeError on non-ASCII str
    utility = razorpay.Client(auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET)
                              ).utility
    try:
        return utility.verify_payment_signature({"razorpay_order_id": order_id,
                                                 "razorpay_payment_id": payment_id,
                                                 "razorpay_signature": signature}) is not False
    except razorpay.errors.SignatureVerificationError:
        return False


_UTILITY = None


def _utility():
    """The razorpay package's stateless signature helper, made once per process: a
    ``razorpay.Client`` builds an HTTP session, a millisecond per webhook otherwise."""
    global _UTILITY
    if _UTILITY is None:
        _UTILITY = razorpay.Client(auth=("", "")).utility
    return _UTILITY


def verify_webhook(body: bytes, signature: str) -> bool:
    """True when ``signature`` is the hex HMAC-SHA256 of the exact ``body`` bytes under
    the current webhook secret (or the previous one during a rotation, NOTES §1.5)."""
    if not signature or not signature.isascii():
        return False  # hmac.compare_digest raises TypeError on non-ASCII str
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    secrets = [settings.RAZORPAY_WEBHOOK_SECRET, settings.RAZORPAY_WEBHOOK_PREVIOUS_SECRET]
    utility = _utility()
    for secret in filter(None, secrets):
        try:
            # razorpay-python #121: it needs str; the UTF-8 decode keeps the exact bytes.
            utility.verify_webhook_signature(text, signature, secret)
            return True
        except razorpay.errors.SignatureVerificationError:
            continue
    return False


# --- refunds (razorpay/TREASURY.md §2) ----------------------------------------------

REFUND_IDEMPOTENCY_HEADER = "X-Refund-Idempotency"


class RefundRefused(RazorpayError):
    """Razorpay answered 400 to a refund create: a definite refusal (over-refund, not
    captured, fully refunded already, a changed body under a used key). ``description``
    is Razorpay's text (for people and the log; never matched by code)."""

    def __init__(self, description: str):
        super().__init__(description)
        self.description = description


def create_refund(*, payment_id: str, amount_paise: int, receipt: str, notes: dict[str, str],
                  speed: str, idempotency_key: str) -> dict[str, Any]:
    """``POST /v1/payments/{id}/refund`` with ``X-Refund-Idempotency: idempotency_key``
    (TREASURY §2.1: same key + same body on a retry returns the first refund).
    ``amount_paise``: integer paise. Returns the refund entity. Raises RefundRefused
    (400: definite) or RazorpayError (409 in progress, 5xx, timeout: the refund may or
    may not exist -- recover by listing, never by a new key)."""
    try:
        with _client() as client:
            response = client.post(
                f"/v1/payments/{quote(payment_id, safe='')}/refund",
                json={"amount": amount_paise, "speed": speed, "receipt": receipt[:40],
                      "notes": notes},
                headers={REFUND_IDEMPOTENCY_HEADER: idempotency_key})
    except httpx.HTTPError as exc:
        raise RazorpayError(f"create_refund: {type(exc).__name__}: {exc}") from exc
    if response.status_code == 400:
        try:
            description = response.json()["error"]["description"]
        except (ValueError, KeyError, TypeError):
            description = response.text[:300]
        raise RefundRefused(str(description)[:500])
    return _json(response)


def payment_refunds(payment_id: str) -> list[dict[str, Any]]:
    """``GET /v1/payments/{id}/refunds?count=100``: the payment's refund entities."""
    try:
        with _client() as client:
            return _json(client.get(f"/v1/payments/{quote(payment_id, safe='')}/refunds",
                                    params={"count": 100})).get("items", [])
    except httpx.HTTPError as exc:
        raise RazorpayError(f"payment_refunds: {type(exc).__name__}: {exc}") from exc


def fetch_refund(refund_id: str) -> dict[str, Any]:
    """``GET /v1/refunds/{id}``: the refund entity as Razorpay holds it now."""
    try:
        with _client() as client:
            return _json(client.get(f"/v1/refunds/{quote(refund_id, safe='')}"))
    except httpx.HTTPError as exc:
        raise RazorpayError(f"fetch_refund: {type(exc).__name__}: {exc}") from exc


# --- settlements (TREASURY §3) --------------------------------------------------------

SETTLEMENTS_PAGE = 100  # docs api/settlements/fetch-all: count 1-100
RECON_PAGE = 1000  # docs api/settlements/fetch-recon: count 1-1000


def from_unix(unix: Any) -> datetime | None:
    """Razorpay's Unix seconds -> an aware UTC datetime (None stays None)."""
    return None if unix is None else datetime.fromtimestamp(int(unix), tz=UTC)


def _paise(row: dict, key: str) -> int:
    """An integer paise field of a Razorpay row; a float, a string or a bool is refused
    (money is never guessed from a lookalike, NOTES §5 bug 10)."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RazorpayError(f"{key} is not integer paise: {value!r}")
    return value


@dataclass(frozen=True)
class Settlement:
    """A settlement of our pay-in balance to our bank account (docs
    ``api/settlements/entity``). ``amount_paise`` is net (per-payment fees and taxes are
    already deducted); ``fees_paise``/``tax_paise`` are 0 for a normal settlement;
    ``status`` created | processed | failed; ``utr`` finds the credit in our bank
    statement."""

    settlement_id: str
    amount_paise: int
    fees_paise: int
    tax_paise: int
    status: str
    utr: str
    created_at: datetime
    raw: dict = field(repr=False, compare=False)

    @property
    def amount(self) -> Decimal:
        """``amount_paise`` as Decimal rupees, 2 dp."""
        return paise_to_rupees(self.amount_paise)

    @classmethod
    def parse(cls, row: Any) -> Settlement:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise RazorpayError(f"not a settlement entity: {str(row)[:200]}")
        return cls(settlement_id=row["id"], amount_paise=_paise(row, "amount"),
                   fees_paise=_paise(row, "fees"), tax_paise=_paise(row, "tax"),
                   status=str(row.get("status") or ""), utr=str(row.get("utr") or ""),
                   created_at=from_unix(row.get("created_at")), raw=row)


@dataclass(frozen=True)
class ReconItem:
    """One row of the settlement recon (docs ``api/settlements/fetch-recon``; TREASURY
    §3.2): a payment, refund, transfer or adjustment settled to us. All amounts integer
    paise; ``fee`` includes ``tax``; for a payment ``credit`` = ``amount - fee``, for a
    refund ``debit`` = ``amount``. ``entity_id``: ``pay_``/``rfnd_``/``trf_``/``adj_``;
    ``payment_id``: the parent payment of a refund or transfer (None for a payment);
    ``order_receipt``: the receipt we set on the order (our AP transaction id, the join
    key to the deposit, NOTES §1.7)."""

    entity_id: str
    type: str
    amount_paise: int
    credit_paise: int
    debit_paise: int
    fee_paise: int
    tax_paise: int
    currency: str
    settled: bool
    settlement_id: str | None
    settlement_utr: str | None
    payment_id: str | None
    order_id: str | None
    order_receipt: str | None
    method: str | None
    created_at: datetime
    settled_at: datetime | None
    raw: dict = field(repr=False, compare=False)

    @property
    def net_paise(self) -> int:
        """What this row adds to its settlement: ``credit - debit``."""
        return self.credit_paise - self.debit_paise

    @classmethod
    def parse(cls, row: Any) -> ReconItem:
        if not isinstance(row, dict) or not isinstance(row.get("entity_id"), str):
            raise RazorpayError(f"not a recon row: {str(row)[:200]}")
        return cls(
            entity_id=row["entity_id"], type=str(row.get("type") or ""),
            amount_paise=_paise(row, "amount"), credit_paise=_paise(row, "credit"),
            debit_paise=_paise(row, "debit"), fee_paise=_paise(row, "fee"),
            tax_paise=_paise(row, "tax"), currency=str(row.get("currency") or ""),
            settled=row.get("settled") is True, settlement_id=row.get("settlement_id"),
            settlement_utr=row.get("settlement_utr"), payment_id=row.get("payment_id"),
            order_id=row.get("order_id"), order_receipt=row.get("order_receipt"),
            method=row.get("method"), created_at=from_unix(row.get("created_at")),
            settled_at=from_unix(row.get("settled_at")), raw=row,
        )


def _collection(response: httpx.Response, what: str) -> list:
    try:
        body = _json(response)
    except ValueError as exc:
        raise RazorpayError(f"{what}: not JSON: {response.text[:100]!r}") from exc
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise RazorpayError(f"{what}: not a collection: {response.text[:200]}")
    return items


def _pages(path: str, params: dict[str, Any], page: int, what: str) -> Iterator[dict]:
    """Every item of a ``count``/``skip`` collection, page by page, until a short page."""
    try:
        with _client() as client:
            skip = 0
            while True:
                items = _collection(client.get(path, params={**params, "count": page,
                                                             "skip": skip}), what)
                yield from items
                if len(items) < page:
                    return
                skip += len(items)
    except httpx.HTTPError as exc:
        raise RazorpayError(f"{what}: {type(exc).__name__}: {exc}") from exc


def settlements(*, since: datetime | None = None, until: datetime | None = None
                ) -> list[Settlement]:
    """``GET /v1/settlements?from=&to=`` paged through to the end: every settlement
    created in ``[since, until]`` (aware datetimes, whole seconds, inclusive; None = no
    bound), newest first, each once (a settlement made while we page shifts the pages:
    repeats are dropped by id). Raises RazorpayError (HTTP error, timeout, unreadable
    row)."""
    params = {name: int(value.timestamp()) for name, value in (("from", since), ("to", until))
              if value is not None}
    seen: dict[str, Settlement] = {}
    for row in _pages("/v1/settlements", params, SETTLEMENTS_PAGE, "settlements"):
        item = Settlement.parse(row)
        seen.setdefault(item.settlement_id, item)
    return list(seen.values())


def settlement(settlement_id: str) -> Settlement:
    """``GET /v1/settlements/{id}``. Raises SettlementNotFound (definite) or
    RazorpayError (5xx, 401, timeout, unreadable: ask again later)."""
    try:
        with _client() as client:
            response = client.get(f"/v1/settlements/{quote(settlement_id, safe='')}")
    except httpx.HTTPError as exc:
        raise RazorpayError(f"settlement: {type(exc).__name__}: {exc}") from exc
    if response.status_code in (400, 404):
        raise SettlementNotFound(f"Razorpay {response.status_code}: {response.text[:300]}")
    try:
        return Settlement.parse(_json(response))
    except ValueError as exc:
        raise RazorpayError(f"settlement: not JSON: {response.text[:100]!r}") from exc


def settlement_recon(day: date) -> list[ReconItem]:
    """``GET /v1/settlements/recon/combined?year=&month=&day=`` paged with ``skip`` until
    a short page (TREASURY §3.3): every row settled on ``day`` (Razorpay groups rows by
    settlement date, not capture date), in Razorpay's order. Raises RazorpayError."""
    params = {"year": f"{day.year:04d}", "month": f"{day.month:02d}", "day": f"{day.day:02d}"}
    return [ReconItem.parse(row) for row in _pages("/v1/settlements/recon/combined", params,
                                                   RECON_PAGE, "settlement_recon")]
