"""Wallet-facing SEP server of the AP stand-in: SEP-10 reduced to a bearer token, and
SEP-24 (NOTES §4).

The drivers' shortcut, NOT SEP-10 (real SEP-10 is sandbox/ap/sep10.py at
``/ap/sep/auth``), is one call, ``POST /ap/sep/sandbox-token {"account", "memo"?,
"client_domain"?, "client_name"?}``, answering ``{"token"}``: a JWT HS256 with the
sandbox's own secret
(``SANDBOX_AP_SEP10_JWT_SECRET``), ``sub`` = the account, ``account:memo`` for a
memo-identified custodial user, or the M-address of a muxed user (AP 4.3.0+, PR #1930).
``client_name`` stands in for AP's clients config (the name AP would resolve for the
wallet, e.g. ``referenceCustodial``).

SEP-24 (``Sep24Service.deposit`` / ``withdraw``, ``SimpleInteractiveUrlConstructor``):
the transaction is created ``incomplete`` and ``transaction_created`` is published;
then SEP-9 fields in the request are forwarded to Corridor with
``PUT {SANDBOX_CALLBACK_URL}/customer`` (``type: "sep24-customer"``, ``account``, and
``memo`` / ``memo_type: "id"`` of a memo-identified user) before the wallet gets
``{"type": "interactive_customer_info_needed", "url", "id"}``. The URL is
``SANDBOX_INTERACTIVE_URL`` (scheme, host, port, path) +
``?transaction_id=<id>&token=<jwt>``, the token HS256 with ``AP_INTERACTIVE_JWT_SECRET``,
claims ``jti`` (= id), ``sub``, ``exp`` (now + ``SANDBOX_INTERACTIVE_JWT_LIFETIME_S``,
600 s), ``client_domain``, ``client_name``, ``data`` {``asset``, and ``amount``,
``client_domain``, ``lang``, ``customer_id`` when present}; no ``iat``.
"""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx
import jwt
from django.conf import settings
from django.db import transaction
from stellar_sdk import StrKey

from common.http import tls_context
from sandbox import keys
from sandbox.ap import assets, events
from sandbox.ap.models import ApTransaction
from sandbox.ap.objects import now, platform_object, token_subject

DB = "sandbox"
SEP10_LIFETIME_S = 86400

# SEP-9 natural-person and financial fields (AP Sep9Fields.extractSep9Fields).
SEP9_FIELDS = {
    "family_name", "last_name", "given_name", "first_name", "additional_name",
    "address_country_code", "state_or_province", "city", "postal_code", "address",
    "mobile_number", "mobile_number_format", "email_address", "birth_date", "birth_place",
    "birth_country_code", "bank_name", "bank_account_number", "bank_account_type",
    "bank_number", "bank_phone_number", "bank_branch_number", "external_transfer_memo",
    "clabe_number", "cbu_number", "cbu_alias", "mobile_money_number",
    "mobile_money_provider", "crypto_address", "crypto_memo", "tax_id", "tax_id_name",
    "occupation", "employer_name", "employer_address", "language_code", "id_type",
    "id_country_code", "id_issue_date", "id_expiration_date", "id_number",
    "photo_id_front", "photo_id_back", "notary_approval_of_photo_id", "ip_address",
    "photo_proof_residence", "sex", "proof_of_income", "proof_of_liveness", "referral_id",
}
JWT_DATA_FIELDS = ("amount", "client_domain", "lang", "customer_id")


