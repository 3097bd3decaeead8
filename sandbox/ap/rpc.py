"""JSON-RPC Platform API of the AP stand-in (NOTES §1.1-1.6): SEP-24 deposits and
withdrawals, and SEP-31 ``receive`` transactions (SEP31-RECEIVE.md §3.2-3.3).

Envelope (AP-4.3.0 ``RpcService`` / ``RpcUtil``): a batch is a JSON array answered by an
array in request order, entries run one after another and are not atomic, more than
``rpc.batch_size_limit`` (40) entries give one -32600 ``RPC batch size limit[40]
exceeded``. Each error object carries ``id`` = ``params.transaction_id``.

Status RPCs follow ``RpcTransactionStatusHandler.handle``: load (-32600 not found),
check the status against :data:`STATE_MACHINE` (-32600 not supported), validate
(-32602), compute the next status, require ``message`` for error/expired, clear
``user_action_required_by`` unless resent, apply the method's changes, set
``updated_at`` / ``completed_at`` / ``message``, save under optimistic locking (-32603
"modified by another request", PR #1896) and publish one ``transaction_status_changed``
event, also when the status did not change.

Fault switches:

- ``ap.rpc_32603_unindexed_hash``: ``notify_onchain_funds_sent`` / ``_received`` answer
  -32603 ``Failed to retrieve Stellar transaction by ID[<hash>]: ...`` while it fires, as
  when AP's ledger node has not indexed the hash yet (PR #1962). ``params.hashes``
  limits it to those hashes.
- ``ap.rpc_32603``: the status RPCs named in ``params.methods`` (all of them when
  absent) answer -32603 with ``params.message`` (default AP 4.2's concurrent
  modification text, NOTES §1.6) while it fires, before touching the transaction: an
  AP whose database or event publisher fails (a notify that never lands).
- ``ap.rpc_slow``: sleep ``params.seconds`` (default 0.5) between validation and the
  write of every status RPC, to open the window in which two concurrent RPCs both pass
  validation (the TOCTOU of PR #1896).
- ``ap.next_withdraw_memo``: force the memo ``request_onchain_funds`` generates
  (:func:`generate_memo_id`).

AP's payment observer (``sandbox.ap.observer``) calls ``notify_onchain_funds_received``
through :func:`handle_one`, the same path as the HTTP endpoint.

SEP-31 (kind ``receive``, AP-4.3.0 handlers' ``getSupportedStatuses`` for protocol 31;
"funds received" = ``transfer_received_at`` set, only by ``notify_onchain_funds_received``):

- ``request_onchain_funds``: ``pending_receiver`` (funds not received) -> ``pending_sender``
- ``notify_onchain_funds_received``: ``pending_sender`` -> ``pending_receiver``
- ``notify_customer_info_updated``: ``pending_receiver``, ``pending_customer_info_update``
  -> by the customer's status (below)
- ``notify_offchain_funds_pending``: ``pending_receiver`` (**no funds check**) ->
  ``pending_external``
- ``notify_offchain_funds_sent``: ``pending_receiver`` (**no funds check**),
  ``pending_external`` -> ``completed``
- ``notify_refund_sent``: ``pending_receiver``, ``pending_stellar`` (**no funds check**)
  -> ``refunded`` / ``pending_anchor``
- ``notify_transaction_error``: all but ``error``, ``expired``, ``completed``,
  ``refunded`` -> ``error``
- ``notify_transaction_expired``: the same, funds not received -> ``expired``
- ``notify_transaction_recovery``: ``error``, ``expired``, funds received ->
  ``pending_receiver``

Every other method is -32600 ``... kind[receive], protocol[31], funds received[B]``. The
traps are kept: payout notifies and refunds are accepted before any USDC arrived, and a
partial refund leaves the transaction in ``pending_anchor``, which only
``notify_transaction_error`` leaves (§3.3). SEP-31 specifics:

- ``request_onchain_funds``: ``sep31.deposit_info_generator_type: none``: ``memo``
  (MEMO_ID digits; -32602 ``memo and memo_type are required`` / ``Invalid id memo: X``)
  and ``destination_account`` (-32602 ``destination_account is required``) are
  required; ``memo_type`` is not read (stored type is always ``id``).
- ``notify_onchain_funds_received``: also sets ``source_account`` from the first
  payment of the Stellar transaction; no check of asset, amount or destination.
- ``notify_customer_info_updated`` (``customer_id``, ``customer_type``, ``message``):
  with ``customer_id`` AP calls ``GET {callback}/customer?id=&transaction_id=&type=``
  and reads ``status`` as ``Sep12Status.valueOf``: ``ACCEPTED`` / ``PROCESSING`` ->
  ``pending_receiver``, ``NEEDS_INFO`` -> ``pending_customer_info_update``,
  ``REJECTED`` -> ``error`` (``message`` required); any other text or a failed callback
  -> -32603. Without ``customer_id`` -> ``pending_receiver``. With one, a
  ``customer_updated`` event follows the status event.
- ``notify_refund_sent``: ``refund`` is required (-32602 ``refund is required``); a
  second refund from ``pending_receiver`` is -32600 ``Multiple refunds aren't supported
  for kind[receive], protocol[31] and action[notify_refund_sent]``; the refund replaces
  the stored list; refund + fee = ``amount_in`` -> ``refunded``, less ->
  ``pending_anchor``, more -> -32602 ``Refund amount exceeds amount_in``.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from sandbox.ap import assets, events, ledger, listing
from sandbox.ap.models import ApTransaction
from sandbox.ap.objects import instant, now, parse_instant, platform_object
from sandbox.control import faults

log = logging.getLogger(__name__)

DB = "sandbox"
JSON_RPC_VERSION = "2.0"
BATCH_SIZE_LIMIT = 40

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

CONCURRENT_MODIFICATION = (
    "Transaction was modified by another request. Please re-read the transaction state "
    "and retry if appropriate."
)

# AP-4.3.0 RpcMethod enum. The custody methods still parse but have no handler (4.2.0,
# PR #1899); notify_customer_info_updated has a handler for SEP-6 only.
KNOWN_METHODS = {
    "do_stellar_payment", "do_stellar_refund", "get_transaction", "get_transactions",
    "notify_amounts_updated", "notify_customer_info_updated",
    "notify_interactive_flow_completed", "notify_offchain_funds_available",
    "notify_offchain_funds_pending", "notify_offchain_funds_received",
    "notify_offchain_funds_sent", "notify_onchain_funds_received",
    "notify_onchain_funds_sent", "notify_refund_pending", "notify_refund_sent",
    "notify_transaction_error", "notify_transaction_expired", "notify_transaction_on_hold",
    "notify_transaction_recovery", "notify_trust_set", "request_offchain_funds",
    "request_onchain_funds", "request_trust",
}
NO_HANDLER = {"do_stellar_payment", "do_stellar_refund"}


class RpcFault(Exception):
    """A JSON-RPC error: ``code`` and AP's exact ``message``."""

    code = INTERNAL_ERROR

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidRequest(RpcFault):
    code = INVALID_REQUEST


