"""Webhook outbox of the Razorpay stand-in: signed, at-least-once, independent events.

Shared by pay-ins (target ``payments``) and RazorpayX payouts (target ``payouts``,
``sandbox.razorpay.payouts``): a caller builds the payload entities and calls
:func:`enqueue` inside its own ``transaction.atomic(using="sandbox")``; the background loop
(:func:`dispatch_due`) delivers.

What a delivery looks like (NOTES §1.4, §1.5; docs ``webhooks/validate-test``,
``webhooks/best-practices``):

- ``POST {SANDBOX_WEBHOOK_URL}/{target}`` with the envelope
  ``{"entity":"event","account_id":"acc_...","event":...,"contains":[...],"payload":{...},"created_at":unix}``
  serialised once as compact JSON bytes with literal UTF-8;
- ``X-Razorpay-Signature``: lower-case hex HMAC-SHA256 of exactly those bytes, keyed with
  ``RAZORPAY_WEBHOOK_SECRET`` as it was when the event was queued (automatic retries keep
  the old secret; a dashboard replay, :func:`redeliver`, signs with the current one);
- ``X-Razorpay-Event-Id``: the event id, the same on every delivery of the event;
- a non-2xx answer, or none within 5 s, is a failure: retried after
  ``SANDBOX_WEBHOOK_BACKOFF_S * 2**(attempts-1)`` seconds, capped at
  ``SANDBOX_WEBHOOK_BACKOFF_MAX_S`` (default 16 x the base), until
  ``SANDBOX_WEBHOOK_RETRY_WINDOW_S`` (default 86400, Razorpay's 24 h) after the delivery
  was queued. Then the delivery is marked ``gave_up``. (Razorpay also disables the whole
  webhook URL after 24 h of failures; the sandbox does not model that.)
- Events are independent: a failing event never holds back another one. Only the first
  attempt of an event can wait for the first attempt of the event queued before it
  (``after``), which is how arrival order (``order.paid`` before ``payment.captured``
  under ``razorpay.webhook_reorder``) is made deterministic.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Executor
from datetime import timedelta

import httpx
from django.conf import settings
from django.db import connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from common.http import tls_context
from sandbox.razorpay.common import compact_json, hmac_sha256_hex, new_id
from sandbox.razorpay.models import WebhookDelivery, WebhookEvent

log = logging.getLogger(__name__)

DB = "sandbox"
ACCOUNT_ID = "acc_CorridorSandbx"  # merchant account id shown in every envelope
RESPONSE_TIMEOUT_S = 5.0  # NOTES §1.5: no answer within 5 s counts as failed
USER_AGENT = "Razorpay-Webhook/v1"  # sandbox wording (inference)
LEASE = timedelta(seconds=60)  # a claimed delivery is retried if its sender vanished
BATCH = 32

_wake = threading.Event()
_http: httpx.Client | None = None
_http_lock = threading.Lock()


def sign(body: bytes, secret: str | None = None) -> str:
    """The ``X-Razorpay-Signature`` of ``body``: hex HMAC-SHA256 over the raw bytes, keyed with
    ``secret`` (default: ``RAZORPAY_WEBHOOK_SECRET`` now). NOTES §1.5, §5.1-5.3."""
    key = settings.RAZORPAY_WEBHOOK_SECRET if secret is None else secret
    return hmac_sha256_hex(key, body)


def envelope(*, event: str, contains: list[str], payload: dict, created_at: int) -> dict:
    """The event envelope, keys in Razorpay's order (``webhook_payment_captured_upi.json``)."""
    return {
        "entity": "event",
        "account_id": ACCOUNT_ID,
        "event": event,
        "contains": contains,
        "payload": payload,
        "created_at": created_at,
    }


def webhook_url(target: str) -> str:
    return f"{settings.SANDBOX_WEBHOOK_URL.rstrip('/')}/{target}"


