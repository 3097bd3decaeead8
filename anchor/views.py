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
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import DataError
from django.http import HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from structlog.contextvars import bind_contextvars

from anchor import (
    callbacks,
    customers,
    deposits,
    limits,
    liquidity,
    platform,
    quotes,
    sep24,
    submissions,
)
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositRelease, InboundEvent
from corridor import inbound, metrics

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
    sep24.open_session(request, claims, sep24.SCOPE_INTERACTIVE)
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


SUBMITTING_REFRESH_S = 2


def submitting_page(request, *, kind: str, transaction_id: str, form_url: str,
                    live: bool, resume_amount: str = ""):
    """The "being submitted" page (200): another request holds the submission's claim
    (``live``: the page refreshes itself back to the form, which moves on once it is
    done), or a holder died after storing its order (``resume_amount``: a Continue
    button that POSTs the stored amount, which resumes it)."""
    return render(request, "sep24/submitting.html", {
        "kind": kind, "transaction_id": transaction_id, "form_url": form_url,
        "live": live, "refresh_s": SUBMITTING_REFRESH_S, "resume_amount": resume_amount,
        "status_url": _status_url(transaction_id)})


@require_http_methods(["GET", "POST"])
def kyc_and_limits(request, context: dict, transaction_id: str, kind: str,
                   amount_inr) -> bool:
    """The SEP-24 pages' gate (anchor/limits.py) before a quote or a confirm: True to go
    on. Otherwise ``context`` holds what to show: ``kyc`` (the KYC fields to ask for,
    with what was typed) and/or ``errors`` (by field; ``amount`` for a limit). On a
    confirm the amount is reserved against the limits."""
    sub = sep24.session_sub(request, transaction_id)
    try:
        gate = limits.gate(sub, amount_inr)
        if gate.kyc_fields and any(request.POST.get(f) for f in gate.kyc_fields):
            limits.give_kyc(sub, {f: request.POST.get(f, "") for f in gate.kyc_fields})
            gate = limits.gate(sub, amount_inr)
        if gate.kyc_fields:
            context["kyc"] = {"fields": gate.kyc_fields,
                              "threshold": settings.KYC_SEP24_THRESHOLD_INR}
            context["kyc_values"] = {f: request.POST.get(f, "") for f in gate.kyc_fields}
            if request.POST.get("confirm") == "yes":
                context["errors"] = {"amount": "Give your details below for this amount."}
            return False
        if request.POST.get("confirm") == "yes":
            limits.reserve(sub=sub, transaction_id=transaction_id, kind=kind,
                           amount_inr=amount_inr)
        else:
            left = min(limits.headroom(sub))
            if amount_inr > left:
                context["errors"] = {"amount": f"This is over your limit: "
                                               f"₹{max(left, 0):.2f} is left."}
                return False
    except (limits.LimitReached, limits.KycRequired) as exc:
        context["errors"] = {"amount": str(exc)}
        return False
    except customers.CustomerInputError as exc:
        field = next((f for f in limits.SEP24_KYC_FIELDS if f in str(exc)), "amount")
        context["kyc"] = {"fields": limits.SEP24_KYC_FIELDS,
                          "threshold": settings.KYC_SEP24_THRESHOLD_INR}
        context["kyc_values"] = {f: request.POST.get(f, "") for f in limits.SEP24_KYC_FIELDS}
        context["errors"] = {field: str(exc)}
        return False
    return True


