"""The RazorpayX Fund Account Validation stand-in of the sandbox, over real HTTP.

Validation webhooks go to ``{SANDBOX_WEBHOOK_URL}/payouts`` on the Corridor ``live_server``;
each test points the live server at the recording receiver below (ROOT_URLCONF = this
module) so it sees the exact bytes and headers. Outcomes are chosen per beneficiary
account with ``POST /razorpay/sandbox/fund_accounts/validations/accounts``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading

import httpx
import pytest
from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from tests.conftest import reference_path
from tests.flows import (
    bank_fund_account,
    razorpayx,
    unique_account_number,
    validation_account,
    vpa_fund_account,
    wait_for,
)

ACCOUNT_NUMBER = getattr(settings, "RAZORPAYX_ACCOUNT_NUMBER", "2323230041626905")


class Receiver:
    """Records every webhook request (raw bytes, headers, parsed body)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []

    def for_entity(self, entity_id: str) -> list[dict]:
        with self.lock:
            return [r for r in self.requests
                    if r["body"]["payload"].get("fund_account.validation", {})
                    .get("entity", {}).get("id") == entity_id]


RECEIVER = Receiver()


@csrf_exempt
def _receive(request, target):
    with RECEIVER.lock:
        RECEIVER.requests.append({
            "target": target, "raw": request.body, "body": json.loads(request.body),
            "headers": {k.lower(): v for k, v in request.headers.items()},
        })
    return HttpResponse(status=200)


urlpatterns = [path("webhooks/razorpay/<str:target>", _receive)]


@pytest.fixture
def receiver(settings, clean_sandbox) -> Receiver:
    settings.ROOT_URLCONF = __name__
    with RECEIVER.lock:
        RECEIVER.requests.clear()
    yield RECEIVER


# --- helpers ---------------------------------------------------------------------------


def api(sandbox, method: str, path_: str, **kwargs) -> httpx.Response:
    return razorpayx(sandbox, method, path_, **kwargs)


def reference() -> dict:
    path_ = reference_path("razorpay", "webhook_fund_account_validation_completed.json")
    return json.loads(path_.read_text(encoding="utf-8"))


def error(description: str, field: str | None) -> dict:
    return {"error": {"code": "BAD_REQUEST_ERROR", "description": description,
                      "source": "business", "step": None,
                      "reason": "input_validation_failed", "metadata": {}, "field": field}}


def validate(sandbox, fund_account: dict, **overrides) -> dict:
    body = {"account_number": ACCOUNT_NUMBER, "fund_account": {"id": fund_account["id"]},
            "amount": 127, "currency": "INR", "notes": {"beneficiary": "b-1"}} | overrides
    response = api(sandbox, "POST", "/fund_accounts/validations", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def fetch(sandbox, validation_id: str) -> dict:
    response = api(sandbox, "GET", f"/fund_accounts/validations/{validation_id}")
    assert response.status_code == 200, response.text
    return response.json()


def webhooks_of(receiver: Receiver, validation_id: str, count: int = 1) -> list[dict]:
    return wait_for(lambda: len(rows := receiver.for_entity(validation_id)) >= count and rows,
                    timeout=10)


# --- outcomes --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_active_bank_account_completes_at_once_with_the_holder_name_and_a_signed_webhook(
    receiver, clean_sandbox
):
    fund_account = bank_fund_account(clean_sandbox, holder="Priya Sharma")

    created = validate(clean_sandbox, fund_account)

    real = reference()["payload"]["fund_account.validation"]["entity"]
    assert list(created) == list(real)
    assert created["id"].startswith("fav_") and len(created["id"]) == 18
    assert created["entity"] == "fund_account.validation"
    assert created["status"] == "completed"
    assert created["amount"] == 127 and created["currency"] == "INR"
    assert created["notes"] == {"beneficiary": "b-1"}
    assert created["results"] == {"account_status": "active", "registered_name": "Priya Sharma",
                                  "details": "The beneficiary account is valid.",
                                  "name_match_score": 100}
    assert isinstance(created["utr"], str) and created["utr"]
    assert set(created["fund_account"]) == set(real["fund_account"])
    assert set(created["fund_account"]["bank_account"]) == set(
        real["fund_account"]["bank_account"])
    assert "fees" not in created  # the real entity reports none
    assert fetch(clean_sandbox, created["id"]) == created

    [hook] = webhooks_of(receiver, created["id"])
    assert hook["target"] == "payouts"
    assert hook["body"]["event"] == "fund_account.validation.completed"
    assert list(hook["body"]) == list(reference())
    assert hook["body"]["contains"] == ["fund_account.validation"]
    assert hook["body"]["payload"]["fund_account.validation"]["entity"] == created
    expected = hmac.new(settings.RAZORPAY_WEBHOOK_SECRET.encode(), hook["raw"],
                        hashlib.sha256).hexdigest()
    assert hook["headers"]["x-razorpay-signature"] == expected
    assert hook["headers"]["x-razorpay-event-id"]