class MethodNotFound(RpcFault):
    code = METHOD_NOT_FOUND


class InvalidParams(RpcFault):
    code = INVALID_PARAMS


class InternalError(RpcFault):
    code = INTERNAL_ERROR


# --------------------------------------------------------------------------- state machine

ANY, RECEIVED, NOT_RECEIVED = "any", "funds received", "funds not received"
FINAL = {"completed", "refunded"}
ERRORS = {"error", "expired"}
SEP24_STATUSES = [
    "incomplete", "pending_user_transfer_start", "pending_user_transfer_complete",
    "pending_external", "pending_anchor", "on_hold", "pending_stellar", "pending_trust",
    "pending_user", "completed", "refunded", "expired", "error", "no_market", "too_small",
    "too_large",
]
_NOT_CLOSED = [s for s in SEP24_STATUSES if s not in FINAL | ERRORS]
# AP SepHelper#sep31Statuses, plus pending_anchor (reached by a partial refund, §3.3).
SEP31_STATUSES = [
    "pending_sender", "pending_stellar", "pending_customer_info_update",
    "pending_transaction_info_update", "pending_receiver", "pending_external", "completed",
    "refunded", "expired", "error", "pending_anchor",
]
_SEP31_NOT_CLOSED = [s for s in SEP31_STATUSES if s not in FINAL | ERRORS]


def _from(*pairs) -> tuple[tuple[str, str], ...]:
    return tuple((p, ANY) if isinstance(p, str) else p for p in pairs)


# method -> kind -> (allowed from: ((status, funds condition), ...), target status).
# NOTES §1.6 (AP-4.3.0 getSupportedStatuses of each *Handler). A target of None is
# computed by the method (notify_refund_sent).
STATE_MACHINE: dict[str, dict[str, tuple[tuple[tuple[str, str], ...], str | None]]] = {
    "notify_interactive_flow_completed": {
        "deposit": (_from("incomplete"), "pending_anchor"),
        "withdrawal": (_from("incomplete"), "pending_anchor"),
    },
    "request_offchain_funds": {
        "deposit": (_from("incomplete", ("pending_anchor", NOT_RECEIVED)),
                    "pending_user_transfer_start"),
    },
    "request_onchain_funds": {
        "withdrawal": (_from("incomplete", ("pending_anchor", NOT_RECEIVED)),
                       "pending_user_transfer_start"),
    },
    "notify_offchain_funds_sent": {
        "deposit": (_from("pending_user_transfer_start"), "pending_external"),
        "withdrawal": (_from(("pending_anchor", RECEIVED), "pending_user_transfer_complete",
                             "pending_external"), "completed"),
    },
    "notify_offchain_funds_received": {
        "deposit": (_from("pending_user_transfer_start", "on_hold", "pending_external"),
                    "pending_anchor"),
    },
    "notify_onchain_funds_received": {
        "withdrawal": (_from("pending_user_transfer_start", "on_hold"), "pending_anchor"),
    },
    "notify_onchain_funds_sent": {
        "deposit": (_from("pending_stellar", ("pending_anchor", RECEIVED)), "completed"),
    },
    "notify_offchain_funds_pending": {
        "withdrawal": (_from(("pending_anchor", RECEIVED)), "pending_external"),
    },
    "notify_offchain_funds_available": {
        "withdrawal": (_from(("pending_anchor", RECEIVED), ("on_hold", RECEIVED)),
                       "pending_user_transfer_complete"),
    },
    "request_trust": {
        "deposit": (_from(("pending_anchor", RECEIVED)), "pending_trust"),
    },
    "notify_trust_set": {
        "deposit": (_from("pending_trust"), "pending_anchor"),
    },
    "notify_amounts_updated": {
        "deposit": (_from(("pending_anchor", RECEIVED)), "pending_anchor"),
        "withdrawal": (_from(("pending_anchor", RECEIVED)), "pending_anchor"),
    },
    "notify_transaction_on_hold": {
        "deposit": (_from("pending_user_transfer_start"), "on_hold"),
        "withdrawal": (_from("pending_user_transfer_start", "pending_anchor"), "on_hold"),
    },
    "notify_refund_pending": {
        "deposit": (_from("pending_anchor"), "pending_external"),
        "withdrawal": (_from("pending_user_transfer_complete", "pending_external"),
                       "pending_anchor"),
    },
    "notify_refund_sent": {
        "deposit": (_from("pending_external", ("pending_anchor", RECEIVED)), None),
        "withdrawal": (_from("pending_stellar", ("pending_anchor", RECEIVED)), None),
    },
    "notify_transaction_error": {
        kind: (_from(*_NOT_CLOSED), "error") for kind in ("deposit", "withdrawal")
    },
    "notify_transaction_expired": {
        kind: (tuple((s, NOT_RECEIVED) for s in _NOT_CLOSED), "expired")
        for kind in ("deposit", "withdrawal")
    },
    "notify_transaction_recovery": {
        kind: (_from(("error", RECEIVED), ("expired", RECEIVED)), "pending_anchor")
        for kind in ("deposit", "withdrawal")
    },
    # SEP-6 only in AP: no SEP-24 status supports it.
    "notify_customer_info_updated": {},
}

_RECEIVE: dict[str, tuple[tuple[tuple[str, str], ...], str | None]] = {
    "request_onchain_funds": (_from(("pending_receiver", NOT_RECEIVED)), "pending_sender"),
    "notify_onchain_funds_received": (_from("pending_sender"), "pending_receiver"),
    "notify_customer_info_updated": (_from("pending_receiver", "pending_customer_info_update"),
                                     None),
    "notify_offchain_funds_pending": (_from("pending_receiver"), "pending_external"),
    "notify_offchain_funds_sent": (_from("pending_receiver", "pending_external"), "completed"),
    "notify_refund_sent": (_from("pending_receiver", "pending_stellar"), None),
    "notify_transaction_error": (_from(*_SEP31_NOT_CLOSED), "error"),
    "notify_transaction_expired": (tuple((s, NOT_RECEIVED) for s in _SEP31_NOT_CLOSED),
                                   "expired"),
    "notify_transaction_recovery": (_from(("error", RECEIVED), ("expired", RECEIVED)),
                                    "pending_receiver"),
}
for _method, _rule in _RECEIVE.items():
    STATE_MACHINE[_method]["receive"] = _rule

