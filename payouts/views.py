"""Thin HTTP layer for withdrawals: the SEP-24 withdrawal page, its part of the status
page (a details hook registered with anchor.views), and payout webhooks."""

from __future__ import annotations

import logging
from decimal import Decimal

from django.conf import settings
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from structlog.contextvars import bind_contextvars

from anchor import callbacks, customers, inbox, limits, platform, sep24, submissions
from anchor import razorpay as rzp
from anchor.models import InboundEvent
from anchor.views import (
    kyc_and_limits,
    register_status_details,
    sep24_error,
    signed_event_rejected,
    submitting_page,
    too_large_answer,
    webhook_outcome,
)
from corridor import inbound
from payouts import fav, liquidity, withdrawals
from payouts.models import WithdrawalPayout, WithdrawalRequest
from payouts.providers.base import ProviderError
from payouts.webhooks import check_payout_event

log = logging.getLogger(__name__)


def _status_url(transaction_id: str) -> str:
    return reverse("anchor:transaction", kwargs={"transaction_id": transaction_id})


def _usdc(amount: Decimal) -> str:
    """7-place USDC as people write it: 10.0000000 -> "10", 0.5000000 -> "0.5"."""
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _amounts(w: WithdrawalRequest) -> dict:
    return {"amount_in": _usdc(w.amount_in), "fee": _usdc(w.fee)}


def _pay_page(request, w: WithdrawalRequest):
    return render(request, "sep24/withdraw_pay.html",
                  {"w": w, "status_url": _status_url(w.transaction_id), **_amounts(w)})


@require_http_methods(["GET", "POST"])
def withdraw(request, transaction_id: str):
    """The withdrawal form: USDC amount and where to pay the INR (bank account + IFSC,
    or a UPI ID), errors next to their fields, a quote to confirm (fields locked;
    "Change details" unlocks them); then the memo and account the wallet must pay.
    Needs the interactive scope for the transaction (403 otherwise): a status link
    (more_info_url) must never set the payout account. Any number of simultaneous
    confirms make one submission (anchor/submissions.py): the others, and any visit
    while it is being made, get the "being submitted" page (200), never a 5xx; once
    made, every visit shows the pay page."""
    bind_contextvars(transaction_id=transaction_id[:64])
    if not sep24.session_allows(request, transaction_id, sep24.SCOPE_INTERACTIVE):
        return sep24_error(request, "forbidden", "Open this page from your wallet to continue.",
                           403)
    existing = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
    if existing is not None and existing.funds_requested_at is not None:
        return _pay_page(request, existing)
    pending = submissions.in_flight(transaction_id)
    if request.method == "GET" and pending is not None and submissions.is_live(pending):
        return submitting_page(request, kind="withdrawal", transaction_id=transaction_id,
                               form_url=request.path, live=True)
    context = {"transaction_id": transaction_id, "data": request.POST, "errors": {},
               "rate": settings.WITHDRAW_RATE_INR_PER_USDC, "fee": settings.WITHDRAW_FEE_USDC,
               "min": settings.WITHDRAW_MIN_USDC, "max": settings.WITHDRAW_MAX_USDC}
    if request.method == "GET" or "edit" in request.POST:
        return render(request, "sep24/withdraw.html", context)
    try:
        amount, beneficiary = withdrawals.parse_form(request.POST)
        own = _own_account_problem(request, transaction_id, beneficiary.name)
        if own:
            raise withdrawals.WithdrawalInputError({"name": own})
        inr = withdrawals.quote(amount).amount_out
        short = liquidity.payout_shortfall(inr)
        if short:  # before the wallet sends its USDC (issue 13 §4)
            context["errors"] = {"amount": short}
            return render(request, "sep24/withdraw.html", context, status=409)
        if not kyc_and_limits(request, context, transaction_id, "withdrawal", inr):
            return render(request, "sep24/withdraw.html", context,
                          status=400 if context["errors"] else 200)
        if request.POST.get("confirm") != "yes":
            context["quote"] = withdrawals.quote(amount)
            return render(request, "sep24/withdraw.html", context)
        w = withdrawals.withdrawal_submit(transaction_id=transaction_id, amount_in=amount,
                                          beneficiary=beneficiary)
    except withdrawals.WithdrawalInputError as exc:
        context["errors"] = exc.errors
        return render(request, "sep24/withdraw.html", context, status=400)
    except submissions.SubmissionInFlight:
        return submitting_page(request, kind="withdrawal", transaction_id=transaction_id,
                               form_url=request.path, live=True)
    except ProviderError as exc:
        context["errors"] = {"account_number": f"The bank refused these details: {exc}"}
        return render(request, "sep24/withdraw.html", context, status=400)
    except withdrawals.WithdrawalStateError as exc:
        return sep24_error(request, "wrong_state", str(exc), 409,
                           status_url=_status_url(transaction_id))
    except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
        log.warning("withdrawal %s submit failed: %s", transaction_id, type(exc).__name__)
        who = "payout provider" if isinstance(exc, rzp.RazorpayError) else "anchor"
        return sep24_error(request, "unavailable",
                           f"The {who} is not answering right now; nothing has been paid yet.", 503,
                           retry_url=request.path)
    log.info("withdrawal submitted", extra={"amount_in": str(w.amount_in),
                                            "beneficiary_type": w.beneficiary_type})
    return _pay_page(request, w)


