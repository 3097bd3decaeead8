"""Client of a SEP-31 receiving anchor (stellar-protocol ``ecosystem/sep-0031.md``):
``POST /transactions`` and ``GET /transactions/{id}`` under ``ANCHOR31_URL``, with
``Authorization: Bearer ANCHOR31_AUTH_TOKEN`` (a SEP-10 JWT in production).

Every call has a timeout (``ANCHOR31_TIMEOUT_S``) and httpx never retries by itself:
the legs decide. Errors:

- ``AnchorUnavailable``: timeout, connection error or 5xx — nothing is known, try again;
- ``AnchorRejected``: a 4xx answer to ``POST /transactions`` (SEP-31: 400 ``error``,
  ``transaction_info_needed``, ``customer_info_needed``) — the anchor will not take this
  payment as asked;
- ``AnchorError``: anything else unexpected (401/403, 404 for our own id, a body that is
  not the schema).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings

from common.http import tls_context

# SEP-31 transaction statuses (GET Transaction, "status" list).
PENDING_SENDER = "pending_sender"
PENDING_STELLAR = "pending_stellar"
PENDING_RECEIVER = "pending_receiver"
COMPLETED = "completed"
ERROR = "error"
REFUNDED = "refunded"
EXPIRED = "expired"


class AnchorError(Exception):
    """An answer the protocol does not allow here."""


class AnchorUnavailable(AnchorError):
    """Timeout, connection error or 5xx: the anchor said nothing we can act on."""


class AnchorRejected(AnchorError):
    """The anchor refused the transaction (4xx on POST /transactions)."""


def _client() -> httpx.Client:
    return httpx.Client(
        base_url=settings.ANCHOR31_URL.rstrip("/"),
        timeout=settings.ANCHOR31_TIMEOUT_S,
        headers={"Authorization": f"Bearer {settings.ANCHOR31_AUTH_TOKEN}"},
        verify=tls_context(),
    )


def _call(method: str, path: str, **kwargs: Any) -> httpx.Response:
    try:
        with _client() as client:
            response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:  # timeouts, refused connections, protocol errors
        raise AnchorUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500:
        raise AnchorUnavailable(f"{method} {path}: HTTP {response.status_code}")
    return response


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError as exc:
        raise AnchorError(f"HTTP {response.status_code}: not JSON") from exc
    if not isinstance(body, dict):
        raise AnchorError(f"HTTP {response.status_code}: not a JSON object")
    return body


def create_transaction(*, amount: Decimal, asset_code: str, asset_issuer: str,
                       sender_id: str, receiver_id: str,
                       fields: dict[str, Any]) -> dict[str, str]:
    """``POST /transactions``: ask the anchor to pay ``amount`` of the asset (Decimal,
    7 dp, sent as a decimal string) to the receiver described by ``fields``
    (``{"transaction": {...}}``). Returns ``{"id", "stellar_account_id",
    "stellar_memo_type", "stellar_memo"}``: where to send the USDC and under which memo.

    Not idempotent at the anchor: a retry after a timeout may leave an unfunded
    transaction behind there, which the anchor expires (it is never paid)."""
    response = _call("POST", "/transactions", json={
        "amount": format(amount, "f"), "asset_code": asset_code, "asset_issuer": asset_issuer,
        "sender_id": sender_id, "receiver_id": receiver_id, "fields": fields})
    body = _json(response)
    if 400 <= response.status_code < 500 and response.status_code not in (401, 403):
        raise AnchorRejected(f"HTTP {response.status_code}: "
                             f"{body.get('error') or body.get('message') or body}")
    if response.status_code not in (200, 201):
        raise AnchorError(f"POST /transactions: HTTP {response.status_code}: {body}")
    try:
        return {"id": str(body["id"]), "stellar_account_id": body["stellar_account_id"],
                "stellar_memo_type": body.get("stellar_memo_type") or "none",
                "stellar_memo": str(body.get("stellar_memo") or "")}
    except KeyError as exc:
        raise AnchorError(f"POST /transactions: {exc} missing in {body}") from exc


def get_transaction(transaction_id: str) -> dict[str, Any]:
    """``GET /transactions/{id}``: the ``transaction`` object (``status``,
    ``amount_in``, ``refunds`` {``amount_refunded``, ``amount_fee``, ``payments``
    [{``id`` (a Stellar hash), ``id_type``, ``amount``, ``fee``}]}, ``status_message``)."""
    response = _call("GET", f"/transactions/{transaction_id}")
    body = _json(response)
    if response.status_code != 200 or not isinstance(body.get("transaction"), dict):
        raise AnchorError(f"GET /transactions/{transaction_id}: HTTP "
                          f"{response.status_code}: {body}")
    return body["transaction"]


def refunds_of(transaction: dict[str, Any]) -> tuple[Decimal, list[dict[str, Any]]]:
    """(amount refunded, refund payments) of a transaction object; (0, []) if none."""
    refunds = transaction.get("refunds") or {}
    payments = [p for p in refunds.get("payments") or [] if isinstance(p, dict)]
    return Decimal(str(refunds.get("amount_refunded") or "0")), payments
