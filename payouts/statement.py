"""RazorpayX balance and account statement reads (razorpay/TREASURY.md §4.2, §5): what a
payout reconciler compares our payout attempts and ledger with. Thin and typed: amounts
integer paise (with Decimal rupee views), timestamps aware UTC datetimes, every call with
``HTTP_TIMEOUT_S``; errors are ``anchor.razorpay.RazorpayError``. No matching here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings

from anchor import razorpay as rzp
from common.http import tls_context

PAGE = 100  # docs api/x/transactions/fetch-all: count <= 100


def _client() -> httpx.Client:
    return httpx.Client(base_url=settings.RAZORPAY_API_URL.rstrip("/"),
                        auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET),
                        timeout=settings.HTTP_TIMEOUT_S, verify=tls_context())


def _paise(row: dict, key: str, default: int | None = None) -> int:
    value = row.get(key, default)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise rzp.RazorpayError(f"{key} is not integer paise: {value!r}")
    return value


def _items(response: httpx.Response, what: str) -> list:
    if response.status_code != 200:
        raise rzp.RazorpayError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")
    try:
        items = response.json().get("items")
    except (ValueError, AttributeError) as exc:
        raise rzp.RazorpayError(f"{what}: not JSON: {response.text[:100]!r}") from exc
    if not isinstance(items, list):
        raise rzp.RazorpayError(f"{what}: not a collection: {response.text[:200]}")
    return items


@dataclass(frozen=True)
class Balance:
    """One RazorpayX account's balance (``banking_balance``, TREASURY §4.2):
    ``amount_paise`` the ledger balance, ``available_paise`` what can be paid out now
    (minus liens, plus overdraft), ``refreshed_at`` when Razorpay last read the bank (a
    stale one is an unknown balance)."""

    account_number: str
    account_type: str
    amount_paise: int
    available_paise: int
    refreshed_at: datetime | None
    raw: dict = field(repr=False, compare=False)

    @property
    def available(self) -> Decimal:
        return rzp.paise_to_rupees(self.available_paise)


@dataclass(frozen=True)
class StatementRow:
    """One account statement row (docs ``api/x/transactions/entity``). ``kind`` is
    ``source.entity``: ``payout`` (a debit; ``payout_id`` its ``pout_``, ``fees_paise``/
    ``tax_paise`` what it charged, taken from the balance besides ``debit``),
    ``reversal`` (a credit of amount + fees back; ``payout_id`` the reversed payout) or
    ``bank_transfer`` (funds added; ``bank_reference``). ``balance_paise`` is after this
    row: previous + credit - debit - fees of a payout row. ``amount_paise`` excludes
    fees. ``status``/``utr``/``mode``: the payout's as of this read."""

    transaction_id: str
    account_number: str
    kind: str
    source_id: str
    amount_paise: int
    credit_paise: int
    debit_paise: int
    balance_paise: int
    fees_paise: int
    tax_paise: int
    payout_id: str | None
    utr: str | None
    status: str | None
    mode: str | None
    bank_reference: str | None
    created_at: datetime
    raw: dict = field(repr=False, compare=False)

    @classmethod
    def parse(cls, row: Any) -> StatementRow:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise rzp.RazorpayError(f"not a transaction entity: {str(row)[:200]}")
        source = row.get("source") if isinstance(row.get("source"), dict) else {}
        kind = str(source.get("entity") or "")
        if kind == "payout":
            payout_id = source.get("id")
            fees, tax = _paise(source, "fees", 0), _paise(source, "tax", 0)
        else:
            payout_id = source.get("payout_id")
            fees, tax = _paise(source, "fee", 0), _paise(source, "tax", 0)
        return cls(
            transaction_id=row["id"], account_number=str(row.get("account_number") or ""),
            kind=kind, source_id=str(source.get("id") or ""),
            amount_paise=_paise(row, "amount"), credit_paise=_paise(row, "credit"),
            debit_paise=_paise(row, "debit"), balance_paise=_paise(row, "balance"),
            fees_paise=fees, tax_paise=tax, payout_id=payout_id, utr=source.get("utr"),
            status=source.get("status"), mode=source.get("mode"),
            bank_reference=source.get("bank_reference"),
            created_at=rzp.from_unix(row.get("created_at")), raw=row,
        )

    @property
    def balance_change_paise(self) -> int:
        """How this row moved the balance: ``credit - debit``, less a payout's fees."""
        return self.credit_paise - self.debit_paise - (
            self.fees_paise if self.kind == "payout" else 0)


def balance(account_number: str | None = None) -> Balance:
    """``GET /v1/banking_balances``: the balance of ``account_number`` (default
    ``RAZORPAYX_ACCOUNT_NUMBER``). Raises RazorpayError, also when Razorpay lists no
    such account."""
    ours = account_number or settings.RAZORPAYX_ACCOUNT_NUMBER
    try:
        with _client() as client:
            items = _items(client.get("/v1/banking_balances", params={"count": PAGE}),
                           "balance")
    except httpx.HTTPError as exc:
        raise rzp.RazorpayError(f"balance: {type(exc).__name__}: {exc}") from exc
    for item in items:
        if isinstance(item, dict) and item.get("account_number") == ours:
            return Balance(account_number=ours, account_type=str(item.get("account_type")),
                           amount_paise=_paise(item, "amount"),
                           available_paise=_paise(item, "available_amount"),
                           refreshed_at=rzp.from_unix(item.get("refreshed_at")), raw=item)
    raise rzp.RazorpayError(f"balance: no banking_balance for account {ours}")


def statement(since: datetime, until: datetime, *,
              account_number: str | None = None) -> list[StatementRow]:
    """``GET /v1/transactions?account_number=&from=&to=`` paged with ``count``/``skip``
    until a short page: every row created in ``[since, until]`` (aware datetimes, whole
    seconds, inclusive), **oldest first** (Razorpay lists newest first; the order is
    Razorpay's, which is the order the balances run in), each row once (a row added
    while we page shifts the pages: repeats are dropped by id). Raises RazorpayError."""
    ours = account_number or settings.RAZORPAYX_ACCOUNT_NUMBER
    params = {"account_number": ours, "from": int(since.timestamp()),
              "to": int(until.timestamp()), "count": PAGE}
    seen: dict[str, StatementRow] = {}
    try:
        with _client() as client:
            skip = 0
            while True:
                items = _items(client.get("/v1/transactions", params={**params, "skip": skip}),
                               "statement")
                for item in items:
                    row = StatementRow.parse(item)
                    seen.setdefault(row.transaction_id, row)
                if len(items) < PAGE:
                    break
                skip += len(items)
    except httpx.HTTPError as exc:
        raise rzp.RazorpayError(f"statement: {type(exc).__name__}: {exc}") from exc
    return list(reversed(seen.values()))
