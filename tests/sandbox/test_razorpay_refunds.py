"""Refunds of the Razorpay stand-in (sandbox/razorpay/refunds.py), over real HTTP.

Webhooks go to a recording receiver served by the live server (``ROOT_URLCONF`` = this
module), so the tests see the exact bytes and headers and do not depend on Corridor's
own endpoint."""

from __future__ import annotations

import json
import threading
import uuid

import httpx
import pytest
from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from sandbox.razorpay.common import hmac_sha256_hex
from tests.conftest import reference_path
from tests.flows import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []

    def handle(self, request) -> int:
        parsed = json.loads(request.body)
        with self.lock:
            self.requests.append({"raw": request.body, "headers": dict(request.headers),
                                  "event": parsed["event"], "payload": parsed["payload"]})
        return 200

    def for_refund(self, refund_id: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests
                    if r["payload"].get("refund", {}).get("entity", {}).get("id") == refund_id]


RECEIVER = Receiver()


@csrf_exempt
def _receive(request, target):
    return HttpResponse(status=RECEIVER.handle(request))


urlpatterns = [path("webhooks/razorpay/<str:target>", _receive)]


@pytest.fixture
def receiver(settings, clean_sandbox):
    settings.ROOT_URLCONF = __name__
    with RECEIVER.lock:
        RECEIVER.requests.clear()
    clean_sandbox.fault("razorpay.refund_settle_delay", seconds=0.3)
    yield RECEIVER


def auth():
    return settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET


def api(sandbox, method: str, url: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{sandbox.url}/razorpay{url}", auth=auth(), timeout=10,
                         **kwargs)


def captured_payment(sandbox, amount: int = 100000) -> dict:
    order = api(sandbox, "POST", "/v1/orders", json={
        "amount": amount, "currency": "INR", "receipt": f"dep-{uuid.uuid4()}"}).json()
    paid = httpx.post(f"{sandbox.url}/razorpay/sandbox/orders/{order['id']}/pay", json={},
                      timeout=10)
    assert paid.status_code == 200, paid.text
    return paid.json()["payment"]


def refund(sandbox, payment_id: str, body: dict | None = None, key: str | None = None):
    headers = {"X-Refund-Idempotency": key} if key else {}
    return api(sandbox, "POST", f"/v1/payments/{payment_id}/refund", json=body or {},
               headers=headers)


def payment(sandbox, payment_id: str) -> dict:
    return api(sandbox, "GET", f"/v1/payments/{payment_id}").json()


def settled(sandbox, refund_id: str) -> dict:
    return wait_for(lambda: (lambda r: r if r["status"] != "pending" else None)(
        api(sandbox, "GET", f"/v1/refunds/{refund_id}").json()), timeout=10,
        what="refund settled")


def test_full_refund_is_pending_then_processed_with_signed_webhooks(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox)

    answer = refund(clean_sandbox, pay["id"], {"receipt": "tx-1", "notes": {"k": "v"}},
                    key="corridor-key-0001")

    assert answer.status_code == 200, answer.text
    entity = answer.json()
    keys = list(json.loads(reference_path("razorpay", "webhook_refund_processed.json")
                           .read_text())["payload"]["refund"]["entity"])
    assert list(entity) == keys
    assert (entity["amount"], entity["status"], entity["receipt"], entity["payment_id"],
            entity["speed_requested"], entity["acquirer_data"]) == (
        100000, "pending", "tx-1", pay["id"], "normal", {"arn": None})
    shown = payment(clean_sandbox, pay["id"])
    assert (shown["status"], shown["amount_refunded"], shown["refund_status"],
            shown["captured"]) == ("refunded", 100000, "full", True)
    done = settled(clean_sandbox, entity["id"])
    assert done["status"] == "processed" and done["acquirer_data"]["arn"]
    listed = api(clean_sandbox, "GET", f"/v1/payments/{pay['id']}/refunds").json()
    assert [r["id"] for r in listed["items"]] == [entity["id"]]
    one = api(clean_sandbox, "GET", f"/v1/payments/{pay['id']}/refunds/{entity['id']}")
    assert one.json()["status"] == "processed"
    got = wait_for(lambda: len(receiver.for_refund(entity["id"])) == 2 and
                   receiver.for_refund(entity["id"]), what="two refund webhooks")
    assert [r["event"] for r in got] == ["refund.created", "refund.processed"]
    for r in got:
        assert r["headers"]["X-Razorpay-Signature"] == hmac_sha256_hex(
            settings.RAZORPAY_WEBHOOK_SECRET, r["raw"])
        assert set(r["payload"]) == {"refund", "payment"}
    assert got[1]["payload"]["payment"]["entity"]["refund_status"] == "full"


