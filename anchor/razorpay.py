"""Razorpay pay-in client: Orders API and webhook signatures.

Amounts are integer paise at this boundary (razorpay/NOTES.md §0 rule 1). Webhook
signatures are verified over the raw request bytes (NOTES §1.5, §5 bugs 1-3) with the
``razorpay`` package's HMAC helper, never over re-serialised JSON.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import razorpay
from django.conf import settings


class RazorpayError(Exception):
    """Razorpay answered an error or could not be reached."""


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
                        timeout=settings.HTTP_TIMEOUT_S)


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


def order_payments(order_id: str) -> list[dict[str, Any]]:
    """``GET /v1/orders/{id}/payments``: the payment entities of one order."""
    try:
        with _client() as client:
            return _json(client.get(f"/v1/orders/{order_id}/payments")).get("items", [])
    except httpx.HTTPError as exc:
        raise RazorpayError(f"order_payments: {type(exc).__name__}: {exc}") from exc


def checkout_url(*, order_id: str, callback_url: str) -> str:
    """Where the customer pays. The sandbox serves a checkout page; against real
    Razorpay this is our own page embedding Checkout (RAZORPAY_CHECKOUT_URL)."""
    base = getattr(settings, "RAZORPAY_CHECKOUT_URL", "") or (
        settings.RAZORPAY_API_URL.rstrip("/") + "/sandbox/checkout")
    return str(httpx.URL(f"{base}/{order_id}", params={"callback_url": callback_url}))


def verify_webhook(body: bytes, signature: str) -> bool:
    """True when ``signature`` is the hex HMAC-SHA256 of the exact ``body`` bytes under
    the current webhook secret (or the previous one during a rotation, NOTES §1.5)."""
    if not signature:
        return False
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    secrets = [settings.RAZORPAY_WEBHOOK_SECRET, settings.RAZORPAY_WEBHOOK_PREVIOUS_SECRET]
    utility = razorpay.Client(auth=("", "")).utility
    for secret in filter(None, secrets):
        try:
            # razorpay-python #121: it needs str; the UTF-8 decode keeps the exact bytes.
            utility.verify_webhook_signature(text, signature, secret)
            return True
        except razorpay.errors.SignatureVerificationError:
            continue
    return False
