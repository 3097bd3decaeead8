"""The SEP-31 API of the receiving-anchor stand-in: authentication, ``GET /info``,
``POST /transactions``, ``GET /transactions/:id`` (SEP-31 v3.0.0, stellar-protocol
``ecosystem/sep-0031.md``; section names below are that text's headings).

- Authentication (SEP-31 "Authentication"): every endpoint wants ``Authorization:
  Bearer <token>``; a request without a valid one is answered 403. SEP-10 is reduced to
  a sandbox token: ``sandbox-sep31:<G... account>``, or a token of the AP stand-in's
  token shortcut (``POST /ap/sep/sandbox-token``). Any account is a partner here (no
  bilateral list), but a
  transaction is only visible to the account that created it (404 to anyone else).
- ``GET /info`` (SEP-31 "GET Info"): one asset, ``USDC`` of the sandbox issuer, 1:1 with
  no SEP-38 quotes, no fee, KYC types ``sep31-sender`` / ``sep31-receiver`` (SEP-12 is
  not served: any non-empty ``sender_id`` / ``receiver_id`` is accepted) and the
  deprecated ``fields.transaction`` an Indian bank payout needs.
- ``POST /transactions`` (SEP-31 "POST Transactions"): 201 with ``id``,
  ``stellar_account_id`` (``sandbox.keys.ANCHOR31``), ``stellar_memo_type`` ``id`` and
  ``stellar_memo`` (a random uint64 as a decimal string, unique). Refusals are 400s in the
  three shapes of that section: ``{"error": "customer_info_needed", "type"}`` for a
  missing ``sender_id`` / ``receiver_id``, ``{"error": "transaction_info_needed",
  "fields": {"transaction": {...}}}`` for missing ``fields.transaction`` entries, and
  ``{"error": "<reason>"}`` otherwise. ``amount`` is a decimal string or JSON number,
  positive, at most 7 decimals (Stellar's precision), within ``min_amount`` /
  ``max_amount``. An absent ``asset_issuer`` means the sandbox issuer (as AP looks the
  asset up by code). ``refund_memo`` / ``refund_memo_type`` (v2.2.0) come together.
  ``quote_id`` / ``destination_asset`` are refused (``quotes_supported`` is false).
- ``GET /transactions/:id`` (SEP-31 "GET Transaction"): ``{"transaction": {...}}`` or 404.
  ``amount_in`` is the amount asked for ("received or to be received"), ``amount_out``
  follows "Amount Formulas" (``amount_in - amount_fee - refunds.amount_refunded -
  refunds.amount_fee``), ``refunds`` ("Refunds Object Schema", plus AP's ``id_type``
  ``"stellar"``) appears once a refund payment is in a ledger, with the deprecated
  ``refunded`` boolean. Times are UTC ISO 8601 with milliseconds and ``Z``.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from stellar_sdk import StrKey

from common import devkeys
from sandbox.anchor31 import machine, stellar
from sandbox.anchor31.models import Sep31Payment, Sep31Refund, Sep31Transaction
from sandbox.control import faults
from sandbox.keys import ANCHOR31, USDC_ISSUER

DB = "sandbox"
TOKEN_PREFIX = devkeys.SANDBOX_ANCHOR31_TOKEN_PREFIX  # production refuses it (E003)
MIN_AMOUNT = Decimal("0.01")
MAX_AMOUNT = Decimal("1000000")
FEE = Decimal("0")
SENDER_TYPE = "sep31-sender"
RECEIVER_TYPE = "sep31-receiver"
TRANSACTION_FIELDS = {
    "receiver_account_number": {"description": "bank account number of the receiver"},
    "receiver_ifsc": {"description": "IFSC of the receiver's bank branch"},
    "type": {"description": "payout rail", "choices": ["IMPS", "NEFT"], "optional": True},
}
_IFSC = re.compile(r"^[A-Z]{4}0[A-Z0-9]{6}$")
_ACCOUNT_NUMBER = re.compile(r"^[0-9]{9,18}$")
iso = machine.iso


class Sep31Error(Exception):
    """A refused request: HTTP ``status`` and the JSON ``body`` to answer."""

    def __init__(self, status: int, body: dict):
        super().__init__(body.get("error"))
        self.status = status
        self.body = body


def _bad(message: str) -> Sep31Error:
    return Sep31Error(400, {"error": message})


# --------------------------------------------------------------------------- auth


def authenticate(header: str | None) -> str:
    """The sending anchor's account from ``Authorization: Bearer ...`` (SEP-31
    "Authentication"). Raises Sep31Error 403."""
    forbidden = Sep31Error(403, {"error": "forbidden"})
    if not header or not header.startswith("Bearer "):
        raise forbidden
    token = header[len("Bearer "):].strip()
    if token.startswith(TOKEN_PREFIX):
        account = token[len(TOKEN_PREFIX):]
        if StrKey.is_valid_ed25519_public_key(account):
            return account
        raise forbidden
    from sandbox.ap import sep  # the AP stand-in's SEP-10 token also authenticates

    try:
        return sep.read_token(header).account
    except sep.SepError:
        raise forbidden from None


# --------------------------------------------------------------------------- info


def asset_code() -> str:
    return settings.STELLAR_USDC_CODE


def asset_id() -> str:
    """SEP-38 asset identification of the received asset: ``stellar:USDC:G...``."""
    return f"stellar:{asset_code()}:{USDC_ISSUER.public_key}"


def info() -> dict:
    """The ``GET /info`` body (SEP-31 "GET Info", "Asset Object Schema")."""
    return {"receive": {asset_code(): {
        "quotes_supported": False,
        "quotes_required": False,
        "fee_fixed": 0,
        "fee_percent": 0,
        "min_amount": float(MIN_AMOUNT),
        "max_amount": float(MAX_AMOUNT),
        "sep12": {
            "sender": {"types": {SENDER_TYPE: {"description": "the person sending"}}},
            "receiver": {"types": {RECEIVER_TYPE: {"description": "the person in India "
                                                                  "receiving INR"}}},
        },
        "sender_sep12_type": SENDER_TYPE,
        "receiver_sep12_type": RECEIVER_TYPE,
        "fields": {"transaction": TRANSACTION_FIELDS},
    }}}


# --------------------------------------------------------------------------- create


def parse_body(raw: bytes) -> dict:
    """JSON object with numbers kept as Decimal. Raises Sep31Error 400."""
    try:
        body = json.loads(raw or b"{}", parse_float=Decimal)
    except ValueError:
        raise _bad("request body must be JSON") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    return body


def _amount(value) -> Decimal:
    """``amount``: a decimal string or a JSON number, positive, at most 7 decimals,
    within the limits ``GET /info`` announces."""
    if value is None:
        raise _bad("amount is required")
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise _bad("amount must be a decimal string")
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise _bad(f"amount {value!r} is not a number") from None
    if not amount.is_finite() or amount <= 0:
        raise _bad("amount must be positive")
    if amount != amount.quantize(stellar.STROOP):
        raise _bad("amount has more than 7 decimal places")
    if amount < MIN_AMOUNT:
        raise _bad(f"amount is below min_amount {MIN_AMOUNT}")
    if amount > MAX_AMOUNT:
        raise _bad(f"amount is above max_amount {MAX_AMOUNT}")
    return amount


def _asset(body: dict) -> None:
    code = body.get("asset_code")
    if not code:
        raise _bad("asset_code is required")
    if code != asset_code():
        raise _bad(f"asset_code {code} is not supported: GET /info lists the assets")
    issuer = body.get("asset_issuer")
    if issuer not in (None, "") and issuer != USDC_ISSUER.public_key:
        raise _bad(f"asset_issuer {issuer} does not issue the {code} this anchor receives")
    if body.get("quote_id") or body.get("destination_asset"):
        raise _bad("quotes are not supported: quote_id and destination_asset must be absent")


def _customers(body: dict) -> tuple[str, str]:
    """``sender_id`` / ``receiver_id``: required, as ``GET /info`` lists KYC types for
    both (SEP-31 "Customer Info Needed")."""
    ids = []
    for key, kyc_type in (("sender_id", SENDER_TYPE), ("receiver_id", RECEIVER_TYPE)):
        value = body.get(key)
        if not isinstance(value, str) or not value.strip():
            raise Sep31Error(400, {"error": "customer_info_needed", "type": kyc_type})
        if len(value) > 128:
            raise _bad(f"{key} is too long")
        ids.append(value)
    return ids[0], ids[1]


def _fields(body: dict) -> dict:
    """``fields.transaction``: every non-optional entry of ``GET /info`` (SEP-31
    "Transaction Info Needed" lists the missing ones), ``choices`` respected."""
    fields = body.get("fields") or {}
    given = fields.get("transaction") if isinstance(fields, dict) else None
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise _bad("fields.transaction must be an object")
    missing = {name: spec for name, spec in TRANSACTION_FIELDS.items()
               if not spec.get("optional") and given.get(name) in (None, "")}
    if missing:
        raise Sep31Error(400, {"error": "transaction_info_needed",
                               "fields": {"transaction": missing}})
    kept = {}
    for name, spec in TRANSACTION_FIELDS.items():
        value = given.get(name)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise _bad(f"fields.transaction.{name} must be a string")
        if "choices" in spec and value not in spec["choices"]:
            raise _bad(f"fields.transaction.{name} must be one of {', '.join(spec['choices'])}")
        kept[name] = value
    if not _ACCOUNT_NUMBER.match(kept["receiver_account_number"]):
        raise _bad("fields.transaction.receiver_account_number must be 9 to 18 digits")
    if not _IFSC.match(kept["receiver_ifsc"]):
        raise _bad("fields.transaction.receiver_ifsc is not an IFSC (e.g. HDFC0000123)")
    return kept


def _refund_memo(body: dict) -> tuple[str | None, str | None]:
    """``refund_memo`` / ``refund_memo_type`` (SEP-31 v2.2.0): both or neither."""
    memo, memo_type = body.get("refund_memo"), body.get("refund_memo_type")
    if memo in (None, "") and memo_type in (None, ""):
        return None, None
    if memo in (None, "") or memo_type in (None, ""):
        raise _bad("refund_memo and refund_memo_type must be given together")
    if memo_type not in ("id", "text", "hash"):
        raise _bad("refund_memo_type must be id, text or hash")
    try:
        stellar.make_memo(memo_type, str(memo))
    except stellar.BadMemo as exc:
        raise _bad(f"refund_memo: {exc}") from None
    return memo_type, str(memo)


def _new_memo() -> str:
    return str(secrets.randbelow(stellar.UINT64_MAX) + 1)


def create(*, client_account: str, body: dict) -> Sep31Transaction:
    """Validate a ``POST /transactions`` body and store the transaction in
    ``pending_sender`` (SEP-31 "Detailed Receiving Anchor Flow": transactions start
    there) with a fresh id memo on the anchor's account. Draws the creation-time fault
    switches (``anchor31.reject_before_funding``, ``anchor31.slow``) and schedules the
    rejection if drawn. Raises Sep31Error 400. Moves no money."""
    amount = _amount(body.get("amount"))
    _asset(body)
    sender_id, receiver_id = _customers(body)
    fields = _fields(body)
    refund_memo_type, refund_memo = _refund_memo(body)
    reject = faults.take(machine.FAULT_REJECT) is not None
    slow = faults.take(machine.FAULT_SLOW)
    slow_s = float(slow.get("seconds", 1.0)) if slow is not None else None
    now = timezone.now()
    for _ in range(5):
        tx = Sep31Transaction(
            id=str(uuid.uuid4()), status=Sep31Transaction.PENDING_SENDER,
            client_account=client_account, amount_in=amount, amount_fee=FEE,
            asset_code=asset_code(), asset_issuer=USDC_ISSUER.public_key,
            sender_id=sender_id, receiver_id=receiver_id, fields={"transaction": fields},
            stellar_account_id=ANCHOR31.public_key, memo_type="id", memo=_new_memo(),
            refund_memo_type=refund_memo_type, refund_memo=refund_memo,
            reject=reject, slow_s=slow_s, started_at=now, updated_at=now,
            history=[{"status": Sep31Transaction.PENDING_SENDER, "at": iso(now)}])
        delay = (slow_s or 0.0) if reject else machine.expiry_delay()
        tx.due_at = now + machine.seconds(delay)
        try:
            with transaction.atomic(using=DB):
                tx.save(using=DB, force_insert=True)
            return tx
        except IntegrityError:  # a memo drawn twice out of 2^64: draw again
            continue
    raise RuntimeError("could not allocate a unique memo")


def find(*, client_account: str, transaction_id: str) -> Sep31Transaction | None:
    """The caller's transaction, or None (unknown, or another account's)."""
    return Sep31Transaction.objects.using(DB).filter(
        pk=transaction_id, client_account=client_account).first()


# --------------------------------------------------------------------------- render


def _amount_text(value: Decimal) -> str:
    return stellar.amount_text(value)


def refunds_object(tx: Sep31Transaction) -> dict | None:
    """SEP-31 "Refunds Object Schema" over the refunds in a ledger, or None."""
    landed = list(tx.refunds.using(DB).filter(status=Sep31Refund.COMPLETED).order_by("id"))
    if not landed:
        return None
    return {
        "amount_refunded": _amount_text(sum((r.amount for r in landed), Decimal(0))),
        "amount_fee": _amount_text(sum((r.fee for r in landed), Decimal(0))),
        "payments": [{"id": r.hash, "id_type": "stellar", "amount": _amount_text(r.amount),
                      "fee": _amount_text(r.fee)} for r in landed],
    }


def render(tx: Sep31Transaction) -> dict:
    """The ``transaction`` object of ``GET /transactions/:id`` (SEP-31 "GET
    Transaction"); optional fields without a value are left out."""
    refunds = refunds_object(tx)
    refunded = Decimal(refunds["amount_refunded"]) if refunds else Decimal(0)
    refund_fee = Decimal(refunds["amount_fee"]) if refunds else Decimal(0)
    amount_out = max(tx.amount_in - tx.amount_fee - refunded - refund_fee, Decimal(0))
    data = {
        "id": tx.id,
        "status": tx.status,
        "status_message": tx.status_message or None,
        "amount_in": _amount_text(tx.amount_in),
        "amount_in_asset": asset_id(),
        "amount_out": _amount_text(amount_out),
        "amount_fee": _amount_text(tx.amount_fee),
        "fee_details": {"total": _amount_text(tx.amount_fee), "asset": asset_id()},
        "stellar_account_id": tx.stellar_account_id,
        "stellar_memo_type": tx.memo_type,
        "stellar_memo": tx.memo,
        "started_at": iso(tx.started_at),
        "updated_at": iso(tx.updated_at),
        "completed_at": iso(tx.completed_at),
        "stellar_transaction_id": tx.stellar_transaction_id,
        "external_transaction_id": tx.external_transaction_id,
        "refunded": bool(refunds) and refunded >= tx.amount_in,
        "refunds": refunds,
    }
    return {key: value for key, value in data.items() if value is not None}


def render_payment(payment: Sep31Payment) -> dict:
    asset = ("native" if payment.asset_type == "native"
             else f"{payment.asset_code}:{payment.asset_issuer}")
    return {
        "operation_id": payment.operation_id, "paging_token": payment.paging_token,
        "stellar_transaction_id": payment.stellar_transaction_id,
        "from": payment.from_account, "to": payment.to_account, "to_muxed": payment.to_muxed,
        "asset": asset, "amount": _amount_text(payment.amount),
        "memo_type": payment.memo_type, "memo": payment.memo, "outcome": payment.outcome,
        "detail": payment.detail, "transaction_id": payment.transaction_id,
        "observed_at": iso(payment.observed_at),
    }


def render_refund(refund: Sep31Refund) -> dict:
    asset = ("native" if refund.asset_type == "native"
             else f"{refund.asset_code}:{refund.asset_issuer}")
    return {
        "hash": refund.hash, "status": refund.status, "destination": refund.destination,
        "asset": asset, "amount": _amount_text(refund.amount), "fee": _amount_text(refund.fee),
        "memo_type": refund.memo_type, "memo": refund.memo, "last_error": refund.last_error,
        "created_at": iso(refund.created_at), "completed_at": iso(refund.completed_at),
    }


def inspect(tx: Sep31Transaction) -> dict:
    """Sandbox-only view: the SEP-31 object plus what the anchor knows behind it."""
    return {
        **render(tx),
        "client_account": tx.client_account, "sender_id": tx.sender_id,
        "receiver_id": tx.receiver_id, "fields": tx.fields,
        "refund_memo_type": tx.refund_memo_type, "refund_memo": tx.refund_memo,
        "faults": {"reject_before_funding": tx.reject, "fate": tx.fate or None,
                   "slow_s": tx.slow_s},
        "history": tx.history,
        "payments": [render_payment(p) for p in tx.payments.using(DB).order_by("seq")],
        "refund_payments": [render_refund(r) for r in tx.refunds.using(DB).order_by("id")],
    }