def deposit(request, transaction_id: str):
    """The deposit form: INR amount in, rate and fee shown (amount locked while the
    quote is shown; "Change amount" unlocks it), then the checkout hand-off. Needs the
    interactive scope for the transaction (403 otherwise). Any number of simultaneous
    confirms make one submission (anchor/submissions.py): the others, and any visit
    while it is being made, get the "being submitted" page (200), never a 5xx; once
    made, every visit goes to checkout (or the status page)."""
    bind_contextvars(transaction_id=transaction_id[:64])
    if not sep24.session_allows(request, transaction_id, sep24.SCOPE_INTERACTIVE):
        return _no_session(request)
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    pending = submissions.in_flight(transaction_id)
    if order is not None and (order.funds_requested_at is not None or pending is None):
        if order.status == DepositOrder.Status.AWAITING_PAYMENT:
            return redirect("anchor:checkout", order_id=order.order_id)
        return redirect(_status_url(transaction_id))
    form_url = request.path
    if request.method == "GET" and pending is not None and (
            submissions.is_live(pending) or order is not None):
        return submitting_page(request, kind="deposit", transaction_id=transaction_id,
                               form_url=form_url, live=submissions.is_live(pending),
                               resume_amount=format(order.amount_in, "f") if order else "")
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
            short = liquidity.release_shortfall(deposits.quote(amount).amount_out)
            if short:  # before the customer pays, not after (issue 13 §4)
                context["errors"] = {"amount": short}
                return render(request, "sep24/deposit.html", context, status=409)
            if not kyc_and_limits(request, context, transaction_id, "deposit", amount):
                return render(request, "sep24/deposit.html", context,
                              status=400 if context["errors"] else 200)
            if request.POST.get("confirm") != "yes":
                context["quote"] = deposits.quote(amount)
                return render(request, "sep24/deposit.html", context)
            order = deposits.deposit_submit(transaction_id=transaction_id, amount_in=amount)
        except deposits.DepositInputError as exc:
            context["errors"] = {"amount": str(exc)}
            return render(request, "sep24/deposit.html", context, status=400)
        except submissions.SubmissionInFlight:
            return submitting_page(request, kind="deposit", transaction_id=transaction_id,
                                   form_url=form_url, live=True)
        except deposits.DepositStateError as exc:
            return sep24_error(request, "wrong_state", str(exc), 409,
                               status_url=_status_url(transaction_id))
        except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
            log.warning("deposit %s submit failed: %s", transaction_id, exc)
            who = "payment provider" if isinstance(exc, rzp.RazorpayError) else "anchor"
            return sep24_error(request, "unavailable",
                               f"The {who} is not answering right now; you have not been charged.",
                               503, retry_url=request.path)
        log.info("deposit order created", extra={"order_id": order.order_id,
                                                 "amount_in": str(order.amount_in)})
        if order.status != DepositOrder.Status.AWAITING_PAYMENT:
            return redirect(_status_url(transaction_id))
        return redirect("anchor:checkout", order_id=order.order_id)
    return render(request, "sep24/deposit.html", context)


@require_http_methods(["GET"])
def checkout(request, order_id: str):
    """``/sep24/checkout/<order_id>``: the hand-off to Razorpay Checkout -- what will
    be paid and received, and the button that opens Checkout (the sandbox's page, or
    the page embedding Checkout at RAZORPAY_CHECKOUT_URL), which returns to the status
    page. A paid or expired order goes to the status page. Needs the interactive scope
    for the order's transaction (403 otherwise)."""
    order = DepositOrder.objects.filter(order_id=order_id).first()
    if order is None or not sep24.session_allows(request, order.transaction_id,
                                                 sep24.SCOPE_INTERACTIVE):
        return _no_session(request)
    bind_contextvars(transaction_id=order.transaction_id)
    if order.status != DepositOrder.Status.AWAITING_PAYMENT or \
            sep24.checkout_paid(request, order.transaction_id) == order.order_id:
        return redirect(_status_url(order.transaction_id))
    back = request.build_absolute_uri(_status_url(order.transaction_id))
    return render(request, "sep24/checkout.html", {
        "order": order, "transaction_id": order.transaction_id,
        "checkout_url": rzp.checkout_url(order_id=order.order_id, callback_url=back),
        "status_url": _status_url(order.transaction_id)})


@require_http_methods(["GET"])
def more_info(request):
    """``GET /sep24/more_info?transaction_id=&token=``: AP's more_info_url; opens the
    session for that transaction with the more-info scope (the status page only, never
    the forms) and shows its status."""
    transaction_id = request.GET.get("transaction_id", "")
    bind_contextvars(transaction_id=transaction_id[:64])
    try:
        claims = sep24.verify_more_info_token(request.GET.get("token", ""), transaction_id)
    except sep24.TokenError as exc:
        return _token_error(request, exc)
    sep24.open_session(request, claims, sep24.SCOPE_MORE_INFO)
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
    "pending_user_transfer_complete": {
        "deposit": ("Payment received, confirming",
                    "Razorpay took your payment. We are confirming it with them, then we "
                    "send your USDC. Do not pay again.", "pending"),
        "": ("Payment received", "We are finishing up.", "pending")},
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


