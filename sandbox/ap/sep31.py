"""SEP-31 receiving of the AP stand-in (AP-4.3.0 ``Sep31Service``; SEP31-RECEIVE.md §1-3,
§6.4, §7): ``GET /ap/sep/sep31/info``, ``POST /ap/sep/sep31/transactions``, ``GET
/ap/sep/sep31/transactions/{id}``, all behind the sandbox SEP-10 token (the sending
anchor is a custodial client; ``client_name`` of its token stands in for the ``clients``
config).

Config reproduced (§2.2): the USDC asset receives with ``quotes_supported`` and
``quotes_required`` true, ``min_amount`` 1, ``max_amount`` 5000 (Java ``Long``), funding
methods ``IMPS``, ``NEFT``, ``UPI``; ``sep31.deposit_info_generator_type: none`` (the
business server's ``request_onchain_funds`` names the account and memo).

``POST /transactions`` checks, in this order, each a 400 ``{"error"}``:

1. ``asset_code`` (``asset_code cannot be empty``) / a receive-enabled asset
   (``asset X:Y is not supported.``);
2. ``amount``: ``amount cannot be empty`` / ``amount is invalid`` / ``amount should be
   positive``; below ``min_amount``: ``sell_amount less than min limit``; above
   ``max_amount``: ``sell_amount exceeds max limit``;
3. ``funding_method``: ``funding_method cannot be empty`` / ``invalid funding method X
   for asset Y, supported types are [IMPS, NEFT, UPI]`` (``SepRequestValidator``);
4. ``fields``: ``'fields' field cannot be empty`` (4.3.0 still requires the deprecated
   object; ``{"fields": {"transaction": {}}}`` passes, §9 and §10.5);
5. ``sender_id`` / ``receiver_id`` present (``sender_id cannot be empty`` /
   ``receiver_id cannot be empty``); **their KYC is not checked** (PR #1459, §1.1);
6. the quote (``Sep31Service#preValidateQuote``, §6.4): ``quotes_required is set to
   true; quote id cannot be empty``, ``quote(id=X) was not found.``, ``quote(id=X) has
   expired at T``, ``Quote sell amount [a] is different from the SEP-31 transaction
   amount [b]``, ``Quote sell asset [a] is different from the SEP-31 transaction asset
   [b]``. Neither the quote's creator nor its earlier use is checked (4.3.0: no single
   use, #1935; no owner check, #2019), and the quote is not linked to the transaction.

The transaction is created in ``pending_receiver`` with ``amount_in`` / ``amount_out`` /
``fee_details`` from the quote (§3.4), ``amount_expected`` = ``amount``, the SA's
account and memo as creator, ``transaction_created`` published; the SA gets 201
``{"id"}``. ``GET /transactions/{id}`` answers ``{"transaction": ...}`` for its creator
only (404 ``transaction (id=X) is not found`` otherwise).

Not reproduced: the no-quote path (``quotes_required`` is true here, §3.4), client
attribution (``Client not found``), ``lang`` validation, ``refund_memo`` (absent in 4.3.0).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction

from sandbox.ap import assets, events
from sandbox.ap.models import ApQuote, ApTransaction
from sandbox.ap.objects import instant, now, platform_object, sep31_object
from sandbox.ap.sep import SepError, WebAuth

DB = "sandbox"
FUNDING_METHODS = ("IMPS", "NEFT", "UPI")
MIN_AMOUNT, MAX_AMOUNT = 1, 5000
PENDING_RECEIVER = "pending_receiver"


@dataclass(frozen=True)
class ReceiveAsset:
    """The ``sep31`` block of one asset of AP's assets config."""

    asset: assets.Asset
    quotes_supported: bool = True
    quotes_required: bool = True
    min_amount: int = MIN_AMOUNT
    max_amount: int = MAX_AMOUNT
    funding_methods: tuple[str, ...] = FUNDING_METHODS


def receive_assets() -> list[ReceiveAsset]:
    """The assets SEP-31 receiving is enabled for: USDC only."""
    return [ReceiveAsset(assets.configured()[0])]


def info() -> dict:
    """``GET /sep31/info`` (AP-4.3.0 shape, ``examples/sep31-info.response.json``)."""
    return {"receive": {
        r.asset.code: {"enabled": True, "quotes_supported": r.quotes_supported,
                       "quotes_required": r.quotes_required, "min_amount": r.min_amount,
                       "max_amount": r.max_amount, "funding_methods": list(r.funding_methods)}
        for r in receive_assets()}}


def _asset(code: str | None, issuer: str | None) -> ReceiveAsset:
    if not code:
        raise SepError(400, "asset_code cannot be empty")
    for candidate in receive_assets():
        if candidate.asset.code == code and (not issuer or candidate.asset.issuer == issuer):
            return candidate
    raise SepError(400, f"asset {code}:{issuer} is not supported.")


