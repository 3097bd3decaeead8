"""The RazorpayX (payouts) stand-in of the sandbox, over real HTTP.

Payout webhooks go to ``{SANDBOX_WEBHOOK_URL}/payouts`` on the Corridor ``live_server``.
Every test points the live server at the recording receiver of
tests/sandbox/razorpayx_calls.py (``receiver`` fixture), so it sees the exact bytes and
headers that arrive and does not depend on Corridor's own webhook endpoint. The
``receiver`` fixture also sets the fault ``razorpayx.settle_delay`` to 0.2 s (the sandbox
process reads ``SANDBOX_PAYOUT_SETTLE_S`` from its environment once), and on the way out
waits until every payout of the test has no step left and every webhook of it was
acknowledged or is lost.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import httpx
import pytest
import razorpay
from django.conf import settings

from sandbox.razorpay.common import compact_json
from sandbox.razorpay.payouts import fee_and_tax
from tests.flows import wait_for
from tests.sandbox import razorpayx_calls
from tests.sandbox.razorpayx_calls import (
    ACCOUNT_NUMBER,
    ENVELOPE_KEYS,
    HEADER,
    MISSING_KEY,
    SETTLE_S,
    api,
    auth,
    bank_account,
    create_payout,
    deliveries,
    error,
    events,
    get_payout,
    make_contact,
    own_hmac,
    payout_body,
    post_payout,
    received,
    reference,
    sandbox_payouts,
    settle_payout,
    status_of,
    vpa_account,
)


@pytest.fixture
def receiver(settings, clean_sandbox):
    """The recording webhook receiver (tests/sandbox/razorpayx_calls.py)."""
    yield from razorpayx_calls.receiving(settings, clean_sandbox)


@pytest.mark.django_db(transaction=True)
def test_contact_with_identical_details_is_returned_not_duplicated(sandbox, receiver):
    details = {"name": "Asha Rao", "email": "asha@example.invalid", "contact": "9000090000",
               "type": "customer", "reference_id": f"cust-{uuid.uuid4().hex[:12]}"}

    first = make_contact(sandbox, **details, notes={"kyc": "ok"})
    again = make_contact(sandbox, **details, notes={"kyc": "ok"})
    other_type = make_contact(sandbox, **details | {"type": "vendor"})

    assert list(first) == ["id", "entity", "name", "contact", "email", "type", "reference_id",
                           "batch_id", "active", "notes", "created_at"]
    assert first["id"].startswith("cont_") and len(first["id"]) == len("cont_") + 14
    assert first | {"id": None, "created_at": None} == {
        "id": None, "entity": "contact", **details, "batch_id": None, "active": True,
        "notes": {"kyc": "ok"}, "created_at": None}
    assert again == first
    assert other_type["id"] != first["id"]
    assert api(sandbox, "GET", f"/contacts/{first['id']}").json() == first


CONTACT_ERRORS = [
    ({"name": None}, "The name field is required.", "name"),
    ({"name": "Al"}, "The name must be at least 3 characters.", "name"),
    ({"name": "A" * 51}, "The name may not be greater than 50 characters.", "name"),
    ({"name": "Asha Rao-"}, "The name field is invalid.", "name"),
    ({"name": "Asha <Rao>"}, "The name field is invalid.", "name"),
    ({"name": "-Asha Rao"}, "The name field is invalid.", "name"),
    ({"type": "Customer"}, "Invalid type: Customer", "type"),
    ({"type": "partner"}, "Invalid type: partner", "type"),
    ({"reference_id": "r" * 41}, "The reference id may not be greater than 40 characters.",
     "reference_id"),
    ({"email": "not-an-email"}, "The email must be a valid email address.", "email"),
    ({"gstin": "X"}, "gstin is/are not required and should not be sent", "gstin"),
]


@pytest.mark.django_db(transaction=True)
def test_contact_validation_errors(sandbox, receiver):
    for overrides, description, field in CONTACT_ERRORS:
        body = {"name": "Asha Rao", "type": "customer"} | overrides
        body = {k: v for k, v in body.items() if v is not None}

        response = api(sandbox, "POST", "/contacts", json=body)

        assert response.status_code == 400, overrides
        reason = "extra_field_sent" if field == "gstin" else "input_validation_failed"
        assert response.json() == error(description, field, reason=reason), overrides


@pytest.mark.django_db(transaction=True)
def test_contact_names_with_allowed_punctuation_are_accepted(sandbox, receiver):
    for name in ["O’Brien Family", "R. K. Narayan Jr.", "Rao_Sons/2, (Pune) Ltd"]:
        assert make_contact(sandbox, name=name)["name"] == name


@pytest.mark.django_db(transaction=True)
def test_fund_accounts_for_bank_and_vpa_and_identical_details_reuse(sandbox, receiver):
    contact = make_contact(sandbox)
    bank = {"contact_id": contact["id"], "account_type": "bank_account",
            "bank_account": {"name": "Asha Rao", "ifsc": "HDFC0000053",
                             "account_number": "765432123456789"}}
    vpa = {"contact_id": contact["id"], "account_type": "vpa",
           "vpa": {"address": "asha@okaxis"}}
    ref_fund_account = reference("webhook_payout_processed_upi.json")[
        "payload"]["payout"]["entity"]["fund_account"]

    first_bank = api(sandbox, "POST", "/fund_accounts", json=bank).json()
    again_bank = api(sandbox, "POST", "/fund_accounts", json=bank).json()
    first_vpa = api(sandbox, "POST", "/fund_accounts", json=vpa).json()
    other_contact = make_contact(sandbox)
    elsewhere = api(sandbox, "POST", "/fund_accounts",
                    json=vpa | {"contact_id": other_contact["id"]}).json()

    assert first_bank["id"].startswith("fa_") and again_bank == first_bank
    assert first_bank["bank_account"] == {"ifsc": "HDFC0000053", "bank_name": "HDFC Bank",
                                          "name": "Asha Rao", "notes": [],
                                          "account_number": "765432123456789"}
    assert (first_bank["contact_id"], first_bank["account_type"], first_bank["active"]) == (
        contact["id"], "bank_account", True)
    assert list(first_vpa) == list(ref_fund_account)
    assert first_vpa["vpa"] == {"username": "asha", "handle": "okaxis", "address": "asha@okaxis"}
    assert elsewhere["id"] not in (first_vpa["id"], first_bank["id"])
    assert api(sandbox, "GET", f"/fund_accounts/{first_vpa['id']}").json() == first_vpa


@pytest.mark.django_db(transaction=True)
def test_contacts_by_reference_and_fund_accounts_by_contact_are_listed(sandbox, receiver):
    """``GET /v1/contacts?reference_id=`` (NOTES §2.2) and ``GET /v1/fund_accounts?
    contact_id=``: what a withdrawal's lost request is rebuilt from (issue 25 §2)."""
    reference_id = f"tx-{uuid.uuid4().hex[:12]}"
    contact = make_contact(sandbox, reference_id=reference_id)
    make_contact(sandbox, reference_id=f"tx-{uuid.uuid4().hex[:12]}")
    vpa = api(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact["id"], "account_type": "vpa",
        "vpa": {"address": "asha@okaxis"}}).json()

    contacts = api(sandbox, "GET", "/contacts", params={"reference_id": reference_id}).json()
    funds = api(sandbox, "GET", "/fund_accounts", params={"contact_id": contact["id"]}).json()

    assert contacts == {"entity": "collection", "count": 1, "items": [contact]}
    assert funds == {"entity": "collection", "count": 1, "items": [vpa]}


