"""Thin HTTP layer for deposits: parse, call one service, render.

SEP-24 pages (templates/sep24/, mobile-first, usable in a wallet's webview):
interactive entry -> deposit form (amount, quote, confirm) -> checkout hand-off
(``/sep24/checkout/<order_id>``, then Razorpay Checkout) -> status page
(``/sep24/transaction/<id>``, also through AP's more_info_url; it refreshes itself until
the transaction is final). Errors (expired link, wrong state, provider down, no session)
render ``sep24/error.html`` through :func:`sep24_error`.

Every view binds ``transaction_id`` for the request's log lines (the request context
middleware clears it when the request ends). Webhooks and AP events count their
outcomes in Prometheus (corridor/metrics.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.http import HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from structlog.contextvars import bind_contextvars

from anchor import callbacks, deposits, platform, sep24
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositRelease
from corridor import metrics

log = logging.getLogger(__name__)

# --- error pages ---------------------------------------------------------------------

ERROR_TITLES = {
    "expired": "This link has expired",
    "forbidden": "This link cannot be used",
    "not_found": "Transaction not found",
    "wrong_state": "This step is already done",
    "unavailable": "Temporarily unavailable",
}
ERROR_HINTS = {
    "expired": "Links from your wallet work for 10 minutes. Go back to your wallet and "
               "open the transaction again.",
    "forbidden": "Go back to your wallet and open the transaction from there.",
    "not_found": "Go back to your wallet and start again.",
    "wrong_state": "Nothing was charged twice. See where the transaction stands below.",
    "unavailable": "Nothing was charged and nothing was sent. Wait a moment and try "
                   "again.",
}


def sep24_error(request, reason: str, message: str, status: int, *,
                status_url: str | None = None, retry_url: str | None = None):
    """An error page: ``reason`` is one of ERROR_TITLES (it picks the title and the
    hint, and tests read it from ``data-reason``); ``status_url`` links the status page,
    ``retry_url`` offers "Try again" (503 pages also send ``Retry-After``)."""
    response = render(request, "sep24/error.html", {
        "reason": reason, "title": ERROR_TITLES.get(reason, "Cannot continue"),
        "message": message, "hint": ERROR_HINTS.get(reason, ""),
        "status_url": status_url, "retry_url": retry_url}, status=status)
    if status == 503:
        response["Retry-After"] = "30"
    return response


def _token_error(request, exc: sep24.TokenError):
    reason = "expired" if "expired" in str(exc) else "forbidden"
    return sep24_error(request, reason, f"This link cannot be used: {exc}.", 403)


def _no_session(request):
    return sep24_error(request, "forbidden", "Open this page from your wallet to continue.",
                       403)


def _status_url(transaction_id: str) -> str:
    return reverse("anchor:transaction", kwargs={"transaction_id": transaction_id})


# --- interactive entry, deposit form, checkout hand-off -----------------------------------

# AP statuses after which no form applies: the status page explains them.
FINAL_STATUSES = {"completed", "refunded", "expired", "error", "no_market", "too_small",
                  "too_large"}


@require_http_methods(["GET"])
def interactive(request):
    """``GET /sep24/interactive?transaction_id=&token=``: check the token, open the
    session, send the user to the form of the transaction's kind (by URL name), or to
    the status page when the transaction is already over."""
    transaction_id = request.GET.get("transaction_id", "")
    bind_contextvars(transaction_id=transaction_id[:64])
    try:
        claims = sep24.verify_interactive_token(request.GET.get("token", ""), transaction_id)
    except sep24.TokenError as exc:
        return _token_error(request, exc)
    sep24.open_session(request, claims)
    try:
        ap_tx = platform.get_transaction(transaction_id)
    except platform.PlatformError:
        return sep24_error(request, "unavailable",
                           "The anchor is not reachable right now.", 503,
                           retry_url=request.get_full_path())
    if ap_tx is None:
        return sep24_error(request, "not_found", "This transaction does not exist.", 404)
    if ap_tx.get("status") in FINAL_STATUSES:
        return redirect(_status_url(transaction_id))
    name = "anchor:deposit" if ap_tx.get("kind") == "deposit" else "payouts:withdraw"
    try:
        target = reverse(name, kwargs={"transaction_id": transaction_id})
    except NoReverseMatch:
        return sep24_error(request, "not_found", "Withdrawals are not available yet.", 404)
    return redirect(target)


@require_http_methods(["GET", "POST"])
def deposit(request, transaction_id: str):
    """The deposit form: INR amount in, rate and fee shown (amount locked while the
    quote is shown; "Change amount" unlocks it), then the checkout hand-off."""
    bind_contextvars(transaction_id=transaction_id[:64])
    if not sep24.session_allows(request, transaction_id):
        return _no_session(request)
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    if order is not None and order.status == DepositOrder.Status.AWAITING_PAYMENT:
        return redirect("anchor:checkout", order_id=order.order_id)
    if order is not None:
        return redirect(_status_url(transaction_id))
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
    if request.method == "POST" and "edit" not in request.POST:
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
            return sep24_error(request, "wrong_state", str(exc), 409,
                               status_url=_status_url(transaction_id))
        except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
            log.warning("deposit %s submit failed: %s", transaction_id, exc)
            return sep24_error(request, "unavailable",
                               "The payment provider is not reachable right now.", 503,
                               retry_url=request.path)
        log.info("deposit order created", extra={"order_id": order.order_id,
                                                 "amount_in": str(order.amount_in)})
        return redirect("anchor:checkout", order_id=order.order_id)
    return render(request, "sep24/deposit.html", context)


@require_http_methods(["GET"])
def checkout(request, order_id: str):
    """``/sep24/checkout/<order_id>``: the hand-off to Razorpay Checkout -- what will
    be paid and received, and the button that opens Checkout (the sandbox's page, or
    the page embedding Checkout at RAZORPAY_CHECKOUT_URL), which returns to the status
    page. A paid or expired order goes to the status page."""
    order = DepositOrder.objects.filter(order_id=order_id).first()
    if order is None or not sep24.session_allows(request, order.transaction_id):
        return _no_session(request)
    bind_contextvars(transaction_id=order.transaction_id)
    if order.status != DepositOrder.Status.AWAITING_PAYMENT:
        return redirect(_status_url(order.transaction_id))
    back = request.build_absolute_uri(_status_url(order.transaction_id))
    return render(request, "sep24/checkout.html", {
        "order": order, "transaction_id": order.transaction_id,
        "checkout_url": rzp.checkout_url(order_id=order.order_id, callback_url=back),
        "status_url": _status_url(order.transaction_id)})


@require_http_methods(["GET"])
def more_info(request):
    """``GET /sep24/more_info?transaction_id=&token=``: AP's more_info_url; opens the
    session for that transaction and shows its status."""
    transaction_id = request.GET.get("transaction_id", "")
    bind_contextvars(transaction_id=transaction_id[:64])
    try:
        claims = sep24.verify_more_info_token(request.GET.get("token", ""), transaction_id)
    except sep24.TokenError as exc:
        return _token_error(request, exc)
    sep24.open_session(request, claims)
    return redirect("anchor:transaction", transaction_id=transaction_id)


# --- status page ------------------------------------------------------------------------

# Kind-specific details on the status page, registered by the app that owns the kind
# (payouts registers "withdrawal" in payouts/views.py), so anchor never imports payouts.
# A hook takes (transaction_id, AP transaction or {}) and returns None when it has no
# record of that transaction, else a dict merged into the page's context:
# ``details_template`` (an include), ``notice`` (shown as an alert), ``action_url`` and
# ``action_label`` (the one button), ``status_as`` (the AP status to word the page by
# when our own record is ahead of AP's, e.g. a captured payment AP has not been told
# of yet; ``data-status`` keeps AP's), and whatever its template reads.
StatusDetails = Callable[[str, dict], dict | None]
STATUS_DETAILS: dict[str, StatusDetails] = {}


def register_status_details(kind: str, hook: StatusDetails) -> None:
    STATUS_DETAILS[kind] = hook


# (label, message, tone) by AP status; a dict picks by kind.
STATUS_TEXT: dict[str, dict[str, tuple[str, str, str]]] = {
    "incomplete": {"": ("Waiting for your details", "Finish the form to continue.",
                        "pending")},
    "pending_user_transfer_start": {
        "deposit": ("Waiting for your payment",
                    "Pay with Razorpay to continue. This page updates by itself.", "pending"),
        "withdrawal": ("Waiting for your USDC",
                       "Send the USDC with the memo shown. Your wallet may do it for you.",
                       "pending")},
    "pending_user_transfer_complete": {"": ("Payment received", "We are finishing up.",
                                            "pending")},
    "pending_anchor": {
        "deposit": ("Payment received", "We are sending your USDC on Stellar.", "pending"),
        "withdrawal": ("USDC received", "We are paying your bank account.", "pending")},
    "pending_stellar": {"": ("Sending on Stellar", "Your USDC is on its way.", "pending")},
    "pending_external": {"": ("Bank payment on its way",
                              "The bank is confirming the payment. This can take a few "
                              "hours.", "pending")},
    "pending_trust": {"": ("Add a USDC trustline",
                           "Your account does not trust USDC yet. Add a USDC trustline in "
                           "your wallet; the deposit continues by itself once it exists.",
                           "warn")},
    "pending_user": {"": ("Action needed", "Go back to your wallet to continue.", "warn")},
    "completed": {
        "deposit": ("Completed", "The USDC is in your Stellar account.", "ok"),
        "withdrawal": ("Completed", "The rupees have been paid to your account.", "ok")},
    "refunded": {"": ("Refunded", "Your payment was returned to you.", "warn")},
    "expired": {"": ("Expired", "Nothing arrived in time, so nothing was charged. Start "
                                "again from your wallet.", "bad")},
    "error": {"": ("Something went wrong", "Our team has been told and will contact you.",
                   "bad")},
    "no_market": {"": ("Not available", "This exchange is not available right now.", "bad")},
    "too_small": {"": ("Amount too small", "Start again with a larger amount.", "bad")},
    "too_large": {"": ("Amount too large", "Start again with a smaller amount.", "bad")},
    "unknown": {"": ("Status unavailable", "We cannot reach the anchor right now; this "
                                           "page tries again by itself.", "warn")},
}
STEPS = {
    "deposit": ("Amount", "Payment", "USDC sent", "Done"),
    "withdrawal": ("Details", "USDC sent", "Bank payout", "Done"),
}
# Index of the current step by status; 4 = every step done.
STEP_AT = {"incomplete": 0, "pending_user_transfer_start": 1,
           "pending_user_transfer_complete": 2, "pending_anchor": 2, "pending_trust": 2,
           "pending_stellar": 2, "pending_external": 2, "completed": 4}


def _status_text(status: str, kind: str) -> tuple[str, str, str]:
    by_kind = STATUS_TEXT.get(status) or {"": (status.replace("_", " ").capitalize(), "",
                                               "pending")}
    return by_kind.get(kind) or by_kind.get("") or next(iter(by_kind.values()))


def _deposit_details(transaction_id: str, ap_tx: dict) -> dict | None:
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    if order is None:
        return None
    release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
    details = {"details_template": "sep24/_deposit_details.html", "order": order,
               "release": release}
    if order.status == DepositOrder.Status.PAID and \
            ap_tx.get("status") == "pending_user_transfer_start":
        details["status_as"] = "pending_anchor"  # paid; AP hears of it in a moment
    if release is not None and release.status == DepositRelease.Status.MANUAL_REVIEW:
        details["notice"] = ("Our team is checking this deposit before sending the USDC. "
                             "Your payment is safe; we will contact you.")
    elif order.status == DepositOrder.Status.AWAITING_PAYMENT and \
            ap_tx.get("status") in (None, "pending_user_transfer_start"):
        details["action_url"] = reverse("anchor:checkout", kwargs={"order_id": order.order_id})
        details["action_label"] = f"Pay ₹{order.amount_in} with Razorpay"
    return details


register_status_details("deposit", _deposit_details)


def transaction_status(request, transaction_id: str):
    """``/sep24/transaction/<id>``: where the user lands after checkout and through
    AP's more_info_url. Shows AP's status in words, the steps, our own details of the
    kind (hooks above), and refreshes itself (SEP24_STATUS_REFRESH_S, default 5 s)
    until the status is final."""
    bind_contextvars(transaction_id=transaction_id[:64])
    if not sep24.session_allows(request, transaction_id):
        return sep24_error(request, "forbidden", "Open this page from your wallet to see it.",
                           403)
    try:
        ap_tx = platform.get_transaction(transaction_id) or {}
    except platform.PlatformError:
        ap_tx = {}
    status = ap_tx.get("status") or "unknown"
    kind = ap_tx.get("kind") or ""
    details = None
    # AP unreachable: the kind is whichever app has a record of the transaction.
    for hook_kind in [kind] if kind in STATUS_DETAILS else list(STATUS_DETAILS):
        details = STATUS_DETAILS[hook_kind](transaction_id, ap_tx)
        if details is not None:
            kind = hook_kind
            break
    shown = (details or {}).get("status_as") or status
    label, message, tone = _status_text(shown, kind)
    final = status in FINAL_STATUSES
    at = STEP_AT.get(shown)
    steps = [] if at is None else [
        {"label": name, "state": "done" if i < at else "current" if i == at else "todo"}
        for i, name in enumerate(STEPS.get(kind, ()))]
    context = {"transaction_id": transaction_id, "ap": ap_tx, "status": status,
               "kind": kind or "transaction", "label": label, "message": message,
               "tone": tone, "final": final, "steps": steps,
               "refresh_s": None if final else getattr(settings, "SEP24_STATUS_REFRESH_S", 5)}
    context.update(details or {})
    return render(request, "sep24/transaction.html", context)


# --- AP callbacks and Razorpay webhooks ----------------------------------------------------

def _json_body(request) -> dict | None:
    try:
        return callbacks.parse_json_object(request.body)
    except callbacks.MalformedEvent:
        return None


def _dig(body: dict, *keys: str) -> dict:
    """``body[k1][k2]...`` when every level is an object, else {} (for log context
    only: the services validate the shape)."""
    for key in keys:
        body = body.get(key) if isinstance(body, dict) else None
    return body if isinstance(body, dict) else {}


def _ap_event_outcome(outcome: str, response: JsonResponse) -> JsonResponse:
    metrics.AP_EVENTS.labels(outcome=outcome).inc()
    log.info("ap event", extra={"outcome": outcome})
    return response


@csrf_exempt
def ap_event(request):
    """``POST /callbacks/event`` (AP callback API)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not callbacks.ap_request_authorized(request.headers):
        return _ap_event_outcome("unauthorized",
                                 JsonResponse({"error": "unauthorized"}, status=401))
    event = _json_body(request)
    if event is None or not event.get("id") or not event.get("type"):
        return _ap_event_outcome("malformed", JsonResponse(
            {"error": "body must be an AP event with id and type"}, status=400))
    tx_id = _dig(event, "payload", "transaction").get("id")
    if isinstance(tx_id, str):
        bind_contextvars(transaction_id=tx_id[:64])
    bind_contextvars(ap_event_id=str(event["id"])[:100], ap_event_type=str(event["type"])[:60])
    try:
        outcome = callbacks.ap_event_receive(event=event)
    except callbacks.MalformedEvent as exc:
        return _ap_event_outcome("malformed", JsonResponse(
            {"error": f"not an AP event: {exc}"}, status=400))
    return _ap_event_outcome(outcome, JsonResponse({"outcome": outcome}))


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


