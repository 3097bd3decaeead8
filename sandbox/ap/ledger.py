"""AP's ledger client against the sandbox Horizon, over real HTTP.

``notify_onchain_funds_sent`` / ``notify_onchain_funds_received`` load the Stellar
transaction by hash (AP-4.3.0 ``Horizon.getTransaction``) and record it with
``PaymentHelper.addStellarTransaction``: one ``stellar_transactions[]`` entry holding
**every** payment-type operation of the transaction (``payment``,
``path_payment_strict_send``, ``path_payment_strict_receive``), whatever its
destination, with ``amount.asset`` in SEP-11 form (``USDC:G...`` / ``native``). The
entry's ``memo`` / ``memo_type`` are the SEP transaction's, not the Stellar memo.

Base URL: ``{SANDBOX_URL}/horizon``.
"""

from __future__ import annotations

import datetime as dt

import httpx
from django.conf import settings

from common.http import tls_context
from sandbox.ap import assets

PAYMENT_TYPES = {
    "payment": "payment",
    "path_payment_strict_send": "path_payment",
    "path_payment_strict_receive": "path_payment",
}


class LedgerError(Exception):
    """The ledger could not return the transaction. ``str()`` is the detail AP appends
    to ``Failed to retrieve Stellar transaction by ID[h]: ``."""


def _horizon() -> str:
    return settings.SANDBOX_URL.rstrip("/") + "/horizon"


def _get(client: httpx.Client, path: str) -> dict:
    try:
        response = client.get(_horizon() + path)
    except httpx.HTTPError as exc:
        raise LedgerError(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        try:
            title = response.json().get("title")
        except ValueError:
            title = None
        raise LedgerError(f"{title or 'HTTP error'} (status {response.status_code})")
    return response.json()


def fetch(stellar_transaction_id: str) -> dict:
    """The transaction ``stellar_transaction_id`` as AP's ledger client sees it:
    ``{"hash", "created_at" (datetime), "envelope", "payments": [...]}``, each payment
    ``{"id", "amount": {"amount", "asset"}, "payment_type", "source_account",
    "destination_account"}``. Raises LedgerError."""
    timeout = float(getattr(settings, "HTTP_TIMEOUT_S", 10.0))
    with httpx.Client(timeout=timeout, verify=tls_context()) as client:
        tx = _get(client, f"/transactions/{stellar_transaction_id}")
        page = _get(client, f"/transactions/{stellar_transaction_id}/payments?limit=200")
    payments = []
    for record in page.get("_embedded", {}).get("records", []):
        kind = PAYMENT_TYPES.get(record.get("type"))
        if kind is None:
            continue
        payments.append({
            "id": str(record.get("id")),
            "amount": {
                "amount": record.get("amount"),
                "asset": assets.sep11_name(record.get("asset_type"), record.get("asset_code"),
                                           record.get("asset_issuer")),
            },
            "payment_type": kind,
            "source_account": record.get("from"),
            "destination_account": record.get("to"),
        })
    created_at = None
    if tx.get("created_at"):
        try:
            created_at = dt.datetime.fromisoformat(tx["created_at"]).astimezone(dt.UTC)
        except ValueError:
            created_at = None
    return {"hash": tx.get("hash", stellar_transaction_id), "created_at": created_at,
            "envelope": tx.get("envelope_xdr"), "payments": payments}
