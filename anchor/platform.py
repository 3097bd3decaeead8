"""Anchor Platform client: JSON-RPC Platform API and the REST transaction reads.

Sources: AP-4.3.0 ``PlatformRpcController`` / ``RpcService`` (``POST /`` with a JSON
array, one reply object per request, batches not atomic), ``PlatformController``
(``GET /transactions[/{id}]``), and ../shared/reference/anchor-platform/NOTES.md §1-2.

Every RPC succeeds at most once in AP (NOTES §1.6): a repeat answers -32600. Callers
that may repeat a call use :func:`rpc_once`, which re-reads the transaction on -32600
and reports whether the target state was already reached.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import jwt
from django.conf import settings

from common.http import tls_context

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class PlatformError(Exception):
    """AP could not be reached or answered outside the protocol (5xx, timeout)."""


class PlatformAuthError(PlatformError):
    """AP answered 403: a configuration error (secret, or the ``aud`` claim AP PR
    #1965 requires), never something a retry fixes."""


@dataclass
class RpcError(Exception):
    """A JSON-RPC error object: ``code`` (-32600..-32603), ``message`` as AP wrote it."""

    code: int
    message: str
    method: str = ""

    def __str__(self) -> str:
        return f"{self.method}: {self.code} {self.message}"


def _token() -> str:
    now = int(time.time())
    claims = {"iat": now, "exp": now + 30, "aud": "platform_api", "jti": uuid.uuid4().hex}
    return jwt.encode(claims, settings.AP_PLATFORM_AUTH_SECRET, algorithm="HS256")


def _client() -> httpx.Client:
    return httpx.Client(
        base_url=settings.AP_PLATFORM_URL.rstrip("/"),
        timeout=settings.HTTP_TIMEOUT_S,
        headers={"Authorization": f"Bearer {_token()}"},
        verify=tls_context(),
    )


def _check(response: httpx.Response) -> None:
    if response.status_code == 403:
        raise PlatformAuthError(f"AP refused our token (403): {response.text[:200]}")
    if response.status_code >= 500:
        raise PlatformError(f"AP answered {response.status_code}: {response.text[:200]}")


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Call one Platform RPC method; return the transaction object AP answers with.

    Raises RpcError (JSON-RPC error), PlatformAuthError (403), PlatformError
    (transport failure, timeout, 5xx; the call may or may not have been applied).
    """
    body = [{"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}]
    try:
        with _client() as client:
            response = client.post("/", json=body)
    except httpx.HTTPError as exc:
        raise PlatformError(f"{method}: {type(exc).__name__}: {exc}") from exc
    _check(response)
    if response.status_code != 200:
        raise PlatformError(f"{method}: HTTP {response.status_code}: {response.text[:200]}")
    reply = response.json()[0]
    if "error" in reply:
        error = reply["error"]
        raise RpcError(code=error.get("code", 0), message=error.get("message", ""),
                       method=method)
    return reply["result"]


def get_transaction(transaction_id: str) -> dict[str, Any] | None:
    """``GET /transactions/{id}``: the transaction object, or None when AP answers 404."""
    try:
        with _client() as client:
            response = client.get(f"/transactions/{transaction_id}")
    except httpx.HTTPError as exc:
        raise PlatformError(f"get_transaction: {type(exc).__name__}: {exc}") from exc
    _check(response)
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise PlatformError(f"get_transaction: HTTP {response.status_code}")
    return response.json()


def list_transactions(*, statuses: list[str], kind: str | None = None, sep: str = "24",
                      page_size: int = 50, max_pages: int = 100,
                      started_after: datetime | None = None) -> list[dict[str, Any]]:
    """All transactions of ``sep`` (24 or 31) in ``statuses`` (``GET /transactions?sep=``), oldest
    first, paged by ``page_number``; the last page is the first shorter than
    ``page_size`` (AP-4.3.0 AllTransactionsRepositoryImpl). With ``started_after``,
    only those AP started after that moment, newest first (``order=desc``; paging stops
    at the first older record). Offset paging can repeat or skip rows that change
    between pages: callers are idempotent and run again."""
    records: list[dict[str, Any]] = []
    with _client() as client:
        for page in range(max_pages):
            try:
                response = client.get("/transactions", params={
                    "sep": sep, "statuses": ",".join(statuses), "order_by": "created_at",
                    "order": "asc" if started_after is None else "desc",
                    "page_number": page, "page_size": page_size,
                })
            except httpx.HTTPError as exc:
                raise PlatformError(f"list_transactions: {type(exc).__name__}: {exc}") from exc
            _check(response)
            page_records = response.json().get("records", [])
            batch = page_records if started_after is None else \
                [r for r in page_records if _started(r) > started_after]
            records.extend(r for r in batch if kind is None or r.get("kind") == kind)
            if len(batch) < len(page_records) or len(page_records) < page_size:
                break
    return records


def _started(record: dict[str, Any]) -> datetime:
    """A record's ``started_at`` (ISO 8601; AP writes ``Z``); the epoch when absent."""
    value = record.get("started_at")
    if not value:
        return datetime.fromtimestamp(0, tz=UTC)
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def rpc_once(method: str, params: dict[str, Any],
             reached: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Call ``method`` so that a repeat is harmless.

    On -32600 (AP also answers it for a call that already succeeded, NOTES §1.6 and
    fault 3) the transaction is re-read; if ``reached(tx)`` holds the call counts as
    done and the fresh object is returned, otherwise the RpcError is raised.
    """
    try:
        return rpc(method, params)
    except RpcError as exc:
        if exc.code != INVALID_REQUEST:
            raise
        current = get_transaction(params["transaction_id"])
        if current is not None and reached(current):
            return current
        raise