# Request classes implementing SupportsUserActionRequiredBy (AP-4.3.0).
SUPPORTS_USER_ACTION_REQUIRED_BY = {
    "notify_interactive_flow_completed", "request_offchain_funds", "request_onchain_funds",
    "notify_offchain_funds_pending", "notify_offchain_funds_available", "request_trust",
    "notify_transaction_on_hold",
}


# Instant-typed params of the request classes (besides user_action_required_by).
INSTANT_PARAMS = {
    "notify_offchain_funds_received": ("funds_received_at",),
    "notify_offchain_funds_sent": ("funds_sent_at",),
}


def funds_received(txn: ApTransaction) -> bool:
    """``RpcTransactionStatusHandler.areFundsReceived``: ``transfer_received_at`` set."""
    return txn.transfer_received_at is not None


def is_supported(method: str, txn: ApTransaction) -> bool:
    rule = STATE_MACHINE[method].get(txn.kind)
    if rule is None:
        return False
    received = funds_received(txn)
    for status, condition in rule[0]:
        if status != txn.status:
            continue
        if condition == ANY or (condition == RECEIVED) == received:
            return True
    return False


def not_supported_message(method: str, txn: ApTransaction) -> str:
    return (f"RPC method[{method}] is not supported. Status[{txn.status}], kind[{txn.kind}], "
            f"protocol[{txn.sep}], "
            f"funds received[{'true' if funds_received(txn) else 'false'}]")


# --------------------------------------------------------------------------- params


def _text(value) -> str | None:
    """A JSON scalar as Gson binds it to a ``String`` field."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        raise InternalError(f"Expected a string but was {type(value).__name__.upper()}")
    return str(value)


@dataclass
class Amount:
    """``AmountAssetRequest`` / ``AmountRequest``: ``asset`` absent for the latter."""

    amount: str | None
    asset: str | None = None


@dataclass
class Fee:
    """``FeeDetails``: ``total``, ``asset``, optional ``details``."""

    total: str | None
    asset: str | None
    details: list | None


def _amount(params: dict, key: str) -> Amount | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InternalError(f"Expected BEGIN_OBJECT but was {type(value).__name__} at {key}")
    return Amount(_text(value.get("amount")), _text(value.get("asset")))


def _fee(params: dict) -> Fee | None:
    value = params.get("fee_details")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InternalError("Expected BEGIN_OBJECT but was a scalar at fee_details")
    details = value.get("details")
    if details is not None and not isinstance(details, list):
        raise InternalError("Expected BEGIN_ARRAY at fee_details.details")
    parsed = None
    if details is not None:
        parsed = []
        for item in details:
            if item is None:
                parsed.append(None)
            elif isinstance(item, dict):
                parsed.append({k: _text(v) for k, v in item.items()
                               if k in ("name", "description", "amount") and v is not None})
            else:
                raise InternalError("Expected BEGIN_OBJECT at fee_details.details")
    return Fee(_text(value.get("total")), _text(value.get("asset")), parsed)


def _instant(params: dict, key: str) -> dt.datetime | None:
    value = params.get(key)
    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise InternalError(f"java.time.format.DateTimeParseException: {exc}") from None


# --------------------------------------------------------------------------- validation
# AP-4.3.0 SepRequestValidator.validateAmount / AssetValidationUtils (messages verbatim).


def validate_amount(prefix: str, amount: str | None, allow_zero: bool) -> Decimal:
    if amount is None or amount == "":
        raise InvalidParams(f"{prefix}amount cannot be empty")
    number = assets.parse_decimal(amount)
    if number is None:
        raise InvalidParams(f"{prefix}amount is invalid")
    if allow_zero and number < 0:
        raise InvalidParams(f"{prefix}amount should be non-negative")
    if not allow_zero and number <= 0:
        raise InvalidParams(f"{prefix}amount should be positive")
    return number


def validate_asset_amount(field: str, amount: str | None, asset: str | None,
                          allow_zero: bool = False) -> None:
    number = validate_amount(f"{field}.", amount, allow_zero)
    if not asset:
        raise InvalidParams(f"{field}.asset cannot be empty")
    configured = assets.by_id(asset)
    if configured is None:
        raise InvalidParams(f"'{asset}' is not a supported asset.")
    if assets.scaled(number, configured.significant_decimals) != number:
        raise InvalidParams(f"'{amount}' has invalid significant decimals. "
                            f"Expected: '{configured.significant_decimals}'")


def validate_fee_details(fee: Fee, txn: ApTransaction | None) -> None:
    validate_asset_amount("fee_details", fee.total, fee.asset, allow_zero=True)
    if txn is not None and txn.amount_fee_asset and fee.asset != txn.amount_fee_asset:
        raise InvalidParams("fee_details.asset is different from expected database asset "
                            f"({txn.amount_fee_asset})")
    if fee.details is not None:
        total = Decimal(0)
        for index, detail in enumerate(fee.details):
            if detail is None:
                raise InvalidParams(f"fee_details.details[{index}] cannot be null")
            total += validate_amount(f"fee_details.details[{index}].", detail.get("amount"),
                                     True)
        if Decimal(fee.total) != total:
            raise InvalidParams(
                "fee_details.total is not equal to the sum of (fee_details.details.amount)")


def _stellar_side(field: str, asset: str | None, stellar: bool) -> None:
    """The kind check of AP's handlers: which side of a transfer is on Stellar."""
    if asset is None:
        raise InvalidParams(f"{field}.asset cannot be empty")
    if stellar and not assets.is_stellar_id(asset):
        raise InvalidParams(f"{field}.asset should be stellar asset")
    if not stellar and assets.is_stellar_id(asset):
        raise InvalidParams(f"{field}.asset should be non-stellar asset")