def _amount(value: str | None, receive: ReceiveAsset) -> Decimal:
    if value in (None, ""):
        raise SepError(400, "amount cannot be empty")
    number = assets.parse_decimal(value)
    if number is None:
        raise SepError(400, "amount is invalid")
    if number <= 0:
        raise SepError(400, "amount should be positive")
    if number < receive.min_amount:
        raise SepError(400, "sell_amount less than min limit")
    if number > receive.max_amount:
        raise SepError(400, "sell_amount exceeds max limit")
    return number


def _funding_method(value: str | None, receive: ReceiveAsset) -> str:
    if not value:
        raise SepError(400, "funding_method cannot be empty")
    if value not in receive.funding_methods:
        raise SepError(400, f"invalid funding method {value} for asset {receive.asset.code}, "
                            f"supported types are [{', '.join(receive.funding_methods)}]")
    return value


def _quote(quote_id: str | None, amount: Decimal, receive: ReceiveAsset) -> ApQuote | None:
    if not quote_id:
        if receive.quotes_required:
            raise SepError(400, "quotes_required is set to true; quote id cannot be empty")
        return None
    quote = None if "\x00" in quote_id else ApQuote.objects.using(DB).filter(
        pk=quote_id[:64]).first()
    if quote is None:
        raise SepError(400, f"quote(id={quote_id[:64]}) was not found.")
    if quote.expires_at <= now():
        raise SepError(400, f"quote(id={quote.id}) has expired at {instant(quote.expires_at)}")
    if Decimal(quote.sell_amount) != amount:
        raise SepError(400, f"Quote sell amount [{quote.sell_amount}] is different from the "
                            f"SEP-31 transaction amount [{amount}]")
    if quote.sell_asset != receive.asset.id:
        raise SepError(400, f"Quote sell asset [{quote.sell_asset}] is different from the "
                            f"SEP-31 transaction asset [{receive.asset.id}]")
    return quote


def post_transaction(body: dict, auth: WebAuth, *, client_ip: str | None) -> dict:
    """``POST /sep31/transactions``: create a ``pending_receiver`` transaction and publish
    ``transaction_created``. ``body``: the SA's JSON object. Returns ``{"id"}`` (201).
    Raises SepError 400."""
    text = {k: (None if v is None else str(v)) for k, v in body.items()
            if not isinstance(v, dict | list)}
    receive = _asset(text.get("asset_code"), text.get("asset_issuer"))
    amount = _amount(text.get("amount"), receive)
    funding_method = _funding_method(text.get("funding_method"), receive)
    fields = body.get("fields")
    if not isinstance(fields, dict):
        raise SepError(400, "'fields' field cannot be empty")
    for name in ("sender_id", "receiver_id"):
        if not text.get(name):
            raise SepError(400, f"{name} cannot be empty")
        if len(text[name]) > ApTransaction._meta.get_field(name).max_length:
            raise SepError(400, f"{name} is too long")
    quote = _quote(text.get("quote_id"), amount, receive)

    moment = now()
    txn = ApTransaction(
        id=str(uuid.uuid4()), sep="31", kind="receive", status=PENDING_RECEIVER,
        request_asset_code=receive.asset.code, request_asset_issuer=receive.asset.issuer,
        amount_expected=text["amount"], amount_in=text["amount"],
        amount_in_asset=receive.asset.id, started_at=moment, updated_at=moment,
        web_auth_account=auth.account, web_auth_account_memo=auth.memo,
        client_domain=auth.client_domain, client_name=auth.client_name,
        request_client_ip_address=client_ip, lang=text.get("lang") or None,
        funding_method=funding_method, sender_id=text["sender_id"],
        receiver_id=text["receiver_id"], fields=fields,
    )
    if quote is not None:
        txn.quote_id = quote.id
        txn.amount_in = quote.sell_amount
        txn.amount_out, txn.amount_out_asset = quote.buy_amount, quote.buy_asset
        fee = quote.fee or {}
        txn.amount_fee, txn.amount_fee_asset = fee.get("total"), fee.get("asset")
        txn.fee_details_list = fee.get("details") or None
    with transaction.atomic(using=DB):
        txn.save(using=DB, force_insert=True)
        events.publish(events.TRANSACTION_CREATED, platform_object(txn))
    return {"id": txn.id}


def get_transaction(transaction_id: str, auth: WebAuth) -> dict:
    """``GET /sep31/transactions/{id}``: the creator's own transaction, else 404."""
    txn = None if "\x00" in transaction_id else ApTransaction.objects.using(DB).filter(
        pk=transaction_id[:64], sep="31").first()
    if txn is None or txn.web_auth_account != auth.account:
        raise SepError(404, f"transaction (id={transaction_id[:64]}) is not found")
    return {"transaction": sep31_object(txn)}
