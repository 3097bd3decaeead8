"""Pay-in services of the Razorpay stand-in: orders, payments, the pay action behind the
checkout page, and the pay-in webhooks they queue.

Amounts are integer paise (NOTES §0.1). Entity shapes follow the reference payloads
``webhook_payment_captured_upi.json`` / ``webhook_order_paid_upi.json`` /
``webhook_payment_failed_netbanking.json`` and the docs pages ``api/orders/entity``,
``payments/payments``.

Fault switches (taken once per pay call, applied to every event of that payment):

- ``razorpay.webhook_replay`` params ``{"copies": 3, "concurrent": false}``: each event is
  delivered ``copies`` times with the same event id and bytes (NOTES §5.6);
- ``razorpay.webhook_lose``: the payment's events are never delivered; the API still shows
  the order paid (NOTES §1.7 step 5);
- ``razorpay.webhook_reorder``: ``order.paid`` arrives before ``payment.captured``
  (NOTES §1.4; otherwise the order is ``SANDBOX_RAZORPAY_EVENT_ORDER``: ``random``
  (default), ``payment_first`` or ``order_first``);
- ``razorpay.payment_failed_then_captured`` params ``{"delay_s": 0.5}``: the pay call
  fails the payment and queues ``payment.failed``; ``delay_s`` later the same payment
  turns ``captured``, the order ``paid``, and ``payment.captured`` + ``order.paid`` follow
  (late authorisation, NOTES §1.3, §5.8).

Read fault (taken once per call, so ``times: null`` is an outage until cleared):

- ``razorpay.payment_fetch_5xx``: ``GET /v1/payments/{id}`` and ``GET
  /v1/orders/{id}/payments`` answer 500 ``SERVER_ERROR`` (the payments API down while
  webhooks still arrive; NOTES §1.7 step 5 is the recovery).
"""

from __future__ import annotations

import random
import secrets
from datetime import timedelta
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from sandbox.control import faults
from sandbox.razorpay import settlements, webhooks
from sandbox.razorpay.common import (
    RazorpayError,
    checkout_signature,
    compact_json,
    new_id,
    server_error,
)
from sandbox.razorpay.models import Order, Payment, WebhookDelivery, WebhookEvent

DB = "sandbox"
CURRENCIES = {"INR"}  # INR pay-ins only in this sandbox
MIN_AMOUNT = 100  # paise; docs api/orders/create: "The amount must be at least INR 1.00"
MAX_RECEIPT = 40
MAX_NOTES = 15
MAX_NOTE_VALUE = 256
ORDER_FIELDS = {
    "amount", "currency", "receipt", "notes", "partial_payment", "first_payment_min_amount",
    "payment_capture", "unique_receipt",
}
METHODS = {"upi", "netbanking", "card"}
OUTCOMES = {"captured", "failed"}
FEE_PERCENT = 2  # sandbox fee schedule: 2 % of the amount, plus 18 % GST on the fee
GST_PERCENT = 18
TEST_EMAIL = "test.user@example.invalid"
TEST_CONTACT = "+910000000000"
FAILURE = {  # webhook_payment_failed_netbanking.json
    "error_code": "BAD_REQUEST_ERROR",
    "error_description": "Payment failed",
    "error_source": "bank",
    "error_step": "payment_authorization",
    "error_reason": "payment_failed",
}


def _not_found() -> RazorpayError:
    return RazorpayError("The id provided does not exist")


# --- entities -------------------------------------------------------------------------


def order_entity(order: Order) -> dict:
    """The order entity (docs ``api/orders/entity``; keys ordered as in
    ``webhook_order_paid_upi.json``)."""
    return {
        "id": order.id,
        "entity": "order",
        "amount": order.amount,
        "amount_paid": order.amount_paid,
        "amount_due": order.amount - order.amount_paid,
        "currency": order.currency,
        "receipt": order.receipt,
        "offer_id": None,
        "status": order.status,
        "attempts": order.attempts,
        "notes": order.notes,
        "created_at": order.created_at,
    }


