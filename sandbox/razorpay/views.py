"""HTTP surface of the Razorpay stand-in: thin views over ``payins``, ``payouts`` and
``webhooks``.

``/razorpay/v1/...`` answers like ``https://api.razorpay.com/v1/...`` (HTTP Basic
``RAZORPAY_KEY_ID:RAZORPAY_KEY_SECRET``, Razorpay error bodies, 401 on bad auth).
``/razorpay/sandbox/...`` is sandbox-only: the checkout page and its pay action, the
webhook deliveries for tests, and the payout listing and hand settlement.
"""

from __future__ import annotations

import functools
import json

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt

from sandbox.razorpay import (
    payins,
    payouts,
    refunds,
    settlements,
    statement,
    validations,
    webhooks,
)
from sandbox.razorpay.common import RazorpayError, check_basic_auth
from sandbox.razorpay.models import WebhookEvent


def _json_body(request):
    if not request.body:
        return None
    try:
        return json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        raise RazorpayError("The request body must be valid JSON.")


def _url_not_found() -> RazorpayError:
    return RazorpayError("The requested URL was not found on the server.",
                         source="NA", step="NA", reason="NA")


def _api(*methods: str, auth: bool = True):
    """Wrap a view: CSRF off, allowed methods, Basic auth (for ``/v1``), Razorpay errors."""

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        def wrapped(request, *args, **kwargs):
            try:
                if auth:
                    check_basic_auth(request)
                if request.method not in methods:
                    raise _url_not_found()
                return view(request, *args, **kwargs)
            except RazorpayError as exc:
                return exc.response()

        return wrapped

    return decorate


def _int_param(request, name: str, default: int, maximum: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) > maximum:
        raise RazorpayError(f"The {name} must be an integer between 0 and {maximum}.", field=name)
    return int(raw)


@_api("GET", "POST")
def orders(request):
    """``POST /v1/orders`` creates; ``GET /v1/orders[?receipt=&count=&skip=]`` lists."""
    if request.method == "POST":
        return JsonResponse(payins.create_order(data=_json_body(request)))
    return JsonResponse(payins.list_orders(
        receipt=request.GET.get("receipt"),
        count=_int_param(request, "count", 10, 100),
        skip=_int_param(request, "skip", 0, 10**9),
    ))


@_api("GET")
def order(request, order_id: str):
    return JsonResponse(payins.get_order(order_id))


@_api("GET")
def order_payments(request, order_id: str):
    return JsonResponse(payins.order_payments(order_id))


@_api("GET")
def payment(request, payment_id: str):
    return JsonResponse(payins.get_payment(payment_id))


@_api("POST")
def payment_refund(request, payment_id: str):
    """``POST /v1/payments/{id}/refund`` with optional ``X-Refund-Idempotency``
    (TREASURY §2.1; ``refunds.create_refund``)."""
    key = request.headers.get(refunds.IDEMPOTENCY_HEADER)
    return refunds.create_refund(payment_id=payment_id, data=_json_body(request),
                                 idempotency_key=key)


@_api("GET")
def payment_refunds(request, payment_id: str):
    """``GET /v1/payments/{id}/refunds[?count=&skip=]``."""
    return JsonResponse(refunds.payment_refunds(
        payment_id, count=_int_param(request, "count", 10, 100),
        skip=_int_param(request, "skip", 0, 10**9)))


@_api("GET")
def payment_refund_one(request, payment_id: str, refund_id: str):
    return JsonResponse(refunds.get_refund(refund_id, payment_id=payment_id))


@_api("GET")
def refund(request, refund_id: str):
    """``GET /v1/refunds/{id}``."""
    return JsonResponse(refunds.get_refund(refund_id))


@_api("GET", auth=False)
def sandbox_refunds(request):
    """``GET /razorpay/sandbox/refunds[?payment_id=&receipt=]``: every refund, oldest
    first, with its idempotency key (for tests and the demo)."""
    items = refunds.sandbox_listing(payment_id=request.GET.get("payment_id"),
                                    receipt=request.GET.get("receipt"))
    return JsonResponse({"count": len(items), "refunds": items})


