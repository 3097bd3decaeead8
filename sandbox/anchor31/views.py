"""HTTP endpoints of the SEP-31 receiving-anchor stand-in (under ``/anchor31/``). Thin:
parse, call one function, render JSON.

SEP-31 API (``sandbox.anchor31.sep31``): ``GET info``, ``POST transactions``,
``GET transactions/<id>``. Every call first draws fault ``anchor31.http_5xx``: while it
fires, the call answers 503 ``{"error": "service unavailable"}`` and does nothing.
``PATCH transactions/<id>`` and ``PUT transactions/<id>/callback`` are not offered
(SEP-31 "PUT Transaction Callback": 404 when callbacks are not supported).

Sandbox-only: ``GET sandbox/partner`` ``{"account", "usdc_balance"}``, ``POST
sandbox/partner/pay`` ``{"destination", "amount", "memo_type", "memo"}`` -> ``{"hash"}``
(the partner pays USDC on the sandbox Horizon), ``GET sandbox/transactions`` (every
SEP-31 transaction with its payments, refunds and status history, and the payments that
matched none).
"""

from __future__ import annotations

import functools
import logging
from decimal import Decimal, InvalidOperation

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from stellar_sdk import exceptions as sdk_errors

from sandbox.anchor31 import machine, sep31, stellar
from sandbox.anchor31.models import Sep31Payment, Sep31Transaction
from sandbox.control import faults
from sandbox.keys import PARTNER

log = logging.getLogger(__name__)

DB = "sandbox"


def _error(status: int, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def sep31_view(*methods: str):
    """Method check, fault ``anchor31.http_5xx``, authentication (SEP-31
    "Authentication": 403), then the view with the caller's account."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                return _error(405, f"method {request.method} not allowed")
            if faults.take(machine.FAULT_HTTP_5XX) is not None:
                return _error(503, "service unavailable")
            try:
                account = sep31.authenticate(request.headers.get("Authorization"))
                return view(request, account, *args, **kwargs)
            except sep31.Sep31Error as exc:
                return JsonResponse(exc.body, status=exc.status)

        return wrapper

    return decorate


@sep31_view("GET")
def info(request: HttpRequest, account: str) -> HttpResponse:
    return JsonResponse(sep31.info())


@sep31_view("POST")
def transactions(request: HttpRequest, account: str) -> HttpResponse:
    tx = sep31.create(client_account=account, body=sep31.parse_body(request.body))
    return JsonResponse({"id": tx.id, "stellar_account_id": tx.stellar_account_id,
                         "stellar_memo_type": tx.memo_type, "stellar_memo": tx.memo},
                        status=201)


@sep31_view("GET")
def transaction(request: HttpRequest, account: str, transaction_id: str) -> HttpResponse:
    tx = sep31.find(client_account=account, transaction_id=transaction_id)
    if tx is None:
        return _error(404, f"transaction {transaction_id} not found")
    return JsonResponse({"transaction": sep31.render(tx)})


# --------------------------------------------------------------------------- sandbox-only


@csrf_exempt
def partner(request: HttpRequest) -> HttpResponse:
    """GET: the partner's account and its USDC balance on the sandbox Horizon."""
    if request.method != "GET":
        return _error(405, f"method {request.method} not allowed")
    try:
        balance = stellar.usdc_balance(PARTNER.public_key)
    except sdk_errors.BaseHorizonError as exc:
        return _error(502, f"Horizon: {exc}")
    except sdk_errors.ConnectionError as exc:
        return _error(502, f"Horizon unreachable: {exc}")
    return JsonResponse({"account": PARTNER.public_key,
                         "usdc_balance": None if balance is None else stellar.amount_text(balance)})


@csrf_exempt
def partner_pay(request: HttpRequest) -> HttpResponse:
    """POST {"destination", "amount", "memo_type"?, "memo"?}: the partner pays that much
    USDC. 200 {"hash"} once in a ledger; 400 for a bad request or a refused / failed
    transaction (``result_codes``); 504 {"error", "hash"} when the outcome is unknown."""
    if request.method != "POST":
        return _error(405, f"method {request.method} not allowed")
    try:
        body = sep31.parse_body(request.body)
    except sep31.Sep31Error as exc:
        return JsonResponse(exc.body, status=exc.status)
    destination = str(body.get("destination") or "")
    if not stellar.valid_destination(destination):
        return _error(400, "destination must be a G... or M... account")
    try:
        amount = Decimal(str(body.get("amount")))
    except InvalidOperation:
        return _error(400, "amount must be a decimal string")
    if (not amount.is_finite() or amount <= 0
            or amount != amount.quantize(stellar.STROOP)):
        return _error(400, "amount must be positive with at most 7 decimal places")
    memo_type = body.get("memo_type")
    memo = body.get("memo")
    try:
        stellar.make_memo(memo_type, None if memo is None else str(memo))
        outcome = stellar.partner_pay(destination=destination, amount=amount,
                                      memo_type=memo_type,
                                      memo=None if memo is None else str(memo))
    except stellar.BadMemo as exc:
        return _error(400, str(exc))
    except (sdk_errors.BaseHorizonError, sdk_errors.ConnectionError) as exc:
        return _error(502, f"Horizon: {exc}")
    if outcome.state == "applied" and outcome.successful:
        return JsonResponse({"hash": outcome.hash})
    if outcome.state == "unknown":
        return _error(504, f"outcome unknown: {outcome.error}", hash=outcome.hash)
    return _error(400, "transaction_failed", hash=outcome.hash, result_codes=outcome.codes)


@csrf_exempt
def inspection(request: HttpRequest) -> HttpResponse:
    """GET: every SEP-31 transaction (oldest first) as ``sep31.inspect`` renders it,
    and the payments that matched no transaction."""
    if request.method != "GET":
        return _error(405, f"method {request.method} not allowed")
    txs = Sep31Transaction.objects.using(DB).order_by("started_at", "id")
    unmatched = Sep31Payment.objects.using(DB).filter(transaction__isnull=True).order_by("seq")
    return JsonResponse({"transactions": [sep31.inspect(tx) for tx in txs],
                         "unmatched_payments": [sep31.render_payment(p) for p in unmatched]})


def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    return _error(404, "not found")
