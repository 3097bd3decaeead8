"""Events AP -> business server: the outbox and its delivery loop (NOTES §3).

Publishing: every transaction creation (``transaction_created``) and every successful
status RPC (``transaction_status_changed``, also when the status stays the same) appends
one :class:`ApEvent` in the same database transaction as the change, with the
transaction object as it is at that moment (``payload.transaction``).

Delivery (AP-4.3.0 ``CallbackApiEventProcessor`` + ``ExponentialBackoffTimer``, PR
#1329): one event at a time, in ``position`` order, ``POST {SANDBOX_CALLBACK_URL}/event``
with ``Authorization: Bearer <JWT HS256 AP_CALLBACK_AUTH_SECRET, iat, exp = iat + 30>``.
``timestamp`` is regenerated for every attempt; ``id`` stays the same. 2xx and 3xx count
as delivered; anything else (and a connection error or timeout) is retried forever after
``SANDBOX_EVENT_BACKOFF_START_S`` doubling up to ``SANDBOX_EVENT_BACKOFF_MAX_S`` (AP: 1 s
to 300 s), and every later event waits behind it. The HTTP timeout is
``SANDBOX_EVENT_TIMEOUT_S`` (default 5 s; AP's is 10 minutes).

Fault switches (``sandbox.control.faults``):

- ``ap.event_lose``: the next event is dropped without being sent (``times`` = how many).
- ``ap.event_duplicate``: the next delivered event is sent ``params.copies`` times
  (default 3) with the same ``id`` (Kafka redelivery); ``times`` = how many events.
- ``ap.event_reorder``: the next two pending events are delivered in swapped order
  (``times`` = how many swaps; an event is swapped at most once). While it is on and only
  one event is pending, that event waits up to ``params.wait_s`` (default 1 s) for a
  second one.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import httpx
import jwt
from django.conf import settings
from django.db import connections, transaction
from django.db.models import F

from common.http import tls_context
from sandbox.ap.models import ApEvent
from sandbox.ap.objects import instant, now
from sandbox.control import faults

log = logging.getLogger(__name__)

DB = "sandbox"
POLL_S = 0.05

TRANSACTION_CREATED = "transaction_created"
TRANSACTION_STATUS_CHANGED = "transaction_status_changed"
CUSTOMER_UPDATED = "customer_updated"


def publish(event_type: str, transaction_object: dict | None = None, *,
            quote_object: dict | None = None, customer_object: dict | None = None) -> ApEvent:
    """Append an event for ``transaction_object`` (the §1.7 object at publish time), or
    for ``quote_object`` (``quote_created``: payload ``quote``, no transaction), or for
    ``customer_object`` (``customer_updated``: payload ``customer`` = ``{"id"}``,
    SEP31-RECEIVE.md §7).

    Call inside the ``transaction.atomic(using="sandbox")`` block that changed the
    transaction, so the event exists exactly when the change does.
    """
    if transaction_object is not None:
        transaction_id, payload = transaction_object["id"], {"transaction": transaction_object}
    elif customer_object is not None:
        transaction_id, payload = "", {"customer": customer_object}
    else:
        transaction_id, payload = "", {"quote": quote_object}
    event = ApEvent.objects.using(DB).create(
        type=event_type,
        transaction_id=transaction_id,
        payload=payload,
        created_at=now(),
    )
    ApEvent.objects.using(DB).filter(pk=event.pk).update(position=F("seq") * 10)
    return event


def callback_token() -> str:
    """AP ``AuthHelper`` callback JWT: HS256, only ``iat`` and ``exp = iat + 30``."""
    issued = int(time.time())
    return jwt.encode({"iat": issued, "exp": issued + 30}, settings.AP_CALLBACK_AUTH_SECRET,
                      algorithm="HS256")


def backoff_s(attempts: int) -> float:
    """Wait after the ``attempts``-th failed attempt: start * 2^(attempts-1), capped."""
    start = float(getattr(settings, "SANDBOX_EVENT_BACKOFF_START_S", 1.0))
    cap = float(getattr(settings, "SANDBOX_EVENT_BACKOFF_MAX_S", 300.0))
    return min(start * (2 ** max(attempts - 1, 0)), cap)


def _pending():
    return ApEvent.objects.using(DB).filter(delivered_at__isnull=True, lost_at__isnull=True)


def _body(event: ApEvent) -> dict:
    return {"id": str(event.event_id), "type": event.type, "timestamp": instant(now()),
            "payload": event.payload}


def _post(client: httpx.Client, event: ApEvent) -> dict:
    """One HTTP attempt; returns its log entry ``{at, status, error}``."""
    url = settings.SANDBOX_CALLBACK_URL.rstrip("/") + "/event"
    entry = {"at": instant(now()), "status": None, "error": None}
    try:
        response = client.post(url, json=_body(event),
                               headers={"Authorization": f"Bearer {callback_token()}"})
        entry["status"] = response.status_code
    except httpx.HTTPError as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return entry


def _delivered(entry: dict) -> bool:
    return entry["status"] is not None and 200 <= entry["status"] < 400


def _lose(head: ApEvent) -> bool:
    if faults.take("ap.event_lose") is None:
        return False
    ApEvent.objects.using(DB).filter(pk=head.pk).update(lost_at=now())
    log.info("ap.event_lose: dropped event %s", head.event_id)
    return True


def _reorder(head: ApEvent) -> bool | None:
    """Swap ``head`` with the next fresh event while ``ap.event_reorder`` is on.

    Returns True when swapped, None when ``head`` must wait for a partner, False when
    the fault is off or the wait is over."""
    if head.reordered:
        return False
    params = faults.peek("ap.event_reorder")
    if params is None:
        return False
    partner = (_pending().filter(attempts=0, reordered=False, position__gt=head.position)
               .order_by("position").first())
    if partner is None:
        waited = (now() - head.created_at).total_seconds()
        return None if waited < float(params.get("wait_s", 1.0)) else False
    if faults.take("ap.event_reorder") is None:
        return False
    with transaction.atomic(using=DB):
        ApEvent.objects.using(DB).filter(pk=head.pk).update(position=partner.position,
                                                            reordered=True)
        ApEvent.objects.using(DB).filter(pk=partner.pk).update(position=head.position,
                                                               reordered=True)
    log.info("ap.event_reorder: swapped events %s and %s", head.event_id, partner.event_id)
    return True


def deliver_next(client: httpx.Client) -> bool:
    """Attempt the head of the queue if it is due. True when something happened."""
    head = _pending().order_by("position").first()
    if head is None:
        return False
    if head.next_attempt_at is not None and head.next_attempt_at > now():
        return False
    if head.attempts == 0:
        if _lose(head):
            return True
        reordered = _reorder(head)
        if reordered is None:
            return False
        if reordered:
            return True
        duplicate = faults.take("ap.event_duplicate")
        if duplicate is not None:
            head.copies = max(int(duplicate.get("copies", 3)), 1)
            ApEvent.objects.using(DB).filter(pk=head.pk).update(copies=head.copies)

    entry = _post(client, head)
    log_entries = [entry]
    attempts = head.attempts + 1
    if _delivered(entry):
        for _ in range(head.copies - 1):
            copy = _post(client, head)
            copy["copy"] = True
            log_entries.append(copy)
        ApEvent.objects.using(DB).filter(pk=head.pk).update(
            attempts=attempts, delivered_at=now(), last_status=entry["status"],
            last_error=None, next_attempt_at=None,
            attempt_log=head.attempt_log + log_entries)
    else:
        ApEvent.objects.using(DB).filter(pk=head.pk).update(
            attempts=attempts, last_status=entry["status"], last_error=entry["error"],
            next_attempt_at=now() + dt.timedelta(seconds=backoff_s(attempts)),
            attempt_log=head.attempt_log + log_entries)
    return True


def run(stop: threading.Event) -> None:
    """The delivery loop: runs until ``stop`` is set; survives database and HTTP errors."""
    timeout = float(getattr(settings, "SANDBOX_EVENT_TIMEOUT_S", 5.0))
    with httpx.Client(timeout=timeout, follow_redirects=False,
                      verify=tls_context()) as client:
        while not stop.is_set():
            try:
                busy = deliver_next(client)
            except Exception:  # the loop must outlive a reset or a database restart
                log.exception("AP event delivery failed; retrying")
                connections[DB].close()
                busy = False
                stop.wait(0.5)
            if not busy:
                stop.wait(POLL_S)
        connections[DB].close()