@_api("GET", "POST")
def contacts(request):
    """``POST /v1/contacts`` (RazorpayX, NOTES §2.2); ``GET /v1/contacts?reference_id=
    &active=&count=&skip=`` lists (NOTES §2.2)."""
    if request.method == "POST":
        return JsonResponse(payouts.create_contact(data=_json_body(request)))
    return JsonResponse(payouts.list_contacts(
        params=request.GET, count=_int_param(request, "count", 10, 100),
        skip=_int_param(request, "skip", 0, 10**9)))


@_api("GET")
def contact(request, contact_id: str):
    return JsonResponse(payouts.get_contact(contact_id))


@_api("GET", "POST")
def fund_accounts(request):
    """``POST /v1/fund_accounts`` (RazorpayX, NOTES §2.3); ``GET /v1/fund_accounts?
    contact_id=&count=&skip=`` lists (docs ``api/x/fund-accounts/fetch-all``)."""
    if request.method == "POST":
        return JsonResponse(payouts.create_fund_account(data=_json_body(request)))
    return JsonResponse(payouts.list_fund_accounts(
        params=request.GET, count=_int_param(request, "count", 10, 100),
        skip=_int_param(request, "skip", 0, 10**9)))


@_api("GET")
def fund_account(request, fund_account_id: str):
    return JsonResponse(payouts.get_fund_account(fund_account_id))


@_api("GET", "POST")
def fund_account_validations(request):
    """``POST /v1/fund_accounts/validations`` validates a fund account (TREASURY §6.2, both
    forms in ``validations``); ``GET /v1/fund_accounts/validations?account_number=&count=
    &skip=`` lists (TREASURY §6.3)."""
    if request.method == "POST":
        return JsonResponse(validations.create_validation(data=_json_body(request)))
    return JsonResponse(validations.list_validations(
        params=request.GET,
        count=_int_param(request, "count", 10, 100),
        skip=_int_param(request, "skip", 0, 10**9),
    ))


@_api("GET")
def fund_account_validation(request, validation_id: str):
    return JsonResponse(validations.get_validation(validation_id))


@_api("POST", auth=False)
def sandbox_validation_account(request):
    """``POST /razorpay/sandbox/fund_accounts/validations/accounts``: what validating one
    beneficiary account answers (body in ``validations.set_account``)."""
    return JsonResponse(validations.set_account(data=_json_body(request)))


@_api("GET", "POST")
def payouts_view(request):
    """``POST /v1/payouts`` with ``X-Payout-Idempotency`` creates (NOTES §2.4, §2.5; the key
    is checked before the body); ``GET /v1/payouts?account_number=&reference_id=&count=
    &skip=...`` lists (NOTES §2.9)."""
    if request.method == "POST":
        key = payouts.check_idempotency_key(request.headers.get(payouts.IDEMPOTENCY_HEADER))
        return payouts.create_payout(idempotency_key=key, data=_json_body(request))
    return JsonResponse(payouts.list_payouts(
        params=request.GET,
        count=_int_param(request, "count", 10, 100),
        skip=_int_param(request, "skip", 0, 10**9),
    ))


@_api("GET")
def payout(request, payout_id: str):
    return JsonResponse(payouts.fetch_payout(payout_id))


@_api("GET")
def settlements_view(request):
    """``GET /v1/settlements?from=&to=&count=&skip=`` (TREASURY §3.1)."""
    return JsonResponse(settlements.list_settlements(params=request.GET))


@_api("GET")
def settlement(request, settlement_id: str):
    return JsonResponse(settlements.get_settlement(settlement_id))


@_api("GET")
def settlement_recon(request):
    """``GET /v1/settlements/recon/combined?year=&month=&day=&count=&skip=`` (TREASURY
    §3.2)."""
    return JsonResponse(settlements.recon(params=request.GET))


@_api("GET")
def banking_balances(request):
    """``GET /v1/banking_balances`` (RazorpayX, TREASURY §4.2)."""
    return JsonResponse(statement.banking_balances(params=request.GET,
                                                   account_number=payouts.account_number()))


