"""Refunds of the Razorpay stand-in (TREASURY §2; docs ``api/refunds/create-normal``,
``api/refunds/entity``, ``api/refunds/normal-refunds-idempotent``, ``webhooks/refunds``).

Amounts are integer paise. Endpoints (views.py):

- ``POST /v1/payments/{id}/refund`` ``{"amount", "speed", "receipt", "notes"}``, all
  optional (``amount`` omitted = what remains of the captured amount; less = a partial
  refund; several partial refunds until the captured amount is used up). Refused with
  Razorpay's 400 ``BAD_REQUEST_ERROR`` body: not a captured payment, an unknown id, an
  extra field, an amount below ₹1 or above what remains, a payment already fully
  refunded. Header ``X-Refund-Idempotency`` (optional; at least 10 characters of
  ``[A-Za-z0-9_-]``): the same key with the same payment and body answers the refund it
  created (latest state); a different request under a used key is 400 "Different
  request with the same idempotency key has already been processed." (the docs' tip box
  says 400, the error table 409: TREASURY §2.1, §9.4); a retry while the first is in
  flight is 409. ``receipt`` is not made unique (the docs do not say Razorpay enforces
  it).
- ``GET /v1/payments/{id}/refunds[?count=&skip=]``: the payment's refunds, newest
  first; ``GET /v1/payments/{id}/refunds/{refund_id}``; ``GET /v1/refunds/{id}``.

Life cycle (background loop, :func:`advance_due`)::

    create -> pending   (answer; webhook refund.created)
      + settle delay -> processed, speed_processed, acquirer_data.arn  (refund.processed)
                     |  failed                                           (refund.failed)

A processed refund is deducted from the next settlement (a ``refund`` row of the
settlement recon, settlements.py ``queue_refund``).

The payment entity shows ``amount_refunded`` (pending and processed refunds; a failed
one gives its amount back), ``refund_status`` (``null`` / ``partial`` / ``full``) and
``status: refunded`` once the whole amount is refunded (docs ``payments/refunds/issue``).
The refund webhooks go to the pay-in URL (target ``payments``) and carry
``payload.refund.entity`` and ``payload.payment.entity`` as they were when queued.

The settle delay is ``SANDBOX_REFUND_SETTLE_S`` (default 1.0 s), overridden by fault
``razorpay.refund_settle_delay`` ``{"seconds": float}``.

Fault switches (``POST /sandbox/faults``), taken once per create that passes validation
and applied to that refund's whole life:

- ``razorpay.refund_create_5xx_after_create``: the refund is created and lives normally,
  but the create call answers 500 ``SERVER_ERROR`` (the lost answer);
- ``razorpay.refund_fail``: ``pending`` -> ``failed`` at settle time (``refund.failed``);
- ``razorpay.refund_webhook_lose``: the refund's webhooks are recorded, never sent;
- ``razorpay.refund_webhook_duplicate`` ``{"copies": 3, "concurrent": false}``: each
  refund webhook delivered ``copies`` times with the same id and bytes;
- ``razorpay.refund_webhook_reorder``: ``refund.created`` is held back and delivered
  after the terminal ``refund.processed`` / ``refund.failed``.

Read fault (taken once per call): ``razorpay.refund_fetch_5xx``: the refund reads
(``GET .../refunds``, ``GET /v1/refunds/{id}``) answer 500.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.http import JsonResponse
from django.utils import timezone

from sandbox.control import faults
from sandbox.razorpay import payins, payouts, settlements, webhooks
from sandbox.razorpay.common import RazorpayError, new_id, server_error
from sandbox.razorpay.models import (
    Payment,
    Refund,
    RefundIdempotencyKey,
    WebhookDelivery,
    WebhookEvent,
)

DB = "sandbox"
IDEMPOTENCY_HEADER = "X-Refund-Idempotency"
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_\-]{10,100}")  # TREASURY §2.1 (upper bound: ours)
REFUND_FIELDS = {"amount", "speed", "receipt", "notes"}
SPEEDS = {"normal", "optimum"}
MIN_AMOUNT = 100  # paise: "The amount must be at least INR 1.00" (normal refunds)
SERVER_ERROR_BODY = server_error().body


def _not_found() -> RazorpayError:
    return RazorpayError("The id provided does not exist")


# --- entities -------------------------------------------------------------------------


def refund_entity(refund: Refund) -> dict:
    """The refund entity (docs ``api/refunds/entity``; keys of
    ``webhook_refund_processed.json``)."""
    return {
        "id": refund.id,
        "entity": "refund",
        "amount": refund.amount,
        "currency": refund.currency,
        "payment_id": refund.payment_id,
        "notes": refund.notes,
        "receipt": refund.receipt,
        "acquirer_data": refund.acquirer_data,
        "created_at": refund.created_at,
        "batch_id": None,
        "status": refund.status,
        "speed_processed": refund.speed_processed,
        "speed_requested": refund.speed_requested,
    }


def refunded_of(payment: Payment) -> int:
    """Paise refunded on ``payment``: pending and processed refunds (a failed refund
    gives its amount back)."""
    total = (Refund.objects.using(DB).filter(payment_id=payment.pk)
             .exclude(status="failed").aggregate(total=Sum("amount"))["total"])
    return int(total or 0)


# --- creating -------------------------------------------------------------------------


def check_idempotency_key(key: str | None) -> str | None:
    """The ``X-Refund-Idempotency`` header: absent -> None (the header is optional);
    not 10+ characters of ``[A-Za-z0-9_-]`` -> 400 (sandbox wording)."""
    if key is None or key == "":
        return None
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise RazorpayError("The idempotency key must be at least 10 characters long and may "
                            "contain only letters, numbers, hyphens and underscores.",
                            field=IDEMPOTENCY_HEADER)
    return key


def _validate(data, payment: Payment, remaining: int) -> dict:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RazorpayError("The request body must be a JSON object.")
    extra = sorted(set(data) - REFUND_FIELDS)
    if extra:
        raise RazorpayError(f"{', '.join(extra)} is/are not required and should not be sent",
                            reason="extra_field_sent", field=extra[0])
    amount = data.get("amount", remaining)
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise RazorpayError("The amount must be an integer.", field="amount")
    if amount < MIN_AMOUNT:
        raise RazorpayError(f"The amount must be at least {payment.currency} 1.00",
                            field="amount")
    if amount > remaining:
        raise RazorpayError("The refund amount provided is greater than amount captured",
                            field="amount")
    speed = data.get("speed", "normal")
    if speed not in SPEEDS:
        raise RazorpayError("Invalid speed. It should be either normal or optimum",
                            field="speed")
    receipt, notes = payins.receipt_and_notes(data)
    return {"amount": amount, "speed_requested": speed, "receipt": receipt, "notes": notes}


def _settle_delay_s() -> float:
    override = faults.take("razorpay.refund_settle_delay")
    if override is not None and "seconds" in override:
        return float(override["seconds"])
    return float(getattr(settings, "SANDBOX_REFUND_SETTLE_S", 1.0))


def _take_faults() -> dict:
    flags: dict = {"settle_s": _settle_delay_s()}
    if faults.take("razorpay.refund_create_5xx_after_create") is not None:
        flags["create_5xx"] = True
    if faults.take("razorpay.refund_fail") is not None:
        flags["fail"] = True
    if faults.take("razorpay.refund_webhook_lose") is not None:
        flags["lose"] = True
    duplicate = faults.take("razorpay.refund_webhook_duplicate")
    if duplicate is not None:
        flags["duplicate"] = {"copies": int(duplicate.get("copies", 3)),
                              "concurrent": bool(duplicate.get("concurrent", False))}
    if faults.take("razorpay.refund_webhook_reorder") is not None:
        flags["reorder"] = True
    return flags


def _request_hash(payment_id: str, data) -> str:
    canonical = json.dumps([payment_id, data], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _claim(key: str, request_hash: str) -> RefundIdempotencyKey | None:
    return payouts.claim_key(RefundIdempotencyKey, key, request_hash, "refund", _in_progress)


def _in_progress() -> RazorpayError:
    return RazorpayError("Request failed because another refund operation with the same "
                         "idempotency key is in progress", field=IDEMPOTENCY_HEADER,
                         status=409)


def create_refund(*, payment_id: str, data, idempotency_key: str | None) -> JsonResponse:
    """``POST /v1/payments/{payment_id}/refund``: create a ``pending`` refund of
    ``data["amount"]`` paise (default: what remains), queue ``refund.created`` and the
    settle step. Returns the HTTP response (200 with the refund entity, or 500 under
    ``razorpay.refund_create_5xx_after_create``); raises ``RazorpayError``."""
    key = check_idempotency_key(idempotency_key)
    request_hash = _request_hash(payment_id, data)
    if key is not None:
        existing = _claim(key, request_hash)
        if existing is not None:
            if existing.in_flight:
                raise _in_progress()
            if existing.request_hash != request_hash:
                raise RazorpayError("Different request with the same idempotency key has "
                                    "already been processed.", field=IDEMPOTENCY_HEADER)
            return JsonResponse(refund_entity(
                Refund.objects.using(DB).get(pk=existing.refund_id)))
    created = False
    try:
        with transaction.atomic(using=DB):
            payment = (Payment.objects.using(DB).select_for_update()
                       .filter(pk=payment_id).first())
            if payment is None:
                raise _not_found()
            if payment.status not in ("captured", "refunded"):
                raise RazorpayError("Only captured payments can be refunded",
                                    field="payment_id")
            remaining = payment.amount - refunded_of(payment)
            if remaining <= 0:
                raise RazorpayError("The payment has been fully refunded already",
                                    field="payment_id")
            fields = _validate(data, payment, remaining)
            flags = _take_faults()
            now = timezone.now()
            refund = Refund.objects.using(DB).create(
                id=new_id("rfnd_"), payment=payment, currency=payment.currency,
                status="pending", acquirer_data={"arn": None}, idempotency_key=key,
                faults=flags, next_step_ts=now + timedelta(seconds=flags["settle_s"]),
                created_at=int(now.timestamp()), created_ts=now, **fields)
            if refund.amount == remaining:
                payment.status = "refunded"
                payment.save(using=DB, update_fields=["status"])
            if key is not None:
                RefundIdempotencyKey.objects.using(DB).filter(key=key).update(refund=refund)
            answer = refund_entity(refund)
            created_event = ("refund.created", _payload(refund))
            if flags.get("reorder"):
                Refund.objects.using(DB).filter(pk=refund.pk).update(
                    held_events=[list(created_event)])
            else:
                _queue(refund, [created_event])
        created = True
    finally:
        if key is not None:
            claims = RefundIdempotencyKey.objects.using(DB).filter(key=key, in_flight=True)
            if created:
                claims.update(in_flight=False)
            else:
                claims.delete()  # refused: the key stays free
    if flags.get("create_5xx"):
        return JsonResponse(SERVER_ERROR_BODY, status=500)
    return JsonResponse(answer)


# --- reading --------------------------------------------------------------------------


def _read_fault() -> None:
    if faults.take("razorpay.refund_fetch_5xx") is not None:
        raise server_error()


def payment_refunds(payment_id: str, *, count: int = 10, skip: int = 0) -> dict:
    """``GET /v1/payments/{id}/refunds``: newest first, as a collection."""
    _read_fault()
    if not Payment.objects.using(DB).filter(pk=payment_id).exists():
        raise _not_found()
    rows = Refund.objects.using(DB).filter(payment_id=payment_id).order_by("-created_ts", "-id")
    items = [refund_entity(r) for r in rows[skip: skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def get_refund(refund_id: str, *, payment_id: str | None = None) -> dict:
    """``GET /v1/refunds/{id}`` (or ``/v1/payments/{payment_id}/refunds/{id}``)."""
    _read_fault()
    rows = Refund.objects.using(DB).filter(pk=refund_id)
    if payment_id is not None:
        rows = rows.filter(payment_id=payment_id)
    refund = rows.first()
    if refund is None:
        raise _not_found()
    return refund_entity(refund)


# --- life cycle -----------------------------------------------------------------------


def _payload(refund: Refund) -> dict:
    from sandbox.razorpay.payins import payment_entity

    payment = Payment.objects.using(DB).get(pk=refund.payment_id)
    return {"refund": {"entity": refund_entity(refund)},
            "payment": {"entity": payment_entity(payment)}}


def _last_delivery(refund: Refund) -> WebhookDelivery | None:
    return (WebhookDelivery.objects.using(DB)
            .filter(event__entity_id=refund.id, kind="original").order_by("-id").first())


def _queue(refund: Refund, events: list) -> None:
    flags = refund.faults
    duplicate = flags.get("duplicate") or {}
    payment_order = (Payment.objects.using(DB).filter(pk=refund.payment_id)
                     .values_list("order_id", flat=True).first())
    webhooks.enqueue(
        target="payments", entity_id=refund.id, order_id=payment_order,
        events=[(name, payload) for name, payload in events],
        lost=bool(flags.get("lose")), copies=int(duplicate.get("copies", 1)),
        concurrent=bool(duplicate.get("concurrent", False)), after=_last_delivery(refund))


def _arn() -> str:
    return "".join(secrets.choice("0123456789") for _ in range(12))


def _settle(refund: Refund, now) -> None:
    """``pending`` -> ``processed`` (speed, ARN) or ``failed`` (fault), its webhook
    queued, then any held event."""
    refund.next_step_ts = None
    if refund.faults.get("fail"):
        refund.status = "failed"
        name = "refund.failed"
        payment = Payment.objects.using(DB).select_for_update().get(pk=refund.payment_id)
        if payment.status == "refunded":  # the amount is refundable again
            payment.status = "captured"
            payment.save(using=DB, update_fields=["status"])
    else:
        refund.status = "processed"
        refund.speed_processed = "normal"
        refund.acquirer_data = {"arn": _arn()}
        refund.processed_ts = now
        name = "refund.processed"
    held, refund.held_events = refund.held_events, []
    refund.save(using=DB)
    if refund.status == "processed":  # deducted from the next settlement (settlements.py)
        settlements.queue_refund(refund, processed_ts=now)
    _queue(refund, [(name, _payload(refund)), *[(n, p) for n, p in held]])


def advance_due() -> int:
    """Settle every refund whose settle time came (background loop), each locked
    (``SKIP LOCKED``) and moved in its own transaction with its webhooks."""
    done = 0
    while True:
        now = timezone.now()
        with transaction.atomic(using=DB):
            refund = (Refund.objects.using(DB).select_for_update(skip_locked=True)
                      .filter(next_step_ts__lte=now).order_by("next_step_ts").first())
            if refund is None:
                return done
            if refund.status == "pending":
                _settle(refund, now)
            else:
                Refund.objects.using(DB).filter(pk=refund.pk).update(next_step_ts=None)
            done += 1


def sandbox_listing(*, payment_id: str | None = None, receipt: str | None = None) -> list[dict]:
    """Every refund, oldest first (``GET /razorpay/sandbox/refunds``), for tests and
    the demo's double-refund count; each entity plus its idempotency key and faults."""
    rows = Refund.objects.using(DB).order_by("created_ts", "id")
    if payment_id:
        rows = rows.filter(payment_id=payment_id)
    if receipt:
        rows = rows.filter(receipt=receipt)
    return [{**refund_entity(r), "idempotency_key": r.idempotency_key, "faults": r.faults}
            for r in rows]


def reset() -> None:
    """Empty the refund tables and the refund webhooks."""
    with transaction.atomic(using=DB):
        WebhookDelivery.objects.using(DB).filter(event__entity_id__startswith="rfnd_").delete()
        WebhookEvent.objects.using(DB).filter(entity_id__startswith="rfnd_").delete()
        RefundIdempotencyKey.objects.using(DB).all().delete()
        Refund.objects.using(DB).all().delete()
