"""Bad input at Corridor's doors gets a clear error and changes nothing."""

import hashlib
import hmac
import json
import time

import jwt
import pytest
from stellar_sdk import Keypair

from anchor.models import DepositPayment, InboundEvent
from tests.inbound import applied_outcome

pytestmark = pytest.mark.usefixtures("no_late_deliveries")


def _callback_headers(secret, **claims):
    token = jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 30, **claims},
                       secret, algorithm="HS256")
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


EVENT = {"id": "evt-1", "type": "transaction_status_changed", "timestamp": "2026-11-29T00:00:00Z",
         "payload": {"transaction": {"id": "tx-1", "kind": "deposit", "status": "incomplete"}}}


@pytest.mark.django_db
def test_event_without_auth_is_refused(client):
    response = client.post("/callbacks/event", EVENT, content_type="application/json")
    assert response.status_code == 401
    assert not InboundEvent.objects.exists()


@pytest.mark.django_db
def test_event_with_a_token_signed_by_another_secret_is_refused(client):
    headers = _callback_headers("not-the-callback-secret-0123456789abcdef")
    response = client.post("/callbacks/event", EVENT, content_type="application/json", **headers)
    assert response.status_code == 401
    assert not InboundEvent.objects.exists()


@pytest.mark.django_db
def test_event_with_an_expired_token_is_refused(client, settings):
    headers = _callback_headers(settings.AP_CALLBACK_AUTH_SECRET, exp=int(time.time()) - 60)
    response = client.post("/callbacks/event", EVENT, content_type="application/json", **headers)
    assert response.status_code == 401


def _only_rejected(source):
    """The one row a rejected delivery leaves: outcome rejected, with its reason."""
    (row,) = InboundEvent.objects.all()
    assert (row.source, row.outcome) == (source, "rejected")
    assert row.reason
    return row


@pytest.mark.django_db
def test_authenticated_event_that_is_not_json_is_acknowledged_as_rejected(client, settings):
    # AP redelivers a non-2xx forever and holds back every later event behind it.
    headers = _callback_headers(settings.AP_CALLBACK_AUTH_SECRET)
    response = client.post("/callbacks/event", b"{not json", content_type="application/json",
                           **headers)
    assert response.status_code == 200
    assert response.json()["outcome"] == "rejected"
    assert "not JSON" in response.json()["error"]
    assert "not JSON" in _only_rejected("ap").reason


@pytest.mark.django_db
def test_event_types_we_ignore_get_200_once_and_dedupe(client, settings):
    headers = _callback_headers(settings.AP_CALLBACK_AUTH_SECRET, aud="anything")
    first = client.post("/callbacks/event", EVENT, content_type="application/json", **headers)
    second = client.post("/callbacks/event", EVENT, content_type="application/json", **headers)
    assert (first.status_code, first.json()["outcome"]) == (200, "ignored")
    assert (second.status_code, second.json()["outcome"]) == (200, "duplicate")
    assert InboundEvent.objects.filter(source="ap", event_id="evt-1").count() == 1


@pytest.mark.django_db
def test_api_key_auth_is_accepted(client, settings):
    response = client.post("/callbacks/event", EVENT, content_type="application/json",
                           HTTP_X_API_KEY=settings.AP_CALLBACK_AUTH_SECRET)
    assert response.status_code == 200


@pytest.mark.django_db
def test_customer_put_stores_sep9_fields(client, settings):
    headers = _callback_headers(settings.AP_CALLBACK_AUTH_SECRET)
    account = Keypair.random().public_key
    body = {"type": "sep24-customer", "account": account, "memo": "7", "memo_type": "id",
            "first_name": "Asha", "email_address": "asha@example.com"}
    response = client.put("/callbacks/customer", json.dumps(body),
                          content_type="application/json", **headers)
    assert response.status_code == 200
    assert response.json()["status"] == "ACCEPTED"
    from anchor import customers
    from anchor.models import Customer

    stored = Customer.objects.get(account=account, memo="7", type="sep24-customer")
    assert customers.personal_data(stored) == {"first_name": "Asha",
                                               "email_address": "asha@example.com"}


