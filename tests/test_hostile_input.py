"""Hostile input at Corridor's doors (issue 9): one gate (corridor/inbound.py) turns
it into a 4xx with a message, and a correctly signed event that can never be stored
into a 2xx ``rejected`` row that operators see -- never a 500.

The first tests are the security tester's findings, one each; then the gate's own
rules; then hypothesis properties over the parser, the shape checks and the views."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import time
from decimal import Decimal

import jwt
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from anchor import callbacks
from anchor.models import (
    Customer,
    DepositOrder,
    DepositPayment,
    DepositRelease,
    InboundEvent,
)
from corridor import inbound
from payouts.models import WithdrawalPayout
from sagas.models import ReviewItem
from tests.conftest import reference_path
from tests.factories import DepositOrderFactory
from tests.inbound import applied_outcome

pytestmark = pytest.mark.usefixtures("no_late_deliveries")

SURROGATE = b'"\\ud800"'  # the JSON escape of a lone surrogate, as a sender writes it


def _ap_headers(settings) -> dict:
    token = jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 30},
                       settings.AP_CALLBACK_AUTH_SECRET, algorithm="HS256")
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def _signed_post(client, path: str, body: bytes, settings, event_id: str = "evt_h"):
    signature = hmac.new(settings.RAZORPAY_WEBHOOK_SECRET.encode(), body,
                         hashlib.sha256).hexdigest()
    return client.post(path, body, content_type="application/json",
                       HTTP_X_RAZORPAY_SIGNATURE=signature, HTTP_X_RAZORPAY_EVENT_ID=event_id)


def _counter(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(f"{name}_total", labels) or 0.0


# --- the findings ---------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "/sep24/checkout/%00", "/sep24/transaction/%00", "/sep24/deposit/%00",
    "/sep24/withdraw/%00", "/sep24/checkout/" + "o" * 41, "/sep24/transaction/" + "t" * 65,
])
@pytest.mark.django_db
def test_hostile_path_parameters_get_the_sep24_not_found_page(client, path):
    client.raise_request_exception = False

    response = client.get(path)

    assert response.status_code == 404
    assert b'data-reason="not_found"' in response.content
    assert b"Traceback" not in response.content


@pytest.mark.django_db
def test_nul_checkout_path_is_a_404_even_with_debug(client, settings):
    settings.DEBUG = True
    client.raise_request_exception = False

    response = client.get("/sep24/checkout/%00")

    assert response.status_code == 404
    assert b"Traceback" not in response.content


@pytest.mark.django_db
def test_a_lone_surrogate_in_an_ap_event_is_acknowledged_as_rejected(client, settings):
    body = b'{"id":"evt-sur","type":' + SURROGATE + b',"payload":{}}'
    before = _counter("corridor_ap_events", outcome="rejected")
    client.raise_request_exception = False

    response = client.post("/callbacks/event", body, content_type="application/json",
                           **_ap_headers(settings))

    assert response.status_code == 200
    assert response.json()["outcome"] == "rejected"
    assert "lone surrogate" in response.json()["error"]
    row = InboundEvent.objects.get()
    assert (row.source, row.event_id, row.outcome) == ("ap", "evt-sur", "rejected")
    assert "lone surrogate" in row.reason
    assert _counter("corridor_ap_events", outcome="rejected") == before + 1


@pytest.mark.parametrize("path", ["/webhooks/razorpay/payments", "/webhooks/razorpay/payouts"])
@pytest.mark.django_db
def test_a_lone_surrogate_in_a_signed_webhook_is_acknowledged_as_rejected(client, settings, path):
    body = b'{"event":' + SURROGATE + b',"payload":{}}'
    client.raise_request_exception = False

    response = _signed_post(client, path, body, settings, event_id="evt_sur")

    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    row = InboundEvent.objects.get()
    assert (row.event_id, row.outcome) == ("evt_sur", "rejected")
    assert row.event_type == "\ufffd"  # sanitised, so this write cannot fail
    assert "lone surrogate" in row.reason
    assert not DepositPayment.objects.exists()


@pytest.mark.parametrize("body", [
    b'{"account":' + SURROGATE + b'}',
    b'{"account":"GABC","first_name":' + SURROGATE + b'}',
    b'{"account":"GABC","memo":{"a":1}}',
])
@pytest.mark.django_db
def test_a_customer_put_that_cannot_be_stored_is_a_400(client, settings, body):
    client.raise_request_exception = False

    response = client.put("/callbacks/customer", body, content_type="application/json",
                          **_ap_headers(settings))

    assert response.status_code == 400
    assert response.json()["error"]
    assert not Customer.objects.exists()


def _captured_event(order: DepositOrder, **entity_changes) -> bytes:
    event = json.loads(reference_path("razorpay", "webhook_payment_captured_upi.json")
                       .read_text())
    entity = event["payload"]["payment"]["entity"]
    entity.update(order_id=order.order_id, amount=order.amount_in_paise, **entity_changes)
    return json.dumps(event, separators=(",", ":")).encode()


@pytest.mark.django_db
def test_a_signed_payment_captured_with_an_overlong_method_is_rejected_not_retried(
        client, settings, admin_client):
    order = DepositOrderFactory()
    method_max = DepositPayment._meta.get_field("method").max_length
    body = _captured_event(order, method="m" * (method_max + 1))
    before = _counter("corridor_webhooks", source="razorpay", outcome="rejected")
    client.raise_request_exception = False

    response = _signed_post(client, "/webhooks/razorpay/payments", body, settings,
                            event_id="evt_long_method")
    again = _signed_post(client, "/webhooks/razorpay/payments", body, settings,
                         event_id="evt_long_method")

    # Acknowledged (Razorpay stops retrying), once, and nothing credited.
    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    assert f"method is longer than {method_max}" in response.json()["error"]
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    row = InboundEvent.objects.get()
    assert (row.source, row.event_id, row.event_type, row.outcome) == (
        "razorpay", "evt_long_method", "payment.captured", "rejected")
    assert not DepositPayment.objects.exists()
    order.refresh_from_db()
    assert order.status == DepositOrder.Status.AWAITING_PAYMENT
    # Counted, and in the operators' queue.
    assert _counter("corridor_webhooks", source="razorpay", outcome="rejected") == before + 1
    metrics = client.get("/metrics").content.decode()
    assert 'corridor_webhooks_total{outcome="rejected",source="razorpay"}' in metrics
    item = ReviewItem.objects.get(key=f"inbound:{row.pk}")
    assert (item.kind, item.status, item.reference) == (
        "inbound", "rejected", "razorpay:evt_long_method")
    assert item.reason.startswith("payment.captured: not a Razorpay payment event:")
    queue = admin_client.get("/admin/sagas/reviewitem/")
    assert queue.status_code == 200
    assert "razorpay:evt_long_method" in queue.content.decode()


@pytest.mark.django_db
def test_the_same_payment_with_a_fitting_method_is_recorded(client, settings):
    order = DepositOrderFactory()

    response = _signed_post(client, "/webhooks/razorpay/payments", _captured_event(order),
                            settings, event_id="evt_ok")

    assert (response.status_code, response.json()["outcome"]) == (200, "received")
    assert applied_outcome("razorpay", "evt_ok") == "recorded"
    assert DepositPayment.objects.get().method == "upi"
    assert not ReviewItem.objects.filter(kind="inbound").exists()


@pytest.mark.django_db
def test_unsigned_hostile_webhooks_stay_400_and_store_nothing(client):
    body = b'{"event":' + SURROGATE + b'}'
    for path in ("/webhooks/razorpay/payments", "/webhooks/razorpay/payouts"):
        response = client.post(path, body, content_type="application/json",
                               HTTP_X_RAZORPAY_SIGNATURE="0" * 64,
                               HTTP_X_RAZORPAY_EVENT_ID="evt_forged")
        assert response.status_code == 400
    assert client.post("/callbacks/event", body, content_type="application/json"
                       ).status_code == 401
    assert not InboundEvent.objects.exists()


@pytest.mark.django_db
def test_a_payout_webhook_with_an_overlong_utr_is_rejected(client, settings):
    utr_max = WithdrawalPayout._meta.get_field("reference").max_length
    event = json.loads(reference_path("razorpay", "webhook_payout_processed_upi.json")
                       .read_text())
    event["payload"]["payout"]["entity"]["utr"] = "u" * (utr_max + 1)

    response = _signed_post(client, "/webhooks/razorpay/payouts",
                            json.dumps(event).encode(), settings, event_id="evt_utr")

    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    assert f"utr is longer than {utr_max}" in InboundEvent.objects.get().reason


@pytest.mark.django_db
def test_an_ap_event_releasing_an_unstorable_transaction_id_is_rejected(client, settings):
    too_long = "t" * (DepositRelease._meta.get_field("transaction_id").max_length + 1)
    event = {"id": "evt-long-tx", "type": "transaction_status_changed",
             "payload": {"transaction": {"id": too_long, "kind": "deposit",
                                         "status": "pending_anchor"}}}

    response = client.post("/callbacks/event", event, content_type="application/json",
                           **_ap_headers(settings))

    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    assert InboundEvent.objects.get().outcome == "rejected"


BIG = b'{"a": "' + b"x" * (3 * 1024 * 1024) + b'"}'  # over Django's 2.5 MB upload limit


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/webhooks/razorpay/payments", "/webhooks/razorpay/payouts"])
def test_a_webhook_body_over_the_limit_is_a_413_in_json_even_under_debug(
        client, settings, path):
    """Found by the new-user trial: above Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) a
    webhook got Django's own answer (under DEBUG the page listing the settings), before
    any signature check. Now: a JSON 413, nothing stored, signed or not."""
    settings.DEBUG = True
    for response in (client.post(path, BIG, content_type="application/json",
                                 HTTP_X_RAZORPAY_SIGNATURE="00"),
                     _signed_post(client, path, BIG, settings)):
        assert (response.status_code, response["Content-Type"]) == (413, "application/json")
        assert "over 1000000 bytes" in response.json()["error"]
    assert not InboundEvent.objects.exists()


@pytest.mark.django_db
def test_an_authenticated_ap_event_over_the_limit_is_acknowledged_rejected(client, settings):
    settings.DEBUG = True
    response = client.post("/callbacks/event", BIG, content_type="application/json",
                           **_ap_headers(settings))
    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    assert "larger than" in InboundEvent.objects.get(outcome="rejected").reason


@pytest.mark.django_db
def test_a_customer_json_body_over_the_limit_is_a_400_naming_it(client, settings):
    settings.DEBUG = True
    response = client.put("/callbacks/customer", BIG, content_type="application/json",
                          **_ap_headers(settings))
    assert (response.status_code, response["Content-Type"]) == (400, "application/json")
    assert "larger than" in response.json()["error"]
    assert not Customer.objects.exists()


# --- the gate's rules -----------------------------------------------------------------

@pytest.mark.parametrize(("raw", "message"), [
    (b'{"a":' + SURROGATE + b'}', "lone surrogate"),
    (b'{' + SURROGATE + b':1}', "lone surrogate"),
    (b'{"a":"\\u0000"}', "NUL"),
    (b'{"a":NaN}', "NaN is not JSON"),
    (b'{"a":-Infinity}', "-Infinity is not JSON"),
    (b'{"a":1e400}', "out of range"),
    (b'{"a":' + b"9" * 5000 + b'}', "not JSON"),
    (b"[" * 40 + b"]" * 40, "nested deeper than 32"),
    (b"[" * 5000 + b"]" * 5000, "nested"),
    (b'"\xff"', "not UTF-8"),
    (b'{"a": "' + b"x" * inbound.MAX_BODY_BYTES + b'"}', "larger than"),
])
def test_loads_refuses_what_postgresql_or_python_cannot_take(raw, message):
    with pytest.raises(inbound.InboundError, match=message):
        inbound.loads(raw)


def test_loads_keeps_valid_unicode_and_numbers():
    assert inbound.loads('{"name":"Ásha \\ud83d\\ude00","n":[1,2.5,-3]}'.encode()) == {
        "name": "Ásha \U0001f600", "n": [1, 2.5, -3]}


def test_lengths_and_ranges_come_from_the_model_fields():
    limit = DepositPayment._meta.get_field("method").max_length
    assert inbound.field_text(DepositPayment, "method", "m" * limit, "method") == "m" * limit
    with pytest.raises(inbound.InboundError, match=f"longer than {limit}"):
        inbound.field_text(DepositPayment, "method", "m" * (limit + 1), "method")
    with pytest.raises(inbound.InboundError, match="must be a string"):
        inbound.field_text(DepositPayment, "method", 7, "method")
    assert inbound.field_int(DepositPayment, "amount_paise", 2**63 - 1, "amount") == 2**63 - 1
    for bad in (2**63, -1, True, 1.0, "100"):
        with pytest.raises(inbound.InboundError):
            inbound.field_int(DepositPayment, "amount_paise", bad, "amount")
    # DepositOrder.amount_in: max_digits=14, decimal_places=2.
    assert inbound.field_decimal(DepositOrder, "amount_in", "999999999999.99", "a") == \
        Decimal("999999999999.99")
    for bad in ("1.001", "1000000000000", "-1", "NaN", "1e5000", 12, ""):
        with pytest.raises(inbound.InboundError):
            inbound.field_decimal(DepositOrder, "amount_in", bad, "amount_in")
    assert inbound.unix_seconds(inbound.MAX_UNIX_SECONDS, "t") == inbound.MAX_UNIX_SECONDS
    with pytest.raises(inbound.InboundError):
        inbound.unix_seconds(inbound.MAX_UNIX_SECONDS + 1, "t")


def test_sanitize_always_gives_storable_text():
    assert inbound.sanitize("a\x00b\ud800", 10) == "a\ufffdb\ufffd"
    assert inbound.sanitize({"x": 1}, 5) == "{'x':"
    assert inbound.sanitize(None, 5) == ""


# --- properties -----------------------------------------------------------------------

PROPERTY = hsettings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])
# Text with everything hostile in it: NUL, lone surrogates, long runs.
HOSTILE_TEXT = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF),
                       max_size=120)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | HOSTILE_TEXT,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(HOSTILE_TEXT, children, max_size=4),
    max_leaves=20)
# What can travel in a URL or a form: no lone surrogates (they have no UTF-8 bytes).
WIRE_TEXT = HOSTILE_TEXT.filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t))


def _dump(value) -> bytes:
    return json.dumps(value).encode()  # ensure_ascii: surrogates travel as \\udXXX escapes


def _storable(value) -> bool:
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    return True


@PROPERTY
@given(value=JSON_VALUES)
def test_loads_returns_the_value_exactly_when_every_string_is_storable(value):
    raw = _dump(value)
    if _storable(value):
        assert inbound.loads(raw) == json.loads(raw)
    else:
        with pytest.raises(inbound.InboundError):
            inbound.loads(raw)


@PROPERTY
@given(raw=st.binary(max_size=200))
def test_loads_never_raises_anything_but_inbound_error(raw):
    try:
        inbound.loads(raw)
    except inbound.InboundError:
        pass


ENTITY = st.fixed_dictionaries({}, optional={
    "id": JSON_VALUES, "order_id": JSON_VALUES, "currency": JSON_VALUES,
    "method": JSON_VALUES, "amount": st.integers() | JSON_VALUES, "status": JSON_VALUES,
    "created_at": st.integers() | JSON_VALUES, "reference_id": JSON_VALUES,
    "utr": JSON_VALUES, "status_details": JSON_VALUES})


@PROPERTY
@given(entity=ENTITY)
def test_the_shape_checks_pass_only_fields_that_fit_their_columns(entity):
    from payouts.models import PayoutAttempt
    from payouts.webhooks import check_payout_event

    entity = json.loads(_dump(entity))  # what a parse gives, before the gate
    bigint = range(0, 2**63)
    try:
        callbacks.check_payment(copy.deepcopy(entity))
    except callbacks.MalformedEvent:
        pass
    else:
        assert _storable(entity)
        assert isinstance(entity["id"], str) and 0 < len(entity["id"]) <= \
            DepositPayment._meta.get_field("payment_id").max_length
        assert entity.get("amount") is None or entity["amount"] in bigint
        for name in ("order_id", "currency", "method"):
            assert len(entity.get(name) or "") <= \
                DepositPayment._meta.get_field(name).max_length
    try:
        check_payout_event({"payload": {"payout": {"entity": copy.deepcopy(entity)}}})
    except callbacks.MalformedEvent:
        pass
    else:
        if entity:
            assert isinstance(entity["id"], str) and 0 < len(entity["id"]) <= \
                PayoutAttempt._meta.get_field("provider_payout_id").max_length
            assert not isinstance(entity["amount"], bool) and entity["amount"] in bigint
            assert len(entity.get("utr") or "") <= \
                WithdrawalPayout._meta.get_field("reference").max_length


@pytest.mark.django_db
@PROPERTY
@given(body=JSON_VALUES, path=st.sampled_from([
    "/callbacks/event", "/webhooks/razorpay/payments", "/webhooks/razorpay/payouts"]))
def test_unsigned_bodies_never_get_a_5xx_and_store_nothing(client, body, path):
    client.raise_request_exception = False

    response = client.post(path, _dump(body), content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE="f" * 64)

    assert response.status_code in (400, 401)
    assert not InboundEvent.objects.exists()


@pytest.mark.django_db
@PROPERTY
@given(event=st.fixed_dictionaries({}, optional={
    "id": JSON_VALUES, "type": JSON_VALUES,
    "payload": st.fixed_dictionaries({}, optional={"transaction": JSON_VALUES})}),
    raw_tail=st.sampled_from([b"", b"x", SURROGATE]))
def test_authenticated_ap_events_always_get_a_2xx(client, settings, event, raw_tail):
    client.raise_request_exception = False

    response = client.post("/callbacks/event", _dump(event) + raw_tail,
                           content_type="application/json", **_ap_headers(settings))

    assert response.status_code == 200, response.content
    assert response.json()["outcome"] in ("ignored", "duplicate", "rejected",
                                          "release_scheduled")


@pytest.mark.django_db
@PROPERTY
@given(event=st.fixed_dictionaries({"event": st.sampled_from(
    ["payment.captured", "order.paid", "payout.processed", "payout.reversed"]) | JSON_VALUES},
    optional={"payload": st.fixed_dictionaries({}, optional={
        "payment": st.fixed_dictionaries({}, optional={"entity": ENTITY}),
        "payout": st.fixed_dictionaries({}, optional={"entity": ENTITY})}) | JSON_VALUES}),
    event_id=HOSTILE_TEXT.filter(lambda t: t.isprintable() and t.isascii()),
    path=st.sampled_from(["/webhooks/razorpay/payments", "/webhooks/razorpay/payouts"]))
def test_signed_webhooks_always_get_a_2xx_and_never_credit_unknown_orders(
        client, settings, event, event_id, path):
    client.raise_request_exception = False

    response = _signed_post(client, path, _dump(event), settings, event_id=event_id)

    assert response.status_code == 200, response.content
    assert not DepositPayment.objects.exists()  # no order of ours exists here


@pytest.mark.django_db
@PROPERTY
@given(segment=HOSTILE_TEXT.filter(lambda t: "/" not in t and t not in ("", ".", "..")),
       prefix=st.sampled_from(["/sep24/checkout/", "/sep24/transaction/", "/sep24/deposit/",
                               "/sep24/withdraw/"]))
def test_sep24_path_parameters_never_get_a_5xx(client, segment, prefix):
    from urllib.parse import quote

    client.raise_request_exception = False
    path = prefix + quote(segment.encode("utf-8", "surrogatepass"), safe="")

    response = client.get(path)

    assert response.status_code in (403, 404), (path, response.status_code)


@pytest.mark.django_db
@PROPERTY
@given(fields=st.dictionaries(st.sampled_from(["amount", "name", "method", "vpa",
                                               "account_number", "ifsc", "confirm", "edit"]),
                              WIRE_TEXT, max_size=6),
       query=st.dictionaries(st.sampled_from(["transaction_id", "token"]), WIRE_TEXT,
                             max_size=2))
def test_sep24_forms_and_entry_links_never_get_a_5xx(client, fields, query):
    client.raise_request_exception = False
    for response in (client.post("/sep24/deposit/tx-h", fields),
                     client.post("/sep24/withdraw/tx-h", fields),
                     client.get("/sep24/interactive", query),
                     client.get("/sep24/more_info", query)):
        assert response.status_code < 500, response.status_code


# --- found by the fresh-clone trial ------------------------------------------------------

@pytest.mark.parametrize("path", ["/webhooks/razorpay/payments", "/webhooks/razorpay/payouts"])
@pytest.mark.django_db
def test_a_non_ascii_signature_is_a_400_not_a_500(client, path):
    """hmac.compare_digest raises TypeError on a non-ASCII str: the signature is refused
    before it gets there (under DEBUG the 500 page showed the webhook secret)."""
    client.raise_request_exception = False

    response = client.post(path, b"{}", content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE="é", HTTP_X_RAZORPAY_EVENT_ID="evt_x")

    assert response.status_code == 400
    assert InboundEvent.objects.count() == 0


def test_a_non_ascii_checkout_signature_is_not_valid():
    from anchor import razorpay as rzp

    assert rzp.verify_checkout_signature(order_id="order_1", payment_id="pay_1",
                                         signature="é") is False
    assert rzp.verify_webhook(b"{}", "é") is False


@pytest.mark.django_db
def test_liveness_answers_any_host_and_plain_http(client, settings):
    settings.ALLOWED_HOSTS = ["corridor.example.com"]
    settings.SECURE_SSL_REDIRECT = True  # with production's exemptions
    settings.SECURE_REDIRECT_EXEMPT = [r"^health/$", r"^health/ready$", r"^metrics$"]

    live = client.get("/health/", HTTP_HOST="10.1.2.3:8000")
    ready = client.get("/health/ready", HTTP_HOST="10.1.2.3:8000")

    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert ready.status_code == 400  # the host check still guards everything else


def test_a_withdrawal_form_with_an_unknown_payout_method_is_refused():
    """Found by the new-user trial: ``method=crypto`` was taken as a bank account."""
    from payouts import withdrawals

    form = {"amount": "10", "name": "Asha Verma", "account_number": "50100123456789",
            "ifsc": "HDFC0001234"}
    with pytest.raises(withdrawals.WithdrawalInputError) as refused:
        withdrawals.parse_form({**form, "method": "crypto"})
    assert refused.value.errors == {"method": "Choose a bank account or a UPI ID."}
    assert withdrawals.parse_form({**form, "method": "bank_account"})[1].kind == "bank_account"