def _checkout_return(request, transaction_id: str) -> None:
    """Razorpay Checkout's return to the status page (``razorpay_payment_id``,
    ``razorpay_order_id``, ``razorpay_signature`` in the query; the sandbox's Checkout
    and our RAZORPAY_CHECKOUT_URL page send them as a GET). A valid signature for the
    order we stored for this transaction is noted in the session; anything else is
    ignored. Either way the caller redirects to the bare status URL."""
    order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
    order_id = request.GET.get("razorpay_order_id", "")
    if order is None or order_id != order.order_id or not rzp.verify_checkout_signature(
            order_id=order.order_id, payment_id=request.GET.get("razorpay_payment_id", ""),
            signature=request.GET.get("razorpay_signature", "")):
        log.warning("checkout return ignored: signature or order does not match")
        return
    sep24.note_checkout_paid(request, transaction_id, order.order_id)
    log.info("back from checkout", extra={"order_id": order.order_id})


def transaction_status(request, transaction_id: str):
    """``/sep24/transaction/<id>``: where the user lands after checkout and through
    AP's more_info_url. Shows AP's status in words, the steps, our own details of the
    kind (hooks above), and refreshes itself (SEP24_STATUS_REFRESH_S, default 5 s)
    until the status is final. Coming back from a successful Checkout (a valid
    signature, :func:`_checkout_return`) it says "Payment received, confirming" and
    never offers to pay again, even while AP still says pending_user_transfer_start.
    Opens with either scope; the form and checkout buttons show only to a session with
    the interactive scope (they would refuse the other)."""
    bind_contextvars(transaction_id=transaction_id[:64])
    if not sep24.session_allows(request, transaction_id, sep24.SCOPE_MORE_INFO):
        return sep24_error(request, "forbidden", "Open this page from your wallet to see it.",
                           403)
    if "razorpay_signature" in request.GET:
        _checkout_return(request, transaction_id)
        return redirect(_status_url(transaction_id))
    if "error[code]" in request.GET:  # Checkout's return from a failed attempt
        sep24.note_checkout_failed(request, transaction_id)
        log.info("back from checkout: the attempt failed",
                 extra={"error_code": request.GET.get("error[code]", "")[:64]})
        return redirect(_status_url(transaction_id))
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
    if details and kind == "deposit" and not details.get("status_as") and \
            status == "pending_user_transfer_start" and \
            sep24.checkout_paid(request, transaction_id) == details["order"].order_id:
        # Back from a successful Checkout, before the webhook: never offer to pay again.
        details = {**details, "status_as": "pending_user_transfer_complete"}
        details.pop("action_url", None)
        details.pop("action_label", None)
    if sep24.take_checkout_failed(request, transaction_id) and details and \
            details.get("action_url") and not details.get("notice"):
        # Still payable: the customer learns the attempt failed (its wording comes from
        # the query string, which anyone can write: a fixed text instead).
        details = {**details, "notice": "Your payment did not go through and nothing was "
                                        "charged. You can try again below."}
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
    if not sep24.session_allows(request, transaction_id, sep24.SCOPE_INTERACTIVE):
        context.pop("action_url", None)
        context.pop("action_label", None)
    return render(request, "sep24/transaction.html", context)


# --- AP callbacks and Razorpay webhooks ----------------------------------------------------

def _dig(body: dict, *keys: str) -> dict:
    """``body[k1][k2]...`` when every level is an object, else {} (for log context
    only: the services validate the shape)."""
    for key in keys:
        body = body.get(key) if isinstance(body, dict) else None
    return body if isinstance(body, dict) else {}


def _ap_event_outcome(outcome: str, response: JsonResponse) -> JsonResponse:
    """Count an AP event's outcome and log it on the request's own line (``outcome``,
    with the event's id and type bound above; corridor/middleware.py): no line of its
    own on the ingest path (issue 11 §3)."""
    metrics.AP_EVENTS.labels(outcome=outcome).inc()
    bind_contextvars(outcome=outcome)
    return response


@csrf_exempt
def ap_event(request):
    """``POST /callbacks/event`` (AP callback API). Unauthenticated: 401, nothing
    stored. Authenticated but unusable (not strict JSON, not an AP event, a field that
    cannot be stored): 200 ``{"outcome": "rejected", "error": ...}`` and a ``rejected``
    row for the operators, because AP redelivers a non-2xx forever and holds back every
    later event behind it (AP NOTES §3)."""
    if request.method != "POST":
        return inbound.method_not_allowed("POST")
    if not callbacks.ap_request_authorized(request.headers):
        return _ap_event_outcome("unauthorized",
                                 JsonResponse({"error": "unauthorized"}, status=401))
    event: dict = {}
    raw = inbound.read_body(request)
    try:
        event = callbacks.parse_json_object(raw)
        tx_id = _dig(event, "payload", "transaction").get("id")
        if isinstance(tx_id, str):
            bind_contextvars(transaction_id=inbound.sanitize(tx_id, 64))
        bind_contextvars(ap_event_id=inbound.sanitize(event.get("id"), 100),
                         ap_event_type=inbound.sanitize(event.get("type"), 60))
        outcome = callbacks.ap_event_receive(event=event)
    except callbacks.MalformedEvent as exc:
        event = event or (callbacks.salvage(raw) if not inbound.too_large(raw) else {})
        outcome = callbacks.event_reject(
            source=InboundEvent.Source.AP, event_id=event.get("id"),
            event_type=event.get("type"), reason=f"not an AP event: {exc}", raw=raw)
        return _ap_event_outcome(outcome, JsonResponse(
            {"outcome": outcome, "error": f"not an AP event: {exc}"}))
    return _ap_event_outcome(outcome, JsonResponse({"outcome": outcome}))