def webhook_outcome(source: str, outcome: str, response: JsonResponse) -> JsonResponse:
    """Count and log a provider webhook's outcome (``source``: razorpay | razorpayx)."""
    metrics.WEBHOOKS.labels(source=source, outcome=outcome).inc()
    log.info("webhook", extra={"source": source, "outcome": outcome})
    return response


@csrf_exempt
def razorpay_payments_webhook(request):
    """``POST /webhooks/razorpay/payments``."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    raw = request.body
    if not rzp.verify_webhook(raw, request.headers.get("X-Razorpay-Signature", "")):
        return webhook_outcome("razorpay", "invalid_signature",
                               JsonResponse({"error": "invalid signature"}, status=400))
    event = _json_body(request)
    event_id = request.headers.get("X-Razorpay-Event-Id", "")
    if event is None or not event_id:
        return webhook_outcome("razorpay", "malformed", JsonResponse(
            {"error": "signed body must be JSON with X-Razorpay-Event-Id"}, status=400))
    order_id = _dig(event, "payload", "payment", "entity").get("order_id")
    if isinstance(order_id, str) and order_id:
        order = DepositOrder.objects.filter(order_id=order_id).only("transaction_id").first()
        if order is not None:
            bind_contextvars(transaction_id=order.transaction_id)
    bind_contextvars(razorpay_event_id=event_id[:100])
    try:
        outcome = callbacks.razorpay_payment_webhook(event_id=event_id, event=event)
    except callbacks.MalformedEvent as exc:
        return webhook_outcome("razorpay", "malformed", JsonResponse(
            {"error": f"not a Razorpay payment event: {exc}"}, status=400))
    return webhook_outcome("razorpay", outcome, JsonResponse({"outcome": outcome}))