def enqueue(
    *,
    target: str,
    entity_id: str,
    events: list[tuple[str, dict]],
    order_id: str | None = None,
    lost: bool = False,
    copies: int = 1,
    concurrent: bool = False,
    delay_s: float = 0.0,
    after: WebhookDelivery | None = None,
) -> list[WebhookDelivery]:
    """Queue ``events`` (``[(event_name, payload), ...]``, payload = ``{"payment": {"entity":
    {...}}, ...}``; ``contains`` is the payload's keys) about ``entity_id``. Must run inside
    ``transaction.atomic(using="sandbox")``; delivery starts after commit.

    First attempts happen in list order (each waits for the previous event's first attempt;
    the first one waits for ``after`` if given), no earlier than ``delay_s`` from now.
    ``copies`` > 1 (fault ``razorpay.webhook_replay``) sends each event that many times with
    the same id, body and signature: one after another, or all at the same moment if
    ``concurrent``. ``lost`` (fault ``razorpay.webhook_lose``) records the deliveries but
    never sends them. Returns the deliveries, in queue order.
    """
    now = timezone.now()
    due = now + timedelta(seconds=delay_s)
    previous = after
    queued: list[WebhookDelivery] = []
    for name, payload in events:
        body = compact_json(
            envelope(event=name, contains=list(payload), payload=payload,
                     created_at=int(now.timestamp()))
        )
        event = WebhookEvent.objects.using(DB).create(
            id=new_id(), event=name, target=target, entity_id=entity_id, order_id=order_id,
            body=body, created_ts=now,
        )
        signature = sign(body)
        first = None
        for copy in range(max(1, copies)):
            delivery = WebhookDelivery.objects.using(DB).create(
                event=event,
                kind="original" if copy == 0 else "duplicate",
                copy=copy,
                signature=signature,
                after=previous if (copy == 0 or not concurrent) else first.after,
                lost=lost,
                next_attempt_ts=None if lost else due,
                created_ts=now,
            )
            first = first or delivery
            if copy == 0 or not concurrent:
                previous = delivery
            queued.append(delivery)
        if concurrent:
            previous = first
    transaction.on_commit(_wake.set, using=DB)
    return queued


def redeliver(event_id: str) -> WebhookDelivery:
    """Dashboard replay of one event (docs ``webhooks/replay-events``, newer docs): a new
    delivery of the original bytes and event id, signed with the current webhook secret,
    due now. Raises ``WebhookEvent.DoesNotExist``."""
    with transaction.atomic(using=DB):
        event = WebhookEvent.objects.using(DB).get(pk=event_id)
        now = timezone.now()
        delivery = WebhookDelivery.objects.using(DB).create(
            event=event, kind="replay", copy=0, signature=sign(bytes(event.body)),
            next_attempt_ts=now, created_ts=now,
        )
        transaction.on_commit(_wake.set, using=DB)
    return delivery


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def describe(delivery: WebhookDelivery) -> dict:
    """One row of ``GET /razorpay/sandbox/webhooks``. ``body`` is the exact body decoded as
    UTF-8 (``body.encode()`` gives the bytes sent)."""
    event = delivery.event
    return {
        "id": delivery.id,
        "event_id": event.id,
        "event": event.event,
        "target": event.target,
        "url": webhook_url(event.target),
        "entity_id": event.entity_id,
        "order_id": event.order_id,
        "kind": delivery.kind,
        "copy": delivery.copy,
        "lost": delivery.lost,
        "attempts": delivery.attempts,
        "delivered": delivery.delivered,
        "gave_up": delivery.gave_up,
        "last_status": delivery.last_status,
        "last_error": delivery.last_error,
        "created_at": _iso(delivery.created_ts),
        "next_attempt_at": _iso(delivery.next_attempt_ts),
        "first_sent_at": _iso(delivery.first_sent_ts),
        "last_sent_at": _iso(delivery.last_sent_ts),
        "delivered_at": _iso(delivery.delivered_ts),
        "signature": delivery.signature,
        "body": bytes(event.body).decode("utf-8"),
    }