def _require(params: dict, *keys: str, blank: bool = False) -> None:
    """Bean validation (``@NotNull`` / ``@NotBlank``): default Jakarta messages, joined
    by newlines as ``RequestValidator`` does."""
    messages = []
    for key in keys:
        value = params.get(key)
        if value is None or (blank and isinstance(value, str) and not value.strip()):
            messages.append("must not be blank" if blank else "must not be null")
    if messages:
        raise InvalidParams("\n".join(messages))


def _set_fee(txn: ApTransaction, fee: Fee, with_asset: bool = True) -> None:
    txn.amount_fee = fee.total
    if with_asset:
        txn.amount_fee_asset = fee.asset
    txn.fee_details_list = fee.details


# --------------------------------------------------------------------------- methods


@dataclass
class Call:
    """One status RPC being processed: the row, its params and parsed instants."""

    method: str
    txn: ApTransaction
    params: dict
    user_action_required_by: dt.datetime | None
    instants: dict


def _interactive_completed_validate(call: Call) -> None:
    """AP ``NotifyInteractiveFlowCompletedHandler.validate``."""
    _require(call.params, "amount_in", "amount_out", "fee_details")
    deposit = call.txn.kind == "deposit"
    amount_in, amount_out = _amount(call.params, "amount_in"), _amount(call.params, "amount_out")
    fee = _fee(call.params)
    validate_asset_amount("amount_in", amount_in.amount, amount_in.asset)
    _stellar_side("amount_in", amount_in.asset, stellar=not deposit)
    validate_asset_amount("amount_out", amount_out.amount, amount_out.asset)
    _stellar_side("amount_out", amount_out.asset, stellar=deposit)
    validate_fee_details(fee, None)
    _stellar_side("fee_details", fee.asset, stellar=not deposit)
    expected = _amount(call.params, "amount_expected")
    if expected is not None:
        validate_asset_amount("amount_expected", expected.amount, amount_in.asset)


def _interactive_completed_apply(call: Call) -> None:
    txn, amount_in = call.txn, _amount(call.params, "amount_in")
    amount_out, fee = _amount(call.params, "amount_out"), _fee(call.params)
    txn.amount_in, txn.amount_in_asset = amount_in.amount, amount_in.asset
    txn.amount_out, txn.amount_out_asset = amount_out.amount, amount_out.asset
    _set_fee(txn, fee)
    expected = _amount(call.params, "amount_expected")
    txn.amount_expected = expected.amount if expected is not None else amount_in.amount


def _request_funds_validate(call: Call, *, onchain: bool) -> None:
    """AP ``RequestOffchainFundsHandler`` / ``RequestOnchainFundsHandler.validate``.

    ``onchain`` (withdrawal): ``amount_in`` and fee on Stellar, ``amount_out`` off-chain;
    otherwise (deposit) the opposite."""
    p, txn = call.params, call.txn
    amount_in, amount_out = _amount(p, "amount_in"), _amount(p, "amount_out")
    fee, expected = _fee(p), _amount(p, "amount_expected")
    if not ((amount_in is None and fee is None and expected is None)
            or (amount_in is not None and fee is not None)):
        raise InvalidParams("All (amount_out is optional) or none of the amount_in, amount_out,"
                            " and fee_details should be set")
    if amount_in is not None:
        _stellar_side("amount_in", amount_in.asset, stellar=onchain)
        validate_asset_amount("amount_in", amount_in.amount, amount_in.asset, allow_zero=True)
    if amount_out is not None:
        _stellar_side("amount_out", amount_out.asset, stellar=not onchain)
        validate_asset_amount("amount_out", amount_out.amount, amount_out.asset,
                              allow_zero=True)
    if fee is not None:
        _stellar_side("fee_details", fee.asset, stellar=onchain)
        validate_fee_details(fee, txn)
    if expected is not None:
        validate_asset_amount("amount_expected", expected.amount,
                              amount_in.asset if amount_in else None)
    if amount_in is None and txn.amount_in is None:
        raise InvalidParams("amount_in is required")
    if amount_out is None and txn.amount_out is None:
        if txn.quote_id is not None:
            raise InvalidParams("amount_out is required for transactions with firm quotes")
        if txn.amount_in_asset is not None and txn.amount_in_asset == txn.amount_out_asset:
            raise InvalidParams("amount_out is required for non-exchange transactions")
    if fee is None and txn.amount_fee is None:
        raise InvalidParams("fee_details or amount_fee is required")
    if onchain:
        _deposit_info_validate(call)


def _generator() -> str:
    """``sep24.deposit_info_generator_type``: ``self`` (AP default) or ``none``."""
    return getattr(settings, "SANDBOX_AP_DEPOSIT_INFO_GENERATOR", "self")


def _id_memo_error(memo) -> str | None:
    text = _text(memo)
    if text is None or not text.isdigit():
        return f"Invalid id memo: {text}"
    if int(text) > 2**64 - 1:
        return f"Invalid id memo: {text} is out of uint64 range"
    return None


def _generator_of(txn: ApTransaction) -> str:
    """``sep24.deposit_info_generator_type`` or, for SEP-31,
    ``sep31.deposit_info_generator_type`` (``none``, AP's default, SEP31-RECEIVE.md §2.1)."""
    return "none" if txn.sep == "31" else _generator()


def _deposit_info_validate(call: Call) -> None:
    memo, destination = call.params.get("memo"), call.params.get("destination_account")
    if _generator_of(call.txn) == "none":
        if memo is None:
            raise InvalidParams("memo and memo_type are required")
        error = _id_memo_error(memo)
        if error:
            raise InvalidParams(error)
        if destination is None:
            raise InvalidParams("destination_account is required")
    elif memo is not None or destination is not None:
        raise InvalidParams(
            "Anchor is not configured to accept memo, memo_type and destination_account. "
            "Please set configuration deposit_info_generator_type to 'none' "
            "if you want to enable this feature")


def _request_funds_apply(call: Call, *, onchain: bool) -> None:
    p, txn = call.params, call.txn
    amount_in, amount_out = _amount(p, "amount_in"), _amount(p, "amount_out")
    fee, expected = _fee(p), _amount(p, "amount_expected")
    if amount_in is not None:
        txn.amount_in, txn.amount_in_asset = amount_in.amount, amount_in.asset
    if amount_out is not None:
        txn.amount_out, txn.amount_out_asset = amount_out.amount, amount_out.asset
    if fee is not None:
        _set_fee(txn, fee)
    if expected is not None:
        txn.amount_expected = expected.amount
    elif amount_in is not None:
        txn.amount_expected = amount_in.amount
    if onchain:
        _assign_deposit_info(call)