@csrf_exempt
def ap_customer(request):
    """``GET`` / ``PUT /callbacks/customer`` (AP callback API ``getCustomer`` /
    ``putCustomer``; anchor/customers.py has the rules). 200 with a
    ``GetCustomerResponse`` (``PUT`` answers the same shape, with the ``id``); a
    malformed request 400 and an unknown or foreign ``id`` 404, each ``{"error": ...}``
    (AP passes both to the client); no valid callback token: 401. ``PUT`` takes JSON or
    multipart (files as AP sends them: every part ``application/octet-stream``)."""
    if request.method not in ("GET", "PUT"):
        return inbound.method_not_allowed("GET", "PUT")
    if not callbacks.ap_request_authorized(request.headers):
        return JsonResponse({"error": "unauthorized"}, status=401)
    try:
        if request.method == "GET":
            params = {k: request.GET[k] for k in customers.IDENTITY if k in request.GET}
            return JsonResponse(customers.get(params).as_json())
        body, uploads = _customer_body(request)
        customer = customers.put(body, uploads)
    except customers.CustomerInputError as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    except inbound.InboundError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    return JsonResponse(customers.answer(customer).as_json())


def _customer_body(request) -> tuple[dict, list]:
    """The PUT body as strings and the uploaded files. Raises InboundError."""
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not length.isdigit() or int(length) > settings.CUSTOMER_BODY_MAX_BYTES:
        raise inbound.InboundError(f"the body is over {settings.CUSTOMER_BODY_MAX_BYTES} "
                                   f"bytes")
    if request.content_type == "multipart/form-data":
        try:
            form, files = request.parse_file_upload(request.META, request)
        except (MultiPartParserError, TooManyFieldsSent, RequestDataTooBig) as exc:
            raise inbound.InboundError(f"malformed multipart body: {exc}") from exc
        body = {}
        for name in form:
            values = form.getlist(name)
            if len(values) != 1:
                raise inbound.InboundError(f"{name} is given {len(values)} times")
            body[name] = values[0]
        uploads = []
        for name in files:
            parts = files.getlist(name)
            if len(parts) != 1:
                raise inbound.InboundError(f"{name} is given {len(parts)} times")
            if parts[0].size > settings.CUSTOMER_FILE_MAX_BYTES:
                raise inbound.InboundError(
                    f"{name} is {parts[0].size} bytes, more than the "
                    f"{settings.CUSTOMER_FILE_MAX_BYTES} allowed")
            uploads.append(customers.Upload(name=name, content=parts[0].read()))
        return body, uploads
    return callbacks.parse_json_object(inbound.read_body(request)), []


@csrf_exempt
def ap_customer_delete(request, customer_id: str):
    """``DELETE /callbacks/customer/{id}`` (AP callback API ``delCustomer``): 204 once
    the customer is deleted (its personal data erased, or sealed for the retention
    period: anchor/customers.py), 404 ``{"error": ...}`` for an unknown id."""
    if request.method != "DELETE":
        return inbound.method_not_allowed("DELETE")
    if not callbacks.ap_request_authorized(request.headers):
        return JsonResponse({"error": "unauthorized"}, status=401)
    try:
        customers.delete(inbound.path_text(customer_id, max_length=40),
                         account=customers.account_of(request.GET))
    except customers.CustomerInputError as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    except inbound.InboundError:
        return JsonResponse({"error": f"customer {inbound.sanitize(customer_id, 40)} not "
                                      "found"}, status=404)
    return HttpResponse(status=204)


RATE_PARAMS = ("type", "client_id", "sell_asset", "buy_asset", "sell_amount", "buy_amount",
               "country_code", "expire_after", "sell_delivery_method", "buy_delivery_method")


