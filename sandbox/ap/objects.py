"""The JSON shapes AP puts on the wire for a SEP-24 or SEP-31 transaction.

- :func:`platform_object`: the Platform API transaction (RPC ``result``, REST bodies,
  event payloads). AP-4.3.0 ``TransactionMapper.toGetTransactionResponse(Sep24Transaction)``
  serialized by Gson in ``PlatformTransactionData`` field order, nulls left out.
  ``transfer_received_at`` and ``withdraw_anchor_account`` are not mapped for SEP-24.
- :func:`sep24_object`: the wallet-facing SEP-24 ``GET /transaction`` view
  (``Sep24Helper.fromTxn``), with ``more_info_url``.
- SEP-31 (``sep == "31"``, kind ``receive``): :func:`platform_object` follows
  ``TransactionMapper.toGetTransactionResponse(Sep31Transaction)``: ``amount_out`` is
  always present (``{}`` until known, as in the recorded examples), ``amount_expected``
  in the ``amount_in`` asset, ``transfer_received_at`` mapped, ``customers`` =
  ``{sender: {id}, receiver: {id}}``, ``creator`` = the SA's SEP-10 account/memo,
  ``funding_method``, ``refund_memo`` = the payment memo (SEP31-RECEIVE.md §3.3);
  :func:`sep31_object` is the SA's ``GET /sep31/transactions/:id`` view (no
  ``updated_at``; ``stellar_account_id`` / ``stellar_memo`` / ``stellar_memo_type`` from
  ``request_onchain_funds``; ``required_info_message`` = the last RPC ``message``).
"""

from __future__ import annotations

import datetime as dt
import time
from urllib.parse import urlencode

import jwt
from django.conf import settings

from sandbox.ap import assets
from sandbox.ap.models import ApTransaction

UTC = dt.UTC


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def instant(value: dt.datetime | None) -> str | None:
    """Java ``Instant.toString()``: ISO-8601 UTC with ``Z``, fraction in groups of three
    digits and dropped when zero (``2024-06-25T20:18:34.205694Z``)."""
    if value is None:
        return None
    value = value.astimezone(UTC)
    base = value.strftime("%Y-%m-%dT%H:%M:%S")
    micros = value.microsecond
    if micros == 0:
        return base + "Z"
    if micros % 1000 == 0:
        return f"{base}.{micros // 1000:03d}Z"
    return f"{base}.{micros:06d}Z"


