"""JSON shapes of the Horizon stand-in, field for field as Horizon renders them
(stellar/go ``protocols/horizon`` and ``protocols/horizon/operations``; stellar-horizon
``internal/resourceadapter``; samples in ../shared/reference/horizon/).

Transactions use the Horizon 2.31 shape of the reference samples, which still carries
the deprecated ``valid_after`` / ``valid_before`` copies of the time bounds next to
``preconditions``. Every ``_links`` href is absolute and points at this stand-in (built
from the request's host), because stellar-sdk's ``.next()`` / ``.prev()`` follow them
verbatim.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import urlencode

from django.http import HttpResponse

from sandbox.horizon import core, models

PROBLEM_HOST = "https://stellar.org/horizon-errors/"
HORIZON_VERSION = "2.31.0-corridor-sandbox"
CORE_VERSION = f"stellar-core {core.PROTOCOL_VERSION}.1.0 (corridor-sandbox)"


def rfc3339(value: datetime | int) -> str:
    """RFC 3339, whole seconds, ``Z`` (Horizon's ``created_at`` / ``closed_at``)."""
    if isinstance(value, int):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def link(href: str, templated: bool = False) -> dict:
    """A HAL link (``templated`` for RFC 6570 hrefs)."""
    return {"href": href, "templated": True} if templated else {"href": href}


def hal(data: dict, status: int = 200) -> HttpResponse:
    """A JSON response as Horizon sends it (``application/hal+json``)."""
    return HttpResponse(json.dumps(data, indent=2), status=status,
                        content_type="application/hal+json; charset=utf-8")


# --- problems (stellar/go support/render/problem) --------------------------------

def problem(kind: str, title: str, status: int, detail: str | None = None,
            extras: dict | None = None) -> HttpResponse:
    """An RFC 7807 problem as Horizon renders it: ``type`` prefixed with
    ``https://stellar.org/horizon-errors/``, ``application/problem+json``."""
    body: dict = {"type": PROBLEM_HOST + kind, "title": title, "status": status}
    if detail:
        body["detail"] = detail
    if extras:
        body["extras"] = extras
    return HttpResponse(json.dumps(body, indent=2), status=status,
                        content_type="application/problem+json; charset=utf-8")


def not_found() -> HttpResponse:
    """404 ``not_found`` with Horizon's wording."""
    return problem(
        "not_found", "Resource Missing", 404,
        "The resource at the url requested was not found.  This usually occurs for one of "
        "two reasons:  The url requested is not valid, or no data in our database could be "
        "found with the parameters provided.")


def bad_request(field: str | None = None, reason: str | None = None,
                detail: str = "The request you sent was invalid in some way.") -> HttpResponse:
    """400 ``bad_request``; ``extras.invalid_field`` / ``extras.reason`` when a field is named."""
    extras = {"invalid_field": field, "reason": reason} if field is not None else None
    return problem("bad_request", "Bad Request", 400, detail, extras)


def server_error() -> HttpResponse:
    """500 ``server_error`` with Horizon's wording."""
    return problem(
        "server_error", "Internal Server Error", 500,
        "An error occurred while processing this request.  This is usually due to a bug "
        "within the server software.  Trying this request again may succeed if the bug is "
        "transient. Otherwise, please contact the system administrator.")


def unsupported_media_type() -> HttpResponse:
    """415 for a POST /transactions body that is not a form."""
    return problem(
        "unsupported_media_type", "Unsupported Media Type", 415,
        "The request has an unsupported content type. Presently, the only supported "
        "content type is application/x-www-form-urlencoded.")


def transaction_malformed(envelope_xdr: str) -> HttpResponse:
    """400 ``transaction_malformed``, echoing the posted ``tx`` in ``extras.envelope_xdr``."""
    return problem(
        "transaction_malformed", "Transaction Malformed", 400,
        "Horizon could not decode the transaction envelope in this request. A transaction "
        "should be an XDR TransactionEnvelope struct encoded using base64.  The envelope "
        "read from this request is echoed in the `extras.envelope_xdr` field of this "
        "response for your convenience.",
        {"envelope_xdr": envelope_xdr})


def transaction_failed(envelope_xdr: str, result_xdr: str) -> HttpResponse:
    """400 ``transaction_failed`` (stellar-horizon actions/submit_transaction.go)."""
    return problem(
        "transaction_failed", "Transaction Failed", 400,
        "The transaction failed when submitted to the stellar network. The "
        "`extras.result_codes` field on this response contains further details.  "
        "Descriptions of each code can be found at: https://developers.stellar.org/api/"
        "errors/http-status-codes/horizon-specific/transaction-failed/",
        {"envelope_xdr": envelope_xdr, "result_xdr": result_xdr,
         "result_codes": core.result_codes(result_xdr)})


def stale_history() -> HttpResponse:
    """503 ``stale_history``: Horizon refuses while its history lags core (stellar/go
    ``services/horizon/internal/render/problem``; a 503 since stellar/go #3653)."""
    return problem(
        "stale_history", "Historical DB Is Too Stale", 503,
        "This horizon instance is configured to reject client requests when it can "
        "determine that the history database is lagging too far behind the connected "
        "instance of Stellar-Core or read replica. It's also possible that Stellar-Core "
        "is out of sync. Please try again later.")


def submission_timeout(tx_hash: str, envelope_xdr: str) -> HttpResponse:
    """504 ``transaction_submission_timeout`` with ``extras.hash`` and
    ``extras.envelope_xdr`` (Horizon >= 2.31, stellar/go PR #5328)."""
    return problem(
        "transaction_submission_timeout", "Transaction Submission Timeout", 504,
        "Your transaction submission request has timed out. This does not necessarily mean "
        "the submission has failed. Before resubmitting, please use the transaction hash "
        "provided in `extras.hash` to poll the GET /transactions endpoint for sometime and "
        "check if it was included in a ledger.",
        {"hash": tx_hash, "envelope_xdr": envelope_xdr})


# --- resources -------------------------------------------------------------------

def transaction_resource(tx: models.Transaction, base: str) -> dict:
    """The transaction resource (GET /transactions/{hash}, a 200 from POST
    /transactions, records of transaction pages). Memo rules: no ``memo`` key for
    ``none``; ``memo_bytes`` only for text."""
    pt = str(tx.id)
    data: dict = {}
    if tx.memo_type != "none":
        data["memo"] = tx.memo
        if tx.memo_type == "text":
            data["memo_bytes"] = tx.memo_bytes
    data["_links"] = {
        "self": link(f"{base}/transactions/{tx.hash}"),
        "account": link(f"{base}/accounts/{tx.source_account}"),
        "ledger": link(f"{base}/ledgers/{tx.ledger}"),
        "operations": link(f"{base}/transactions/{tx.hash}/operations{{?cursor,limit,order}}",
                           True),
        "effects": link(f"{base}/transactions/{tx.hash}/effects{{?cursor,limit,order}}", True),
        "precedes": link(f"{base}/transactions?order=asc&cursor={pt}"),
        "succeeds": link(f"{base}/transactions?order=desc&cursor={pt}"),
        "transaction": link(f"{base}/transactions/{tx.hash}"),
    }
    data.update({
        "id": tx.hash,
        "paging_token": pt,
        "successful": tx.successful,
        "hash": tx.hash,
        "ledger": tx.ledger,
        "created_at": rfc3339(tx.created_at),
        "source_account": tx.source_account,
    })
    if tx.account_muxed:
        data["account_muxed"] = tx.account_muxed
        data["account_muxed_id"] = tx.account_muxed_id
    data["source_account_sequence"] = str(tx.source_account_sequence)
    data["fee_account"] = tx.fee_account
    if tx.account_muxed:
        data["fee_account_muxed"] = tx.account_muxed
        data["fee_account_muxed_id"] = tx.account_muxed_id
    data.update({
        "fee_charged": str(tx.fee_charged),
        "max_fee": str(tx.max_fee),
        "operation_count": tx.operation_count,
        "envelope_xdr": tx.envelope_xdr,
        "result_xdr": tx.result_xdr,
        "result_meta_xdr": tx.result_meta_xdr,
        "fee_meta_xdr": tx.fee_meta_xdr,
        "memo_type": tx.memo_type,
        "signatures": tx.signatures,
    })
    preconditions: dict = {}
    if tx.has_time_bounds:
        data["valid_after"] = rfc3339(int(tx.min_time))
        timebounds = {"min_time": str(tx.min_time)}
        if tx.max_time:
            data["valid_before"] = rfc3339(int(tx.max_time))
            timebounds["max_time"] = str(tx.max_time)
        preconditions["timebounds"] = timebounds
    if tx.min_ledger is not None:
        ledgerbounds = {"min_ledger": tx.min_ledger}
        if tx.max_ledger:
            ledgerbounds["max_ledger"] = tx.max_ledger
        preconditions["ledgerbounds"] = ledgerbounds
    if tx.min_account_sequence is not None:
        preconditions["min_account_sequence"] = str(tx.min_account_sequence)
    if tx.min_account_sequence_age:
        preconditions["min_account_sequence_age"] = str(tx.min_account_sequence_age)
    if tx.min_account_sequence_ledger_gap:
        preconditions["min_account_sequence_ledger_gap"] = tx.min_account_sequence_ledger_gap
    if preconditions:
        data["preconditions"] = preconditions
    return data


# Field order of the type-specific part of operation records (stellar/go
# protocols/horizon/operations): the JSON column does not keep insertion order.
_DETAIL_ORDER = [
    "asset_type", "asset_code", "asset_issuer", "limit", "trustee", "trustor",
    "trustor_muxed", "trustor_muxed_id", "starting_balance", "funder", "funder_muxed",
    "funder_muxed_id", "account", "from", "from_muxed", "from_muxed_id", "to", "to_muxed",
    "to_muxed_id", "amount",
]


def _ordered_details(details: dict) -> dict:
    rank = {name: i for i, name in enumerate(_DETAIL_ORDER)}
    return dict(sorted(details.items(), key=lambda item: rank.get(item[0], len(rank))))


def operation_record(op: models.Operation, base: str, joined: dict | None = None) -> dict:
    """An operation record (payments and operations pages). ``joined``: the transaction
    resource embedded under ``transaction`` (``join=transactions``)."""
    oid = str(op.id)
    data: dict = {
        "_links": {
            "self": link(f"{base}/operations/{oid}"),
            "transaction": link(f"{base}/transactions/{op.transaction.hash}"),
            "effects": link(f"{base}/operations/{oid}/effects"),
            "succeeds": link(f"{base}/effects?order=desc&cursor={oid}"),
            "precedes": link(f"{base}/effects?order=asc&cursor={oid}"),
        },
        "id": oid,
        "paging_token": oid,
        "transaction_successful": op.successful,
        "source_account": op.source_account,
    }
    if op.source_account_muxed:
        data["source_account_muxed"] = op.source_account_muxed
        data["source_account_muxed_id"] = op.source_account_muxed_id
    data.update({
        "type": op.type,
        "type_i": op.type_i,
        "created_at": rfc3339(op.created_at),
        "transaction_hash": op.transaction.hash,
    })
    if joined is not None:
        data["transaction"] = joined
    data.update(_ordered_details(op.details))
    return data


def account_resource(account: models.Account, trustlines: list[models.Trustline],
                     base: str) -> dict:
    """GET /accounts/{id}: credit balances first, native last (as Horizon); sequence as
    a string; master key as the only signer."""
    aid = account.account_id
    paged = "{?cursor,limit,order}"
    balances = [{
        "balance": core.format_amount(line.balance),
        "limit": core.format_amount(line.limit),
        "buying_liabilities": "0.0000000",
        "selling_liabilities": "0.0000000",
        "last_modified_ledger": line.last_modified_ledger,
        "is_authorized": bool(line.flags & core.TRUSTLINE_AUTHORIZED),
        "is_authorized_to_maintain_liabilities": bool(line.flags & core.TRUSTLINE_AUTHORIZED),
        **core.AssetKey(line.asset_code, line.asset_issuer).horizon_fields(),
    } for line in trustlines]
    balances.append({
        "balance": core.format_amount(account.balance),
        "buying_liabilities": "0.0000000",
        "selling_liabilities": "0.0000000",
        "asset_type": "native",
    })
    data: dict = {
        "_links": {
            "self": link(f"{base}/accounts/{aid}"),
            "transactions": link(f"{base}/accounts/{aid}/transactions{paged}", True),
            "operations": link(f"{base}/accounts/{aid}/operations{paged}", True),
            "payments": link(f"{base}/accounts/{aid}/payments{paged}", True),
            "effects": link(f"{base}/accounts/{aid}/effects{paged}", True),
            "offers": link(f"{base}/accounts/{aid}/offers{paged}", True),
            "trades": link(f"{base}/accounts/{aid}/trades{paged}", True),
            "data": link(f"{base}/accounts/{aid}/data/{{key}}", True),
        },
        "id": aid,
        "account_id": aid,
        "sequence": str(account.sequence),
    }
    if account.sequence_ledger:
        data["sequence_ledger"] = account.sequence_ledger
        data["sequence_time"] = str(account.sequence_time)
    data["subentry_count"] = account.subentry_count
    if account.home_domain:
        data["home_domain"] = account.home_domain
    data.update({
        "last_modified_ledger": account.last_modified_ledger,
        "last_modified_time": rfc3339(int(account.last_modified_time)),
        "thresholds": {"low_threshold": account.low_threshold,
                       "med_threshold": account.med_threshold,
                       "high_threshold": account.high_threshold},
        "flags": {"auth_required": bool(account.flags & 1),
                  "auth_revocable": bool(account.flags & 2),
                  "auth_immutable": bool(account.flags & 4),
                  "auth_clawback_enabled": bool(account.flags & 8)},
        "balances": balances,
        "signers": [{"weight": account.master_weight, "key": aid,
                     "type": "ed25519_public_key"}],
        "data": account.data,
        "num_sponsoring": 0,
        "num_sponsored": 0,
        "paging_token": aid,
    })
    return data


def ledger_record(ledger: models.Ledger, base: str) -> dict:
    """A ledger record (``/ledgers``; ``base_fee_in_stroops`` is what ``fetch_base_fee`` reads)."""
    seq = ledger.sequence
    paged = "{?cursor,limit,order}"
    data = {
        "_links": {
            "self": link(f"{base}/ledgers/{seq}"),
            "transactions": link(f"{base}/ledgers/{seq}/transactions{paged}", True),
            "operations": link(f"{base}/ledgers/{seq}/operations{paged}", True),
            "payments": link(f"{base}/ledgers/{seq}/payments{paged}", True),
            "effects": link(f"{base}/ledgers/{seq}/effects{paged}", True),
        },
        "id": ledger.hash,
        "paging_token": str(ledger.paging_token),
        "hash": ledger.hash,
    }
    if seq > 1:
        data["prev_hash"] = ledger.prev_hash
    data.update({
        "sequence": seq,
        "successful_transaction_count": ledger.successful_transaction_count,
        "failed_transaction_count": ledger.failed_transaction_count,
        "operation_count": ledger.operation_count,
        "tx_set_operation_count": ledger.tx_set_operation_count,
        "closed_at": rfc3339(ledger.closed_at),
        "total_coins": core.format_amount(ledger.total_coins),
        "fee_pool": core.format_amount(ledger.fee_pool),
        "base_fee_in_stroops": ledger.base_fee,
        "base_reserve_in_stroops": ledger.base_reserve,
        "max_tx_set_size": ledger.max_tx_set_size,
        "protocol_version": ledger.protocol_version,
        "header_xdr": ledger.header_xdr,
    })
    return data


def root_resource(base: str, latest: models.Ledger, elder: int, passphrase: str, *,
                  core_latest: int | None = None, ingest_latest: int | None = None) -> dict:
    """GET / (stellar/go protocols/horizon ``Root``; testnet adds ``friendbot``).
    ``latest``: the last ledger in this node's history; ``core_latest`` /
    ``ingest_latest``: core's and the ingested state's heights when they differ."""
    links = {
        "account": link(f"{base}/accounts/{{account_id}}", True),
        "accounts": link(f"{base}/accounts{{?signer,sponsor,asset,liquidity_pool,cursor,"
                         "limit,order}", True),
        "account_transactions": link(
            f"{base}/accounts/{{account_id}}/transactions{{?cursor,limit,order}}", True),
        "claimable_balances": link(
            f"{base}/claimable_balances{{?asset,sponsor,claimant,cursor,limit,order}}", True),
        "assets": link(f"{base}/assets{{?asset_code,asset_issuer,cursor,limit,order}}", True),
        "effects": link(f"{base}/effects{{?cursor,limit,order}}", True),
        "fee_stats": link(f"{base}/fee_stats"),
        "friendbot": link(f"{base}/friendbot{{?addr}}", True),
        "ledger": link(f"{base}/ledgers/{{sequence}}", True),
        "ledgers": link(f"{base}/ledgers{{?cursor,limit,order}}", True),
        "liquidity_pools": link(
            f"{base}/liquidity_pools{{?reserves,account,cursor,limit,order}}", True),
        "offer": link(f"{base}/offers/{{offer_id}}", True),
        "offers": link(f"{base}/offers{{?selling,buying,seller,sponsor,cursor,limit,order}}",
                       True),
        "operation": link(f"{base}/operations/{{id}}", True),
        "operations": link(f"{base}/operations{{?cursor,limit,order,include_failed}}", True),
        "order_book": link(
            f"{base}/order_book{{?selling_asset_type,selling_asset_code,selling_asset_issuer,"
            "buying_asset_type,buying_asset_code,buying_asset_issuer,limit}", True),
        "payments": link(f"{base}/payments{{?cursor,limit,order,include_failed}}", True),
        "self": link(f"{base}/"),
        "strict_receive_paths": link(
            f"{base}/paths/strict-receive{{?source_assets,source_account,destination_account,"
            "destination_asset_type,destination_asset_issuer,destination_asset_code,"
            "destination_amount}", True),
        "strict_send_paths": link(
            f"{base}/paths/strict-send{{?destination_account,destination_assets,"
            "source_asset_type,source_asset_issuer,source_asset_code,source_amount}", True),
        "trade_aggregations": link(
            f"{base}/trade_aggregations?base_asset_type={{base_asset_type}}&base_asset_code="
            "{base_asset_code}&base_asset_issuer={base_asset_issuer}&counter_asset_type="
            "{counter_asset_type}&counter_asset_code={counter_asset_code}&"
            "counter_asset_issuer={counter_asset_issuer}", True),
        "trades": link(
            f"{base}/trades?base_asset_type={{base_asset_type}}&base_asset_code="
            "{base_asset_code}&base_asset_issuer={base_asset_issuer}&counter_asset_type="
            "{counter_asset_type}&counter_asset_code={counter_asset_code}&"
            "counter_asset_issuer={counter_asset_issuer}", True),
        "transaction": link(f"{base}/transactions/{{hash}}", True),
        "transactions": link(f"{base}/transactions{{?cursor,limit,order}}", True),
    }
    return {
        "_links": links,
        "horizon_version": HORIZON_VERSION,
        "core_version": CORE_VERSION,
        "ingest_latest_ledger": ingest_latest or latest.sequence,
        "history_latest_ledger": latest.sequence,
        "history_latest_ledger_closed_at": rfc3339(latest.closed_at),
        "history_elder_ledger": elder,
        "core_latest_ledger": core_latest or latest.sequence,
        "network_passphrase": passphrase,
        "current_protocol_version": latest.protocol_version,
        "supported_protocol_version": core.PROTOCOL_VERSION,
        "core_supported_protocol_version": core.PROTOCOL_VERSION,
    }


def _distribution(values: list[int], default: int) -> dict:
    """max, min, mode and p10..p99 (nearest rank) as strings, Horizon's fee_stats."""
    ordered = sorted(values) or [default]
    counts: dict[int, int] = {}
    for value in ordered:
        counts[value] = counts.get(value, 0) + 1
    mode = min(v for v, n in counts.items() if n == max(counts.values()))
    result = {"max": str(ordered[-1]), "min": str(ordered[0]), "mode": str(mode)}
    for p in (10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99):
        rank = max(1, -(-p * len(ordered) // 100))  # ceil(p/100 * n)
        result[f"p{p}"] = str(ordered[rank - 1])
    return result


def fee_stats(ledgers: list[models.Ledger], txs: list[models.Transaction]) -> dict:
    """GET /fee_stats over the last ledgers: per-operation fee charged and max fee bid
    (stroops, as strings); capacity usage = operations of the last ledger / max tx set
    size, two decimals."""
    last = ledgers[0]
    charged = [tx.fee_charged // max(1, tx.operation_count) for tx in txs]
    bids = [tx.max_fee // max(1, tx.operation_count) for tx in txs]
    usage = (Decimal(last.tx_set_operation_count) / Decimal(last.max_tx_set_size)).quantize(
        Decimal("0.01"))
    return {
        "last_ledger": str(last.sequence),
        "last_ledger_base_fee": str(last.base_fee),
        "ledger_capacity_usage": str(usage),
        "fee_charged": _distribution(charged, last.base_fee),
        "max_fee": _distribution(bids, last.base_fee),
    }


def page(*, url: str, extra: dict, records: list[dict], cursor: str, limit: int,
         order: str) -> dict:
    """A HAL page (stellar/go support/render/hal/page.go): ``next`` continues after the
    last record, ``prev`` goes the other way from the first; both keep the cursor when
    the page is empty."""
    inverted = "desc" if order == "asc" else "asc"

    def href(c: str, o: str) -> str:
        query = urlencode({"cursor": c, "limit": limit, "order": o, **extra})
        return f"{url}?{query}"

    first = records[0]["paging_token"] if records else cursor
    last = records[-1]["paging_token"] if records else cursor
    return {
        "_links": {
            "self": link(href(cursor, order)),
            "next": link(href(last, order)),
            "prev": link(href(first, inverted)),
        },
        "_embedded": {"records": records},
    }