def _assign_deposit_info(call: Call) -> None:
    """Where the wallet must pay a withdrawal. ``self`` generator
    (``Sep24DepositInfoSelfGenerator``, 4.x): the asset's distribution account, memo type
    ``id``, memo = the wallet's id memo if it sent one, else a random positive long.
    ``none``: the ``destination_account`` and ``memo`` of the request."""
    txn = call.txn
    if _generator_of(txn) == "none":
        txn.to_account = _text(call.params["destination_account"])
        if txn.sep != "31":
            txn.withdraw_anchor_account = txn.to_account
        txn.memo, txn.memo_type = _text(call.params["memo"]), "id"
        return
    asset = assets.by_code(txn.request_asset_code, txn.request_asset_issuer)
    txn.to_account = txn.withdraw_anchor_account = asset.distribution_account if asset else None
    if not (txn.memo_type == "id" and txn.memo):
        txn.memo = generate_memo_id()
    txn.memo_type = "id"


def generate_memo_id() -> str:
    """A new withdrawal memo as decimal text. AP-4.3.0 ``DepositInfoSelfGeneratorBase
    .generateMemoId`` (since PR #1929): ``SecureRandom.nextLong(1, Long.MAX_VALUE)``, so
    1 .. 2^63-2; memos above 2^63 (PR #1918) reach a withdrawal only as a wallet-supplied
    id memo, which ``Sep24DepositInfoSelfGenerator`` reuses, or through the fault below.

    Fault ``ap.next_withdraw_memo`` (params ``{"memo": "18446744073709551615"}``, any
    uint64 as decimal text): the next ``times`` generated memos are that value; ``times``
    of 2 or more gives several withdrawals one memo, as the non-atomic generator before
    PR #1929 could. Raises InternalError for a value that is not a uint64."""
    forced = faults.take("ap.next_withdraw_memo")
    if forced is None:
        return str(secrets.randbelow(2**63 - 2) + 1)
    memo = _text(forced.get("memo"))
    error = _id_memo_error(memo)
    if error:
        raise InternalError(f"ap.next_withdraw_memo: {error}")
    return str(int(memo))


def _funds_received_combination(call: Call) -> tuple[Amount | None, Amount | None, Fee | None]:
    p = call.params
    amount_in, amount_out, fee = _amount(p, "amount_in"), _amount(p, "amount_out"), _fee(p)
    present = (amount_in is not None, amount_out is not None, fee is not None)
    if present not in {(False, False, False), (True, True, True), (True, False, False)}:
        raise InvalidParams(
            "Invalid amounts combination provided: all, none or only amount_in should be set")
    txn = call.txn
    if amount_in is not None:
        validate_asset_amount("amount_in", amount_in.amount, txn.amount_in_asset)
    if amount_out is not None:
        validate_asset_amount("amount_out", amount_out.amount, txn.amount_out_asset)
    if fee is not None:
        validate_fee_details(fee, txn)
    return amount_in, amount_out, fee


def _apply_received_amounts(call: Call) -> None:
    amount_in, amount_out, fee = (_amount(call.params, "amount_in"),
                                  _amount(call.params, "amount_out"), _fee(call.params))
    if amount_in is not None:
        call.txn.amount_in = amount_in.amount
    if amount_out is not None:
        call.txn.amount_out = amount_out.amount
    if fee is not None:
        _set_fee(call.txn, fee, with_asset=False)


def _offchain_received_apply(call: Call) -> None:
    """AP ``NotifyOffchainFundsReceivedHandler``: ``funds_received_at`` is used only
    together with ``external_transaction_id``; otherwise now, if not set yet."""
    txn, external = call.txn, _text(call.params.get("external_transaction_id"))
    if external is not None:
        txn.external_transaction_id = external
        if call.instants.get("funds_received_at") is not None:
            txn.transfer_received_at = call.instants["funds_received_at"]
    if txn.transfer_received_at is None:
        txn.transfer_received_at = now()
    _apply_received_amounts(call)


def _offchain_sent_apply(call: Call) -> None:
    """AP ``NotifyOffchainFundsSentHandler``: a deposit counts as funded only when
    ``external_transaction_id`` is sent (``funds_sent_at`` or now)."""
    txn, external = call.txn, _text(call.params.get("external_transaction_id"))
    if external is not None:
        txn.external_transaction_id = external
        if txn.kind == "deposit":
            txn.transfer_received_at = call.instants.get("funds_sent_at") or now()


def _external_id_apply(call: Call) -> None:
    external = _text(call.params.get("external_transaction_id"))
    if external is not None:
        call.txn.external_transaction_id = external


def _stellar_id_validate(call: Call) -> None:
    _require(call.params, "stellar_transaction_id", blank=True)


def _record_stellar_transaction(call: Call) -> None:
    """Load the hash from the ledger and append it (``PaymentHelper.addStellarTransaction``).
    Raises InternalError -32603 ``Failed to retrieve Stellar transaction by ID[h]: ...``."""
    txn, stellar_id = call.txn, _text(call.params.get("stellar_transaction_id"))
    fault = faults.peek("ap.rpc_32603_unindexed_hash")
    if fault is not None and stellar_id in fault.get("hashes", [stellar_id]):
        if faults.take("ap.rpc_32603_unindexed_hash") is not None:
            raise InternalError(f"Failed to retrieve Stellar transaction by ID[{stellar_id}]: "
                                "Resource Missing (status 404)")
    try:
        loaded = ledger.fetch(stellar_id)
    except ledger.LedgerError as exc:
        raise InternalError(
            f"Failed to retrieve Stellar transaction by ID[{stellar_id}]: {exc}") from None
    entry = {"id": loaded["hash"], "memo": txn.memo, "memo_type": txn.memo_type,
             "created_at": instant(loaded["created_at"] or now()), "envelope": loaded["envelope"],
             "payments": loaded["payments"]}
    txn.stellar_transactions = list(txn.stellar_transactions or []) + [
        {k: v for k, v in entry.items() if v is not None}]
    txn.transfer_received_at = loaded["created_at"] or now()
    txn.stellar_transaction_id = loaded["hash"]


def _onchain_sent_apply(call: Call) -> None:
    """AP ``NotifyOnchainFundsSentHandler``: records the tx, keeps ``transfer_received_at``."""
    kept = call.txn.transfer_received_at
    _record_stellar_transaction(call)
    call.txn.transfer_received_at = kept