def _own_account_problem(request, transaction_id: str, holder: str) -> str:
    """A customer who gave KYC (anchor/limits.py) withdraws to an account in their own
    name: the holder typed must match the KYC name (payouts/fav.py ``name_match``), or
    fund account validation would only prove the account is the typed stranger's."""
    sub = sep24.session_sub(request, transaction_id)
    customer = limits.sep24_customer(sub) if sub else None
    data = customers.personal_data(customer) if customer is not None else {}
    kyc_name = " ".join(p for p in (data.get("first_name"), data.get("last_name")) if p)
    if not kyc_name or fav.name_match(holder, kyc_name).matched:
        return ""
    return "The account must be in your own name, as in your KYC details."


def _withdrawal_details(transaction_id: str, ap_tx: dict) -> dict | None:
    """The status page's withdrawal part: amounts, the masked beneficiary, the pay
    instructions while we wait for the USDC, the bank reference (UTR) once paid."""
    w = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
    if w is None:
        return None
    payout = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
    details = {"details_template": "sep24/_withdrawal_details.html", "w": w,
               "payout": payout, **_amounts(w),
               "awaiting_usdc": w.status == WithdrawalRequest.Status.AWAITING_FUNDS
               and w.funds_requested_at is not None and payout is None
               and ap_tx.get("status") in (None, "pending_user_transfer_start")}
    # Our own record ahead of AP's (its observer lags, or missed the payment).
    if ap_tx.get("status") == "pending_user_transfer_start" and (
            payout is not None or w.status == WithdrawalRequest.Status.FUNDS_VERIFIED):
        details["status_as"] = "pending_anchor"
    elif ap_tx.get("status") == "pending_anchor" and payout is not None and \
            payout.status in (WithdrawalPayout.Status.PROCESSING,
                              WithdrawalPayout.Status.COMPLETED):
        details["status_as"] = "pending_external"
    held = {WithdrawalPayout.Status.MANUAL_REVIEW, WithdrawalPayout.Status.FAILED,
            WithdrawalPayout.Status.REVERSED}
    if w.status == WithdrawalRequest.Status.MANUAL_REVIEW or (payout and payout.status in held):
        details["notice"] = ("Our team is reviewing this withdrawal and will contact you. "
                             "Do not send the USDC again.")
    elif w.funds_requested_at is None:
        details["action_url"] = reverse("payouts:withdraw",
                                        kwargs={"transaction_id": transaction_id})
        details["action_label"] = "Finish the form"
    return details


register_status_details("withdrawal", _withdrawal_details)


@csrf_exempt
def razorpayx_webhook(request):
    """``POST /webhooks/razorpay/payouts``: signature over the raw body, dedupe by
    ``X-Razorpay-Event-Id``, any order of arrival (forward-only ranks). A bad
    signature: 400, nothing stored; signed but never storable (corridor/inbound.py
    checks in ``check_payout_event``): 200 ``rejected``, for the operators."""
    if request.method != "POST":
        return inbound.method_not_allowed("POST")
    raw = inbound.read_body(request)
    if inbound.too_large(raw):
        return webhook_outcome("razorpayx", "too_large", too_large_answer())
    if not rzp.verify_webhook(raw, request.headers.get("X-Razorpay-Signature", "")):
        return webhook_outcome("razorpayx", "invalid_signature",
                               JsonResponse({"error": "invalid signature"}, status=400))
    event_id = request.headers.get("X-Razorpay-Event-Id", "")
    event: dict = {}
    try:
        event = callbacks.parse_json_object(raw)
        event_id = callbacks.event_id_checked(event_id, "X-Razorpay-Event-Id")
        check_payout_event(event)
    except callbacks.MalformedEvent as exc:
        # Signed by Razorpay, yet never storable: acknowledge it as rejected.
        event = event or callbacks.salvage(raw)
        return signed_event_rejected("razorpayx", event_id=event_id,
                                     event_type=event.get("event"), exc=exc, raw=raw)
    entity = ((event.get("payload") or {}).get("payout") or {}).get("entity") or {}
    if isinstance(entity.get("reference_id"), str):
        bind_contextvars(transaction_id=entity["reference_id"])
    bind_contextvars(razorpay_event_id=event_id)
    # Stored as verified; the drain applies it (payout_webhook_apply asks RazorpayX
    # first, and is tried again by a later drain while RazorpayX cannot be asked).
    outcome = inbox.store(source=InboundEvent.Source.RAZORPAYX, event_id=event_id,
                          event_type=inbound.sanitize(event.get("event"), 60), body=raw,
                          apply="payouts.webhooks.payout_webhook_apply_stored")
    return webhook_outcome("razorpayx", outcome, JsonResponse({"outcome": outcome}))