def payment_entity(payment: Payment) -> dict:
    """The payment entity (docs ``payments/payments``; keys of
    ``webhook_payment_captured_upi.json`` plus the failure fields). ``amount_refunded``
    and ``refund_status`` come from its refunds (sandbox/razorpay/refunds.py)."""
    from sandbox.razorpay.refunds import refunded_of

    refunded = refunded_of(payment) if payment.status in ("captured", "refunded") else 0
    entity = {
        "id": payment.id,
        "entity": "payment",
        "amount": payment.amount,
        "currency": payment.currency,
        "base_amount": payment.amount,
        "status": payment.status,
        "order_id": payment.order_id,
        "invoice_id": None,
        "international": False,
        "method": payment.method,
        "amount_refunded": refunded,
        "amount_transferred": 0,
        "refund_status": None if refunded == 0 else (
            "full" if refunded >= payment.amount else "partial"),
        "captured": payment.status in ("captured", "refunded"),
        "description": payment.description,
        "card_id": payment.card_id,
        "bank": payment.bank,
        "wallet": None,
        "vpa": payment.vpa,
        "email": payment.email,
        "contact": payment.contact,
        "notes": payment.notes,
        "fee": payment.fee,
        "tax": payment.tax,
        "error_code": payment.error_code,
        "error_description": payment.error_description,
        "error_source": payment.error_source,
        "error_step": payment.error_step,
        "error_reason": payment.error_reason,
        "acquirer_data": payment.acquirer_data,
        "created_at": payment.created_at,
    }
    if payment.upi is not None:
        entity["upi"] = payment.upi
    return entity


def fee_and_tax(amount: int) -> tuple[int, int]:
    """Sandbox fee schedule in paise: fee = 2 % of ``amount`` + 18 % GST on it, each rounded
    half up; returns ``(fee including tax, tax)``. 100 paise -> (2, 0), as in
    ``webhook_payment_captured_upi.json``."""
    base = (amount * FEE_PERCENT + 50) // 100
    tax = (base * GST_PERCENT + 50) // 100
    return base + tax, tax


# --- orders ---------------------------------------------------------------------------


def receipt_and_notes(data: dict) -> tuple[str | None, list | dict]:
    """The ``receipt`` (at most 40 characters) and ``notes`` (at most 15 keys of
    strings or numbers, each at most 256 characters; ``[]`` when empty) of an order or
    refund create body, checked as Razorpay checks them. Raises RazorpayError."""
    receipt = data.get("receipt")
    if receipt is not None:
        if not isinstance(receipt, str):
            raise RazorpayError("The receipt must be a string.", field="receipt")
        if len(receipt) > MAX_RECEIPT:
            raise RazorpayError("The receipt may not be greater than 40 characters.",
                                field="receipt")
    notes = data.get("notes")
    if notes is None or notes == []:
        notes = []
    elif not isinstance(notes, dict):
        raise RazorpayError("The notes must be an array.", field="notes")
    elif len(notes) > MAX_NOTES:
        raise RazorpayError("Number of fields in notes should be less than or equal to 15",
                            field="notes")
    else:
        for key, value in notes.items():
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise RazorpayError(f"The notes.{key} must be a string.", field="notes")
            if len(str(value)) > MAX_NOTE_VALUE:
                raise RazorpayError(
                    f"The notes.{key} may not be greater than 256 characters.", field="notes"
                )
        notes = notes or []
    return receipt, notes


def _validate_order(data) -> dict:
    """Check a create-order body (docs ``api/orders/create``; error texts from that page and
    the newer ``test-s2s/error-index``). Stricter than Razorpay on one point: ``amount``
    must be a JSON integer, so ``100.0`` and ``"29935"`` are refused too (money is never a
    float, NOTES §5.10)."""
    if not isinstance(data, dict):
        raise RazorpayError("The request body must be a JSON object.")
    extra = sorted(set(data) - ORDER_FIELDS)
    if extra:
        raise RazorpayError(f"{', '.join(extra)} is/are not required and should not be sent",
                            reason="extra_field_sent", field=extra[0])
    if "amount" not in data:
        raise RazorpayError("amount: is required.", field="amount")
    amount = data["amount"]
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise RazorpayError("The amount must be an integer.", field="amount")
    currency = data.get("currency")
    if currency is None:
        raise RazorpayError("The currency field is required.", field="currency")
    if not isinstance(currency, str):
        raise RazorpayError(f"expected string but provided {currency!r}", field="currency")
    if currency not in CURRENCIES:
        raise RazorpayError("Currency is not supported", field="currency")
    if amount < MIN_AMOUNT:
        raise RazorpayError(f"The amount must be at least {currency} 1.00", field="amount")
    receipt, notes = receipt_and_notes(data)
    return {
        "amount": amount,
        "currency": currency,
        "receipt": receipt,
        "notes": notes,
        "partial_payment": bool(data.get("partial_payment", False)),
        "unique_receipt": bool(data.get("unique_receipt", False)),
    }