def _onchain_received_apply(call: Call) -> None:
    """AP ``NotifyOnchainFundsReceivedHandler``: records the tx (funds received at its
    ledger time), then the optional amounts. No check of destination, asset or amount."""
    _record_stellar_transaction(call)
    if call.txn.sep == "31":
        # NotifyOnchainFundsReceivedHandler: the payer is operation 0's source.
        payments = (call.txn.stellar_transactions or [{}])[-1].get("payments") or []
        if payments:
            call.txn.from_account = payments[0].get("source_account")
    _apply_received_amounts(call)


def _amounts_updated_validate(call: Call) -> None:
    """AP ``NotifyAmountsUpdatedHandler.validate``."""
    _require(call.params, "amount_out")
    amount_out = _amount(call.params, "amount_out")
    validate_asset_amount("amount_out", amount_out.amount, call.txn.amount_out_asset,
                          allow_zero=True)
    fee = _fee(call.params)
    if fee is None:
        raise InvalidParams("fee_details must be set")
    validate_fee_details(fee, call.txn)


def _amounts_updated_apply(call: Call) -> None:
    call.txn.amount_out = _amount(call.params, "amount_out").amount
    _set_fee(call.txn, _fee(call.params), with_asset=False)


def _on_hold_apply(call: Call) -> None:
    """AP ``NotifyTransactionOnHoldHandler``: from here on the transaction counts as
    "funds received" (NOTES §1.5)."""
    if call.txn.transfer_received_at is None:
        call.txn.transfer_received_at = now()


def _refund(params: dict) -> dict | None:
    refund = params.get("refund")
    if refund is None:
        return None
    if not isinstance(refund, dict):
        raise InternalError("Expected BEGIN_OBJECT but was a scalar at refund")
    amount, fee = _amount(refund, "amount"), _amount(refund, "amount_fee")
    if amount is None or fee is None:
        raise InvalidParams("must not be null")
    return {"id": _text(refund.get("id")), "amount": amount, "fee": fee}


def _asset_decimals(txn: ApTransaction) -> int:
    asset = assets.by_id(txn.amount_in_asset)
    return asset.significant_decimals if asset else 7


def _validate_refund(txn: ApTransaction, refund: dict) -> None:
    """Shared refund checks of ``NotifyRefundPendingHandler`` / ``NotifyRefundSentHandler``."""
    validate_asset_amount("refund.amount", refund["amount"].amount, txn.amount_in_asset)
    validate_asset_amount("refund.amountFee", refund["fee"].amount, txn.amount_in_asset,
                          allow_zero=True)
    if txn.amount_in_asset != refund["amount"].asset:
        raise InvalidParams("refund.amount.asset does not match transaction amount_in_asset")
    if txn.amount_fee_asset != refund["fee"].asset:
        raise InvalidParams(
            "refund.amount_fee.asset does not match match transaction amount_fee_asset")


def _refund_pending_validate(call: Call) -> None:
    """AP ``NotifyRefundPendingHandler.validate``: deposits only (a withdrawal just moves
    to ``pending_anchor``)."""
    if call.txn.kind != "deposit":
        return
    refund = _refund(call.params)
    if refund is None:
        raise InvalidParams("refund must not be null")
    txn = call.txn
    _validate_refund(txn, refund)
    decimals = _asset_decimals(txn)
    parts = [refund["amount"].amount, refund["fee"].amount]
    if txn.refunds and txn.refunds.get("payments"):
        parts.append(txn.refunds["amount_refunded"])
    total = _sum(parts, decimals)
    if total > assets.scaled(Decimal(txn.amount_in), decimals):
        raise InvalidParams("Refund amount exceeds amount_in")


def _sum(values: list[str], decimals: int) -> Decimal:
    total = Decimal(0)
    for value in values:
        total += assets.scaled(Decimal(value), decimals)
    return total


def _store_refund(txn: ApTransaction, refund: dict, replace: bool) -> None:
    """Append (pending) or replace by id (sent) a refund payment and recompute the totals
    (``Sep24Refunds.recalculateAmounts``: ``amount_fee`` = Σ fees, ``amount_refunded`` =
    Σ amounts + Σ fees, at the asset's scale)."""
    payments = list((txn.refunds or {}).get("payments", []))
    if replace:
        payments = [p for p in payments if p["id"] != refund["id"]]
    payments.append({"id": refund["id"],
                     "id_type": "external" if txn.kind == "deposit" else "stellar",
                     "amount": refund["amount"].amount, "fee": refund["fee"].amount})
    decimals = _asset_decimals(txn)
    fees = _sum([p["fee"] for p in payments], decimals)
    amounts = _sum([p["amount"] for p in payments], decimals)
    txn.refunds = {"amount_refunded": assets.plain(fees + amounts),
                   "amount_fee": assets.plain(fees), "payments": payments}


def _refund_pending_apply(call: Call) -> None:
    if call.txn.kind == "deposit":
        _store_refund(call.txn, _refund(call.params), replace=False)


def _receive_refund_validate(call: Call) -> None:
    """``NotifyRefundSentHandler.validate`` for protocol 31: one refund only."""
    txn, refund = call.txn, _refund(call.params)
    if refund is None:
        raise InvalidParams("refund is required")
    if txn.status == "pending_receiver" and txn.refunds and txn.refunds.get("payments"):
        raise InvalidRequest("Multiple refunds aren't supported for kind[receive], "
                             "protocol[31] and action[notify_refund_sent]")
    _validate_refund(txn, refund)


def _receive_refund_next(call: Call) -> str:
    txn, refund = call.txn, _refund(call.params)
    decimals = _asset_decimals(txn)
    total = _sum([refund["amount"].amount, refund["fee"].amount], decimals)
    amount_in = assets.scaled(Decimal(txn.amount_in), decimals)
    if total > amount_in:
        raise InvalidParams("Refund amount exceeds amount_in")
    return "refunded" if total == amount_in else "pending_anchor"


def _receive_refund_apply(call: Call) -> None:
    """The refund replaces the stored list (``id_type: stellar``)."""
    call.txn.refunds = None
    _store_refund(call.txn, _refund(call.params), replace=True)


def _refund_sent_validate(call: Call) -> None:
    """AP ``NotifyRefundSentHandler.validate``."""
    if call.txn.kind == "receive":
        return _receive_refund_validate(call)
    refund = _refund(call.params)
    if refund is None and call.txn.status == "pending_anchor":
        raise InvalidParams("refund is required")
    if refund is not None:
        _validate_refund(call.txn, refund)