class SepError(Exception):
    """A refused SEP request: HTTP ``status`` and the ``error`` text AP answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class WebAuth:
    """The decoded sandbox SEP-10 token."""

    account: str
    memo: str | None
    client_domain: str | None
    client_name: str | None


def _sep10_secret() -> str:
    return getattr(settings, "SANDBOX_AP_SEP10_JWT_SECRET",
                   "sandbox-sep10-secret-0123456789abcdef0123456789")


def _account_type(account: str) -> str | None:
    if StrKey.is_valid_ed25519_public_key(account):
        return "G"
    if StrKey.is_valid_med25519_public_key(account):
        return "M"
    if StrKey.is_valid_contract(account):
        return "C"
    return None


def _id_memo_ok(memo: str) -> bool:
    return memo.isdigit() and int(memo) <= 2**64 - 1


def issue_token(*, account: str | None, memo: str | None = None,
                client_domain: str | None = None, client_name: str | None = None) -> str:
    """A sandbox SEP-10 token for ``account``. Raises SepError 400."""
    if not account or _account_type(account) is None:
        raise SepError(400, f"invalid account {account}")
    if memo is not None:
        memo = str(memo)
        if _account_type(account) == "M":
            raise SepError(400, "memo cannot be used with a muxed account")
        if not _id_memo_ok(memo):
            raise SepError(400, "invalid 'memo' value. Expected a 64-bit integer.")
    issued = int(time.time())
    claims = {
        "iss": f"{settings.SANDBOX_URL.rstrip('/')}/ap/sep/auth",
        "sub": f"{account}:{memo}" if memo else account,
        "iat": issued,
        "exp": issued + SEP10_LIFETIME_S,
        "jti": uuid.uuid4().hex,
    }
    if client_domain:
        claims["client_domain"] = client_domain
    if client_name:
        claims["client_name"] = client_name
    return jwt.encode(claims, _sep10_secret(), algorithm="HS256")


def read_token(header: str | None) -> WebAuth:
    """Decode ``Authorization: Bearer <token>``. Raises SepError 403 ``forbidden``."""
    if not header or not header.startswith("Bearer "):
        raise SepError(403, "forbidden")
    try:
        claims = jwt.decode(header[len("Bearer "):], _sep10_secret(), algorithms=["HS256"],
                            options={"verify_aud": False, "verify_iat": False})
    except jwt.InvalidTokenError:
        raise SepError(403, "forbidden") from None
    subject = str(claims.get("sub") or "")
    account, _, memo = subject.partition(":")
    if not account:
        raise SepError(403, "forbidden")
    return WebAuth(account, memo or None, claims.get("client_domain"), claims.get("client_name"))


def _memo(memo: str | None, memo_type: str | None) -> tuple[str | None, str | None]:
    """AP ``MemoHelper.makeMemo``: ``(memo, memo_type)`` as stored, or SepError 400.
    Missing ``memo_type`` means text; hash memos are base64 of 32 bytes."""
    if memo is None or memo == "":
        return None, None
    kind = (memo_type or "text").lower()
    if kind == "id":
        if not _id_memo_ok(memo):
            raise SepError(400, f"Invalid memo {memo} of type:{kind}")
    elif kind == "text":
        if len(memo.encode()) > 28:
            raise SepError(400, f"Invalid memo {memo} of type:{kind}")
    elif kind == "hash":
        try:
            if len(base64.b64decode(memo, validate=True)) != 32:
                raise ValueError
        except (binascii.Error, ValueError):
            raise SepError(400, f"Invalid memo {memo} of type:{kind}") from None
    else:
        raise SepError(400, f"Invalid memo type: {memo_type}")
    return memo, kind


def _checked_amount(amount: str | None, asset: assets.Asset) -> str | None:
    if amount is None or amount == "":
        return None
    number = assets.parse_decimal(amount)
    if number is None or number <= 0:
        raise SepError(400, f"invalid amount {amount} for asset {asset.code}")
    return amount


def _interactive_base() -> str:
    """Scheme, host, port and path of ``SANDBOX_INTERACTIVE_URL`` (its query dropped)."""
    parts = urlsplit(settings.SANDBOX_INTERACTIVE_URL)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def interactive_token(txn: ApTransaction, request: dict, asset: assets.Asset) -> str:
    """The interactive-URL JWT (NOTES §4.2)."""
    lifetime = int(getattr(settings, "SANDBOX_INTERACTIVE_JWT_LIFETIME_S", 600))
    data = {k: request[k] for k in JWT_DATA_FIELDS if request.get(k) not in (None, "")}
    data["asset"] = asset.id
    claims = {"jti": txn.id, "sub": token_subject(txn), "exp": int(time.time()) + lifetime}
    if txn.client_domain:
        claims["client_domain"] = txn.client_domain
    if txn.client_name:
        claims["client_name"] = txn.client_name
    claims["data"] = data
    return jwt.encode(claims, settings.AP_INTERACTIVE_JWT_SECRET, algorithm="HS256")


def forward_kyc_fields(request: dict, auth: WebAuth) -> None:
    """``PUT {SANDBOX_CALLBACK_URL}/customer`` with the request's SEP-9 fields, if any.

    Corridor's answer maps as AP's ``PlatformIntegrationHelper`` does: 400 -> 400 with its
    ``error``, 404 -> 404, anything else (or no answer) -> 502."""
    fields = {k: v for k, v in request.items() if k in SEP9_FIELDS and v not in (None, "")}
    if not fields:
        return
    body = {**fields, "account": auth.account, "type": "sep24-customer"}
    if auth.memo:
        body["memo"], body["memo_type"] = auth.memo, "id"
    url = settings.SANDBOX_CALLBACK_URL.rstrip("/") + "/customer"
    try:
        response = httpx.put(url, json=body, timeout=float(getattr(settings, "HTTP_TIMEOUT_S", 10)),
                             headers={"Authorization": f"Bearer {events.callback_token()}"},
                             verify=tls_context())
    except httpx.HTTPError as exc:
        raise SepError(502, f"{type(exc).__name__}: {exc}") from None
    if 200 <= response.status_code < 300:
        return
    try:
        detail = response.json().get("error")
    except (ValueError, AttributeError):
        detail = None
    if response.status_code == 400:
        raise SepError(400, detail or "Bad Request")
    if response.status_code == 404:
        raise SepError(404, detail or "Not Found")
    raise SepError(502, "internal server error")


def start_interactive(*, kind: str, auth: WebAuth, request: dict, client_ip: str | None) -> dict:
    """Create an ``incomplete`` SEP-24 deposit or withdrawal for ``auth`` and answer the
    wallet (``Sep24Service.deposit`` / ``withdraw``). ``request``: the wallet's fields as
    strings. Raises SepError."""
    code, issuer = request.get("asset_code"), request.get("asset_issuer") or None
    if not code:
        raise SepError(400, "missing 'asset_code'")
    account = request.get("account") or auth.account
    if kind == "deposit" and account != auth.account:
        raise SepError(400, "'account' does not match the one in the token")
    asset = assets.by_code(code, issuer)
    if asset is None or not asset.sep24_enabled:
        raise SepError(400, f"invalid operation for asset {code}")
    amount = _checked_amount(request.get("amount"), asset)
    if _account_type(account) is None:
        raise SepError(400, f"invalid account {account}")
    if kind == "deposit" and _account_type(auth.account) == "C" and (
            (request.get("memo_type") or "").lower() != "id"):
        raise SepError(400, "C-account requires 'memo_type' to be set to 'id' in the request")
    if auth.client_domain:
        request["client_domain"] = auth.client_domain
    memo, memo_type = _memo(request.get("memo"), request.get("memo_type"))

    moment = now()
    txn = ApTransaction(
        id=str(uuid.uuid4()), kind=kind, status="incomplete",
        request_asset_code=asset.code, request_asset_issuer=asset.issuer,
        amount_expected=amount, started_at=moment, updated_at=moment,
        web_auth_account=auth.account, web_auth_account_memo=auth.memo,
        client_domain=auth.client_domain, client_name=auth.client_name,
        request_client_ip_address=client_ip, lang=request.get("lang") or None,
        memo=memo, memo_type=memo_type,
    )
    if kind == "deposit":
        txn.to_account = account
    else:
        txn.from_account = account
        txn.to_account = asset.distribution_account or keys.DISTRIBUTION.public_key
        refund_memo, refund_type = _memo(request.get("refund_memo"),
                                         request.get("refund_memo_type"))
        txn.refund_memo, txn.refund_memo_type = refund_memo, refund_type
    with transaction.atomic(using=DB):
        txn.save(using=DB, force_insert=True)
        events.publish(events.TRANSACTION_CREATED, platform_object(txn))

    forward_kyc_fields(request, auth)
    token = interactive_token(txn, request, asset)
    url = f"{_interactive_base()}?{urlencode({'transaction_id': txn.id, 'token': token})}"
    return {"type": "interactive_customer_info_needed", "url": url, "id": txn.id}


def find_for_wallet(auth: WebAuth, *, transaction_id: str | None,
                    stellar_transaction_id: str | None,
                    external_transaction_id: str | None) -> ApTransaction:
    """``Sep24Service.findTransaction``: the wallet's own transaction, else 404. Like
    AP-4.3.0 it compares only the account, not the memo, of a custodial user."""
    rows = ApTransaction.objects.using(DB)
    if transaction_id:
        txn = rows.filter(pk=transaction_id).first()
    elif stellar_transaction_id:
        txn = rows.filter(stellar_transaction_id=stellar_transaction_id).first()
    elif external_transaction_id:
        txn = rows.filter(external_transaction_id=external_transaction_id).first()
    else:
        raise SepError(400, "One of id, stellar_transaction_id or external_transaction_id is "
                            "required.")
    if txn is None or txn.web_auth_account != auth.account:
        raise SepError(404, "transaction not found")
    return txn


def sep24_info() -> dict:
    """SEP-24 ``GET /info`` (AP ``Sep24Service.getInfo``): USDC for deposit and
    withdrawal, no fee endpoint, no account creation or claimable balances."""
    asset = {"enabled": True, "min_amount": 1, "max_amount": 1000000}
    return {"deposit": {settings.STELLAR_USDC_CODE: asset},
            "withdraw": {settings.STELLAR_USDC_CODE: asset},
            "fee": {"enabled": False},
            "features": {"account_creation": False, "claimable_balances": False}}


def wallet_transactions(auth: WebAuth, params) -> list[ApTransaction]:
    """SEP-24 ``GET /transactions``: the wallet's own deposits and withdrawals of
    ``asset_code`` (required), newest first; ``kind`` deposit|withdrawal,
    ``no_older_than`` (ISO 8601), ``paging_id`` (those started before that transaction),
    ``limit`` (default and maximum 100). Raises SepError 400."""
    from django.utils.dateparse import parse_datetime

    code = params.get("asset_code")
    if not code:
        raise SepError(400, "asset code must be provided")
    if code != settings.STELLAR_USDC_CODE:
        raise SepError(400, f"invalid operation for asset {code}")
    rows = ApTransaction.objects.using(DB).filter(
        web_auth_account=auth.account, request_asset_code=code, kind__in=("deposit",
                                                                           "withdrawal"))
    kind = params.get("kind")
    if kind:
        if kind not in ("deposit", "withdrawal"):
            raise SepError(400, "kind must be deposit or withdrawal")
        rows = rows.filter(kind=kind)
    if params.get("no_older_than"):
        since = parse_datetime(params["no_older_than"])
        if since is None:
            raise SepError(400, "no_older_than must be an ISO 8601 date-time")
        rows = rows.filter(started_at__gte=since)
    if params.get("paging_id"):
        anchor = rows.filter(pk=params["paging_id"]).first()
        if anchor is None:
            raise SepError(400, "paging_id is not one of your transactions")
        rows = rows.filter(started_at__lt=anchor.started_at)
    try:
        limit = min(100, max(1, int(params.get("limit") or 100)))
    except ValueError:
        raise SepError(400, "limit must be an integer") from None
    return list(rows.order_by("-started_at", "-pk")[:limit])
