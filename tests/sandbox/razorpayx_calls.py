"""Calls, fixtures and the webhook receiver the RazorpayX sandbox tests share
(tests/sandbox/test_razorpayx.py, test_razorpayx_statement.py): payout webhooks go to
``{SANDBOX_WEBHOOK_URL}/payouts`` on the Corridor ``live_server``, which the ``receiver``
fixture points at the recording receiver here (ROOT_URLCONF = this module). The
fixture also sets ``razorpayx.settle_delay`` to 0.2 s and, on the way out, waits until
every payout of the test has no step left and every webhook of it was acknowledged or
is lost.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import uuid

import httpx
from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from tests.conftest import reference_path
from tests.flows import wait_for

ACCOUNT_NUMBER = getattr(settings, "RAZORPAYX_ACCOUNT_NUMBER", "2323230041626905")
ENVELOPE_KEYS = ["entity", "account_id", "event", "contains", "payload", "created_at"]
SETTLE_S = 0.2
HEADER = "X-Payout-Idempotency"
MISSING_KEY = {"error": {
    "code": "BAD_REQUEST_ERROR",
    "description": "Idempotency key is missing. Include idempotency header and key in the "
                   "request.",
    "source": "business", "step": None, "reason": "null", "metadata": {},
    "field": "X-Payout-Idempotency",
}}


# --- a recording webhook receiver, served by the live server during a test ---------------


class Receiver:
    """Records every webhook request (raw bytes, headers, timing). Events named in
    ``hold`` wait for ``gate`` before being answered."""

    def __init__(self):
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.reset()

    def reset(self):
        with self.lock:
            self.requests: list[dict] = []
            self.hold: set[str] = set()
            self.gate.set()

    def handle(self, request, target: str) -> int:
        started = time.monotonic()
        raw = request.body
        parsed = json.loads(raw)
        if parsed["event"] in self.hold:
            self.gate.wait(5)
        payload = parsed["payload"]
        if "payout" in payload:
            payout_id = payload["payout"]["entity"]["id"]
        else:
            payout_id = payload.get("transaction", {}).get("entity", {}).get("source", {}).get(
                "payout_id")
        record = {
            "target": target,
            "raw": raw,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "event_id": request.headers.get("X-Razorpay-Event-Id"),
            "event": parsed["event"],
            "body": parsed,
            "payout_id": payout_id,
            "started": started,
            "ended": time.monotonic(),
        }
        with self.lock:
            self.requests.append(record)
        return 200

    def for_payout(self, payout_id: str) -> list[dict]:
        with self.lock:
            rows = [r for r in self.requests if r["payout_id"] == payout_id]
        return sorted(rows, key=lambda r: r["started"])


RECEIVER = Receiver()
FUND_ACCOUNTS: list[str] = []  # fund account ids created by the current test


@csrf_exempt
def _receive(request, target):
    return HttpResponse(status=RECEIVER.handle(request, target))


urlpatterns = [path("webhooks/razorpay/<str:target>", _receive)]


def receiving(settings, clean_sandbox):
    """The body of each test module's ``receiver`` fixture (``yield from``): the live
    server answers with the recording receiver for the test, then is drained."""
    settings.ROOT_URLCONF = __name__
    RECEIVER.reset()
    FUND_ACCOUNTS.clear()
    clean_sandbox.fault("razorpayx.settle_delay", seconds=SETTLE_S)
    yield RECEIVER
    RECEIVER.gate.set()

    def settled():
        rows = [r for fa in FUND_ACCOUNTS
                for r in sandbox_payouts(clean_sandbox, fund_account_id=fa)]
        if any(r["next_step"] for r in rows):
            return False
        return all(d["delivered"] or d["lost"] for r in rows
                   for d in deliveries(clean_sandbox, entity_id=r["id"]))

    wait_for(settled)
    RECEIVER.reset()
    FUND_ACCOUNTS.clear()


# --- helpers ---------------------------------------------------------------------------


def auth() -> tuple[str, str]:
    return settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET


def api(sandbox, method: str, path_: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{sandbox.url}/razorpay/v1{path_}", auth=auth(), timeout=20,
                         **kwargs)


def reference(name: str) -> dict:
    return json.loads(reference_path("razorpay", name).read_text(encoding="utf-8"))


def error(description: str, field: str | None, *, reason="input_validation_failed",
          step=None) -> dict:
    return {"error": {"code": "BAD_REQUEST_ERROR", "description": description,
                      "source": "business", "step": step, "reason": reason, "metadata": {},
                      "field": field}}


def own_hmac(secret: str, raw: bytes) -> str:
    return hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def make_contact(sandbox, **overrides) -> dict:
    body = {"name": "Asha Rao", "email": "asha@example.invalid", "contact": "9000090000",
            "type": "customer", "reference_id": f"cust-{uuid.uuid4().hex[:12]}"} | overrides
    response = api(sandbox, "POST", "/contacts", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def vpa_account(sandbox, address: str = "asha@okaxis") -> dict:
    contact = make_contact(sandbox)
    response = api(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact["id"], "account_type": "vpa", "vpa": {"address": address}})
    assert response.status_code == 200, response.text
    FUND_ACCOUNTS.append(response.json()["id"])
    return response.json()


def bank_account(sandbox) -> dict:
    contact = make_contact(sandbox)
    response = api(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact["id"], "account_type": "bank_account",
        "bank_account": {"name": "Asha Rao", "ifsc": "HDFC0000053",
                         "account_number": "765432123456789"}})
    assert response.status_code == 200, response.text
    FUND_ACCOUNTS.append(response.json()["id"])
    return response.json()


def payout_body(fund_account: dict, **overrides) -> dict:
    mode = "UPI" if fund_account["account_type"] == "vpa" else "IMPS"
    return {"account_number": ACCOUNT_NUMBER, "fund_account_id": fund_account["id"],
            "amount": 29935, "currency": "INR", "mode": mode, "purpose": "payout",
            "queue_if_low_balance": True, "reference_id": f"wd-{uuid.uuid4()}"[:40],
            "narration": "Corridor withdrawal", "notes": {"withdrawal": "wd-1"}} | overrides


def post_payout(sandbox, body, key: str | bytes | None = "new", **kwargs) -> httpx.Response:
    headers = {}
    if key == "new":
        key = str(uuid.uuid4())
    if key is not None:
        headers[HEADER] = key
    if isinstance(body, dict):
        kwargs["json"] = body
    else:
        kwargs["content"] = body
        headers["Content-Type"] = "application/json"
    return api(sandbox, "POST", "/payouts", headers=headers, **kwargs)


def create_payout(sandbox, fund_account: dict, key: str | None = None, **overrides):
    key = key or str(uuid.uuid4())
    response = post_payout(sandbox, payout_body(fund_account, **overrides), key)
    assert response.status_code == 200, response.text
    return response.json(), key


def get_payout(sandbox, payout_id: str) -> dict:
    response = api(sandbox, "GET", f"/payouts/{payout_id}")
    assert response.status_code == 200, response.text
    return response.json()


def sandbox_payouts(sandbox, **filters) -> list[dict]:
    response = httpx.get(f"{sandbox.url}/razorpay/sandbox/payouts", params=filters, timeout=10)
    response.raise_for_status()
    body = response.json()
    assert body["count"] == len(body["payouts"])
    return body["payouts"]


def deliveries(sandbox, **filters) -> list[dict]:
    response = httpx.get(f"{sandbox.url}/razorpay/sandbox/webhooks", params=filters, timeout=10)
    response.raise_for_status()
    return response.json()["items"]


def settle_payout(sandbox, payout_id: str, **body) -> httpx.Response:
    return httpx.post(f"{sandbox.url}/razorpay/sandbox/payouts/{payout_id}/settle", json=body,
                      timeout=10)


def received(receiver: Receiver, payout_id: str, count: int, timeout: float = 5.0):
    return wait_for(lambda: len(receiver.for_payout(payout_id)) >= count
                    and receiver.for_payout(payout_id), timeout=timeout)


def events(requests: list[dict]) -> list[str]:
    return [r["event"] for r in requests]


def status_of(sandbox, payout_id: str, status: str, timeout: float = 5.0) -> dict:
    return wait_for(lambda: (p := get_payout(sandbox, payout_id))["status"] == status and p,
                    timeout=timeout)


# --- contacts and fund accounts -------------------------------------------------------


