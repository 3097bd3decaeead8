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

import hmac
import json
import logging

import jwt
from django.conf import settings
from django.db import IntegrityError, transaction

from anchor import deposits
from anchor.models import InboundEvent, Sep24Customer

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


def _seen(source: str, event_id: str, event_type: str, outcome: str) -> bool:
    """Record the delivery; False when (source, event_id) was already recorded."""
    try:
        with transaction.atomic():
            InboundEvent.objects.create(source=source, event_id=event_id,
                                        event_type=event_type[:60], outcome=outcome[:200])
    except IntegrityError:
        return False
    return True


class MalformedEvent(ValueError):
    """The body is not shaped like the sender's events; the message says what is off."""


def parse_json_object(raw: bytes) -> dict:
    """The request body as a JSON object. Raises MalformedEvent for bodies that are not
    UTF-8 JSON objects, that nest absurdly deep, or that carry NUL characters (which
    PostgreSQL text cannot store and no real sender uses)."""
    if b"\x00" in raw or b"\\u0000" in raw:
        raise MalformedEvent("the body contains NUL characters")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise MalformedEvent("the body is not JSON")
    if not isinstance(body, dict):
        raise MalformedEvent("the body must be a JSON object")
    return body


def _obj(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedEvent(f"{where} must be an object")
    return value


def event_id_checked(value, where: str) -> str:
    """A sender's event id: a non-empty string of at most 100 characters."""
    return _event_id(value, where)


def _event_id(value, where: str) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value):
        raise MalformedEvent(f"{where} must be a non-empty string")
    if len(str(value)) > 100:
        raise MalformedEvent(f"{where} is longer than 100 characters")
    return str(value)


def ap_event_receive(*, event: dict) -> str:
    """Handle one AP event; returns the outcome (for the log and the reply).
    Raises MalformedEvent for a body that is not an AP event."""
    from anchor import tasks

    event_id = _event_id(event.get("id"), "id")
    event_type = _event_id(event.get("type"), "type")
    tx = _obj(_obj(event.get("payload"), "payload").get("transaction"), "payload.transaction")
    wants_release = (event_type in ("transaction_status_changed", "transaction_created")
                     and tx.get("kind") == "deposit" and tx.get("status") == "pending_anchor"
                     and tx.get("id"))
    outcome = "release_scheduled" if wants_release else "ignored"
    with transaction.atomic():
        if not _seen(InboundEvent.Source.AP, event_id, event_type, outcome):
            return "duplicate"
        if wants_release:
            transaction.on_commit(lambda: tasks.deposit_release.delay(tx["id"]))
    return outcome


def sep24_customer_put(*, body: dict) -> Sep24Customer:
    """Store the SEP-9 fields AP forwards (type ``sep24-customer``). Raises
    MalformedEvent for an account or memo that cannot be one, or NUL characters."""
    account = str(body.get("account") or "")
    memo = str(body.get("memo") or "")
    if len(account) > 69 or len(memo) > 128:
        raise MalformedEvent("account or memo is too long to be a Stellar account / memo")
    if "\\u0000" in json.dumps(body):  # JSON escapes NUL; PostgreSQL text refuses it
        raise MalformedEvent("fields may not contain NUL characters")
    reserved = {"id", "account", "memo", "memo_type", "type", "transaction_id"}
    fields = {k: v for k, v in body.items() if k not in reserved}
    customer, _ = Sep24Customer.objects.update_or_create(
        account=account, memo=memo, defaults={"fields": fields})
    return customer


def razorpay_payment_webhook(*, event_id: str, event: dict) -> str:
    """A verified pay-in webhook: ``payment.captured`` / ``order.paid`` carry the
    payment entity; both for one payment are one effect (per-payment uniqueness in
    ``payment_record``). The event id is recorded in the same transaction as its
    effect, so a delivery that fails half-way is not mistaken for a duplicate when
    Razorpay retries it. Returns the outcome; raises MalformedEvent."""
    event_id = _event_id(event_id, "X-Razorpay-Event-Id")
    name = str(event.get("event", ""))[:60]
    payload = _obj(event.get("payload"), "payload")
    payment = _obj(_obj(payload.get("payment"), "payload.payment").get("entity"),
                   "payload.payment.entity")
    wanted = name in ("payment.captured", "order.paid") and bool(payment)
    if wanted:
        _check_payment(payment)
    with transaction.atomic():
        if not _seen(InboundEvent.Source.RAZORPAY, event_id, name, "received"):
            return "duplicate"
        outcome = deposits.payment_record(payment=payment) if wanted else "ignored"
        InboundEvent.objects.filter(source=InboundEvent.Source.RAZORPAY, event_id=event_id
                                    ).update(outcome=outcome)
    return outcome


def _check_payment(payment: dict) -> None:
    if not isinstance(payment.get("id"), str) or not payment["id"] or len(payment["id"]) > 40:
        raise MalformedEvent("payload.payment.entity.id must be a Razorpay payment id")
    if not isinstance(payment.get("order_id"), str | type(None)):
        raise MalformedEvent("payload.payment.entity.order_id must be a string")
    created = payment.get("created_at")
    if created is not None and (not isinstance(created, int) or isinstance(created, bool)):
        raise MalformedEvent("payload.payment.entity.created_at must be Unix seconds")