@csrf_exempt
def ap_rate(request):
    """``GET /callbacks/rate`` (AP callback API ``getRates``; anchor/quotes.py has the
    pricing): 200 ``{"rate": {...}}``; ``type=firm`` adds ``id`` and ``expires_at`` and
    stores the quote. A malformed request is a 400 and one Corridor does not serve (a
    pair, an amount below the fee, a country) a 422, each ``{"error": "..."}`` (AP
    gives the text to the client); no valid callback token: 401; the rate source
    down: 503."""
    if request.method != "GET":
        return inbound.method_not_allowed("GET")
    if not callbacks.ap_request_authorized(request.headers):
        return JsonResponse({"error": "unauthorized"}, status=401)
    try:
        params = {name: inbound.text(request.GET[name], name, max_length=200)
                  for name in RATE_PARAMS if name in request.GET}
    except inbound.InboundError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    try:
        rate = quotes.rate_answer(params)
    except quotes.QuoteRefused as exc:
        return JsonResponse({"error": str(exc)}, status=exc.status)
    except quotes.RateUnavailable as exc:
        log.warning("no rate: %s", exc)
        return JsonResponse({"error": "no exchange rate right now; try again"}, status=503)
    return JsonResponse({"rate": rate})


def webhook_outcome(source: str, outcome: str, response: JsonResponse) -> JsonResponse:
    """Count a provider webhook's outcome (``source``: razorpay | razorpayx) and log it on
    the request's own line (``source``, ``outcome``; corridor/middleware.py): no line of
    its own on the ingest path (issue 11 §3). The drain logs ``webhook applied``."""
    metrics.WEBHOOKS.labels(source=source, outcome=outcome).inc()
    bind_contextvars(source=source, outcome=outcome)
    return response


def signed_event_rejected(source: str, *, event_id, event_type, exc: Exception,
                          raw: bytes) -> JsonResponse:
    """The answer to a correctly signed provider webhook that can never be stored
    (``source``: razorpay | razorpayx): recorded once as ``rejected`` (anchor/callbacks.py
    ``event_reject``), counted, logged, and a 200 so Razorpay stops retrying (it
    disables endpoints that keep failing, razorpay/NOTES.md §1.5)."""
    what = "Razorpay payment" if source == "razorpay" else "RazorpayX payout"
    reason = f"not a {what} event: {exc}"
    outcome = callbacks.event_reject(source=source, event_id=event_id, event_type=event_type,
                                     reason=reason, raw=raw)
    return webhook_outcome(source, outcome, JsonResponse({"outcome": outcome,
                                                          "error": reason}))


def too_large_answer() -> JsonResponse:
    """A webhook body over ``inbound.MAX_BODY_BYTES``: 413, nothing read further or
    stored. Razorpay's events are a few KB; the signature cannot be checked without the
    whole body, and Corridor does not hold bodies that size."""
    return JsonResponse({"error": f"the body is over {inbound.MAX_BODY_BYTES} bytes"},
                        status=413)


@csrf_exempt
def razorpay_payments_webhook(request):
    """``POST /webhooks/razorpay/payments``. A bad or missing signature: 400, nothing
    stored. Signed but unusable (not strict JSON, a field longer than its column, a
    value out of range, no event id): 200 ``rejected`` (:func:`signed_event_rejected`)."""
    if request.method != "POST":
        return inbound.method_not_allowed("POST")
    raw = inbound.read_body(request)
    if inbound.too_large(raw):
        return webhook_outcome("razorpay", "too_large", too_large_answer())
    if not rzp.verify_webhook(raw, request.headers.get("X-Razorpay-Signature", "")):
        return webhook_outcome("razorpay", "invalid_signature",
                               JsonResponse({"error": "invalid signature"}, status=400))
    event_id = request.headers.get("X-Razorpay-Event-Id", "")
    event: dict = {}
    try:
        event = callbacks.parse_json_object(raw)
        bind_contextvars(razorpay_event_id=inbound.sanitize(event_id, 100))
        outcome = callbacks.razorpay_payment_webhook(event_id=event_id, event=event, raw=raw)
    except (callbacks.MalformedEvent, DataError) as exc:
        if isinstance(exc, DataError):  # a column the checks missed: still never storable
            log.exception("signed payment webhook could not be stored")
        event = event or callbacks.salvage(raw)
        return signed_event_rejected("razorpay", event_id=event_id,
                                     event_type=event.get("event"), exc=exc, raw=raw)
    return webhook_outcome("razorpay", outcome, JsonResponse({"outcome": outcome}))
