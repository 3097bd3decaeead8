"""HTTP surface of the Razorpay stand-in: thin views over ``payins`` and ``webhooks``.

``/razorpay/v1/...`` answers like ``https://api.razorpay.com/v1/...`` (HTTP Basic
``RAZORPAY_KEY_ID:RAZORPAY_KEY_SECRET``, Razorpay error bodies, 401 on bad auth).
``/razorpay/sandbox/...`` is sandbox-only: the checkout page and its pay action, and the
webhook deliveries for tests.
"""

from __future__ import annotations

import functools
import json

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt

from sandbox.razorpay import payins, webhooks
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