@pytest.mark.django_db(transaction=True)
def test_a_registered_name_set_for_the_account_number_gives_a_name_mismatch(
    receiver, clean_sandbox
):
    number = unique_account_number()
    assert validation_account(clean_sandbox, account_number=number,
                       registered_name="MOHAMMED IRFAN SHAIKH").status_code == 200
    fund_account = bank_fund_account(clean_sandbox, holder="Priya Sharma", number=number)

    created = validate(clean_sandbox, fund_account)

    assert created["status"] == "completed"
    assert created["results"]["account_status"] == "active"
    assert created["results"]["registered_name"] == "MOHAMMED IRFAN SHAIKH"
    assert created["results"]["name_match_score"] < 50
    assert created["fund_account"]["bank_account"]["name"] == "Priya Sharma"


@pytest.mark.django_db(transaction=True)
def test_an_invalid_account_completes_with_null_name_and_no_utr(receiver, clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, account_status="invalid")
    fund_account = bank_fund_account(clean_sandbox, number=number)

    created = validate(clean_sandbox, fund_account)

    assert created["status"] == "completed"
    assert created["results"] == {"account_status": "invalid", "registered_name": None,
                                  "details": "The beneficiary account is invalid.",
                                  "name_match_score": None}
    assert created["utr"] is None
    [hook] = webhooks_of(receiver, created["id"])
    assert hook["body"]["event"] == "fund_account.validation.completed"


@pytest.mark.django_db(transaction=True)
def test_a_pending_validation_stays_created_then_completes_with_its_webhook(
    receiver, clean_sandbox
):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, pending_s=1.5)
    fund_account = bank_fund_account(clean_sandbox, holder="Anil Kumar Verma", number=number)

    created = validate(clean_sandbox, fund_account)

    assert created["status"] == "created"
    assert created["results"] == {"account_status": None, "registered_name": None,
                                  "details": None, "name_match_score": None}
    assert created["utr"] is None
    assert fetch(clean_sandbox, created["id"])["status"] == "created"
    assert receiver.for_entity(created["id"]) == []
    [hook] = webhooks_of(receiver, created["id"])
    done = fetch(clean_sandbox, created["id"])
    assert done["status"] == "completed"
    assert done["results"]["registered_name"] == "Anil Kumar Verma"
    assert hook["body"]["payload"]["fund_account.validation"]["entity"] == done


@pytest.mark.django_db(transaction=True)
def test_a_failed_validation_sends_the_failed_webhook(receiver, clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, status="failed")

    created = validate(clean_sandbox, bank_fund_account(clean_sandbox, number=number))

    assert created["status"] == "failed"
    assert created["results"]["account_status"] == ""
    assert created["results"]["registered_name"] == ""
    assert created["utr"] is None
    [hook] = webhooks_of(receiver, created["id"])
    assert hook["body"]["event"] == "fund_account.validation.failed"


@pytest.mark.django_db(transaction=True)
def test_a_vpa_validates_with_the_contact_name_and_no_utr(receiver, clean_sandbox):
    fund_account = vpa_fund_account(clean_sandbox, name="Ravi Kumar")

    created = validate(clean_sandbox, fund_account)

    assert created["status"] == "completed"
    assert created["results"]["account_status"] == "active"
    assert created["results"]["registered_name"] == "Ravi Kumar"
    assert created["utr"] is None
    assert created["fund_account"]["vpa"]["address"] == fund_account["vpa"]["address"]


@pytest.mark.django_db(transaction=True)
def test_a_vpa_name_can_be_set_too(receiver, clean_sandbox):
    fund_account = vpa_fund_account(clean_sandbox, name="Ravi Kumar")
    validation_account(clean_sandbox, vpa=fund_account["vpa"]["address"], registered_name="R KUMAR")

    created = validate(clean_sandbox, fund_account)

    assert created["results"]["registered_name"] == "R KUMAR"


@pytest.mark.django_db(transaction=True)
def test_composite_form_creates_the_fund_account_and_answers_shape_two(
    receiver, clean_sandbox
):
    number = unique_account_number()
    body = {
        "source_account_number": ACCOUNT_NUMBER, "validation_type": "pennydrop",
        "reference_id": "kyc-42", "notes": {"k": "v"},
        "fund_account": {
            "account_type": "bank_account",
            "bank_account": {"name": "Sunita Devi", "ifsc": "SBIN0000001",
                             "account_number": number},
            "contact": {"name": "Sunita Devi", "type": "customer", "reference_id": "kyc-42"},
        },
    }

    response = api(clean_sandbox, "POST", "/fund_accounts/validations", json=body)

    assert response.status_code == 200, response.text
    created = response.json()
    assert created["status"] == "completed"
    assert created["reference_id"] == "kyc-42"
    assert created["validation_results"]["registered_name"] == "Sunita Devi"
    assert created["validation_results"]["validated_account_type"] == "bank_account"
    assert created["status_details"] == {"description": "Validation request is completed",
                                         "source": "beneficiary_bank",
                                         "reason": "validation_completed"}
    assert created["fund_account"]["contact"]["name"] == "Sunita Devi"
    assert "results" not in created
    assert fetch(clean_sandbox, created["id"]) == created