def parse_instant(value: str) -> dt.datetime:
    """An ISO-8601 instant as AP's Gson adapter reads it. Raises ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"Text '{value}' could not be parsed")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"Text '{value}' could not be parsed at index 0") from None
    if parsed.tzinfo is None:
        raise ValueError(f"Text '{value}' could not be parsed: no zone offset")
    return parsed.astimezone(UTC)


def _drop_none(data: dict) -> dict:
    return {k: v for k, v in data.items() if v is not None}


def request_asset_id(txn: ApTransaction) -> str | None:
    """``makeAsset(null, ...)``: the id of the asset the wallet asked for."""
    asset = assets.by_code(txn.request_asset_code, txn.request_asset_issuer)
    return asset.id if asset else None


def _amount(amount: str | None, asset: str | None) -> dict | None:
    return _drop_none({"amount": amount, "asset": asset})


def fee_details(txn: ApTransaction) -> dict | None:
    """``JdbcSepTransaction.getFeeDetails()``: null until a fee is set."""
    if txn.amount_fee is None:
        return None
    return _drop_none({"total": txn.amount_fee, "asset": txn.amount_fee_asset,
                       "details": txn.fee_details_list})


def refunds(txn: ApTransaction) -> dict | None:
    """``TransactionMapper.toRefunds``: every amount in the ``amount_in`` asset and every
    payment rendered with ``id_type: "stellar"`` (the mapper hard-codes it)."""
    if not txn.refunds:
        return None
    asset = txn.amount_in_asset or request_asset_id(txn)
    return {
        "amount_refunded": _amount(txn.refunds.get("amount_refunded"), asset),
        "amount_fee": _amount(txn.refunds.get("amount_fee"), asset),
        "payments": [
            {"id": p["id"], "id_type": "stellar", "amount": _amount(p["amount"], asset),
             "fee": _amount(p["fee"], asset)}
            for p in txn.refunds.get("payments", [])
        ],
    }


def _stellar_id(account: str, memo: str | None) -> dict:
    return _drop_none({"account": account, "memo": memo})


def platform_object(txn: ApTransaction) -> dict:
    """The Platform API transaction object of ``txn`` (NOTES §1.7), keys in AP's order."""
    if txn.sep == "31":
        return _sep31_platform_object(txn)
    requested = request_asset_id(txn)
    customer = _stellar_id(txn.web_auth_account, txn.web_auth_account_memo)
    data = {
        "id": txn.id,
        "sep": "24",
        "kind": txn.kind,
        "status": txn.status,
        "amount_expected": _amount(txn.amount_expected, requested) if requested else None,
        "amount_in": (_amount(txn.amount_in, txn.amount_in_asset or requested)
                      if txn.amount_in is not None else None),
        "amount_out": (_amount(txn.amount_out, txn.amount_out_asset or requested)
                       if txn.amount_out is not None else None),
        "fee_details": fee_details(txn),
        "quote_id": txn.quote_id,
        "started_at": instant(txn.started_at),
        "updated_at": instant(txn.updated_at),
        "completed_at": instant(txn.completed_at),
        "user_action_required_by": instant(txn.user_action_required_by),
        "message": txn.message,
        "refunds": refunds(txn),
        "stellar_transactions": txn.stellar_transactions or None,
        "source_account": txn.from_account,
        "destination_account": txn.to_account,
        "external_transaction_id": txn.external_transaction_id,
        "memo": txn.memo,
        "memo_type": txn.memo_type,
        "refund_memo": txn.refund_memo,
        "refund_memo_type": txn.refund_memo_type,
        "client_domain": txn.client_domain,
        "client_name": txn.client_name,
        "customers": {"sender": customer, "receiver": customer},
        "creator": customer,
        "request_client_ip_address": txn.request_client_ip_address,
    }
    return _drop_none(data)


def token_subject(txn: ApTransaction) -> str:
    """``UrlConstructorHelper.getAccount``: ``account`` or ``account:memo``."""
    if txn.web_auth_account_memo:
        return f"{txn.web_auth_account}:{txn.web_auth_account_memo}"
    return txn.web_auth_account


def more_info_url(txn: ApTransaction) -> str:
    """``Sep24MoreInfoUrlConstructor``: ``base?transaction_id=&token=``, token HS256 with
    ``AP_MORE_INFO_JWT_SECRET``, claims ``jti``, ``sub``, ``exp`` (now + 600 s),
    ``client_domain``, ``client_name``, ``data``. The base is
    ``SANDBOX_MORE_INFO_URL`` (default: Corridor's ``/sep24/transaction/more_info``)."""
    base = getattr(settings, "SANDBOX_MORE_INFO_URL", None) or (
        f"{settings.CORRIDOR_URL.rstrip('/')}/sep24/transaction/more_info")
    lifetime = int(getattr(settings, "SANDBOX_MORE_INFO_JWT_LIFETIME_S", 600))
    claims = _drop_none({
        "jti": txn.id, "sub": token_subject(txn), "exp": int(time.time()) + lifetime,
        "client_domain": txn.client_domain, "client_name": txn.client_name, "data": {},
    })
    token = jwt.encode(claims, settings.AP_MORE_INFO_JWT_SECRET, algorithm="HS256")
    return f"{base}?{urlencode({'transaction_id': txn.id, 'token': token})}"


def sep24_object(txn: ApTransaction) -> dict:
    """The SEP-24 ``GET /transaction`` view (``Sep24Helper.fromTxn``)."""
    data = {
        "id": txn.id,
        "kind": txn.kind,
        "status": txn.status,
        "more_info_url": more_info_url(txn),
        "amount_in": txn.amount_in,
        "amount_in_asset": txn.amount_in_asset,
        "amount_out": txn.amount_out,
        "amount_out_asset": txn.amount_out_asset,
        "amount_fee": txn.amount_fee,
        "amount_fee_asset": txn.amount_fee_asset,
        "fee_details": fee_details(txn),  # SEP-24 v3 / AP 2.x+
        "started_at": instant(txn.started_at),
        "updated_at": instant(txn.updated_at),
        "completed_at": instant(txn.completed_at),
        "user_action_required_by": instant(txn.user_action_required_by),
        "stellar_transaction_id": txn.stellar_transaction_id,
        "external_transaction_id": txn.external_transaction_id,
        "message": txn.message,
        "refunded": txn.status == "refunded",
        "refunds": _sep24_refunds(txn),
        "from": txn.from_account,
        "to": txn.to_account,
    }
    if txn.kind == "deposit":
        data["deposit_memo"] = txn.memo
        data["deposit_memo_type"] = txn.memo_type
    else:
        data["withdraw_anchor_account"] = txn.withdraw_anchor_account
        data["withdraw_memo"] = txn.memo
        data["withdraw_memo_type"] = txn.memo_type
    return _drop_none(data)


