"""Razorpay API conventions shared by the pay-in and payout (RazorpayX) surfaces: ids,
signatures, error bodies, HTTP Basic auth.

Error body (docs: ``errors``, ``api/orders/create``)::

    {"error": {"code": "BAD_REQUEST_ERROR", "description": "...", "source": "business",
               "step": "payment_initiation", "reason": "input_validation_failed",
               "metadata": {}, "field": "amount"}}

Descriptions quoted from the docs are marked with their page; the others are sandbox
wording (inference) and should not be matched by text in Corridor (the SDK keeps only
``description`` anyway, NOTES §3.3).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import string

from django.conf import settings
from django.http import JsonResponse

_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def new_id(prefix: str = "") -> str:
    """A Razorpay-style public id: ``prefix`` + 14 base62 characters (``order_DESxiijbl9xjDB``).
    Event ids (``X-Razorpay-Event-Id``) use the bare 14 characters (inference)."""
    return prefix + "".join(secrets.choice(_BASE62) for _ in range(14))


def hmac_sha256_hex(secret: str, message: bytes) -> str:
    """Lower-case hex HMAC-SHA256 of ``message`` (raw bytes, never re-encoded) keyed with the
    UTF-8 bytes of ``secret``. Used for webhook signatures (NOTES §1.5, key = webhook secret,
    message = exact body bytes) and the Checkout signature (NOTES §1.6)."""
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def checkout_signature(order_id: str, payment_id: str, secret: str | None = None) -> str:
    """Checkout success signature: hex HMAC-SHA256, key = API key secret
    (``RAZORPAY_KEY_SECRET``), message = ``order_id|payment_id`` (NOTES §1.6)."""
    key = settings.RAZORPAY_KEY_SECRET if secret is None else secret
    return hmac_sha256_hex(key, f"{order_id}|{payment_id}".encode())


def compact_json(value) -> bytes:
    """Compact JSON bytes with literal UTF-8 (no ``\\uXXXX`` escapes), the webhook body form
    (NOTES §4.2, §5.3)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class RazorpayError(Exception):
    """A Razorpay API error: rendered as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        description: str,
        *,
        field: str | None = None,
        status: int = 400,
        code: str = "BAD_REQUEST_ERROR",
        source: str = "business",
        step: str = "payment_initiation",
        reason: str = "input_validation_failed",
        metadata: dict | None = None,
    ):
        super().__init__(description)
        self.status = status
        self.body = {
            "error": {
                "code": code,
                "description": description,
                "source": source,
                "step": step,
                "reason": reason,
                "metadata": metadata or {},
                "field": field,
            }
        }

    def response(self) -> JsonResponse:
        return JsonResponse(self.body, status=self.status)


def server_error() -> RazorpayError:
    """A 500 ``SERVER_ERROR`` (Razorpay's 5xx body shape, docs ``errors``; sandbox
    wording), for the fault switches that take an API read down."""
    return RazorpayError("We are facing some trouble completing your request at the moment. "
                         "Please try again shortly.", status=500, code="SERVER_ERROR",
                         source="NA", step="NA", reason="NA")


def auth_error(description: str) -> RazorpayError:
    """401 for a missing or wrong key (``source``/``step``/``reason`` are ``NA`` on real
    authentication failures; descriptions are sandbox wording)."""
    return RazorpayError(description, status=401, source="NA", step="NA", reason="NA")


def check_basic_auth(request) -> None:
    """Raise a 401 ``RazorpayError`` unless the request carries HTTP Basic
    ``RAZORPAY_KEY_ID:RAZORPAY_KEY_SECRET`` (docs: ``api/sandbox-setup``)."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise auth_error("Please provide your api key for authentication purposes.")
    try:
        key_id, _, key_secret = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise auth_error("Please provide your api key for authentication purposes.")
    if not hmac.compare_digest(key_id.encode(), settings.RAZORPAY_KEY_ID.encode()):
        raise auth_error("The api key provided is invalid")
    if not hmac.compare_digest(key_secret.encode(), settings.RAZORPAY_KEY_SECRET.encode()):
        raise auth_error("Authentication failed")