def _signed(body: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.mark.django_db
def test_forged_payment_webhook_is_refused_and_changes_nothing(client, settings):
    body = json.dumps({"event": "payment.captured", "payload": {"payment": {"entity": {
        "id": "pay_X", "order_id": "order_X", "amount": 100000, "currency": "INR",
        "status": "captured"}}}}, separators=(",", ":")).encode()
    response = client.post("/webhooks/razorpay/payments", body, content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE=_signed(body, "forged-secret"),
                           HTTP_X_RAZORPAY_EVENT_ID="evt_forged")
    missing = client.post("/webhooks/razorpay/payments", body, content_type="application/json",
                          HTTP_X_RAZORPAY_EVENT_ID="evt_forged")
    assert response.status_code == 400
    assert missing.status_code == 400
    assert not InboundEvent.objects.exists()
    assert not DepositPayment.objects.exists()


@pytest.mark.django_db
def test_signed_webhook_for_an_unknown_order_gets_2xx_and_credits_nothing(client, settings):
    body = json.dumps({"event": "payment.captured", "payload": {"payment": {"entity": {
        "id": "pay_Y", "order_id": "order_unknown", "amount": 100000, "currency": "INR",
        "status": "captured"}}}}, separators=(",", ":")).encode()
    signature = _signed(body, settings.RAZORPAY_WEBHOOK_SECRET)
    response = client.post("/webhooks/razorpay/payments", body, content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE=signature,
                           HTTP_X_RAZORPAY_EVENT_ID="evt_unknown")
    assert (response.status_code, response.json()["outcome"]) == (200, "received")
    assert applied_outcome("razorpay", "evt_unknown") == "unknown_order"
    assert not DepositPayment.objects.exists()


def _interactive_token(secret, transaction_id, **claims):
    body = {"jti": transaction_id, "sub": "GABC", "exp": int(time.time()) + 600, **claims}
    return jwt.encode(body, secret, algorithm="HS256")


@pytest.mark.parametrize("case", ["expired", "wrong_secret", "other_jti", "missing"])
@pytest.mark.django_db
def test_bad_interactive_tokens_get_403_and_open_no_session(client, settings, case):
    secret = settings.AP_INTERACTIVE_JWT_SECRET
    token = {
        "expired": _interactive_token(secret, "tx-1", exp=int(time.time()) - 60),
        "wrong_secret": _interactive_token("a-sep10-secret-not-the-interactive-one-000",
                                           "tx-1"),
        "other_jti": _interactive_token(secret, "tx-2"),
        "missing": "",
    }[case]

    response = client.get("/sep24/interactive", {"transaction_id": "tx-1", "token": token})

    assert response.status_code == 403
    assert b"cannot be used" in response.content
    assert "sep24" not in client.session
    assert client.get("/sep24/deposit/tx-1").status_code == 403


@pytest.mark.django_db
def test_more_info_link_opens_the_status_page_only_with_the_more_info_secret(client, settings):
    good = _interactive_token(settings.AP_MORE_INFO_JWT_SECRET, "tx-9")
    wrong = _interactive_token(settings.AP_INTERACTIVE_JWT_SECRET, "tx-9")

    refused = client.get("/sep24/more_info", {"transaction_id": "tx-9", "token": wrong})
    assert refused.status_code == 403
    opened = client.get("/sep24/more_info", {"transaction_id": "tx-9", "token": good})
    assert opened.status_code == 302
    assert opened["Location"] == "/sep24/transaction/tx-9"


@pytest.mark.parametrize("event", [
    {**EVENT, "payload": "a string"},
    {**EVENT, "payload": {"transaction": [1, 2]}},
    {**EVENT, "id": "x" * 300},
    {**EVENT, "id": {"a": 1}},
])
@pytest.mark.django_db
def test_malformed_ap_events_are_acknowledged_as_rejected_once(client, settings, event):
    headers = _callback_headers(settings.AP_CALLBACK_AUTH_SECRET)

    response = client.post("/callbacks/event", event, content_type="application/json", **headers)
    again = client.post("/callbacks/event", event, content_type="application/json", **headers)

    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    assert response.json()["error"]
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    _only_rejected("ap")


@pytest.mark.parametrize("body", [
    {"type": "sep24-customer", "account": "G" * 200},
    {"type": "sep24-customer", "account": "GABC", "first_name": "A\u0000B"},
    {"type": "sep24-customer", "account": "not-a-stellar-account", "first_name": "Zed"},
    {"type": "sep24-customer", "account": "GX\r\n--ABC--", "first_name": "Zed"},
])
@pytest.mark.django_db
def test_malformed_customer_puts_get_400(client, settings, body):
    headers = _callback_headers(settings.AP_CALLBACK_AUTH_SECRET)

    response = client.put("/callbacks/customer", json.dumps(body),
                          content_type="application/json", **headers)

    assert response.status_code == 400
    from anchor.models import Customer

    assert not Customer.objects.exists()


def _payment_event(entity, payload=None):
    return json.dumps({"event": "payment.captured",
                       "payload": payload if payload is not None else
                       {"payment": {"entity": entity}}}, separators=(",", ":")).encode()


@pytest.mark.parametrize(("body", "event_id"), [
    (_payment_event(None, payload="a string"), "evt_a"),
    (_payment_event("a string"), "evt_b"),
    (_payment_event({"order_id": "order_1", "amount": 100000, "currency": "INR",
                     "status": "captured"}), "evt_c"),
    (_payment_event({"id": "pay_1", "order_id": "order_1", "amount": 100000,
                     "currency": "INR", "status": "captured", "created_at": "yesterday"}),
     "evt_d"),
    (_payment_event({"id": "pay_1", "order_id": "order_1", "amount": 100000,
                     "currency": "INR", "status": "captured"}), "e" * 300),
])
@pytest.mark.django_db
def test_malformed_signed_payment_webhooks_are_acknowledged_as_rejected(
        client, settings, body, event_id):
    signature = _signed(body, settings.RAZORPAY_WEBHOOK_SECRET)

    response = client.post("/webhooks/razorpay/payments", body, content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE=signature,
                           HTTP_X_RAZORPAY_EVENT_ID=event_id)

    # Signed by Razorpay yet never storable: a 2xx stops its retries (NOTES §1.5).
    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    row = _only_rejected("razorpay")
    assert row.event_id == event_id if len(event_id) <= 100 else row.event_id.startswith(
        "sha256:")
    assert not DepositPayment.objects.exists()


@pytest.mark.django_db
def test_an_event_whose_handling_fails_is_not_recorded_as_seen(client, settings, monkeypatch):
    from anchor import deposits

    def boom(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(deposits, "payment_record", boom)
    body = _payment_event({"id": "pay_2", "order_id": "order_2", "amount": 100000,
                           "currency": "INR", "status": "captured"})
    signature = _signed(body, settings.RAZORPAY_WEBHOOK_SECRET)
    client.raise_request_exception = False

    response = client.post("/webhooks/razorpay/payments", body, content_type="application/json",
                           HTTP_X_RAZORPAY_SIGNATURE=signature, HTTP_X_RAZORPAY_EVENT_ID="evt_f")

    # Durably received, not applied: the row waits for a drain that succeeds.
    assert (response.status_code, response.json()["outcome"]) == (200, "received")
    assert applied_outcome("razorpay", "evt_f") == "received"
    assert InboundEvent.objects.get(event_id="evt_f").processed_at is None
    monkeypatch.undo()
    assert applied_outcome("razorpay", "evt_f") == "unknown_order"


def _signed_post(client, path, body: bytes, secret, event_id="evt_x"):
    return client.post(path, body, content_type="application/json",
                       HTTP_X_RAZORPAY_SIGNATURE=_signed(body, secret),
                       HTTP_X_RAZORPAY_EVENT_ID=event_id)


@pytest.mark.parametrize("body", [
    b'{"event":"payout.processed","payload":[1]}',
    b'{"event":"payout.processed","payload":{"payout":"x"}}',
    b'{"event":"payout.processed","payload":{"payout":{"entity":{"id":"pout_1","amount":"abc"}}}}',
    b'{"event":"payout.processed","payload":{"payout":{"entity":{"id":"pout_1","amount":1e400}}}}',
    b'{"event":"payout.processed","payload":{"payout":{"entity":{"id":"pout_1","amount":100,'
    b'"status_details":"x"}}}}',
    b'{"event":"payout\\u0000processed","payload":{}}',
    b"[" * 3000 + b"]" * 3000,
])
@pytest.mark.django_db
def test_malformed_signed_payout_webhooks_are_acknowledged_as_rejected(client, settings, body):
    response = _signed_post(client, "/webhooks/razorpay/payouts", body,
                            settings.RAZORPAY_WEBHOOK_SECRET)

    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "rejected"
    assert _only_rejected("razorpayx").event_id == "evt_x"


@pytest.mark.django_db
def test_a_payout_webhook_with_an_overlong_event_id_is_rejected_under_a_digest(client, settings):
    body = b'{"event":"payout.processed","payload":{}}'
    response = _signed_post(client, "/webhooks/razorpay/payouts", body,
                            settings.RAZORPAY_WEBHOOK_SECRET, event_id="e" * 5000)
    assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    row = _only_rejected("razorpayx")
    assert row.event_id.startswith("sha256:") and len(row.event_id) == 71
    assert "X-Razorpay-Event-Id is longer than 100" in row.reason


@pytest.mark.django_db
def test_a_payout_webhook_whose_handling_fails_can_be_retried(client, settings, monkeypatch):
    from payouts import webhooks

    def boom(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(webhooks, "payout_webhook_apply", boom)
    client.raise_request_exception = False
    body = b'{"event":"payout.processed","payload":{}}'

    response = _signed_post(client, "/webhooks/razorpay/payouts", body,
                            settings.RAZORPAY_WEBHOOK_SECRET, event_id="evt_retry")

    # Durably received, not applied: the row waits for a drain that succeeds.
    assert (response.status_code, response.json()["outcome"]) == (200, "received")
    assert applied_outcome("razorpayx", "evt_retry") == "received"
    monkeypatch.undo()
    assert applied_outcome("razorpayx", "evt_retry") == "ignored"


@pytest.mark.django_db
def test_nul_and_deep_nesting_in_payment_webhooks_are_rejected(client, settings):
    for n, body in enumerate((b'{"event":"payment.captured","payload":{"payment":{"entity":'
                              b'{"id":"pay_\\u0000","order_id":"o"}}}}',
                              b"[" * 3000 + b"]" * 3000)):
        response = _signed_post(client, "/webhooks/razorpay/payments", body,
                                settings.RAZORPAY_WEBHOOK_SECRET, event_id=f"evt_{n}")
        assert (response.status_code, response.json()["outcome"]) == (200, "rejected")
    assert sorted(InboundEvent.objects.values_list("event_id", "outcome")) == [
        ("evt_0", "rejected"), ("evt_1", "rejected")]
    assert not DepositPayment.objects.exists()


@pytest.mark.parametrize("method, path, allowed", [
    ("get", "/callbacks/event", "POST"),
    ("post", "/callbacks/customer", "GET, PUT"),
    ("get", "/callbacks/customer/c-1", "DELETE"),
    ("post", "/callbacks/rate", "GET"),
    ("get", "/webhooks/razorpay/payments", "POST"),
    ("put", "/webhooks/razorpay/payouts", "POST"),
])
@pytest.mark.django_db
def test_another_method_is_a_json_405_naming_the_allowed_ones(client, method, path, allowed):
    """The new-user trial's finding: the 405s of the callback and webhook endpoints were
    empty HTML pages; every other answer there is JSON."""
    response = getattr(client, method)(path)
    assert response.status_code == 405
    assert response["Allow"] == allowed
    assert response.json() == {"error": f"method not allowed; use {allowed}"}
    assert not InboundEvent.objects.exists()