def _sep24_refunds(txn: ApTransaction) -> dict | None:
    if not txn.refunds:
        return None
    return {
        "amount_refunded": txn.refunds.get("amount_refunded"),
        "amount_fee": txn.refunds.get("amount_fee"),
        "payments": [{"id": p["id"], "id_type": p.get("id_type", "stellar"),
                      "amount": p["amount"], "fee": p["fee"]}
                     for p in txn.refunds.get("payments", [])],
    }



def _sep31_platform_object(txn: ApTransaction) -> dict:
    asset = txn.amount_in_asset or request_asset_id(txn)
    data = {
        "id": txn.id,
        "sep": "31",
        "kind": txn.kind,
        "status": txn.status,
        "funding_method": txn.funding_method,
        "amount_expected": _amount(txn.amount_expected, asset),
        "amount_in": _amount(txn.amount_in, txn.amount_in_asset),
        "amount_out": {k: v for k, v in (("amount", txn.amount_out),
                                         ("asset", txn.amount_out_asset)) if v is not None},
        "fee_details": fee_details(txn),
        "quote_id": txn.quote_id,
        "started_at": instant(txn.started_at),
        "updated_at": instant(txn.updated_at),
        "completed_at": instant(txn.completed_at),
        "transfer_received_at": instant(txn.transfer_received_at),
        "user_action_required_by": instant(txn.user_action_required_by),
        "message": txn.message,
        "refunds": refunds(txn),
        "stellar_transactions": txn.stellar_transactions or None,
        "source_account": txn.from_account,
        "destination_account": txn.to_account,
        "external_transaction_id": txn.external_transaction_id,
        "memo": txn.memo,
        "memo_type": txn.memo_type,
        "refund_memo": txn.memo,
        "refund_memo_type": txn.memo_type,
        "client_domain": txn.client_domain,
        "client_name": txn.client_name,
        "customers": {"sender": _drop_none({"id": txn.sender_id}),
                      "receiver": _drop_none({"id": txn.receiver_id})},
        "creator": _stellar_id(txn.web_auth_account, txn.web_auth_account_memo),
        "request_client_ip_address": txn.request_client_ip_address,
    }
    return _drop_none(data)


def sep31_object(txn: ApTransaction) -> dict:
    """The SA's SEP-31 ``GET /transactions/:id`` view (``Sep31Transaction``, SEP-31
    v3.1.0 fields; no ``updated_at``)."""
    refund = None
    if txn.refunds:
        refund = {
            "amount_refunded": txn.refunds.get("amount_refunded"),
            "amount_fee": txn.refunds.get("amount_fee"),
            "payments": [{"id": p["id"], "amount": p["amount"], "fee": p["fee"]}
                         for p in txn.refunds.get("payments", [])],
        }
    data = {
        "id": txn.id,
        "status": txn.status,
        "amount_in": txn.amount_in,
        "amount_in_asset": txn.amount_in_asset,
        "amount_out": txn.amount_out,
        "amount_out_asset": txn.amount_out_asset,
        "fee_details": fee_details(txn),
        "quote_id": txn.quote_id,
        "stellar_account_id": txn.to_account,
        "stellar_memo": txn.memo,
        "stellar_memo_type": txn.memo_type,
        "started_at": instant(txn.started_at),
        "completed_at": instant(txn.completed_at),
        "user_action_required_by": instant(txn.user_action_required_by),
        "stellar_transaction_id": txn.stellar_transaction_id,
        "external_transaction_id": txn.external_transaction_id,
        "refunded": txn.status == "refunded",
        "refunds": refund,
        "required_info_message": txn.message,
    }
    return _drop_none(data)
