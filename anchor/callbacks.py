"""What AP and Razorpay send us: authentication, dedupe and the one service each.

- AP callback auth (NOTES §2.2): ``Authorization: Bearer <JWT HS256>`` with the
  callback secret (signature and ``exp``; an ``aud`` is accepted, not required; a few
  seconds of leeway), or ``X-Api-Key: <secret>`` (AP always uses that header name).
- AP events (NOTES §3): answer 2xx fast, also for types we ignore (a non-2xx blocks
  every later event); dedupe on ``id``; never act on the payload's status alone: a
  deposit in ``pending_anchor`` only schedules a release, which re-reads AP and needs
  Corridor's own captured payment.
- Razorpay webhooks (razorpay/NOTES.md §1.5, §5): signature over the raw bytes, dedupe
  on ``X-Razorpay-Event-Id`` and again per payment id; signed but unusable events get
  2xx so Razorpay does not disable the endpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

import jwt
from django.conf import settings
from django.db import IntegrityError, transaction
from structlog.contextvars import bind_contextvars

from anchor import deposits, inbox
from anchor.models import (
    DepositOrder,
    DepositPayment,
    DepositRefund,
    DepositRelease,
    InboundEvent,
)
from corridor import inbound

log = logging.getLogger(__name__)


def ap_request_authorized(headers) -> bool:
    """True for a valid callback JWT or API key from AP."""
    secret = settings.AP_CALLBACK_AUTH_SECRET
    api_key = headers.get("X-Api-Key", "")
    if api_key:
        return hmac.compare_digest(api_key.encode(), secret.encode())
    auth = headers.get("Authorization", "")
    if not auth.startswith("Bearer "):
        return False
    try:
        jwt.decode(auth[7:], secret, algorithms=["HS256"], leeway=settings.AP_JWT_LEEWAY_S,
                   options={"require": ["exp"], "verify_aud": False})
    except jwt.PyJWTError:
        return False
    return True


class MalformedEvent(inbound.InboundError):
    """The body is not shaped like the sender's events; the message says what is off."""


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object, decoded strictly by corridor/inbound.py
    (UTF-8, no lone surrogates, no NUL, no NaN, bounded depth and size). Raises
    MalformedEvent."""
    try:
        return inbound.json_object(raw)
    except inbound.InboundError as exc:
        raise MalformedEvent(str(exc)) from None


def salvage(raw: bytes) -> dict:
    """For the record of a rejected body only: the body as Python's lenient ``json``
    reads it (lone surrogates and all), or {} -- so a rejected event keeps the sender's
    id and type where they are readable. Never feed this to a service."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def _obj(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedEvent(f"{where} must be an object")
    return value


def _checked(check, *args, **kwargs):
    try:
        return check(*args, **kwargs)
    except MalformedEvent:
        raise
    except inbound.InboundError as exc:
        raise MalformedEvent(str(exc)) from None