@pytest.mark.django_db(transaction=True)
def test_list_by_account_number_is_newest_first(receiver, clean_sandbox):
    fund_account = bank_fund_account(clean_sandbox)
    first = validate(clean_sandbox, fund_account)
    second = validate(clean_sandbox, fund_account)

    response = api(clean_sandbox, "GET", "/fund_accounts/validations",
                   params={"account_number": ACCOUNT_NUMBER, "count": 2})

    assert response.status_code == 200
    assert [v["id"] for v in response.json()["items"]] == [second["id"], first["id"]]


# --- refusals --------------------------------------------------------------------------


BAD_BODIES = [
    ({"account_number": None}, "The account number field is required.",
     "account_number"),
    ({"account_number": "999"}, "The RazorpayX Account number is invalid", "account_number"),
    ({"fund_account": None}, "The fund account field is required.", "fund_account"),
    ({"fund_account": "fa_x"}, "The fund_account must be a JSON object.", "fund_account"),
    ({"fund_account": {}}, "The fund account id field is required.", "fund_account.id"),
    ({"fund_account": {"id": "fa_00000000000000"}}, "The id provided does not exist",
     "fund_account.id"),
    ({"amount": "127"}, "The amount must be an integer.", "amount"),
    ({"amount": 99}, "The amount must be at least INR 1.00", "amount"),
    ({"currency": "USD"}, "Currency is not supported", "currency"),
    ({"notes": "x"}, "The notes must be an array.", "notes"),
    ({"mode": "IMPS"}, "mode is/are not required and should not be sent", "mode"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("change", "description", "field"), BAD_BODIES)
def test_bad_bodies_are_refused_with_razorpays_error_shape(
    receiver, clean_sandbox, change, description, field
):
    fund_account = bank_fund_account(clean_sandbox)
    body = {"account_number": ACCOUNT_NUMBER, "fund_account": {"id": fund_account["id"]},
            "amount": 100} | change
    body = {k: v for k, v in body.items() if v is not None}

    response = api(clean_sandbox, "POST", "/fund_accounts/validations", json=body)

    assert response.status_code == 400
    expected = error(description, field)
    if field == "mode":
        expected["error"]["reason"] = "extra_field_sent"
    assert response.json() == expected
    listed = api(clean_sandbox, "GET", "/fund_accounts/validations",
                 params={"account_number": ACCOUNT_NUMBER, "count": 100}).json()
    assert [v for v in listed["items"] if v["fund_account"]["id"] == fund_account["id"]] == []


@pytest.mark.django_db(transaction=True)
def test_composite_refusals_create_no_contact(receiver, clean_sandbox):
    body = {"source_account_number": ACCOUNT_NUMBER, "validation_type": "pennydrop",
            "fund_account": {"account_type": "bank_account",
                             "bank_account": {"name": "Sunita Devi", "ifsc": "BAD",
                                              "account_number": unique_account_number()},
                             "contact": {"name": "Sunita Devi Unique Contact"}}}

    response = api(clean_sandbox, "POST", "/fund_accounts/validations", json=body)

    assert response.status_code == 400
    assert response.json()["error"]["field"] == "fund_account.bank_account.ifsc"
    for kind, text in (("upi_intent", "not supported"), ("optimized", "Invalid validation")):
        refused = api(clean_sandbox, "POST", "/fund_accounts/validations",
                      json={**body, "validation_type": kind})
        assert refused.status_code == 400 and text in refused.json()["error"]["description"]


@pytest.mark.django_db(transaction=True)
def test_unknown_id_bad_auth_and_bad_sandbox_account_are_refused(receiver, clean_sandbox):
    missing = api(clean_sandbox, "GET", "/fund_accounts/validations/fav_00000000000000")
    assert missing.status_code == 400
    assert missing.json() == error("The id provided does not exist", None)

    anonymous = httpx.post(f"{clean_sandbox.url}/razorpay/v1/fund_accounts/validations",
                           json={}, timeout=10)
    assert anonymous.status_code == 401

    no_account = api(clean_sandbox, "GET", "/fund_accounts/validations")
    assert no_account.status_code == 400
    assert no_account.json()["error"]["field"] == "account_number"

    for body, field in (({"registered_name": "X"}, "account_number"),
                        ({"account_number": "1", "vpa": "a@b"}, "account_number"),
                        ({"account_number": "1", "account_status": "closed"},
                         "account_status"),
                        ({"account_number": "1", "status": "processed"}, "status"),
                        ({"account_number": "1", "pending_s": -1}, "pending_s"),
                        ({"account_number": "1", "registered_name": 7}, "registered_name")):
        refused = validation_account(clean_sandbox, **body)
        assert refused.status_code == 400, body
        assert refused.json()["error"]["field"] == field
