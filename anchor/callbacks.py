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


def ap_event_receive(*, event: dict) -> str:
    """Handle one AP event; returns the outcome (for the log and the reply)."""
    from anchor import tasks

    event_id, event_type = str(event["id"]), str(event["type"])
    tx = (event.get("payload") or {}).get("transaction") or {}
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
    """Store the SEP-9 fields AP forwards (type ``sep24-customer``)."""
    account = str(body.get("account") or "")
    memo = str(body.get("memo") or "")
    reserved = {"id", "account", "memo", "memo_type", "type", "transaction_id"}
    fields = {k: v for k, v in body.items() if k not in reserved}
    customer, _ = Sep24Customer.objects.update_or_create(
        account=account, memo=memo, defaults={"fields": fields})
    return customer


def razorpay_payment_webhook(*, event_id: str, event: dict) -> str:
    """A verified pay-in webhook: ``payment.captured`` / ``order.paid`` carry the
    payment entity; both for one payment are one effect (per-payment uniqueness in
    ``payment_record``). Returns the outcome."""
    name = str(event.get("event", ""))
    payment = (((event.get("payload") or {}).get("payment") or {}).get("entity")) or {}
    if name not in ("payment.captured", "order.paid") or not payment:
        outcome = "ignored"
    else:
        outcome = None
    with transaction.atomic():
        if not _seen(InboundEvent.Source.RAZORPAY, event_id, name, outcome or "received"):
            return "duplicate"
    if outcome:
        return outcome
    outcome = deposits.payment_record(payment=payment)
    InboundEvent.objects.filter(source=InboundEvent.Source.RAZORPAY, event_id=event_id
                                ).update(outcome=outcome)
    return outcome