def create_order(*, data) -> dict:
    """``POST /v1/orders``: validate ``data`` (the decoded JSON body; amount in paise) and
    create an order in ``created``. A receipt already used is refused ("Order receipt
    should be unique.", newer ``test-s2s/error-index``) unless ``unique_receipt: true``,
    which returns the existing order instead (newer docs, idempotent create, NOTES §1.1).
    The receipt's uniqueness is a database constraint, so concurrent creates with one
    receipt make exactly one order. Returns the order entity; raises ``RazorpayError``."""
    fields = _validate_order(data)
    unique_receipt = fields.pop("unique_receipt")
    now = timezone.now()
    try:
        with transaction.atomic(using=DB):
            order = Order.objects.using(DB).create(
                id=new_id("order_"), created_at=int(now.timestamp()), created_ts=now, **fields
            )
    except IntegrityError:
        existing = Order.objects.using(DB).filter(receipt=fields["receipt"]).first()
        if existing is None:  # not a receipt clash (an id collision): let it surface
            raise
        if unique_receipt:
            return order_entity(existing)
        raise RazorpayError("Order receipt should be unique.", field="receipt")
    return order_entity(order)


def get_order(order_id: str) -> dict:
    order = Order.objects.using(DB).filter(pk=order_id).first()
    if order is None:
        raise _not_found()
    return order_entity(order)


