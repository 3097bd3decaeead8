"""Thin HTTP layer for deposits: parse, call one service, render."""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.http import HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from anchor import callbacks, deposits, platform, sep24
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositRelease

log = logging.getLogger(__name__)


def _error(request, message: str, status: int):
    return render(request, "sep24/error.html", {"message": message}, status=status)


@require_http_methods(["GET"])
def interactive(request):
    """``GET /sep24/interactive?transaction_id=&token=``: check the token, open the
    session, send the user to the form of the transaction's kind (by URL name)."""
    transaction_id = request.GET.get("transaction_id", "")
    try:
        claims = sep24.verify_interactive_token(request.GET.get("token", ""), transaction_id)
    except sep24.TokenError as exc:
        return _error(request, f"This link cannot be used: {exc}.", 403)
    sep24.open_session(request, claims)
    try:
        ap_tx = platform.get_transaction(transaction_id)
    except platform.PlatformError:
        return _error(request, "The anchor is not reachable right now. Try again shortly.", 503)
    if ap_tx is None:
        return _error(request, "This transaction does not exist.", 404)
    name = "anchor:deposit" if ap_tx.get("kind") == "deposit" else "payouts:withdraw"
    try:
        target = reverse(name, kwargs={"transaction_id": transaction_id})
    except NoReverseMatch:
        return _error(request, "Withdrawals are not available yet.", 404)
    return redirect(target)


@require_http_methods(["GET", "POST"])
def deposit(request, transaction_id: str):
    """The deposit form: INR amount in, rate and fee shown, then Razorpay checkout."""
    if not sep24.session_allows(request, transaction_id):
        return _error(request, "Open this page from your wallet to continue.", 403)
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    if order is not None and order.status == DepositOrder.Status.AWAITING_PAYMENT:
        return redirect(_checkout(request, order))
    if order is not None:
        return redirect("anchor:transaction", transaction_id=transaction_id)
    context = {
        "transaction_id": transaction_id,
        "rate": settings.DEPOSIT_RATE_INR_PER_USDC,
        "fee_percent": settings.DEPOSIT_FEE_PERCENT,
        "fee_fixed": settings.DEPOSIT_FEE_FIXED_INR,
        "min": settings.DEPOSIT_MIN_INR,
        "max": settings.DEPOSIT_MAX_INR,
        "amount": request.POST.get("amount", ""),
        "errors": {},
    }
    if request.method == "POST":
        try:
            amount = deposits.parse_inr(request.POST.get("amount", ""))
            if request.POST.get("confirm") != "yes":
                context["quote"] = deposits.quote(amount)
                return render(request, "sep24/deposit.html", context)
            order = deposits.deposit_submit(transaction_id=transaction_id, amount_in=amount)
        except deposits.DepositInputError as exc:
            context["errors"] = {"amount": str(exc)}
            return render(request, "sep24/deposit.html", context, status=400)
        except deposits.DepositStateError as exc:
            return _error(request, str(exc), 409)
        except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
            log.warning("deposit %s submit failed: %s", transaction_id, exc)
            return _error(request, "The payment provider is not reachable right now. "
                                   "Try again shortly.", 503)
        return redirect(_checkout(request, order))
    return render(request, "sep24/deposit.html", context)


def _checkout(request, order: DepositOrder) -> str:
    back = request.build_absolute_uri(
        reverse("anchor:transaction", kwargs={"transaction_id": order.transaction_id}))
    return rzp.checkout_url(order_id=order.order_id, callback_url=back)


@require_http_methods(["GET"])
def more_info(request):
    """``GET /sep24/more_info?transaction_id=&token=``: AP's more_info_url; opens the
    session for that transaction and shows its status."""
    transaction_id = request.GET.get("transaction_id", "")
    try:
        claims = sep24.verify_more_info_token(request.GET.get("token", ""), transaction_id)
    except sep24.TokenError as exc:
        return _error(request, f"This link cannot be used: {exc}.", 403)
    sep24.open_session(request, claims)
    return redirect("anchor:transaction", transaction_id=transaction_id)


def transaction_status(request, transaction_id: str):
    """``/sep24/transaction/<id>``: where the user lands after checkout."""
    if not sep24.session_allows(request, transaction_id):
        return _error(request, "Open this page from your wallet to see it.", 403)
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
    try:
        ap_tx = platform.get_transaction(transaction_id) or {}
    except platform.PlatformError:
        ap_tx = {}
    return render(request, "sep24/transaction.html",
                  {"transaction_id": transaction_id, "order": order, "release": release,
                   "status": ap_tx.get("status", "unknown"), "ap": ap_tx})


def _json_body(request) -> dict | None:
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


@csrf_exempt
def ap_event(request):
    """``POST /callbacks/event`` (AP callback API)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not callbacks.ap_request_authorized(request.headers):
        return JsonResponse({"error": "unauthorized"}, status=401)
    event = _json_body(request)
    if event is None or not event.get("id") or not event.get("type"):
        return JsonResponse({"error": "body must be an AP event with id and type"}, status=400)
    try:
        outcome = callbacks.ap_event_receive(event=event)
    except callbacks.MalformedEvent as exc:
        return JsonResponse({"error": f"not an AP event: {exc}"}, status=400)
    return JsonResponse({"outcome": outcome})


@csrf_exempt
def ap_customer(request):
    """``PUT /callbacks/customer``: SEP-9 fields AP forwards for SEP-24."""
    if request.method != "PUT":
        return HttpResponseNotAllowed(["PUT"])
    if not callbacks.ap_request_authorized(request.headers):
        return JsonResponse({"error": "unauthorized"}, status=401)
    body = _json_body(request)
    if body is None:
        return JsonResponse({"error": "body must be a JSON object"}, status=400)
    try:
        customer = callbacks.sep24_customer_put(body=body)
    except callbacks.MalformedEvent as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse({"id": str(customer.pk), "status": "ACCEPTED"})


@csrf_exempt
def razorpay_payments_webhook(request):
    """``POST /webhooks/razorpay/payments``."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    raw = request.body
    if not rzp.verify_webhook(raw, request.headers.get("X-Razorpay-Signature", "")):
        return JsonResponse({"error": "invalid signature"}, status=400)
    event = _json_body(request)
    event_id = request.headers.get("X-Razorpay-Event-Id", "")
    if event is None or not event_id:
        return JsonResponse({"error": "signed body must be JSON with X-Razorpay-Event-Id"},
                            status=400)
    try:
        outcome = callbacks.razorpay_payment_webhook(event_id=event_id, event=event)
    except callbacks.MalformedEvent as exc:
        return JsonResponse({"error": f"not a Razorpay payment event: {exc}"}, status=400)
    return JsonResponse({"outcome": outcome})