def test_partial_refunds_until_used_up_then_over_refund_is_refused(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox, 50000)

    first = refund(clean_sandbox, pay["id"], {"amount": 20000})
    over = refund(clean_sandbox, pay["id"], {"amount": 30001})
    second = refund(clean_sandbox, pay["id"], {"amount": 30000})
    again = refund(clean_sandbox, pay["id"], {"amount": 100})

    assert first.status_code == 200 and second.status_code == 200
    assert payment(clean_sandbox, pay["id"])["amount_refunded"] == 50000
    assert over.status_code == 400
    assert over.json()["error"]["code"] == "BAD_REQUEST_ERROR"
    assert over.json()["error"]["field"] == "amount"
    assert set(over.json()["error"]) == {"code", "description", "source", "step", "reason",
                                         "metadata", "field"}
    assert again.status_code == 400
    assert "fully refunded" in again.json()["error"]["description"]
    fresh = captured_payment(clean_sandbox)["id"]
    small = refund(clean_sandbox, fresh, {"amount": 99})
    assert small.json()["error"]["description"] == "The amount must be at least INR 1.00"
    extra = refund(clean_sandbox, fresh, {"amount": 100, "currency": "INR"})
    assert extra.json()["error"]["reason"] == "extra_field_sent"
    unknown = refund(clean_sandbox, "pay_DoesNotExist00")
    assert unknown.json()["error"]["description"] == "The id provided does not exist"


def test_idempotency_key_replays_the_refund_and_refuses_another_body(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox)

    first = refund(clean_sandbox, pay["id"], {"receipt": "tx-2"}, key="same-key-00002")
    replay = refund(clean_sandbox, pay["id"], {"receipt": "tx-2"}, key="same-key-00002")
    other = refund(clean_sandbox, pay["id"], {"receipt": "tx-3"}, key="same-key-00002")
    short = refund(clean_sandbox, pay["id"], {"receipt": "tx-2"}, key="short")

    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    assert other.status_code == 400
    assert other.json()["error"]["description"] == (
        "Different request with the same idempotency key has already been processed.")
    assert short.status_code == 400
    listed = api(clean_sandbox, "GET", f"/v1/payments/{pay['id']}/refunds").json()
    assert listed["count"] == 1


def test_fault_5xx_after_create_loses_the_answer_not_the_refund(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox)
    clean_sandbox.fault("razorpay.refund_create_5xx_after_create", times=1)

    answer = refund(clean_sandbox, pay["id"], {"receipt": "tx-4"}, key="lost-answer-004")

    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "SERVER_ERROR"
    listed = api(clean_sandbox, "GET", f"/v1/payments/{pay['id']}/refunds").json()
    assert [r["receipt"] for r in listed["items"]] == ["tx-4"]
    replay = refund(clean_sandbox, pay["id"], {"receipt": "tx-4"}, key="lost-answer-004")
    assert replay.status_code == 200 and replay.json()["id"] == listed["items"][0]["id"]


def test_fault_refund_fail_gives_the_amount_back(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox)
    clean_sandbox.fault("razorpay.refund_fail", times=1)

    entity = refund(clean_sandbox, pay["id"]).json()

    assert settled(clean_sandbox, entity["id"])["status"] == "failed"
    shown = payment(clean_sandbox, pay["id"])
    assert (shown["status"], shown["amount_refunded"], shown["refund_status"]) == (
        "captured", 0, None)
    got = wait_for(lambda: len(receiver.for_refund(entity["id"])) == 2 and
                   receiver.for_refund(entity["id"]), what="webhooks")
    assert [r["event"] for r in got] == ["refund.created", "refund.failed"]


def test_fault_webhook_reorder_and_duplicate(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox)
    clean_sandbox.fault("razorpay.refund_webhook_reorder", times=1)
    clean_sandbox.fault("razorpay.refund_webhook_duplicate", times=1, copies=2)

    entity = refund(clean_sandbox, pay["id"]).json()

    got = wait_for(lambda: len(receiver.for_refund(entity["id"])) == 4 and
                   receiver.for_refund(entity["id"]), what="four deliveries")
    assert [r["event"] for r in got] == ["refund.processed", "refund.processed",
                                         "refund.created", "refund.created"]
    assert got[0]["headers"]["X-Razorpay-Event-Id"] == got[1]["headers"]["X-Razorpay-Event-Id"]
    assert got[2]["payload"]["refund"]["entity"]["status"] == "pending"


def test_fault_webhook_lose_still_settles_the_refund(receiver, clean_sandbox):
    pay = captured_payment(clean_sandbox)
    clean_sandbox.fault("razorpay.refund_webhook_lose", times=1)

    entity = refund(clean_sandbox, pay["id"]).json()

    assert settled(clean_sandbox, entity["id"])["status"] == "processed"
    rows = httpx.get(f"{clean_sandbox.url}/razorpay/sandbox/webhooks",
                     params={"entity_id": entity["id"]}, timeout=10).json()["items"]
    assert rows and all(r["lost"] for r in rows)
    assert receiver.for_refund(entity["id"]) == []
