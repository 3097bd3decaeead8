"""The receiving anchor's and the partner's Horizon client: stellar-sdk's ``Server`` over
HTTP against the sandbox Horizon (``{SANDBOX_URL}/horizon``), as they would reach a real
Horizon. The SDK's own retries are off (it re-POSTs on 504 by itself); callers decide
every resubmission from ``Submitted``.
"""

from __future__ import annotations

import base64
import binascii
import threading
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import httpx
from django.conf import settings
from stellar_sdk import (
    Asset,
    HashMemo,
    IdMemo,
    Keypair,
    Memo,
    NoneMemo,
    Server,
    StrKey,
    TextMemo,
    TransactionBuilder,
    TransactionEnvelope,
)
from stellar_sdk import exceptions as sdk_errors
from stellar_sdk.client.requests_client import RequestsClient

from common.http import tls_context
from sandbox.keys import PARTNER, USDC_ISSUER

BASE_FEE = 100
TX_TIMEOUT_S = 60  # time bounds of our own envelopes: past them a lost one is provably dead
STROOP = Decimal("0.0000001")
UINT64_MAX = 2**64 - 1

_partner_lock = threading.Lock()  # the partner has one sequence: one payment at a time


def horizon_url() -> str:
    return settings.SANDBOX_URL.rstrip("/") + "/horizon"


def server() -> Server:
    submit_wait = float(getattr(settings, "SANDBOX_SUBMISSION_TIMEOUT_S", 30.0)) + 5.0
    client = RequestsClient(num_retries=0,
                            request_timeout=float(getattr(settings, "HTTP_TIMEOUT_S", 10.0)),
                            post_timeout=submit_wait)
    return Server(horizon_url(), client=client)


def usdc() -> Asset:
    return Asset(settings.STELLAR_USDC_CODE, USDC_ISSUER.public_key)


def amount_text(amount: Decimal) -> str:
    """Decimal -> Stellar's 7-decimal string ("10" -> "10.0000000")."""
    return format(amount.quantize(STROOP), "f")


@dataclass
class Submitted:
    """What a POST /transactions told us. ``state``: ``applied`` (in a ledger,
    ``successful`` says how), ``refused`` (never applied; ``codes`` from Horizon),
    ``unknown`` (timeout, 5xx, connection error: it may still land)."""

    state: str
    hash: str
    successful: bool = False
    codes: dict = field(default_factory=dict)
    error: str = ""


def submit(envelope_xdr: str, tx_hash: str) -> Submitted:
    """POST one signed envelope once. A 400 for a transaction that is in a ledger
    (``tx_failed``) is ``applied`` with ``successful`` False."""
    try:
        reply = server().submit_transaction(envelope_xdr, skip_memo_required_check=True)
    except sdk_errors.BadRequestError as exc:
        codes = (exc.extras or {}).get("result_codes", {}) or {}
        found = lookup(tx_hash)
        if found is not None:
            return Submitted("applied", tx_hash, bool(found.get("successful")), codes)
        return Submitted("refused", tx_hash, codes=codes, error=str(exc.title or exc.detail))
    except (sdk_errors.BadResponseError, sdk_errors.ConnectionError,
            sdk_errors.UnknownRequestError, sdk_errors.NotFoundError) as exc:
        return Submitted("unknown", tx_hash, error=f"{type(exc).__name__}: {exc}")
    return Submitted("applied", tx_hash, bool(reply.get("successful", True)))


def lookup(tx_hash: str) -> dict | None:
    """``GET /transactions/{hash}``: the transaction resource, or None when Horizon does
    not know it. Raises stellar-sdk's errors for anything else."""
    try:
        return server().transactions().transaction(tx_hash).call()
    except sdk_errors.NotFoundError:
        return None


