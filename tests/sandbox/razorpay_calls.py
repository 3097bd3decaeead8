"""Calls, fixtures and the webhook receiver the Razorpay (pay-ins) sandbox tests share
(tests/sandbox/test_razorpay.py, test_settlements.py); the ``receiver`` fixture points
the Corridor ``live_server`` at the recording receiver here (ROOT_URLCONF = this
module).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid

import httpx
import razorpay
from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from tests.conftest import reference_path
from tests.flows import wait_for

ORDER_KEYS = ["id", "entity", "amount", "amount_paid", "amount_due", "currency", "receipt",
              "offer_id", "status", "attempts", "notes", "created_at"]
ENVELOPE_KEYS = ["entity", "account_id", "event", "contains", "payload", "created_at"]


# --- a recording webhook receiver, served by the live server during a test ---------------


class Receiver:
    """Records every webhook request (raw bytes, headers, timing) and answers with
    ``status_for(event_name, event_id, nth_request_for_that_event_id)``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.requests: list[dict] = []
            self.status_for = lambda event, event_id, nth: 200
            self.delay_s = 0.0

    def handle(self, request, target: str) -> int:
        started = time.monotonic()
        raw = request.body
        parsed = json.loads(raw)
        event_id = request.headers.get("X-Razorpay-Event-Id")
        with self.lock:
            nth = 1 + sum(1 for r in self.requests if r["event_id"] == event_id)
            status = self.status_for(parsed["event"], event_id, nth)
            delay = self.delay_s
        if delay:
            time.sleep(delay)
        record = {
            "target": target,
            "raw": raw,
            "headers": dict(request.headers),
            "event_id": event_id,
            "event": parsed["event"],
            "payment_id": parsed["payload"].get("payment", {}).get("entity", {}).get("id"),
            "status": status,
            "started": started,
            "ended": time.monotonic(),
        }
        with self.lock:
            self.requests.append(record)
        return status

    def for_payment(self, payment_id: str) -> list[dict]:
        with self.lock:
            rows = [r for r in self.requests if r["payment_id"] == payment_id]
        return sorted(rows, key=lambda r: r["started"])


RECEIVER = Receiver()
PAID: list[str] = []  # payment ids created by the current test (see ``receiver``)


@csrf_exempt
def _receive(request, target):
    return HttpResponse(status=RECEIVER.handle(request, target))


urlpatterns = [path("webhooks/razorpay/<str:target>", _receive)]


def receiving(settings, clean_sandbox):
    """The body of each test module's ``receiver`` fixture (``yield from``): the live
    server answers with the recording receiver for the test, then is drained."""
    """Webhooks of this test land in ``RECEIVER`` (200 unless told otherwise). On the way
    out, waits until every webhook of the test's payments was acknowledged (or is lost), so
    no retry of ours reaches Corridor's endpoint during a later test."""
    settings.ROOT_URLCONF = __name__
    RECEIVER.reset()
    PAID.clear()
    yield RECEIVER
    RECEIVER.reset()
    for payment_id in PAID:
        wait_for(lambda payment_id=payment_id: all(
            r["delivered"] or r["lost"] for r in deliveries(clean_sandbox, entity_id=payment_id)))
    PAID.clear()


# --- helpers ---------------------------------------------------------------------------


def auth() -> tuple[str, str]:
    return settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET


def sdk(sandbox) -> razorpay.Client:
    return razorpay.Client(auth=auth(), base_url=f"{sandbox.url}/razorpay")


def receipt() -> str:
    return f"dep-{uuid.uuid4()}"


def post_order(sandbox, body: dict, *, auth_=None) -> httpx.Response:
    return httpx.post(f"{sandbox.url}/razorpay/v1/orders", json=body,
                      auth=auth_ if auth_ is not None else auth(), timeout=10)


def create_order(sandbox, amount: int = 29935, **extra) -> dict:
    response = post_order(sandbox, {"amount": amount, "currency": "INR", "receipt": receipt(),
                                    **extra})
    assert response.status_code == 200, response.text
    return response.json()


def pay(sandbox, order_id: str, **body) -> httpx.Response:
    response = httpx.post(f"{sandbox.url}/razorpay/sandbox/orders/{order_id}/pay", json=body,
                          timeout=10)
    if response.status_code == 200:
        PAID.append(response.json()["payment"]["id"])
    return response


def paid_order(sandbox, **body) -> tuple[dict, dict]:
    order = create_order(sandbox)
    response = pay(sandbox, order["id"], **body)
    assert response.status_code == 200, response.text
    return order, response.json()


def deliveries(sandbox, **filters) -> list[dict]:
    response = httpx.get(f"{sandbox.url}/razorpay/sandbox/webhooks", params=filters, timeout=10)
    response.raise_for_status()
    return response.json()["items"]


def all_delivered(sandbox, payment_id: str, timeout: float = 5.0) -> list[dict]:
    """The payment's deliveries once every one of them got a 2xx."""

    def done():
        rows = deliveries(sandbox, entity_id=payment_id)
        return rows if rows and all(r["delivered"] for r in rows) else None

    return wait_for(done, timeout=timeout)


def own_hmac(secret: str, raw: bytes) -> str:
    return hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def error(description: str, field: str | None, *, reason="input_validation_failed",
          source="business", step="payment_initiation", metadata=None) -> dict:
    return {"error": {"code": "BAD_REQUEST_ERROR", "description": description, "source": source,
                      "step": step, "reason": reason, "metadata": metadata or {},
                      "field": field}}


def reference(name: str) -> dict:
    return json.loads(reference_path("razorpay", name).read_text(encoding="utf-8"))


def orders_with_receipt(sandbox, value: str) -> int:
    response = httpx.get(f"{sandbox.url}/razorpay/v1/orders", params={"receipt": value},
                         auth=auth(), timeout=10)
    return response.json()["count"]


# --- orders API ------------------------------------------------------------------------


def sandbox_refunds(sandbox, payment_id: str) -> list[dict]:
    """Every refund the sandbox's Razorpay holds for ``payment_id`` (its own view)."""
    response = httpx.get(f"{sandbox.url}/razorpay/sandbox/refunds",
                         params={"payment_id": payment_id}, timeout=10)
    response.raise_for_status()
    return response.json()["refunds"]