def _refund_sent_next(call: Call) -> str:
    """AP ``NotifyRefundSentHandler.getNextStatus``: all refunded (fees included) =
    ``amount_in`` -> refunded; less -> pending_anchor; more -> -32602."""
    if call.txn.kind == "receive":
        return _receive_refund_next(call)
    txn, refund = call.txn, _refund(call.params)
    decimals = _asset_decimals(txn)
    payments = (txn.refunds or {}).get("payments") or []
    if not payments:
        if refund is None:
            raise InternalError('Cannot invoke "NotifyRefundSentRequest$Refund.getAmount()" '
                                'because "refund" is null')
        total = _sum([refund["amount"].amount, refund["fee"].amount], decimals)
    elif txn.status == "pending_anchor":
        total = _sum([txn.refunds["amount_refunded"], refund["amount"].amount,
                      refund["fee"].amount], decimals)
    elif refund is None:
        total = assets.scaled(Decimal(txn.refunds["amount_refunded"]), decimals)
    else:
        if refund["id"] not in {p["id"] for p in payments}:
            raise InvalidParams("Invalid refund id")
        total = Decimal(0)
        for p in payments:
            if p["id"] == refund["id"]:
                total += _sum([refund["amount"].amount, refund["fee"].amount], decimals)
            else:
                total += _sum([p["amount"], p["fee"]], decimals)
    amount_in = assets.scaled(Decimal(txn.amount_in), decimals)
    if total == amount_in:
        return "refunded"
    if total < amount_in:
        return "pending_anchor"
    raise InvalidParams("Refund amount exceeds amount_in")


def _refund_sent_apply(call: Call) -> None:
    if call.txn.kind == "receive":
        return _receive_refund_apply(call)
    refund = _refund(call.params)
    if refund is not None:
        _store_refund(call.txn, refund, replace=True)


CUSTOMER_STATUS_NEXT = {"ACCEPTED": "pending_receiver", "PROCESSING": "pending_receiver",
                        "NEEDS_INFO": "pending_customer_info_update", "REJECTED": "error"}


def _customer_info_next(call: Call) -> str:
    """``NotifyCustomerInfoUpdatedHandler.getNextStatus`` (SEP-31): the status of
    ``customer_id`` as the anchor's ``GET /customer`` reports it. Raises InternalError
    (callback failed, or a status ``Sep12Status.valueOf`` does not know)."""
    from sandbox.ap import sep12

    customer_id = _text(call.params.get("customer_id"))
    if not customer_id:
        return "pending_receiver"
    try:
        status = sep12.callback_status({"id": customer_id, "transaction_id": call.txn.id,
                                        "type": _text(call.params.get("customer_type"))})
    except sep12.SepError as exc:
        raise InternalError(exc.message) from None
    if status not in CUSTOMER_STATUS_NEXT:
        raise InternalError("No enum constant org.stellar.anchor.api.sep.sep12.Sep12Status."
                            f"{status}")
    return CUSTOMER_STATUS_NEXT[status]


def _nothing(call: Call) -> None:
    return None


@dataclass(frozen=True)
class Method:
    validate: Callable[[Call], None] = _nothing
    apply: Callable[[Call], None] = _nothing
    next_status: Callable[[Call], str] | None = None


METHODS: dict[str, Method] = {
    "notify_interactive_flow_completed": Method(_interactive_completed_validate,
                                                _interactive_completed_apply),
    "request_offchain_funds": Method(lambda c: _request_funds_validate(c, onchain=False),
                                     lambda c: _request_funds_apply(c, onchain=False)),
    "request_onchain_funds": Method(lambda c: _request_funds_validate(c, onchain=True),
                                    lambda c: _request_funds_apply(c, onchain=True)),
    "notify_offchain_funds_received": Method(_funds_received_combination,
                                             _offchain_received_apply),
    "notify_offchain_funds_sent": Method(apply=_offchain_sent_apply),
    "notify_onchain_funds_received": Method(
        lambda c: (_stellar_id_validate(c), _funds_received_combination(c)),
        _onchain_received_apply),
    "notify_onchain_funds_sent": Method(_stellar_id_validate, _onchain_sent_apply),
    "notify_offchain_funds_pending": Method(apply=_external_id_apply),
    "notify_offchain_funds_available": Method(apply=_external_id_apply),
    "notify_amounts_updated": Method(_amounts_updated_validate, _amounts_updated_apply),
    "request_trust": Method(),
    "notify_trust_set": Method(),
    "notify_transaction_on_hold": Method(apply=_on_hold_apply),
    "notify_transaction_error": Method(),
    "notify_transaction_expired": Method(),
    "notify_transaction_recovery": Method(),
    "notify_refund_pending": Method(_refund_pending_validate, _refund_pending_apply),
    "notify_refund_sent": Method(_refund_sent_validate, _refund_sent_apply, _refund_sent_next),
    "notify_customer_info_updated": Method(next_status=_customer_info_next),
}


# --------------------------------------------------------------------------- execution

_FIELDS = [f.attname for f in ApTransaction._meta.concrete_fields
           if f.attname not in ("id", "version")]


def _load(transaction_id: str | None) -> ApTransaction | None:
    if transaction_id is None:
        return None
    return ApTransaction.objects.using(DB).filter(pk=transaction_id).first()


def save_checked(txn: ApTransaction, read_version: int, event_type: str) -> dict:
    """Write ``txn`` back only if nobody changed it since it was read at ``read_version``
    (JPA ``@Version``, AP 4.2.0+), and publish its event in the same transaction.
    Returns the transaction object. Raises InternalError (concurrent modification)."""
    values = {name: getattr(txn, name) for name in _FIELDS}
    with transaction.atomic(using=DB):
        updated = (ApTransaction.objects.using(DB)
                   .filter(pk=txn.pk, version=read_version)
                   .update(version=read_version + 1, **values))
        if updated != 1:
            raise InternalError(CONCURRENT_MODIFICATION)
        txn.version = read_version + 1
        result = platform_object(txn)
        events.publish(event_type, result)
    return result