def event_id_checked(value, where: str) -> str:
    """A sender's event id as stored in ``inbound_events.event_id``: a non-empty string
    (an integer is taken as its digits) that fits the column. Raises MalformedEvent."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return _checked(inbound.field_text, InboundEvent, "event_id", value, where)


def _event_id(value, where: str) -> str:
    return event_id_checked(value, where)


def _event_type(value, where: str) -> str:
    return _checked(inbound.field_text, InboundEvent, "event_type", value, where)


def event_reject(*, source: str, event_id, event_type, reason: str, raw: bytes) -> str:
    """Acknowledge a correctly signed (or authenticated) event that can never be
    stored or applied: record it once as outcome ``rejected`` with the reason, so the
    sender's retries stop (Razorpay retries non-2xx and disables the endpoint, NOTES
    §1.5; AP retries forever and holds back every later event, AP NOTES §3) and
    operators see it in the review queue (``operator_review_queue``, kind
    ``inbound``). Nothing else is written.

    ``event_id``/``event_type`` are whatever the sender gave (any type): an id that
    cannot be stored is replaced by ``sha256:<hex>`` of the id and the body, so every
    distinct delivery still dedupes; the type and reason are sanitised and cut to
    their columns, so this write cannot fail on the input. Returns ``rejected``, or
    ``duplicate`` when that id was already recorded."""
    try:
        stored_id = event_id_checked(event_id, "event id")
    except MalformedEvent:
        digest = hashlib.sha256(inbound.sanitize(event_id, 100_000).encode() + b"\n" + raw)
        stored_id = f"sha256:{digest.hexdigest()}"
    kind = inbound.sanitize(event_type, inbound.max_length(InboundEvent, "event_type"))
    try:
        with transaction.atomic():
            InboundEvent.objects.create(source=source, event_id=stored_id, event_type=kind,
                                        outcome=InboundEvent.REJECTED,
                                        reason=inbound.sanitize(reason, 1000))
    except IntegrityError:
        return "duplicate"
    log.error("signed %s event rejected: %s", source, inbound.sanitize(reason, 300),
              extra={"source": source, "event_id": stored_id, "outcome": "rejected"})
    return "rejected"


def ap_event_receive(*, event: dict) -> str:
    """Handle one AP event; returns the outcome (for the log and the reply).
    Raises MalformedEvent for a body that is not an AP event."""
    from anchor import tasks

    event_id = _event_id(event.get("id"), "id")
    event_type = _event_type(event.get("type"), "type")
    tx = _obj(_obj(event.get("payload"), "payload").get("transaction"), "payload.transaction")
    wants_release = (event_type in ("transaction_status_changed", "transaction_created")
                     and tx.get("kind") == "deposit" and tx.get("status") == "pending_anchor"
                     and tx.get("id"))
    if wants_release:
        _checked(inbound.field_text, DepositRelease, "transaction_id", tx["id"],
                 "payload.transaction.id")

    # SEP-31 receive (payouts/receive.py, named: payouts sits above anchor): the task
    # re-reads the transaction from AP; a customer's change re-decides those waiting.
    if event_type in ("transaction_status_changed", "transaction_created") and \
            tx.get("kind") == "receive" and isinstance(tx.get("id"), str) and tx["id"]:
        _checked(inbound.field_text, DepositRelease, "transaction_id", tx["id"],
                 "payload.transaction.id")
        return inbox.record(source=InboundEvent.Source.AP, event_id=event_id,
                            event_type=event_type, outcome="receive_scheduled",
                            follow_ups=[("payouts.tasks.receive_process", tx["id"])])
    if event_type == "customer_updated":
        return inbox.record(source=InboundEvent.Source.AP, event_id=event_id,
                            event_type=event_type, outcome="receive_recheck",
                            follow_ups=[("payouts.tasks.receive_customer_updated",)])
    # The outcome follows from the payload alone: one INSERT records the event and,
    # on the same row, the release to start (the drain dispatches it, anchor/inbox.py).
    if not wants_release:
        return inbox.record(source=InboundEvent.Source.AP, event_id=event_id,
                            event_type=event_type, outcome="ignored")
    return inbox.record(source=InboundEvent.Source.AP, event_id=event_id,
                        event_type=event_type, outcome="release_scheduled",
                        follow_ups=[(tasks.deposit_release, tx["id"])])


def razorpay_payment_webhook(*, event_id: str, event: dict, raw: bytes) -> str:
    """A verified pay-in webhook (``raw``: its body, ``event``: parsed): checked here
    (each field it lands in fits its column; raises MalformedEvent), then stored as it
    came for the drain to apply (``inbox.store``, one INSERT): ``received``, or
    ``duplicate`` for an event id recorded before. :func:`razorpay_payment_apply` is
    the effect."""
    event_id = _event_id(event_id, "X-Razorpay-Event-Id")
    name = _event_type(event.get("event"), "event")
    payload = _obj(event.get("payload"), "payload")
    payment = _obj(_obj(payload.get("payment"), "payload.payment").get("entity"),
                   "payload.payment.entity")
    if name.startswith("refund."):
        refund = _obj(_obj(payload.get("refund"), "payload.refund").get("entity"),
                      "payload.refund.entity")
        _checked(inbound.field_text, DepositRefund, "refund_id", refund.get("id"),
                 "payload.refund.entity.id", required=False)
    elif name in ("payment.captured", "order.paid") and payment:
        check_payment(payment)
    return inbox.store(source=InboundEvent.Source.RAZORPAY, event_id=event_id,
                       event_type=name, body=raw,
                       apply="anchor.callbacks.razorpay_payment_apply")


def razorpay_payment_apply(event: dict) -> str:
    """The effect of a stored pay-in webhook (run by the drain, once, in its claim
    transaction: anchor/inbox.py): ``payment.captured`` / ``order.paid`` carry the
    payment entity; both for one payment are one effect (per-payment uniqueness in
    ``deposits.payment_record``); ``refund.*`` go to ``refunds.refund_webhook_apply``.
    Returns the outcome."""
    name = event.get("event") or ""
    if name.startswith("refund."):
        from anchor import refunds

        return refunds.refund_webhook_apply(event=event)
    payment = ((event.get("payload") or {}).get("payment") or {}).get("entity") or {}
    if name not in ("payment.captured", "order.paid") or not payment:
        return "ignored"
    order_id = payment.get("order_id")
    order = None
    if isinstance(order_id, str) and order_id:
        # Read once: the log context here, and payment_record's checks. By the unique
        # key, unordered (.first() would add ORDER BY id).
        order = next(iter(DepositOrder.objects.filter(order_id=order_id)[:1]), None)
        if order is not None:
            bind_contextvars(transaction_id=order.transaction_id)
    return deposits.payment_record(payment=payment, order=order)


def check_payment(payment: dict) -> None:
    """A Razorpay payment entity (razorpay/NOTES.md §1.5) whose fields fit the
    ``deposit_payments`` columns they land in: ``id``, ``order_id``, ``currency``,
    ``method`` strings within their max_length; ``amount`` integer paise, 0..2^63-1;
    ``created_at`` Unix seconds (:func:`corridor.inbound.unix_seconds`). Raises MalformedEvent."""
    where = "payload.payment.entity"
    _checked(inbound.field_text, DepositPayment, "payment_id", payment.get("id"), f"{where}.id")
    for name in ("order_id", "currency", "method"):
        _checked(inbound.field_text, DepositPayment, name, payment.get(name), f"{where}.{name}",
                 required=False)
    if not isinstance(payment.get("status"), str | type(None)):
        raise MalformedEvent(f"{where}.status must be a string")
    if payment.get("amount") is not None:
        _checked(inbound.field_int, DepositPayment, "amount_paise", payment["amount"],
                 f"{where}.amount")
    if payment.get("created_at") is not None:
        _checked(inbound.unix_seconds, payment["created_at"], f"{where}.created_at")