BANK_ACCOUNT_ERRORS = [
    ({"ifsc": "HDFC000005"}, "The bank_account.ifsc must be 11 characters.",
     "bank_account.ifsc"),
    ({"ifsc": "HDFC1000053"}, "Invalid IFSC Code in Bank Account", "bank_account.ifsc"),
    ({"account_number": "1234"},
     "The bank_account.account_number must be between 5 and 35 alphanumeric characters.",
     "bank_account.account_number"),
    ({"account_number": "1234-5678"},
     "The bank_account.account_number must be between 5 and 35 alphanumeric characters.",
     "bank_account.account_number"),
    ({"account_number": "1" * 36},
     "The bank_account.account_number must be between 5 and 35 alphanumeric characters.",
     "bank_account.account_number"),
    ({"name": "Al"}, "The bank_account.name must be between 3 and 120 characters.",
     "bank_account.name"),
]


@pytest.mark.django_db(transaction=True)
def test_bank_fund_account_validation_errors(sandbox, receiver):
    contact = make_contact(sandbox)
    for bank_account_, description, field in BANK_ACCOUNT_ERRORS:
        details = {"name": "Asha Rao", "ifsc": "HDFC0000053",
                   "account_number": "765432123456789"} | bank_account_

        response = api(sandbox, "POST", "/fund_accounts", json={
            "contact_id": contact["id"], "account_type": "bank_account",
            "bank_account": details})

        assert response.status_code == 400, bank_account_
        assert response.json() == error(description, field), bank_account_


@pytest.mark.django_db(transaction=True)
def test_fund_account_refuses_bad_vpa_unknown_contact_and_type(sandbox, receiver):
    contact = make_contact(sandbox)

    bad_vpa = api(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact["id"], "account_type": "vpa", "vpa": {"address": "no-handle"}})
    unknown = api(sandbox, "POST", "/fund_accounts", json={
        "contact_id": "cont_DoesNotExist00", "account_type": "vpa",
        "vpa": {"address": "asha@okaxis"}})
    card = api(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact["id"], "account_type": "card", "card": {}})

    assert bad_vpa.json() == error(
        "Invalid VPA. Please enter a valid Virtual Payment Address", "vpa.address")
    assert unknown.json() == error("The id provided does not exist", "contact_id")
    assert card.json()["error"]["field"] in ("account_type", "card")
    assert {bad_vpa.status_code, unknown.status_code, card.status_code} == {400}