@_api("GET")
def transactions(request):
    """``GET /v1/transactions?account_number=&from=&to=&count=&skip=`` (RazorpayX account
    statement, TREASURY §5)."""
    return JsonResponse(statement.list_transactions(params=request.GET,
                                                    account_number=payouts.account_number()))


@_api("GET")
def transaction_view(request, transaction_id: str):
    return JsonResponse(statement.get_transaction(transaction_id))


@_api("POST", auth=False)
def sandbox_topup(request):
    """``POST /razorpay/sandbox/banking_balances/topup {"amount": paise, ...}``: funds added
    to our RazorpayX account (body in ``statement.top_up``)."""
    return JsonResponse(statement.top_up(data=_json_body(request),
                                         account_number=payouts.account_number()))


@_api("GET", "POST", "PUT", "PATCH", "DELETE")
def v1_not_found(request, rest: str = ""):
    raise _url_not_found()


def checkout(request, order_id: str):
    """``GET /razorpay/sandbox/checkout/{order_id}?callback_url=<url>``: a small mobile page
    with the amount in rupees and Pay / Fail buttons calling the pay action, then sending
    the browser to ``callback_url`` with the Checkout parameters (as a GET query; real
    Checkout with ``redirect: true`` POSTs a form)."""
    context = payins.checkout_context(order_id)
    if context is None:
        return HttpResponse("Order not found", status=404, content_type="text/plain")
    context["callback_url"] = request.GET.get("callback_url", "")
    return render(request, "sandbox_razorpay/checkout.html", context)


@_api("POST", auth=False)
def pay(request, order_id: str):
    """``POST /razorpay/sandbox/orders/{id}/pay``; body and answer in ``payins.pay_order``."""
    return JsonResponse(payins.pay_order(order_id=order_id, data=_json_body(request)))


@_api("GET", auth=False)
def webhook_deliveries(request):
    """``GET /razorpay/sandbox/webhooks[?event_id=&entity_id=&order_id=&event=]``."""
    items = webhooks.listing(
        event_id=request.GET.get("event_id"),
        entity_id=request.GET.get("entity_id"),
        order_id=request.GET.get("order_id"),
        event=request.GET.get("event"),
    )
    return JsonResponse({"entity": "collection", "count": len(items), "items": items})


@_api("POST", auth=False)
def webhook_redeliver(request):
    """``POST /razorpay/sandbox/webhooks/redeliver {"event_id": ...}``: dashboard replay."""
    body = _json_body(request)
    event_id = body.get("event_id") if isinstance(body, dict) else None
    if not isinstance(event_id, str):
        raise RazorpayError("event_id: is required.", field="event_id")
    try:
        delivery = webhooks.redeliver(event_id)
    except WebhookEvent.DoesNotExist:
        raise RazorpayError("The id provided does not exist", field="event_id")
    return JsonResponse(webhooks.describe(delivery))


@_api("GET", auth=False)
def sandbox_payouts(request):
    """``GET /razorpay/sandbox/payouts[?reference_id=&status=&idempotency_key=
    &fund_account_id=]``: every payout, oldest first, as ``{"count": N, "payouts": [row, ...]}``
    (row: ``payouts.describe``)."""
    items = payouts.sandbox_listing(
        reference_id=request.GET.get("reference_id"),
        status=request.GET.get("status"),
        idempotency_key=request.GET.get("idempotency_key"),
        fund_account_id=request.GET.get("fund_account_id"),
    )
    return JsonResponse({"count": len(items), "payouts": items})


@_api("POST", auth=False)
def sandbox_payout_settle(request, payout_id: str):
    """``POST /razorpay/sandbox/payouts/{id}/settle {"status": ..., "reason": ...}``."""
    return JsonResponse(payouts.settle(payout_id=payout_id, data=_json_body(request)))


@_api("POST", auth=False)
def sandbox_payouts_reset(request):
    """``POST /razorpay/sandbox/payouts/reset``: empty the RazorpayX tables and the payout
    webhooks only (``/sandbox/reset`` empties the whole world)."""
    payouts.reset()
    return JsonResponse({"reset": True})