def status_rpc(method: str, params: dict) -> dict:
    """Run one status-changing RPC (``RpcTransactionStatusHandler.handle``)."""
    # Gson binds only the fields of the method's request class, before anything else.
    names = list(INSTANT_PARAMS.get(method, ()))
    if method in SUPPORTS_USER_ACTION_REQUIRED_BY:
        names.append("user_action_required_by")
    instants = {key: _instant(params, key) for key in names}
    transaction_id = _text(params.get("transaction_id"))
    txn = _load(transaction_id)
    if txn is None:
        shown = "null" if transaction_id is None else transaction_id
        raise InvalidRequest(f"Transaction with id[{shown}] is not found")
    if not is_supported(method, txn):
        raise InvalidRequest(not_supported_message(method, txn))

    read_version = txn.version
    spec = METHODS[method]
    action_by = instants.get("user_action_required_by")
    call = Call(method, txn, params, action_by, instants)
    if action_by is not None and action_by < now():
        raise InvalidParams("user_action_required_by can not be in the past")
    spec.validate(call)

    rule_target = STATE_MACHINE[method][txn.kind][1]
    next_status = spec.next_status(call) if spec.next_status else rule_target
    message = _text(params.get("message"))
    if next_status in ERRORS and message is None:
        raise InvalidParams("message is required")
    clear_message = next_status not in ERRORS and txn.status in ERRORS

    txn.user_action_required_by = action_by
    spec.apply(call)
    txn.updated_at = now()
    txn.status = next_status
    if next_status in FINAL:
        txn.completed_at = now()
    if message is not None:
        txn.message = message
    elif clear_message:
        txn.message = None

    slow = faults.take("ap.rpc_slow")
    if slow is not None:
        time.sleep(min(float(slow.get("seconds", 0.5)), 5.0))
    result = save_checked(txn, read_version, events.TRANSACTION_STATUS_CHANGED)
    customer_id = _text(params.get("customer_id"))
    if method == "notify_customer_info_updated" and customer_id:
        events.publish(events.CUSTOMER_UPDATED, customer_object={"id": customer_id})
    return result


def get_transaction(params: dict) -> dict:
    """``GetTransactionHandler``: -32602 for an empty id, -32603 for an unknown one."""
    transaction_id = _text(params.get("transaction_id"))
    if not transaction_id:
        raise InvalidParams("transaction id cannot be empty")
    txn = _load(transaction_id)
    if txn is None:
        raise InternalError(f"transaction (id={transaction_id}) is not found")
    return platform_object(txn)


def get_transactions(params: dict) -> dict:
    """``GetTransactionsHandler``: the REST listing's rules (``listing.find``). AP binds
    ``order_by`` / ``order`` as Java enum names; this stand-in accepts either case."""
    statuses = params.get("statuses")
    if isinstance(statuses, list):
        statuses = ",".join(str(s) for s in statuses)
    try:
        records = listing.find(
            sep=_text(params.get("sep")), order_by=_text(params.get("order_by")),
            order=_text(params.get("order")), statuses=_text(statuses),
            page_number=_text(params.get("page_number")),
            page_size=_text(params.get("page_size")))
    except listing.ListingError as exc:
        raise (InvalidParams if exc.status == 400 else InternalError)(exc.message) from None
    return {"records": records}


def dispatch(method: str, params) -> dict:
    """Run ``method``; raises RpcFault."""
    if method not in KNOWN_METHODS:
        raise MethodNotFound(f"No matching RPC method[{method}]")
    if method in NO_HANDLER:
        raise MethodNotFound(f"RPC method[{method}] handler is not found")
    if not isinstance(params, dict):
        raise InternalError("Cannot invoke \"RpcMethodParamsRequest.getTransactionId()\" "
                            "because \"request\" is null")
    if method == "get_transaction":
        return get_transaction(params)
    if method == "get_transactions":
        return get_transactions(params)
    forced = faults.peek("ap.rpc_32603")
    if forced is not None and method in (forced.get("methods") or [method]) \
            and faults.take("ap.rpc_32603") is not None:
        raise InternalError(forced.get("message") or CONCURRENT_MODIFICATION)
    return status_rpc(method, params)


def _validate_envelope(item: dict) -> None:
    """``RpcUtil.validateRpcRequest``: all messages joined by ``;``."""
    messages = []
    version = item.get("jsonrpc")
    if _safe_text(version) != JSON_RPC_VERSION:
        messages.append(f"Unsupported JSON-RPC protocol version[{_safe_text(version)}]")
    if not _safe_text(item.get("method")):
        messages.append("Method name can't be NULL or empty")
    rpc_id = item.get("id")
    if rpc_id is None:
        messages.append("Id can't be NULL")
    elif isinstance(rpc_id, bool) or not isinstance(rpc_id, str | int | float | Decimal):
        messages.append("An identifier MUST contain a String or a Number")
    if messages:
        raise InvalidRequest(";".join(messages))


def _safe_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        return str(value)
    return _text(value)


def _echo_id(rpc_id):
    if isinstance(rpc_id, Decimal):
        return float(rpc_id)
    return rpc_id


def handle_one(item: dict) -> dict:
    """One batch entry -> one response object ``{jsonrpc, result|error, id}``."""
    rpc_id = _echo_id(item.get("id"))
    params = item.get("params")
    try:
        _validate_envelope(item)
        result = dispatch(_text(item.get("method")), params)
        response = {"jsonrpc": JSON_RPC_VERSION, "result": result, "id": rpc_id}
    except RpcFault as fault:
        response = _error(rpc_id, params, fault.code, fault.message)
    except Exception as exc:  # AP maps every other exception to -32603 with its message
        log.exception("RPC %s failed", item.get("method"))
        response = _error(rpc_id, params, INTERNAL_ERROR, str(exc))
    return {k: v for k, v in response.items() if v is not None}


def _error(rpc_id, params, code: int, message: str) -> dict:
    transaction_id = None
    if isinstance(params, dict) and not isinstance(params.get("transaction_id"), dict | list):
        transaction_id = _text(params.get("transaction_id"))
    error = {"id": transaction_id, "code": code, "message": message}
    return {"jsonrpc": JSON_RPC_VERSION,
            "error": {k: v for k, v in error.items() if v is not None}, "id": rpc_id}


def handle_batch(batch: list[dict]) -> list[dict]:
    """``RpcService.handle``: the batch limit, then each entry in order."""
    if len(batch) > BATCH_SIZE_LIMIT:
        return [{"jsonrpc": JSON_RPC_VERSION,
                 "error": {"code": INVALID_REQUEST,
                           "message": f"RPC batch size limit[{BATCH_SIZE_LIMIT}] exceeded"}}]
    return [handle_one(item) for item in batch]