@pytest.mark.django_db(transaction=True)
def test_payout_apis_require_basic_auth(sandbox, receiver):
    for method, path_ in [("POST", "/payouts"), ("GET", "/payouts/pout_DoesNotExist00"),
                          ("POST", "/contacts"), ("POST", "/fund_accounts")]:
        response = httpx.request(method, f"{sandbox.url}/razorpay/v1{path_}", json={},
                                 headers={HEADER: str(uuid.uuid4())}, timeout=10)
        assert response.status_code == 401
        assert response.json()["error"]["description"] == (
            "Please provide your api key for authentication purposes.")


# --- creating payouts and idempotency -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_create_payout_answers_processing_with_fees_and_no_utr(sandbox, receiver):
    fund_account = bank_account(sandbox)
    ref = reference("api_create_payout_response_queued.json")
    body = payout_body(fund_account, amount=1000000, mode="IMPS", purpose="refund")

    response = post_payout(sandbox, body)

    assert response.status_code == 200, response.text
    payout = response.json()
    assert set(ref) <= set(payout)
    assert payout["id"].startswith("pout_") and len(payout["id"]) == len("pout_") + 14
    assert (payout["entity"], payout["status"], payout["utr"]) == ("payout", "processing", None)
    assert (payout["amount"], payout["currency"], payout["mode"], payout["purpose"]) == (
        1000000, "INR", "IMPS", "refund")
    assert (payout["fees"], payout["tax"]) == fee_and_tax("IMPS") == (590, 90)
    assert (payout["fund_account_id"], payout["reference_id"], payout["narration"]) == (
        fund_account["id"], body["reference_id"], "Corridor withdrawal")
    assert payout["notes"] == {"withdrawal": "wd-1"}
    assert payout["debit_account_number"] == ACCOUNT_NUMBER
    assert payout["status_details"] == {"reason": None, "description": None, "source": None}
    assert abs(payout["created_at"] - time.time()) < 60
    assert "fund_account" not in payout
    assert get_payout(sandbox, payout["id"]) == payout


@pytest.mark.django_db(transaction=True)
def test_sdk_generic_post_creates_a_payout_with_the_idempotency_header(sandbox, receiver):
    client = razorpay.Client(auth=auth(), base_url=f"{sandbox.url}/razorpay")
    fund_account = vpa_account(sandbox)
    key = str(uuid.uuid4())

    payout = client.post("/v1/payouts", payout_body(fund_account), headers={HEADER: key})

    assert payout["status"] == "processing"
    with pytest.raises(razorpay.errors.BadRequestError, match="Idempotency key is missing"):
        client.post("/v1/payouts", payout_body(fund_account))
    rows = sandbox_payouts(sandbox, fund_account_id=fund_account["id"])
    assert [r["idempotency_key"] for r in rows] == [key]


@pytest.mark.django_db(transaction=True)
def test_missing_idempotency_key_is_refused_with_the_documented_body(sandbox, receiver):
    fund_account = vpa_account(sandbox)

    missing = post_payout(sandbox, payout_body(fund_account), key=None)
    empty = post_payout(sandbox, payout_body(fund_account), key="")

    assert (missing.status_code, empty.status_code) == (400, 400)
    assert missing.json() == MISSING_KEY == empty.json()
    assert missing.content.count(b'"reason": "null"') + missing.content.count(
        b'"reason":"null"') == 1  # the string "null", not JSON null
    assert sandbox_payouts(sandbox, fund_account_id=fund_account["id"]) == []