def list_orders(*, receipt: str | None = None, count: int = 10, skip: int = 0) -> dict:
    """``GET /v1/orders[?receipt=]``: newest first, as a collection."""
    rows = Order.objects.using(DB).order_by("-created_ts", "-id")
    if receipt is not None:
        rows = rows.filter(receipt=receipt)
    items = [order_entity(o) for o in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def order_payments(order_id: str) -> dict:
    """``GET /v1/orders/:id/payments``: every payment of the order, newest first."""
    if faults.take("razorpay.payment_fetch_5xx") is not None:
        raise server_error()
    order = Order.objects.using(DB).filter(pk=order_id).first()
    if order is None:
        raise _not_found()
    items = [payment_entity(p) for p in order.payments.order_by("-created_ts", "-id")]
    return {"entity": "collection", "count": len(items), "items": items}


def get_payment(payment_id: str) -> dict:
    """``GET /v1/payments/:id``: the payment in its latest state."""
    if faults.take("razorpay.payment_fetch_5xx") is not None:
        raise server_error()
    payment = Payment.objects.using(DB).filter(pk=payment_id).first()
    if payment is None:
        raise _not_found()
    return payment_entity(payment)


# --- paying ---------------------------------------------------------------------------


def _digits(n: int) -> str:
    return "".join(secrets.choice("0123456789") for _ in range(n))


def _instrument(method: str, captured: bool) -> dict:
    """Method details: Razorpay's test instruments (``success@razorpay`` /
    ``failure@razorpay``, NOTES §4.1) and acquirer data (``rrn`` for UPI,
    ``bank_transaction_id`` for netbanking, NOTES §1.3)."""
    if method == "upi":
        vpa = "success@razorpay" if captured else "failure@razorpay"
        return {
            "vpa": vpa,
            "acquirer_data": {"rrn": _digits(12) if captured else None},
            "upi": {"payer_account_type": "bank_account", "vpa": vpa, "flow": "collect"},
        }
    if method == "netbanking":
        return {
            "bank": "HDFC",
            "acquirer_data": {"bank_transaction_id": _digits(10) if captured else None},
        }
    return {
        "card_id": new_id("card_"),
        "acquirer_data": {"auth_code": _digits(6) if captured else None},
    }


def _validate_pay(data) -> dict:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RazorpayError("The request body must be a JSON object.")
    method = data.get("method", "upi")
    if method not in METHODS:
        raise RazorpayError("Invalid payment method given: " + str(method), field="method")
    outcome = data.get("outcome", "captured")
    if outcome not in OUTCOMES:
        raise RazorpayError("outcome must be captured or failed (sandbox)", field="outcome")
    callback_url = data.get("callback_url")
    if callback_url is not None:
        if not isinstance(callback_url, str) or urlsplit(callback_url).scheme not in (
            "http", "https"
        ):
            raise RazorpayError("The callback url must be a valid URL.", field="callback_url")
    notes = data.get("notes") or []
    if not isinstance(notes, dict | list):
        raise RazorpayError("The notes must be an array.", field="notes")
    return {
        "method": method,
        "outcome": outcome,
        "callback_url": callback_url,
        "notes": notes,
        "description": data.get("description"),
        "email": data.get("email") or TEST_EMAIL,
        "contact": data.get("contact") or TEST_CONTACT,
    }


def _event_order() -> str:
    choice = getattr(settings, "SANDBOX_RAZORPAY_EVENT_ORDER", "random")
    if choice == "random":
        return random.choice(["payment_first", "order_first"])
    return choice


def _captured_events(payment: Payment, order: Order) -> list[tuple[str, dict]]:
    """``payment.captured`` (payment only) and ``order.paid`` (payment + order), two events
    with two ids for one payment (NOTES §1.4, §5.7), in the order the faults or the
    ``SANDBOX_RAZORPAY_EVENT_ORDER`` setting choose."""
    captured = ("payment.captured", {"payment": {"entity": payment_entity(payment)}})
    paid = (
        "order.paid",
        {"payment": {"entity": payment_entity(payment)}, "order": {"entity": order_entity(order)}},
    )
    reorder = payment.webhook_faults.get("reorder") or _event_order() == "order_first"
    return [paid, captured] if reorder else [captured, paid]


def _queue(payment: Payment, events, *, after=None, delay_s: float = 0.0):
    flags = payment.webhook_faults
    replay = flags.get("replay")
    return webhooks.enqueue(
        target="payments",
        entity_id=payment.id,
        order_id=payment.order_id,
        events=events,
        lost=bool(flags.get("lose")),
        copies=int(replay.get("copies", 3)) if replay is not None else 1,
        concurrent=bool(replay.get("concurrent", False)) if replay is not None else False,
        after=after,
        delay_s=delay_s,
    )


def _capture(payment: Payment, order: Order) -> None:
    fee, tax = fee_and_tax(payment.amount)
    payment.status = "captured"
    payment.fee, payment.tax = fee, tax
    for field in FAILURE:
        setattr(payment, field, None)
    payment.acquirer_data = _instrument(payment.method, True)["acquirer_data"]
    if payment.method == "upi":
        payment.vpa = "success@razorpay"
        payment.upi = {**payment.upi, "vpa": payment.vpa}
    order.amount_paid = order.amount
    order.status = "paid"


def _redirect(callback_url: str | None, params: dict) -> str | None:
    """``callback_url`` with ``params`` added to its query (existing parameters kept)."""
    if callback_url is None:
        return None
    parts = urlsplit(callback_url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


def pay_order(*, order_id: str, data) -> dict:
    """``POST /razorpay/sandbox/orders/{id}/pay`` (the checkout's Pay / Fail buttons).

    ``data``: ``{"method": "upi"|"netbanking"|"card", "outcome": "captured"|"failed",
    "callback_url": str, "notes": {...}, "description": str, "email": str, "contact": str}``,
    all optional. Creates a payment of the full order amount (paise) and:

    - captured: fee/tax set, order ``paid`` (``amount_paid`` = amount), webhooks
      ``payment.captured`` and ``order.paid`` queued;
    - failed: error fields set, order ``attempted``, ``payment.failed`` queued; the order
      can be paid again (India docs: several attempts per order, NOTES §1.1).

    Returns ``{"payment", "order", "callback", "redirect_url"}``: ``callback`` holds what
    Checkout hands to ``callback_url`` (``razorpay_payment_id``, ``razorpay_order_id``,
    ``razorpay_signature`` on success, NOTES §1.6; ``error[...]`` fields on failure).
    Raises ``RazorpayError`` for an unknown or already paid order (sandbox wording).
    """
    fields = _validate_pay(data)
    with transaction.atomic(using=DB):
        order = Order.objects.using(DB).select_for_update().filter(pk=order_id).first()
        if order is None:
            raise _not_found()
        if order.status == "paid":
            raise RazorpayError("Order has already been paid", field="order_id",
                                metadata={"order_id": order.id})
        late = faults.take("razorpay.payment_failed_then_captured")
        captured_now = fields["outcome"] == "captured" and late is None
        flags = {
            "lose": faults.take("razorpay.webhook_lose") is not None,
            "replay": faults.take("razorpay.webhook_replay"),
            "reorder": (
                faults.take("razorpay.webhook_reorder") is not None
                if (captured_now or late is not None) else False
            ),
        }
        now = timezone.now()
        instrument = _instrument(fields["method"], captured_now)
        payment = Payment(
            id=new_id("pay_"),
            order=order,
            amount=order.amount,
            currency=order.currency,
            status="failed",
            method=fields["method"],
            email=fields["email"],
            contact=fields["contact"],
            description=fields["description"],
            notes=fields["notes"],
            created_at=int(now.timestamp()),
            created_ts=now,
            webhook_faults=flags,
            **instrument,
        )
        order.attempts += 1
        order.status = "attempted"
        if captured_now:
            _capture(payment, order)
        else:
            for field, value in FAILURE.items():
                setattr(payment, field, value)
        if late is not None:
            delay_s = float(late.get("delay_s", 0.5))
            payment.late_capture_ts = now + timedelta(seconds=delay_s)
        payment.save(using=DB, force_insert=True)
        order.save(using=DB)
        if captured_now:
            settlements.queue_payment(payment, captured_ts=now)
            _queue(payment, _captured_events(payment, order))
        else:
            _queue(payment, [("payment.failed", {"payment": {"entity": payment_entity(payment)}})])
    if captured_now:
        callback = {
            "razorpay_payment_id": payment.id,
            "razorpay_order_id": order.id,
            "razorpay_signature": checkout_signature(order.id, payment.id),
        }
    else:
        callback = {
            "error[code]": payment.error_code,
            "error[description]": payment.error_description,
            "error[source]": payment.error_source,
            "error[step]": payment.error_step,
            "error[reason]": payment.error_reason,
            "error[metadata]": compact_json(
                {"payment_id": payment.id, "order_id": order.id}
            ).decode(),
        }
    return {
        "payment": payment_entity(payment),
        "order": order_entity(order),
        "callback": callback,
        "redirect_url": _redirect(fields["callback_url"], callback),
    }


def capture_due_late_payments() -> int:
    """Turn ``failed`` payments whose ``late_capture_ts`` has come into ``captured`` (fault
    ``razorpay.payment_failed_then_captured``): the order becomes ``paid`` and
    ``payment.captured`` + ``order.paid`` are queued after the ``payment.failed`` event.
    If another payment paid the order meanwhile, the late payment stays failed (sandbox
    choice; Razorpay would capture and refund it). Returns how many were captured."""
    captured = 0
    now = timezone.now()
    while True:
        with transaction.atomic(using=DB):
            payment = (
                Payment.objects.using(DB).select_for_update(skip_locked=True)
                .filter(late_capture_ts__lte=now).order_by("late_capture_ts").first()
            )
            if payment is None:
                return captured
            order = Order.objects.using(DB).select_for_update().get(pk=payment.order_id)
            payment.late_capture_ts = None
            if order.status == "paid":
                payment.save(using=DB)
                continue
            _capture(payment, order)
            payment.save(using=DB)
            order.save(using=DB)
            settlements.queue_payment(payment, captured_ts=now)
            failed_delivery = (
                WebhookDelivery.objects.using(DB)
                .filter(event__entity_id=payment.id, event__event="payment.failed",
                        kind="original").order_by("id").first()
            )
            _queue(payment, _captured_events(payment, order), after=failed_delivery)
            captured += 1


def format_inr(paise: int) -> str:
    """``123456789`` -> ``"₹12,34,567.89"`` (Indian digit grouping), integer arithmetic."""
    rupees, rest = divmod(paise, 100)
    digits = str(rupees)
    head, tail = digits[:-3], digits[-3:]
    groups = []
    while len(head) > 2:
        groups.insert(0, head[-2:])
        head = head[:-2]
    if head:
        groups.insert(0, head)
    return "₹" + ",".join([*groups, tail]) + f".{rest:02d}"


def checkout_context(order_id: str) -> dict | None:
    order = Order.objects.using(DB).filter(pk=order_id).first()
    if order is None:
        return None
    return {"order": order_entity(order), "amount_display": format_inr(order.amount)}


def reset() -> None:
    """Empty the stand-in's tables (settlements, deliveries, events, payments, orders)."""
    settlements.reset()
    with transaction.atomic(using=DB):
        WebhookDelivery.objects.using(DB).all().delete()
        WebhookEvent.objects.using(DB).all().delete()
        Payment.objects.using(DB).all().delete()
        Order.objects.using(DB).all().delete()