def listing(*, event_id=None, entity_id=None, order_id=None, event=None) -> list[dict]:
    """Deliveries, oldest first, optionally filtered."""
    rows = WebhookDelivery.objects.using(DB).select_related("event").order_by("id")
    if event_id:
        rows = rows.filter(event_id=event_id)
    if entity_id:
        rows = rows.filter(event__entity_id=entity_id)
    if order_id:
        rows = rows.filter(event__order_id=order_id)
    if event:
        rows = rows.filter(event__event=event)
    return [describe(d) for d in rows]


def backoff_s(attempts: int) -> float:
    """Delay before the next attempt after ``attempts`` failed ones: base doubling, capped."""
    base = float(settings.SANDBOX_WEBHOOK_BACKOFF_S)
    cap = float(getattr(settings, "SANDBOX_WEBHOOK_BACKOFF_MAX_S", 16 * base))
    return min(base * 2 ** max(0, attempts - 1), cap)


def _client() -> httpx.Client:
    global _http
    with _http_lock:
        if _http is None:
            _http = httpx.Client(timeout=RESPONSE_TIMEOUT_S, follow_redirects=False,
                                 verify=tls_context())
        return _http


def dispatch_due(pool: Executor) -> int:
    """Claim the deliveries that are due (and whose ``after`` made its first attempt), lease
    them, and hand them to ``pool``. Returns how many were handed over."""
    now = timezone.now()
    with transaction.atomic(using=DB):
        due = list(
            WebhookDelivery.objects.using(DB)
            .select_for_update(skip_locked=True, of=("self",))
            .filter(next_attempt_ts__lte=now)
            .filter(
                Q(after__isnull=True)
                | Q(after__attempts__gt=0)
                | Q(after__next_attempt_ts__isnull=True)
            )
            .order_by("next_attempt_ts", "id")
            .values_list("id", flat=True)[:BATCH]
        )
        if due:
            WebhookDelivery.objects.using(DB).filter(id__in=due).update(
                next_attempt_ts=now + LEASE
            )
    for delivery_id in due:
        pool.submit(_send_logged, delivery_id)
    return len(due)


def _send_logged(delivery_id: int) -> None:
    try:
        send(delivery_id)
    except Exception:
        log.exception("razorpay webhook delivery %s crashed", delivery_id)
        connections[DB].close()


def send(delivery_id: int) -> None:
    """One attempt of one delivery; records the outcome and schedules the next attempt."""
    delivery = (
        WebhookDelivery.objects.using(DB).select_related("event").filter(pk=delivery_id).first()
    )
    if delivery is None or delivery.delivered:  # reset meanwhile, or already done
        return
    event = delivery.event
    body = bytes(event.body)
    headers = {
        "Content-Type": "application/json",
        "X-Razorpay-Signature": delivery.signature,
        "X-Razorpay-Event-Id": event.id,
        "User-Agent": USER_AGENT,
    }
    sent_at = timezone.now()
    status, error = None, ""
    try:
        response = _client().post(webhook_url(event.target), content=body, headers=headers)
        status = response.status_code
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    done_at = timezone.now()
    attempts = delivery.attempts + 1
    changes = {
        "attempts": F("attempts") + 1,
        "last_status": status,
        "last_error": error,
        "first_sent_ts": Coalesce(F("first_sent_ts"), sent_at),
        "last_sent_ts": sent_at,
    }
    if status is not None and 200 <= status < 300:
        changes.update(delivered=True, delivered_ts=done_at, next_attempt_ts=None)
    else:
        window = float(getattr(settings, "SANDBOX_WEBHOOK_RETRY_WINDOW_S", 86400))
        retry_at = done_at + timedelta(seconds=backoff_s(attempts))
        if retry_at > delivery.created_ts + timedelta(seconds=window):
            changes.update(gave_up=True, next_attempt_ts=None)
        else:
            changes.update(next_attempt_ts=retry_at)
    WebhookDelivery.objects.using(DB).filter(pk=delivery.pk, delivered=False).update(**changes)


def wait_for_work(timeout_s: float) -> None:
    """Sleep until something was queued or ``timeout_s`` passed."""
    _wake.wait(timeout_s)
    _wake.clear()


def close() -> None:
    global _http
    with _http_lock:
        if _http is not None:
            _http.close()
            _http = None