@pytest.mark.django_db(transaction=True)
def test_idempotency_key_outside_4_to_36_of_the_charset_is_refused(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    bad_keys = ["abc", "k" * 37, "tx:1", f"anchor-tx-{uuid.uuid4()}", "ключ-1234".encode(),
                "tx#1234", "a.b.c.d"]

    for key in bad_keys:
        response = post_payout(sandbox, payout_body(fund_account), key=key)

        assert response.status_code == 400, key
        body = response.json()["error"]
        assert (body["code"], body["field"], body["source"]) == (
            "BAD_REQUEST_ERROR", "X-Payout-Idempotency", "business"), key
        assert body["description"].startswith("Idempotency key is invalid"), key
    assert sandbox_payouts(sandbox, fund_account_id=fund_account["id"]) == []


@pytest.mark.django_db(transaction=True)
def test_idempotency_keys_at_the_limits_are_accepted(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    suffix = uuid.uuid4().hex[:4]  # keys are global in the sandbox: unique to this run
    keys = [suffix, str(uuid.uuid4()), f"wd 42_attempt-{suffix}", "k" * 32 + suffix]

    for key in keys:
        create_payout(sandbox, fund_account, key=key)

    rows = sandbox_payouts(sandbox, fund_account_id=fund_account["id"])
    assert [r["idempotency_key"] for r in rows] == keys
    assert sorted(len(k) for k in keys) == [4, 18, 36, 36]


@pytest.mark.django_db(transaction=True)
def test_replay_with_same_key_and_body_returns_the_payout_in_its_latest_state(sandbox,
                                                                              receiver):
    fund_account = vpa_account(sandbox)
    body = payout_body(fund_account)
    key = str(uuid.uuid4())
    first = post_payout(sandbox, body, key).json()
    processed = status_of(sandbox, first["id"], "processed")

    replay = post_payout(sandbox, body, key)
    reordered = post_payout(sandbox, json.dumps(dict(reversed(list(body.items())))), key)

    assert first["status"] == "processing"
    assert replay.status_code == 200 and reordered.status_code == 200
    assert replay.json() == processed == reordered.json()
    assert processed["id"] == first["id"] and processed["utr"]
    assert [r["id"] for r in sandbox_payouts(sandbox, reference_id=body["reference_id"])] == [
        first["id"]]


@pytest.mark.django_db(transaction=True)
def test_same_key_with_a_different_body_is_a_bad_request(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    body = payout_body(fund_account)
    first, key = create_payout(sandbox, fund_account, **body)

    for change in [{"amount": 29936}, {"amount": 29935.0}, {"narration": "Other narration"},
                   {"notes": {}}, {"queue_if_low_balance": False}]:
        response = post_payout(sandbox, body | change, key)

        assert response.status_code == 400, change
        assert response.json() == error(
            "Different request body sent for the same Idempotency Header",
            "X-Payout-Idempotency"), change
    assert [r["id"] for r in sandbox_payouts(sandbox, fund_account_id=fund_account["id"])] == [
        first["id"]]
    assert get_payout(sandbox, first["id"])["amount"] == 29935


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_in_flight_gets_409_and_then_the_stored_payout(sandbox,
                                                                           receiver):
    fund_account = vpa_account(sandbox)
    body = payout_body(fund_account)
    key = str(uuid.uuid4())
    receiver.hold = {"payout.processed"}
    receiver.gate.clear()
    sandbox.fault("razorpayx.webhook_before_create_returns", times=1)

    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(post_payout, sandbox, body, key)
        wait_for(lambda: sandbox_payouts(sandbox, idempotency_key=key))
        in_flight = post_payout(sandbox, body, key)
        receiver.gate.set()
        first = first.result()

    after = post_payout(sandbox, body, key)
    assert in_flight.status_code == 409
    assert in_flight.json() == error(
        "Request failed because another payout operation with the same Idempotency Key is in "
        "progress", "X-Payout-Idempotency")
    assert first.status_code == 200 and after.status_code == 200
    assert after.json()["id"] == first.json()["id"]
    assert len(sandbox_payouts(sandbox, idempotency_key=key)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_one_key_makes_exactly_one_payout(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    body = payout_body(fund_account)
    key = str(uuid.uuid4())

    with ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(lambda _: post_payout(sandbox, body, key), range(6)))

    assert {r.status_code for r in responses} <= {200, 409}
    ids = {r.json()["id"] for r in responses if r.status_code == 200}
    assert len(ids) == 1
    assert [r["id"] for r in sandbox_payouts(sandbox, idempotency_key=key)] == list(ids)


PAYOUT_ERRORS = [
    ({"account_number": "7878780080316316"}, "The RazorpayX Account number is invalid",
     "account_number"),
    ({"account_number": None}, "The account number field is required.", "account_number"),
    ({"fund_account_id": "fa_DoesNotExist000"}, "The id provided does not exist",
     "fund_account_id"),
    ({"amount": 99}, "The amount must be at least INR 1.00", "amount"),
    ({"amount": 299.35}, "The amount must be an integer.", "amount"),
    ({"amount": "29935"}, "The amount must be an integer.", "amount"),
    ({"amount": 10000001}, "The amount may not be greater than INR 100,000.00 for UPI",
     "amount"),
    ({"currency": "USD"}, "Currency is not supported", "currency"),
    ({"mode": "upi"}, "Invalid mode: upi", "mode"),
    ({"mode": "IMPS"}, "IMPS is not a valid mode for a fund account of type vpa", "mode"),
    ({"purpose": "gift"}, "Invalid purpose: gift", "purpose"),
    ({"purpose": None}, "The purpose field is required.", "purpose"),
    ({"reference_id": "r" * 41}, "The reference id may not be greater than 40 characters.",
     "reference_id"),
    ({"narration": "N" * 31}, "The narration may not be greater than 30 characters.",
     "narration"),
    ({"narration": "Withdrawal #42"}, "The narration format is invalid.", "narration"),
    ({"notes": {f"k{i}": "v" for i in range(16)}},
     "Number of fields in notes should be less than or equal to 15", "notes"),
    ({"queue_if_low_balance": "yes"},
     "The queue if low balance field must be true or false.", "queue_if_low_balance"),
    ({"amount_paise": 29935}, "amount_paise is/are not required and should not be sent",
     "amount_paise"),
]


@pytest.mark.django_db(transaction=True)
def test_create_payout_validation_errors_keep_the_key_free(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    key = str(uuid.uuid4())

    for change, description, field in PAYOUT_ERRORS:
        body = {k: v for k, v in (payout_body(fund_account) | change).items() if v is not None}

        refused = post_payout(sandbox, body, key)

        assert refused.status_code == 400, change
        reason = "extra_field_sent" if field == "amount_paise" else "input_validation_failed"
        assert refused.json() == error(description, field, reason=reason), change
    assert sandbox_payouts(sandbox, fund_account_id=fund_account["id"]) == []
    corrected = post_payout(sandbox, payout_body(fund_account), key)
    assert corrected.status_code == 200, corrected.text


@pytest.mark.django_db(transaction=True)
def test_mode_limits_and_bank_modes(sandbox, receiver):
    fund_account = bank_account(sandbox)

    rtgs_small = post_payout(sandbox, payout_body(fund_account, mode="RTGS", amount=19999999))
    imps_large = post_payout(sandbox, payout_body(fund_account, mode="IMPS", amount=50000001))
    neft = post_payout(sandbox, payout_body(fund_account, mode="NEFT", amount=100))
    rtgs = post_payout(sandbox, payout_body(fund_account, mode="RTGS", amount=20000000))
    upi = post_payout(sandbox, payout_body(fund_account, mode="UPI"))

    assert rtgs_small.json() == error("The amount must be at least INR 200,000.00 for RTGS",
                                      "amount")
    assert imps_large.json() == error(
        "The amount may not be greater than INR 500,000.00 for IMPS", "amount")
    assert upi.json() == error("UPI is not a valid mode for a fund account of type "
                               "bank_account", "mode")
    assert (neft.status_code, rtgs.status_code) == (200, 200)
    assert (neft.json()["fees"], rtgs.json()["fees"]) == (fee_and_tax("NEFT")[0],
                                                          fee_and_tax("RTGS")[0])


# --- reading ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_list_payouts_by_reference_id_returns_every_match_newest_first(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    reference_id = f"wd-{uuid.uuid4()}"[:40]
    older, _ = create_payout(sandbox, fund_account, reference_id=reference_id)
    newer, _ = create_payout(sandbox, fund_account, reference_id=reference_id, amount=500)
    third, _ = create_payout(sandbox, fund_account)
    for payout in (older, newer, third):
        status_of(sandbox, payout["id"], "processed")

    def listing(**params):
        return api(sandbox, "GET", "/payouts", params={"account_number": ACCOUNT_NUMBER,
                                                       **params})

    both = listing(reference_id=reference_id).json()
    first_page = listing(reference_id=reference_id, count=1).json()
    second_page = listing(reference_id=reference_id, count=1, skip=1).json()
    none = listing(reference_id="wd-nothing-here").json()
    missing = api(sandbox, "GET", "/payouts", params={"reference_id": reference_id})
    wrong = api(sandbox, "GET", "/payouts", params={"account_number": "7878780080316316"})

    assert (both["entity"], both["count"]) == ("collection", 2)
    assert [p["id"] for p in both["items"]] == [newer["id"], older["id"]]
    assert both["items"][0] == get_payout(sandbox, newer["id"])
    assert [p["id"] for p in first_page["items"] + second_page["items"]] == [
        newer["id"], older["id"]]
    assert none == {"entity": "collection", "count": 0, "items": []}
    assert missing.json() == error("The account number field is required.", "account_number")
    assert wrong.json() == error("The RazorpayX Account number is invalid", "account_number")
    assert listing(fund_account_id=fund_account["id"]).json()["count"] == 3


@pytest.mark.django_db(transaction=True)
def test_unknown_payout_id_answers_the_razorpay_error(sandbox, receiver):
    response = api(sandbox, "GET", "/payouts/pout_DoesNotExist00")

    assert response.status_code == 400
    assert response.json() == error("The id provided does not exist", None)


@pytest.mark.django_db(transaction=True)
def test_sandbox_listing_shows_every_payout_with_its_key(sandbox, receiver):
    sandbox.fault("razorpayx.settle_delay", seconds=0.8)
    fund_account = vpa_account(sandbox, address="ravi@okhdfc")
    payout, key = create_payout(sandbox, fund_account)

    rows = sandbox_payouts(sandbox, fund_account_id=fund_account["id"])

    assert len(rows) == 1
    row = rows[0]
    assert {k: row[k] for k in ("id", "reference_id", "idempotency_key", "amount", "status",
                                "utr", "fund_account_id", "beneficiary", "created_at")} == {
        "id": payout["id"], "reference_id": payout["reference_id"], "idempotency_key": key,
        "amount": 29935, "status": "processing", "utr": None,
        "fund_account_id": fund_account["id"], "beneficiary": "ravi@okhdfc",
        "created_at": payout["created_at"]}
    assert row["created"] and row["next_step"] == "settle"


# --- life cycle and webhooks ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_life_cycle_processing_to_processed_with_signed_webhooks(sandbox, receiver):
    secret = settings.RAZORPAY_WEBHOOK_SECRET
    fund_account = vpa_account(sandbox)
    ref = reference("webhook_payout_processed_upi.json")
    ref_entity = ref["payload"]["payout"]["entity"]
    started = time.monotonic()

    payout, _ = create_payout(sandbox, fund_account, notes={"memo": "₹299.35 निकासी"})

    got = received(receiver, payout["id"], 3)
    assert events(got) == ["payout.initiated", "payout.updated", "payout.processed"]
    final = get_payout(sandbox, payout["id"])
    assert final["status"] == "processed" and len(final["utr"]) == 12
    assert final["status_details"] == ref_entity["status_details"]
    rows = {r["event_id"]: r for r in deliveries(sandbox, entity_id=payout["id"])}
    assert len(rows) == 3
    for request in got:
        raw, headers = request["raw"], request["headers"]
        row = rows[request["event_id"]]
        assert request["target"] == "payouts" and row["url"].endswith("/webhooks/razorpay/payouts")
        assert headers["x-razorpay-signature"] == own_hmac(secret, raw) == row["signature"]
        assert headers["x-razorpay-event-id"] == row["event_id"]
        assert headers["content-type"] == "application/json"
        assert raw == row["body"].encode("utf-8") == compact_json(json.loads(raw))
        assert "₹299.35 निकासी".encode() in raw
        body = request["body"]
        assert list(body) == ENVELOPE_KEYS == list(ref)
        assert body["contains"] == ["payout"] and body["event"] == request["event"]
        entity = body["payload"]["payout"]["entity"]
        assert set(ref_entity) <= set(entity)
        assert list(entity["fund_account"]) == list(ref_entity["fund_account"])
        assert entity["fund_account"] == fund_account
        assert {k: v for k, v in entity.items() if k != "fund_account"} == (
            payout if request["event"] == "payout.initiated" else final)
    assert got[0]["body"]["payload"]["payout"]["entity"]["utr"] is None
    processed_at = got[2]["started"]
    assert processed_at - started >= SETTLE_S - 0.05


@pytest.mark.django_db(transaction=True)
def test_settle_delay_comes_from_the_fault_switch(sandbox, receiver):
    sandbox.fault("razorpayx.settle_delay", seconds=0.8)
    fund_account = vpa_account(sandbox)

    payout, _ = create_payout(sandbox, fund_account)

    [row] = sandbox_payouts(sandbox, fund_account_id=fund_account["id"])
    assert row["next_step"] == "settle"
    due = datetime.fromisoformat(row["next_step_at"]) - datetime.fromisoformat(row["created"])
    assert due.total_seconds() == pytest.approx(0.8, abs=0.01)
    status_of(sandbox, payout["id"], "processed", timeout=10)


@pytest.mark.django_db(transaction=True)
def test_hand_settlement_moves_and_refuses_impossible_moves(sandbox, receiver):
    sandbox.fault("razorpayx.settle_delay", seconds=30)  # only the hand moves these
    fund_account = vpa_account(sandbox)
    one, _ = create_payout(sandbox, fund_account)
    two, _ = create_payout(sandbox, fund_account)

    failed = settle_payout(sandbox, one["id"], status="failed", reason="bank_account_closed")
    not_again = settle_payout(sandbox, one["id"], status="processed")
    processed = settle_payout(sandbox, two["id"], status="processed")
    reversed_ = settle_payout(sandbox, two["id"], status="reversed")
    unknown = settle_payout(sandbox, "pout_DoesNotExist00", status="processed")
    bad = settle_payout(sandbox, two["id"], status="done")

    assert failed.status_code == 200
    assert (failed.json()["status"], failed.json()["status_details"]) == ("failed", {
        "reason": "bank_account_closed", "source": "beneficiary_bank",
        "description": "The beneficiary bank account is closed."})
    assert not_again.status_code == 400
    assert not_again.json()["error"]["description"] == (
        "Payout cannot be moved from failed to processed (sandbox)")
    assert processed.json()["status"] == "processed" and processed.json()["utr"]
    assert reversed_.json()["status"] == "reversed"
    assert reversed_.json()["utr"] == processed.json()["utr"]
    assert unknown.status_code == 400 and bad.status_code == 400
    assert events(received(receiver, one["id"], 2)) == ["payout.initiated", "payout.failed"]
    assert events(received(receiver, two["id"], 5)) == [
        "payout.initiated", "payout.updated", "payout.processed", "payout.reversed",
        "transaction.created"]


# --- fault switches --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_fault_payout_stuck_processing_never_settles(sandbox, receiver):
    sandbox.fault("razorpayx.payout_stuck_processing", times=1)
    fund_account = vpa_account(sandbox)

    stuck, _ = create_payout(sandbox, fund_account)
    normal, _ = create_payout(sandbox, fund_account)

    status_of(sandbox, normal["id"], "processed")
    got = received(receiver, stuck["id"], 2)
    time.sleep(SETTLE_S * 2)
    assert events(receiver.for_payout(stuck["id"])) == ["payout.initiated", "payout.updated"]
    entity = got[1]["body"]["payload"]["payout"]["entity"]
    assert (entity["status"], entity["utr"], entity["status_details"]["reason"]) == (
        "processing", None, "beneficiary_bank_confirmation_pending")
    current = get_payout(sandbox, stuck["id"])
    assert (current["status"], current["utr"]) == ("processing", None)
    [row] = sandbox_payouts(sandbox, fund_account_id=fund_account["id"], status="processing")
    assert (row["id"], row["next_step"]) == (stuck["id"], None)


@pytest.mark.django_db(transaction=True)
def test_fault_processed_then_reversed_sends_reversal_and_transaction(sandbox, receiver):
    sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.3)
    fund_account = bank_account(sandbox)
    ref_reversed = reference("webhook_payout_reversed_imps.json")
    ref_txn = reference("webhook_transaction_created_reversal.json")

    payout, _ = create_payout(sandbox, fund_account, mode="IMPS", amount=40000)

    got = received(receiver, payout["id"], 5)
    assert events(got) == ["payout.initiated", "payout.updated", "payout.processed",
                           "payout.reversed", "transaction.created"]
    processed = got[2]["body"]["payload"]["payout"]["entity"]
    reversed_ = got[3]["body"]["payload"]["payout"]["entity"]
    # after_s apart on the sandbox's own clock (queued times; arrival times also carry the
    # webhook loop's pace, which a loaded machine stretches unevenly)
    queued = {d["event"]: datetime.fromisoformat(d["created_at"])
              for d in deliveries(sandbox, entity_id=payout["id"])}
    assert (queued["payout.reversed"] - queued["payout.processed"]).total_seconds() >= 0.25
    assert (reversed_["status"], reversed_["utr"]) == ("reversed", processed["utr"])
    assert reversed_["status_details"] == ref_reversed["payload"]["payout"]["entity"][
        "status_details"]
    assert set(ref_reversed["payload"]["payout"]["entity"]) <= set(reversed_)
    assert list(got[3]["body"]) == list(ref_reversed)
    txn_body = got[4]["body"]
    assert set(txn_body) == set(ref_txn) and txn_body["contains"] == ["transaction"]
    txn = txn_body["payload"]["transaction"]["entity"]
    ref_entity = ref_txn["payload"]["transaction"]["entity"]
    assert set(txn) == set(ref_entity) and set(txn["source"]) == set(ref_entity["source"])
    fees, tax = fee_and_tax("IMPS")
    assert (txn["amount"], txn["credit"], txn["debit"], txn["account_number"]) == (
        40000 + fees, 40000 + fees, 0, ACCOUNT_NUMBER)
    assert txn["id"].startswith("txn_") and txn["source"]["id"].startswith("rvrsl_")
    assert {k: txn["source"][k] for k in ("entity", "payout_id", "utr", "fee", "tax")} == {
        "entity": "reversal", "payout_id": payout["id"], "utr": processed["utr"],
        "fee": fees, "tax": tax}
    assert get_payout(sandbox, payout["id"])["status"] == "reversed"
    union = set(ref_reversed["payload"]["payout"]["entity"]) | set(
        reference("webhook_payout_processed_upi.json")["payload"]["payout"]["entity"]) | set(
        reference("api_create_payout_response_queued.json"))
    assert set(reversed_) <= union  # no invented keys


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("params", "reason", "source"), [
    ({}, "beneficiary_bank_rejected", "beneficiary_bank"),
    ({"reason": "gateway_technical_error"}, "gateway_technical_error", "gateway"),
])
def test_fault_fail_payout_fails_and_the_key_stays_dead(sandbox, receiver, params, reason,
                                                        source):
    sandbox.fault("razorpayx.fail_payout", times=1, **params)
    fund_account = vpa_account(sandbox)
    body = payout_body(fund_account)
    key = str(uuid.uuid4())

    payout = post_payout(sandbox, body, key).json()

    got = received(receiver, payout["id"], 2)
    assert events(got) == ["payout.initiated", "payout.failed"]
    failed = got[1]["body"]["payload"]["payout"]["entity"]
    assert (failed["status"], failed["utr"]) == ("failed", None)
    assert (failed["status_details"]["reason"], failed["status_details"]["source"]) == (
        reason, source)
    assert failed["failure_reason"] == failed["status_details"]["description"]
    replay = post_payout(sandbox, body, key)
    assert replay.status_code == 200
    assert {k: v for k, v in failed.items() if k != "fund_account"} == replay.json()
    time.sleep(SETTLE_S)
    assert events(receiver.for_payout(payout["id"])) == ["payout.initiated", "payout.failed"]
    assert len(sandbox_payouts(sandbox, fund_account_id=fund_account["id"])) == 1


@pytest.mark.django_db(transaction=True)
def test_fault_create_5xx_after_create_still_creates_and_replay_finds_it(sandbox, receiver):
    sandbox.fault("razorpayx.create_5xx_after_create", times=1)
    fund_account = vpa_account(sandbox)
    body = payout_body(fund_account)
    key = str(uuid.uuid4())

    response = post_payout(sandbox, body, key)

    assert response.status_code == 500
    assert response.json() == {"error": {
        "code": "SERVER_ERROR",
        "description": "We are facing some trouble completing your request at the moment. "
                       "Please try again shortly.",
        "source": "NA", "step": "NA", "reason": "NA", "metadata": {}, "field": None}}
    rows = sandbox_payouts(sandbox, fund_account_id=fund_account["id"])
    assert [r["idempotency_key"] for r in rows] == [key]
    replay = post_payout(sandbox, body, key)
    assert replay.status_code == 200 and replay.json()["id"] == rows[0]["id"]
    status_of(sandbox, rows[0]["id"], "processed")
    assert len(sandbox_payouts(sandbox, fund_account_id=fund_account["id"])) == 1


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_before_create_returns(sandbox, receiver):
    sandbox.fault("razorpayx.webhook_before_create_returns", times=1)
    fund_account = vpa_account(sandbox)

    response = post_payout(sandbox, payout_body(fund_account))
    returned = time.monotonic()

    assert response.status_code == 200
    answer = response.json()
    assert (answer["status"], answer["utr"]) == ("processing", None)
    got = receiver.for_payout(answer["id"])
    processed = [r for r in got if r["event"] == "payout.processed"]
    assert len(processed) == 1 and processed[0]["ended"] <= returned
    assert processed[0]["body"]["payload"]["payout"]["entity"]["reference_id"] == answer[
        "reference_id"]
    assert get_payout(sandbox, answer["id"])["status"] == "processed"


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_duplicate_delivers_each_event_several_times(sandbox, receiver):
    sandbox.fault("razorpayx.webhook_duplicate", times=1, copies=3)
    fund_account = vpa_account(sandbox)

    payout, _ = create_payout(sandbox, fund_account)
    other, _ = create_payout(sandbox, fund_account)

    got = received(receiver, payout["id"], 9)
    by_event: dict[str, list] = {}
    for request in got:
        by_event.setdefault(request["event_id"], []).append(request)
    assert len(by_event) == 3
    for copies in by_event.values():
        assert len(copies) == 3
        assert len({c["raw"] for c in copies}) == 1
        assert len({c["headers"]["x-razorpay-signature"] for c in copies}) == 1
    assert sorted(r["kind"] for r in deliveries(sandbox, entity_id=payout["id"])) == (
        ["duplicate"] * 6 + ["original"] * 3)
    received(receiver, other["id"], 3)
    time.sleep(0.2)
    assert len(receiver.for_payout(other["id"])) == 3  # the fault fired once


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_reorder_sends_reversed_before_processed(sandbox, receiver):
    sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.2)
    sandbox.fault("razorpayx.webhook_reorder", times=1)
    fund_account = vpa_account(sandbox)

    payout, _ = create_payout(sandbox, fund_account)

    got = received(receiver, payout["id"], 5)
    assert events(got) == ["payout.initiated", "payout.reversed", "transaction.created",
                           "payout.updated", "payout.processed"]
    statuses = [r["body"]["payload"]["payout"]["entity"]["status"] for r in got
                if r["event"].startswith("payout.")]
    assert statuses == ["processing", "reversed", "processed", "processed"]
    assert get_payout(sandbox, payout["id"])["status"] == "reversed"


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_lose_records_but_never_sends(sandbox, receiver):
    sandbox.fault("razorpayx.webhook_lose", times=1)
    fund_account = vpa_account(sandbox)

    payout, _ = create_payout(sandbox, fund_account)

    status_of(sandbox, payout["id"], "processed")
    rows = wait_for(lambda: len(r := deliveries(sandbox, entity_id=payout["id"])) == 3 and r)
    time.sleep(0.2)
    assert receiver.for_payout(payout["id"]) == []
    assert all(r["lost"] and r["attempts"] == 0 for r in rows)


@pytest.mark.django_db(transaction=True)
def test_payouts_reset_empties_the_payout_tables(sandbox, receiver):
    fund_account = vpa_account(sandbox)
    payout, _ = create_payout(sandbox, fund_account)
    status_of(sandbox, payout["id"], "processed")
    received(receiver, payout["id"], 3)

    httpx.post(f"{sandbox.url}/razorpay/sandbox/payouts/reset", timeout=10).raise_for_status()

    assert sandbox_payouts(sandbox) == []
    assert deliveries(sandbox, entity_id=payout["id"]) == []
    assert api(sandbox, "GET", f"/payouts/{payout['id']}").status_code == 400
    assert api(sandbox, "GET", f"/fund_accounts/{fund_account['id']}").status_code == 400
