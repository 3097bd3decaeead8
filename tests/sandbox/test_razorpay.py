"""The Razorpay (pay-ins) stand-in of the sandbox, over real HTTP.

Webhooks go to ``{SANDBOX_WEBHOOK_URL}/payments`` on the Corridor ``live_server``. Every
test that pays points the live server at the recording receiver of
tests/sandbox/razorpay_calls.py (``receiver`` fixture), so the tests see the exact bytes
and headers that arrive, choose the HTTP answer (503 / 404 to force retries) and do not
depend on Corridor's own webhook endpoint. Delivery state is read from ``GET
/razorpay/sandbox/webhooks``.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import razorpay
from django.conf import settings

from sandbox.razorpay.common import checkout_signature, compact_json, hmac_sha256_hex
from sandbox.razorpay.payins import fee_and_tax, format_inr
from sandbox.razorpay.webhooks import sign
from tests.conftest import reference_path
from tests.flows import wait_for
from tests.sandbox import razorpay_calls
from tests.sandbox.razorpay_calls import (
    ENVELOPE_KEYS,
    ORDER_KEYS,
    all_delivered,
    auth,
    create_order,
    deliveries,
    error,
    orders_with_receipt,
    own_hmac,
    paid_order,
    pay,
    post_order,
    receipt,
    reference,
    sdk,
)


@pytest.fixture
def receiver(settings, clean_sandbox):
    """The recording webhook receiver (tests/sandbox/razorpay_calls.py)."""
    yield from razorpay_calls.receiving(settings, clean_sandbox)


@pytest.mark.django_db(transaction=True)
def test_create_order_answers_the_razorpay_order_entity(sandbox):
    client = sdk(sandbox)
    rcpt = receipt()

    order = client.order.create({"amount": 29935, "currency": "INR", "receipt": rcpt,
                                 "notes": {"deposit_id": "dep-1"}})

    assert list(order) == ORDER_KEYS
    assert set(order) == set(reference("webhook_order_paid_upi.json")["payload"]["order"]["entity"])
    assert order["id"].startswith("order_") and len(order["id"]) == len("order_") + 14
    assert order | {"id": None, "created_at": None} == {
        "id": None, "entity": "order", "amount": 29935, "amount_paid": 0, "amount_due": 29935,
        "currency": "INR", "receipt": rcpt, "offer_id": None, "status": "created",
        "attempts": 0, "notes": {"deposit_id": "dep-1"}, "created_at": None,
    }
    assert abs(order["created_at"] - time.time()) < 60
    assert client.order.fetch(order["id"]) == order
    assert client.order.payments(order["id"]) == {"entity": "collection", "count": 0,
                                                  "items": []}


@pytest.mark.django_db(transaction=True)
def test_empty_notes_read_back_as_an_empty_array(sandbox):
    order = create_order(sandbox)

    assert order["notes"] == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("amount", [99, 1, 0, -100])
def test_create_order_refuses_less_than_one_rupee(sandbox, amount):
    rcpt = receipt()

    response = post_order(sandbox, {"amount": amount, "currency": "INR", "receipt": rcpt})

    assert response.status_code == 400
    assert response.json() == error("The amount must be at least INR 1.00", "amount")
    assert orders_with_receipt(sandbox, rcpt) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("amount", [299.35, 100.0, 1187.5, "29935", "299.35", True, None])
def test_create_order_refuses_float_and_rupee_looking_amounts(sandbox, amount):
    rcpt = receipt()

    response = post_order(sandbox, {"amount": amount, "currency": "INR", "receipt": rcpt})

    assert response.status_code == 400
    assert response.json() == error("The amount must be an integer.", "amount")
    assert orders_with_receipt(sandbox, rcpt) == 0


@pytest.mark.django_db(transaction=True)
def test_sdk_surfaces_validation_errors_as_bad_request(sandbox):
    with pytest.raises(razorpay.errors.BadRequestError, match="at least INR 1.00"):
        sdk(sandbox).order.create({"amount": 99, "currency": "INR", "receipt": receipt()})


@pytest.mark.django_db(transaction=True)
def test_create_order_limits_receipt_to_40_characters(sandbox):
    forty = receipt()[:40]
    ok = post_order(sandbox, {"amount": 100, "currency": "INR", "receipt": forty})
    too_long = post_order(sandbox, {"amount": 100, "currency": "INR", "receipt": "x" * 41})

    assert len(forty) == 40
    assert ok.status_code == 200 and ok.json()["receipt"] == forty
    assert too_long.status_code == 400
    assert too_long.json() == error("The receipt may not be greater than 40 characters.",
                                    "receipt")
    assert orders_with_receipt(sandbox, "x" * 41) == 0


@pytest.mark.django_db(transaction=True)
def test_create_order_limits_notes_to_15_pairs(sandbox):
    fifteen = {f"k{i}": "v" for i in range(15)}
    sixteen = {f"k{i}": "v" for i in range(16)}

    ok = post_order(sandbox, {"amount": 100, "currency": "INR", "receipt": receipt(),
                              "notes": fifteen})
    refused = post_order(sandbox, {"amount": 100, "currency": "INR", "receipt": receipt(),
                                   "notes": sixteen})

    assert ok.status_code == 200 and ok.json()["notes"] == fifteen
    assert refused.status_code == 400
    assert refused.json() == error(
        "Number of fields in notes should be less than or equal to 15", "notes")


@pytest.mark.django_db(transaction=True)
def test_create_order_refuses_unknown_fields_and_currencies(sandbox):
    extra = post_order(sandbox, {"amount": 100, "currency": "INR", "amount_paise": 100})
    usd = post_order(sandbox, {"amount": 100, "currency": "USD"})

    assert extra.status_code == 400
    assert extra.json() == error("amount_paise is/are not required and should not be sent",
                                 "amount_paise", reason="extra_field_sent")
    assert usd.status_code == 400
    assert usd.json()["error"]["field"] == "currency"


@pytest.mark.django_db(transaction=True)
def test_receipt_reuse_is_refused_unless_unique_receipt(sandbox):
    first = create_order(sandbox)

    again = post_order(sandbox, {"amount": 29935, "currency": "INR", "receipt": first["receipt"]})
    idempotent = post_order(sandbox, {"amount": 29935, "currency": "INR",
                                      "receipt": first["receipt"], "unique_receipt": True})

    assert again.status_code == 400
    assert again.json() == error("Order receipt should be unique.", "receipt")
    assert idempotent.status_code == 200
    assert idempotent.json() == first
    assert orders_with_receipt(sandbox, first["receipt"]) == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_with_one_receipt_make_one_order(sandbox):
    rcpt = receipt()
    body = {"amount": 29935, "currency": "INR", "receipt": rcpt}

    with ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(lambda _: post_order(sandbox, body), range(6)))

    assert sorted(r.status_code for r in responses) == [200] + [400] * 5
    for refused in (r for r in responses if r.status_code == 400):
        assert refused.json() == error("Order receipt should be unique.", "receipt")
    assert orders_with_receipt(sandbox, rcpt) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("credentials", "description"),
    [
        (None, "Please provide your api key for authentication purposes."),
        (("rzp_test_someoneelse", "whatever"), "The api key provided is invalid"),
        ("wrong-secret", "Authentication failed"),
    ],
)
def test_api_refuses_bad_basic_auth_with_401(sandbox, credentials, description):
    if credentials == "wrong-secret":
        credentials = (settings.RAZORPAY_KEY_ID, "not-the-secret")
    rcpt = receipt()
    body = {"amount": 100, "currency": "INR", "receipt": rcpt}

    if credentials is None:
        response = httpx.post(f"{sandbox.url}/razorpay/v1/orders", json=body, timeout=10)
    else:
        response = post_order(sandbox, body, auth_=credentials)

    assert response.status_code == 401
    assert response.json() == error(description, None, reason="NA", source="NA", step="NA")
    assert orders_with_receipt(sandbox, rcpt) == 0


@pytest.mark.django_db(transaction=True)
def test_unknown_ids_and_urls_answer_razorpay_errors(sandbox):
    base = f"{sandbox.url}/razorpay/v1"

    order = httpx.get(f"{base}/orders/order_DoesNotExist00", auth=auth())
    payments = httpx.get(f"{base}/orders/order_DoesNotExist00/payments", auth=auth())
    payment = httpx.get(f"{base}/payments/pay_DoesNotExist000", auth=auth())
    unknown = httpx.get(f"{base}/payouts_typo", auth=auth())

    for response in (order, payments, payment):
        assert response.status_code == 400
        assert response.json() == error("The id provided does not exist", None)
    assert unknown.status_code == 400
    assert unknown.json() == error("The requested URL was not found on the server.", None,
                                   reason="NA", source="NA", step="NA")


# --- paying ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_pay_captures_the_order_and_queues_two_signed_webhooks(sandbox, receiver):
    client = sdk(sandbox)
    secret = settings.RAZORPAY_WEBHOOK_SECRET
    order = create_order(sandbox, amount=29935)

    response = pay(sandbox, order["id"])

    assert response.status_code == 200, response.text
    payment = response.json()["payment"]
    assert payment["id"].startswith("pay_")
    assert (payment["status"], payment["captured"], payment["method"]) == ("captured", True, "upi")
    assert (payment["amount"], payment["currency"], payment["order_id"]) == (
        29935, "INR", order["id"])
    assert (payment["fee"], payment["tax"]) == fee_and_tax(29935) == (707, 108)
    assert len(payment["acquirer_data"]["rrn"]) == 12
    assert payment["error_code"] is None
    fetched = client.order.fetch(order["id"])
    assert (fetched["status"], fetched["amount_paid"], fetched["amount_due"],
            fetched["attempts"]) == ("paid", 29935, 0, 1)
    assert client.payment.fetch(payment["id"]) == payment
    assert client.order.payments(order["id"]) == {"entity": "collection", "count": 1,
                                                  "items": [payment]}

    rows = deliveries(sandbox, entity_id=payment["id"])
    assert sorted(r["event"] for r in rows) == ["order.paid", "payment.captured"]
    assert len({r["event_id"] for r in rows}) == 2
    ref_payment_keys = set(
        reference("webhook_payment_captured_upi.json")["payload"]["payment"]["entity"])
    for row in rows:
        raw = row["body"].encode("utf-8")
        assert client.utility.verify_webhook_signature(row["body"], row["signature"], secret)
        assert own_hmac(secret, raw) == row["signature"] == sign(raw)
        assert compact_json(json.loads(raw)) == raw  # compact, literal UTF-8
        body = json.loads(raw)
        assert list(body) == ENVELOPE_KEYS
        assert body["entity"] == "event" and body["account_id"].startswith("acc_")
        assert body["event"] == row["event"]
        assert body["contains"] == list(body["payload"])
        assert body["payload"]["payment"]["entity"] == payment
        assert ref_payment_keys <= set(body["payload"]["payment"]["entity"])
        assert row["kind"] == "original" and row["lost"] is False
        assert row["url"].endswith("/webhooks/razorpay/payments")
    paid = next(json.loads(r["body"]) for r in rows if r["event"] == "order.paid")
    assert paid["contains"] == ["payment", "order"]
    assert paid["payload"]["order"]["entity"] == client.order.fetch(order["id"])
    captured = next(json.loads(r["body"]) for r in rows if r["event"] == "payment.captured")
    assert captured["contains"] == ["payment"]


@pytest.mark.django_db(transaction=True)
def test_webhooks_reach_the_merchant_as_signed_raw_utf8_bytes(sandbox, receiver):
    secret = settings.RAZORPAY_WEBHOOK_SECRET
    memo = "₹299.35 जमा"

    order, paid = paid_order(sandbox, notes={"memo": memo})
    payment_id = paid["payment"]["id"]

    received = wait_for(lambda: len(receiver.for_payment(payment_id)) == 2
                        and receiver.for_payment(payment_id))
    rows = {r["event_id"]: r for r in all_delivered(sandbox, payment_id)}
    assert len(rows) == 2
    for request in received:
        raw = request["raw"]
        headers = {k.lower(): v for k, v in request["headers"].items()}
        row = rows[request["event_id"]]
        assert request["target"] == "payments"
        assert headers["content-type"] == "application/json"
        assert headers["x-razorpay-event-id"] == row["event_id"]
        assert headers["x-razorpay-signature"] == own_hmac(secret, raw) == row["signature"]
        assert raw == row["body"].encode("utf-8")
        assert memo.encode("utf-8") in raw and b"\\u20b9" not in raw
        assert razorpay.Client(auth=auth()).utility.verify_webhook_signature(
            raw.decode("utf-8"), headers["x-razorpay-signature"], secret)
        with pytest.raises(TypeError):  # NOTES §5.1: the SDK cannot take the raw bytes
            razorpay.Client(auth=auth()).utility.verify_webhook_signature(
                raw, headers["x-razorpay-signature"], secret)
        assert (row["attempts"], row["last_status"], row["delivered"]) == (1, 200, True)


@pytest.mark.django_db(transaction=True)
def test_failed_payment_queues_payment_failed_and_the_order_takes_a_retry(sandbox, receiver):
    client = sdk(sandbox)
    order = create_order(sandbox, amount=50000)
    ref = reference("webhook_payment_failed_netbanking.json")["payload"]["payment"]["entity"]

    failed = pay(sandbox, order["id"], method="netbanking", outcome="failed",
                 callback_url="https://corridor.example/return")

    assert failed.status_code == 200, failed.text
    body = failed.json()
    payment = body["payment"]
    assert (payment["status"], payment["captured"], payment["bank"]) == ("failed", False, "HDFC")
    assert {k: payment[k] for k in ("error_code", "error_description", "error_source",
                                    "error_step", "error_reason")} == {
        k: ref[k] for k in ("error_code", "error_description", "error_source", "error_step",
                            "error_reason")}
    assert (payment["fee"], payment["tax"]) == (None, None)
    assert set(ref) <= set(payment)
    assert "razorpay_signature" not in body["callback"]
    assert json.loads(body["callback"]["error[metadata]"]) == {"payment_id": payment["id"],
                                                               "order_id": order["id"]}
    assert parse_qs(urlsplit(body["redirect_url"]).query)["error[reason]"] == ["payment_failed"]
    after_failure = client.order.fetch(order["id"])
    assert (after_failure["status"], after_failure["amount_paid"],
            after_failure["attempts"]) == ("attempted", 0, 1)
    rows = deliveries(sandbox, order_id=order["id"])
    assert [r["event"] for r in rows] == ["payment.failed"]
    assert json.loads(rows[0]["body"])["payload"]["payment"]["entity"] == payment

    retried = pay(sandbox, order["id"], method="netbanking")

    assert retried.status_code == 200, retried.text
    assert retried.json()["payment"]["status"] == "captured"
    assert retried.json()["payment"]["id"] != payment["id"]
    final = client.order.fetch(order["id"])
    assert (final["status"], final["amount_paid"], final["attempts"]) == ("paid", 50000, 2)
    assert client.order.payments(order["id"])["count"] == 2


@pytest.mark.django_db(transaction=True)
def test_paying_a_paid_order_is_refused_without_side_effects(sandbox, receiver):
    client = sdk(sandbox)
    order, _ = paid_order(sandbox)

    again = pay(sandbox, order["id"])

    assert again.status_code == 400
    assert again.json() == error("Order has already been paid", "order_id",
                                 metadata={"order_id": order["id"]})
    assert client.order.payments(order["id"])["count"] == 1
    assert client.order.fetch(order["id"])["attempts"] == 1
    assert len(deliveries(sandbox, order_id=order["id"])) == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_pays_on_one_order_capture_once(sandbox, receiver):
    client = sdk(sandbox)
    order = create_order(sandbox)

    with ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(lambda _: pay(sandbox, order["id"]), range(6)))

    assert sorted(r.status_code for r in responses) == [200] + [400] * 5
    fetched = client.order.fetch(order["id"])
    assert (fetched["status"], fetched["amount_paid"], fetched["attempts"]) == (
        "paid", 29935, 1)
    assert client.order.payments(order["id"])["count"] == 1
    assert len(deliveries(sandbox, order_id=order["id"])) == 2


@pytest.mark.django_db(transaction=True)
def test_pay_refuses_an_unknown_order_and_bad_options(sandbox):
    order = create_order(sandbox)

    unknown = pay(sandbox, "order_DoesNotExist00")
    bad_method = pay(sandbox, order["id"], method="bitcoin")

    assert unknown.status_code == 400
    assert unknown.json()["error"]["description"] == "The id provided does not exist"
    assert bad_method.status_code == 400
    assert bad_method.json()["error"]["field"] == "method"
    assert sdk(sandbox).order.fetch(order["id"])["attempts"] == 0


# --- signatures ------------------------------------------------------------------------


def test_signature_vectors_are_reproduced_by_the_delivery_hmac():
    vectors = reference("signature_vectors.json")
    sdk_file = reference_path("razorpay", "sdk_vector_webhook_payment_authorized.json")
    sdk_bytes = sdk_file.read_bytes()
    verifier = razorpay.Client(auth=("key_id", "key_secret")).utility
    by_name = {}

    for vector in vectors["webhook_signature"]:
        if "body_file" in vector:
            raw = reference_path("razorpay", vector["body_file"]).read_bytes()
            assert len(raw) == vector["body_length_bytes"]
        elif "body" in vector:
            raw = vector["body"].encode("utf-8")
        else:  # reserialised_pretty_python: the bytes are derived, not stored
            raw = (json.dumps(json.loads(sdk_bytes), indent=2) + "\n").encode("utf-8")
        by_name[vector["name"]] = raw

        assert sign(raw, vector["secret"]) == vector["expected_hex"], vector["name"]
        assert verifier.verify_webhook_signature(raw.decode("utf-8"), vector["expected_hex"],
                                                 vector["secret"])

    sdk_signature = sign(sdk_bytes, "key_secret")
    assert sign(by_name["trailing_newline_stripped"], "key_secret") != sdk_signature
    assert sign(by_name["reserialised_compact"], "key_secret") != sdk_signature
    assert sign(by_name["reserialised_pretty_python"], "key_secret") == sdk_signature
    literal, escaped = by_name["synthetic_utf8_literal"], by_name["synthetic_utf8_escaped"]
    assert json.loads(literal) == json.loads(escaped)
    assert sign(literal, "key_secret") != sign(escaped, "key_secret")
    assert compact_json(json.loads(literal)) == literal  # our serialiser writes literal UTF-8
    for vector in vectors["checkout_payment_signature"]:
        assert checkout_signature(vector["order_id"], vector["payment_id"],
                                  vector["secret"]) == vector["expected_hex"]
    for group in ("payment_link_callback_signature", "subscription_payment_signature"):
        for vector in vectors[group]:
            assert hmac_sha256_hex(vector["secret"], vector["message"].encode()) == (
                vector["expected_hex"])


def test_amounts_are_shown_in_rupees_with_indian_grouping():
    assert format_inr(100) == "₹1.00"
    assert format_inr(29935) == "₹299.35"
    assert format_inr(123450) == "₹1,234.50"
    assert format_inr(10000000) == "₹1,00,000.00"
    assert format_inr(123456789) == "₹12,34,567.89"


def test_fee_and_tax_are_integer_paise():
    assert fee_and_tax(100) == (2, 0)  # as in webhook_payment_captured_upi.json
    assert fee_and_tax(29935) == (707, 108)


# --- checkout --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_checkout_page_renders_amount_order_and_buttons(sandbox):
    order = create_order(sandbox, amount=123450)

    page = httpx.get(f"{sandbox.url}/razorpay/sandbox/checkout/{order['id']}",
                     params={"callback_url": "https://corridor.example/return?x=1"})
    missing = httpx.get(f"{sandbox.url}/razorpay/sandbox/checkout/order_DoesNotExist00")

    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert 'name="viewport"' in html
    assert "₹1,234.50" in html
    assert order["id"] in html
    assert 'id="pay"' in html and 'id="fail"' in html
    assert f"../orders/{order['id']}/pay" in html
    assert '"https://corridor.example/return?x=1"' in html
    assert missing.status_code == 404


@pytest.mark.django_db(transaction=True)
def test_checkout_page_of_a_paid_order_has_no_pay_button(sandbox, receiver):
    order, _ = paid_order(sandbox)

    html = httpx.get(f"{sandbox.url}/razorpay/sandbox/checkout/{order['id']}").text

    assert "already been paid" in html
    assert 'id="pay"' not in html


@pytest.mark.django_db(transaction=True)
def test_checkout_callback_carries_a_signature_that_verifies(sandbox, receiver):
    order = create_order(sandbox)
    callback_url = "https://corridor.example/sep24/deposit/return?transaction_id=abc"

    body = pay(sandbox, order["id"], callback_url=callback_url).json()

    target = urlsplit(body["redirect_url"])
    assert (target.scheme, target.netloc, target.path) == (
        "https", "corridor.example", "/sep24/deposit/return")
    query = {k: v[0] for k, v in parse_qs(target.query).items()}
    assert query["transaction_id"] == "abc"
    assert query["razorpay_order_id"] == order["id"]
    assert query["razorpay_payment_id"] == body["payment"]["id"]
    params = {k: query[k] for k in ("razorpay_order_id", "razorpay_payment_id",
                                    "razorpay_signature")}
    assert params == body["callback"]
    assert razorpay.Client(auth=auth()).utility.verify_payment_signature(params)
    assert query["razorpay_signature"] == own_hmac(
        settings.RAZORPAY_KEY_SECRET, f"{order['id']}|{body['payment']['id']}".encode())
    with pytest.raises(razorpay.errors.SignatureVerificationError):
        razorpay.Client(auth=auth()).utility.verify_payment_signature(
            params | {"razorpay_order_id": "order_SomeoneElse000"})


# --- delivery --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_failing_delivery_is_retried_with_backoff_and_blocks_no_other_event(sandbox, receiver):
    receiver.status_for = lambda event, event_id, nth: (
        503 if event == "payment.captured" and nth <= 2 else 200)

    _, paid = paid_order(sandbox)
    payment_id = paid["payment"]["id"]

    rows = all_delivered(sandbox, payment_id)
    by_event = {r["event"]: r for r in rows}
    assert (by_event["order.paid"]["attempts"], by_event["order.paid"]["last_status"]) == (1, 200)
    assert (by_event["payment.captured"]["attempts"],
            by_event["payment.captured"]["last_status"]) == (3, 200)
    tries = [r for r in receiver.for_payment(payment_id) if r["event"] == "payment.captured"]
    assert [t["status"] for t in tries] == [503, 503, 200]
    assert len({t["raw"] for t in tries}) == 1
    assert len({t["headers"]["X-Razorpay-Signature"] for t in tries}) == 1
    assert {t["event_id"] for t in tries} == {by_event["payment.captured"]["event_id"]}
    first_gap = tries[1]["started"] - tries[0]["ended"]
    second_gap = tries[2]["started"] - tries[1]["ended"]
    assert first_gap >= 0.18 and second_gap >= 0.38  # SANDBOX_WEBHOOK_BACKOFF_S 0.2, doubling


@pytest.mark.django_db(transaction=True)
def test_unacknowledged_delivery_keeps_being_retried(sandbox, receiver):
    receiver.status_for = lambda event, event_id, nth: 404

    _, paid = paid_order(sandbox)
    payment_id = paid["payment"]["id"]

    def retried_three_times():
        rows = deliveries(sandbox, entity_id=payment_id)
        return rows if min(r["attempts"] for r in rows) >= 3 else None

    rows = wait_for(retried_three_times)
    for row in rows:
        assert (row["delivered"], row["gave_up"], row["last_status"]) == (False, False, 404)
        assert row["next_attempt_at"] is not None

    receiver.status_for = lambda event, event_id, nth: 200

    rows = all_delivered(sandbox, payment_id)
    assert all(r["last_status"] == 200 and r["next_attempt_at"] is None for r in rows)


@pytest.mark.django_db(transaction=True)
def test_redeliver_replays_the_same_event_bytes(sandbox, receiver):
    _, paid = paid_order(sandbox)
    payment_id = paid["payment"]["id"]
    wait_for(lambda: len(receiver.for_payment(payment_id)) == 2)
    original = receiver.for_payment(payment_id)[0]

    response = httpx.post(f"{sandbox.url}/razorpay/sandbox/webhooks/redeliver",
                          json={"event_id": original["event_id"]})
    unknown = httpx.post(f"{sandbox.url}/razorpay/sandbox/webhooks/redeliver",
                         json={"event_id": "NoSuchEvent000"})

    assert response.status_code == 200, response.text
    assert response.json()["kind"] == "replay"
    replays = wait_for(lambda: [r for r in receiver.for_payment(payment_id)
                                  if r["event_id"] == original["event_id"]][1:])
    assert replays[0]["raw"] == original["raw"]
    assert replays[0]["headers"]["X-Razorpay-Signature"] == original["headers"][
        "X-Razorpay-Signature"]
    assert [r["kind"] for r in deliveries(sandbox, event_id=original["event_id"])] == [
        "original", "replay"]
    assert unknown.status_code == 400


# --- fault switches --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_replay_delivers_each_event_several_times(sandbox, receiver):
    receiver.delay_s = 0.1
    sandbox.fault("razorpay.webhook_replay", times=1, copies=3)

    _, paid = paid_order(sandbox)
    _, next_paid = paid_order(sandbox)

    payment_id = paid["payment"]["id"]
    received = wait_for(lambda: len(receiver.for_payment(payment_id)) == 6
                        and receiver.for_payment(payment_id))
    by_event: dict[str, list] = {}
    for request in received:
        by_event.setdefault(request["event_id"], []).append(request)
    assert sorted(len(v) for v in by_event.values()) == [3, 3]
    for copies in by_event.values():
        assert len({c["raw"] for c in copies}) == 1
        assert len({c["headers"]["X-Razorpay-Signature"] for c in copies}) == 1
        for earlier, later in zip(copies, copies[1:], strict=False):
            assert later["started"] >= earlier["ended"]  # one after another
    kinds = sorted(r["kind"] for r in deliveries(sandbox, entity_id=payment_id))
    assert kinds == ["duplicate"] * 4 + ["original"] * 2
    next_id = next_paid["payment"]["id"]
    wait_for(lambda: len(receiver.for_payment(next_id)) == 2)
    time.sleep(0.3)
    assert len(receiver.for_payment(next_id)) == 2  # the fault fired once


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_replay_concurrent_sends_copies_at_once(sandbox, receiver):
    receiver.delay_s = 0.3
    sandbox.fault("razorpay.webhook_replay", times=1, copies=3, concurrent=True)

    _, paid = paid_order(sandbox)

    payment_id = paid["payment"]["id"]
    received = wait_for(lambda: len(receiver.for_payment(payment_id)) == 6
                        and receiver.for_payment(payment_id))
    by_event: dict[str, list] = {}
    for request in received:
        by_event.setdefault(request["event_id"], []).append(request)
    for copies in by_event.values():
        assert len(copies) == 3
        assert max(c["started"] for c in copies) < min(c["ended"] for c in copies)
        assert len({c["raw"] for c in copies}) == 1


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_lose_never_delivers_but_the_api_shows_paid(sandbox, receiver):
    sandbox.fault("razorpay.webhook_lose", times=1)

    order, paid = paid_order(sandbox)
    _, next_paid = paid_order(sandbox)

    payment_id = paid["payment"]["id"]
    assert sdk(sandbox).order.fetch(order["id"])["status"] == "paid"
    assert sdk(sandbox).payment.fetch(payment_id)["status"] == "captured"
    wait_for(lambda: len(receiver.for_payment(next_paid["payment"]["id"])) == 2)
    time.sleep(0.3)
    assert receiver.for_payment(payment_id) == []
    rows = deliveries(sandbox, entity_id=payment_id)
    assert sorted(r["event"] for r in rows) == ["order.paid", "payment.captured"]
    for row in rows:
        assert (row["lost"], row["attempts"], row["next_attempt_at"]) == (True, 0, None)

    httpx.post(f"{sandbox.url}/razorpay/sandbox/webhooks/redeliver",
               json={"event_id": rows[0]["event_id"]}).raise_for_status()

    replayed = wait_for(lambda: receiver.for_payment(payment_id))
    assert replayed[0]["event_id"] == rows[0]["event_id"]
    assert replayed[0]["raw"] == rows[0]["body"].encode("utf-8")


@pytest.mark.django_db(transaction=True)
def test_fault_webhook_reorder_sends_order_paid_first(sandbox, receiver):
    sandbox.fault("razorpay.webhook_reorder", times=1)

    _, paid = paid_order(sandbox)

    payment_id = paid["payment"]["id"]
    received = wait_for(lambda: len(receiver.for_payment(payment_id)) == 2
                        and receiver.for_payment(payment_id))
    assert [r["event"] for r in received] == ["order.paid", "payment.captured"]
    rows = {r["event"]: r for r in deliveries(sandbox, entity_id=payment_id)}
    assert rows["order.paid"]["first_sent_at"] < rows["payment.captured"]["first_sent_at"]


@pytest.mark.django_db(transaction=True)
def test_fault_payment_failed_then_captured(sandbox, receiver):
    client = sdk(sandbox)
    sandbox.fault("razorpay.payment_failed_then_captured", times=1, delay_s=0.3)
    order = create_order(sandbox)

    body = pay(sandbox, order["id"], callback_url="https://corridor.example/return").json()

    payment_id = body["payment"]["id"]
    assert body["payment"]["status"] == "failed"
    assert "razorpay_signature" not in body["callback"]
    assert client.order.fetch(order["id"])["status"] == "attempted"
    wait_for(lambda: client.order.fetch(order["id"])["status"] == "paid", timeout=5)
    payment = client.payment.fetch(payment_id)
    assert (payment["status"], payment["error_code"]) == ("captured", None)
    assert client.order.payments(order["id"])["count"] == 1
    received = wait_for(lambda: len(receiver.for_payment(payment_id)) == 3
                        and receiver.for_payment(payment_id))
    assert received[0]["event"] == "payment.failed"
    assert sorted(r["event"] for r in received[1:]) == ["order.paid", "payment.captured"]
    assert len({r["event_id"] for r in received}) == 3
    statuses = [json.loads(r["raw"])["payload"]["payment"]["entity"]["status"] for r in received]
    assert statuses == ["failed", "captured", "captured"]
