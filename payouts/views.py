"""Thin HTTP layer for withdrawals: the SEP-24 withdrawal page and payout webhooks."""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpResponseNotAllowed, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from anchor import platform, sep24
from anchor import razorpay as rzp
from anchor.models import InboundEvent
from payouts import withdrawals
from payouts.providers.base import ProviderError
from payouts.webhooks import payout_webhook_apply

log = logging.getLogger(__name__)


def _error(request, message: str, status: int):
    return render(request, "sep24/error.html", {"message": message}, status=status)


@require_http_methods(["GET", "POST"])
def withdraw(request, transaction_id: str):
    """The withdrawal form: USDC amount and where to pay the INR; then the memo and
    account the wallet must pay."""
    if not sep24.session_allows(request, transaction_id):
        return _error(request, "Open this page from your wallet to continue.", 403)
    from payouts.models import WithdrawalRequest

    existing = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
    if existing is not None and existing.funds_requested_at is not None:
        return render(request, "sep24/withdraw_pay.html", {"w": existing})
    context = {"transaction_id": transaction_id, "data": request.POST, "errors": {},
               "rate": settings.WITHDRAW_RATE_INR_PER_USDC, "fee": settings.WITHDRAW_FEE_USDC,
               "min": settings.WITHDRAW_MIN_USDC, "max": settings.WITHDRAW_MAX_USDC}
    if request.method == "GET":
        return render(request, "sep24/withdraw.html", context)
    try:
        amount, beneficiary = withdrawals.parse_form(request.POST)
        if request.POST.get("confirm") != "yes":
            context["quote"] = withdrawals.quote(amount)
            return render(request, "sep24/withdraw.html", context)
        w = withdrawals.withdrawal_submit(transaction_id=transaction_id, amount_in=amount,
                                          beneficiary=beneficiary)
    except withdrawals.WithdrawalInputError as exc:
        context["errors"] = exc.errors
        return render(request, "sep24/withdraw.html", context, status=400)
    except ProviderError as exc:
        context["errors"] = {"account_number": f"The bank refused these details: {exc}"}
        return render(request, "sep24/withdraw.html", context, status=400)
    except withdrawals.WithdrawalStateError as exc:
        return _error(request, str(exc), 409)
    except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
        log.warning("withdrawal %s submit failed: %s", transaction_id, type(exc).__name__)
        return _error(request, "The payout provider is not reachable right now. "
                               "Try again shortly.", 503)
    return render(request, "sep24/withdraw_pay.html", {"w": w})


@csrf_exempt
def razorpayx_webhook(request):
    """``POST /webhooks/razorpay/payouts``: signature over the raw body, dedupe by
    ``X-Razorpay-Event-Id``, any order of arrival (forward-only ranks)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    raw = request.body
    if not rzp.verify_webhook(raw, request.headers.get("X-Razorpay-Signature", "")):
        return JsonResponse({"error": "invalid signature"}, status=400)
    event_id = request.headers.get("X-Razorpay-Event-Id", "")
    try:
        event = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        event = None
    if not isinstance(event, dict) or not event_id:
        return JsonResponse({"error": "signed body must be JSON with X-Razorpay-Event-Id"},
                            status=400)
    try:
        with transaction.atomic():
            InboundEvent.objects.create(source=InboundEvent.Source.RAZORPAYX,
                                        event_id=event_id,
                                        event_type=str(event.get("event", ""))[:60])
    except IntegrityError:
        return JsonResponse({"outcome": "duplicate"})
    outcome = payout_webhook_apply(event=event)
    InboundEvent.objects.filter(source=InboundEvent.Source.RAZORPAYX, event_id=event_id
                                ).update(outcome=outcome)
    return JsonResponse({"outcome": outcome})