def envelope_dead(envelope_xdr: str, max_time: int) -> bool:
    """Whether a signed envelope of ours can never apply, by the one proof Horizon's data
    makes consistent (horizon/NOTES.md §2.6 rule 3, corrected): ONE read of the source
    account whose ``Latest-Ledger`` header is L shows its sequence still below the
    envelope's, and ledger L closed after ``max_time``. A ``tx_bad_seq`` answer, a 404
    for the hash or a late "latest" ledger prove nothing: the sequence may have been
    consumed by this very envelope on a ledger the history nodes have not ingested.
    False whenever anything is missing or Horizon is unreachable."""
    envelope = TransactionEnvelope.from_xdr(envelope_xdr, settings.STELLAR_NETWORK_PASSPHRASE)
    source = envelope.transaction.source.account_id
    timeout = float(getattr(settings, "HTTP_TIMEOUT_S", 10.0))
    try:
        account = httpx.get(f"{horizon_url()}/accounts/{source}", timeout=timeout,
                            verify=tls_context())
        height = account.headers.get("Latest-Ledger")
        if account.status_code != 200 or not height or not height.isdigit():
            return False
        if int(account.json()["sequence"]) >= envelope.transaction.sequence:
            return False
        ledger = httpx.get(f"{horizon_url()}/ledgers/{height}", timeout=timeout,
                           verify=tls_context())
        if ledger.status_code != 200:
            return False
        closed = ledger.json()["closed_at"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return int(datetime.fromisoformat(closed.replace("Z", "+00:00")).timestamp()) > max_time


def usdc_balance(account: str) -> Decimal | None:
    """The account's USDC balance on the sandbox Horizon (None without a trustline)."""
    data = server().accounts().account_id(account).call()
    asset = usdc()
    for line in data.get("balances", []):
        if line.get("asset_code") == asset.code and line.get("asset_issuer") == asset.issuer:
            return Decimal(line["balance"])
    return None


class BadMemo(ValueError):
    """A memo that does not fit its type."""


def make_memo(memo_type: str | None, memo: str | None) -> Memo:
    """A memo given as on the wire: ``id`` a decimal uint64, ``text`` up to 28 UTF-8
    bytes, ``hash`` 32 bytes as 64 hex digits or base64 (Horizon renders hash memos in
    base64); no type = no memo. Raises BadMemo."""
    if memo_type in (None, "", "none"):
        if memo not in (None, ""):
            raise BadMemo("memo given without memo_type")
        return NoneMemo()
    if memo is None:
        raise BadMemo(f"memo_type {memo_type} needs a memo")
    memo = str(memo)
    if memo_type == "id":
        if not memo.isdigit() or int(memo) > UINT64_MAX:
            raise BadMemo("an id memo is a decimal unsigned 64-bit integer")
        return IdMemo(int(memo))
    if memo_type == "text":
        if len(memo.encode()) > 28:
            raise BadMemo("a text memo is at most 28 bytes")
        return TextMemo(memo)
    if memo_type == "hash":
        return HashMemo(hash_memo_bytes(memo))
    raise BadMemo("memo_type must be id, text or hash")


def hash_memo_bytes(memo: str) -> bytes:
    """The 32 bytes of a hash memo written as 64 hex digits or base64. Raises BadMemo."""
    try:
        raw = bytes.fromhex(memo) if len(memo) == 64 else base64.b64decode(memo, validate=True)
    except (ValueError, binascii.Error):
        raw = b""
    if len(raw) != 32:
        raise BadMemo("a hash memo is 32 bytes: 64 hex digits or base64")
    return raw


def build_payment(source: Keypair, *, destination: str, asset: Asset, amount: Decimal,
                  memo_type: str | None, memo: str | None) -> tuple[str, str, int]:
    """Load ``source``'s sequence from Horizon and sign one payment. Returns
    ``(envelope_xdr, hash, max_time)``. Raises BadMemo, stellar-sdk errors."""
    account = server().load_account(source.public_key)
    builder = TransactionBuilder(account, network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE,
                                 base_fee=BASE_FEE).set_timeout(TX_TIMEOUT_S)
    builder.append_payment_op(destination, asset, amount_text(amount))
    builder.add_memo(make_memo(memo_type, memo))
    envelope = builder.build()
    envelope.sign(source)
    max_time = envelope.transaction.preconditions.time_bounds.max_time
    return envelope.to_xdr(), envelope.hash_hex(), max_time


def valid_destination(address: str) -> bool:
    return StrKey.is_valid_ed25519_public_key(address) or StrKey.is_valid_med25519_public_key(
        address)


def partner_pay(*, destination: str, amount: Decimal, memo_type: str | None,
                memo: str | None) -> Submitted:
    """The partner pays ``amount`` USDC (Decimal, 7 dp) to ``destination`` with the
    given memo: signed with ``sandbox.keys.PARTNER``, posted once. One partner payment
    at a time in this process (one sequence number). Raises BadMemo."""
    with _partner_lock:
        envelope_xdr, tx_hash, _ = build_payment(PARTNER, destination=destination,
                                                 asset=usdc(), amount=amount,
                                                 memo_type=memo_type, memo=memo)
        return submit(envelope_xdr, tx_hash)
