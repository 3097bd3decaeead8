"""The partner API (sagas/api.py): validation, partner authentication, idempotency on
the Idempotency-Key header, the read view and the OpenAPI schema.

Creating a remittance reads the hub's Horizon cursor and enqueues a Celery run: both are
replaced here (``no_outside``), so these tests need neither the sandbox nor a worker;
tests/test_remittances.py runs the same API end to end against the sandbox."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connections
from rest_framework.test import APIClient

from anchor import stellar
from ledger import services as ledger
from ledger.services import Line
from sagas import engine, remittances
from sagas.models import Partner, Saga, SagaStep

pytestmark = pytest.mark.django_db

PARTNER_ACCOUNT = "GBR5EOMXSVA5S3QQGQJXQ6N6XP6CSLSZRHOCB5AG5AZ7KI2Q7X7W3MYK"
URL = "/api/remittances"


def order(**changes) -> dict:
    body = {"amount": "25.50", "send_currency": "USDC", "receive_currency": "INR",
            "corridor": "USDC-INR",
            "beneficiary": {"name": "Asha Verma", "account_number": "50100123456789",
                            "ifsc": "HDFC0001234"}}
    body.update(changes)
    return body


@pytest.fixture(autouse=True)
def no_outside(monkeypatch):
    """No Horizon, no broker: a fixed cursor, and enqueued runs only counted."""
    enqueued = []
    monkeypatch.setattr(stellar, "latest_payment_cursor", lambda account: "12345")
    monkeypatch.setattr(engine, "_enqueue", lambda saga_id, delay: enqueued.append(saga_id))
    return enqueued


@pytest.fixture
def partner_key():
    _, key = remittances.partner_create(name="acme", stellar_account=PARTNER_ACCOUNT)
    return key


@pytest.fixture
def api(partner_key) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {partner_key}")
    return client


def post(client: APIClient, body: dict, key: str | None = "key-1"):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(URL, body, format="json", **headers)


# --- create -------------------------------------------------------------------------

def test_a_valid_request_locks_the_quote_and_answers_how_to_fund_it(api, settings):
    settings.REMITTANCE_RATE_INR_PER_USDC = Decimal("83.50")

    response = post(api, order(amount="25.50"))

    assert response.status_code == 202, response.json()
    body = response.json()
    saga = Saga.objects.get()
    assert body["id"] == saga.pk
    assert body["status"] == "running"
    assert body["hub_account"] == stellar.hub_keypair().public_key
    assert (body["memo_type"], body["memo"]) == ("text", saga.reference)
    assert len(body["memo"].encode()) <= 28  # fits a Stellar text memo
    assert (body["amount"], body["asset_code"]) == ("25.5", "USDC")
    assert body["quote"] == {"rate": "83.50", "receive_amount": "2129.25",
                             "receive_currency": "INR"}
    assert body["beneficiary"]["account_number"] == "**********6789"
    assert saga.kind == "remittance" and saga.stellar_cursor == "12345"
    assert saga.input["beneficiary"]["account_number"] == "50100123456789"
    assert list(SagaStep.objects.filter(saga=saga).values_list("kind", "status")) == [
        ("bridge.fill", "pending"), ("fx.convert", "pending"), ("anchor.fund", "pending"),
        ("anchor.payout", "pending")]
    assert "Idempotent-Replayed" not in response.headers


@pytest.mark.parametrize("amount", [
    "0", "0.0", "-5", "-0.01", "+5", "1.12345678", "25.000000000", "1e3", "1E+2", "2.5e-1",
    "", " 5", "5 ", "1,000", "abc", "NaN", "Infinity", "0x10", 25.5, 25, None, True,
])
def test_bad_amounts_are_refused_and_nothing_is_created(api, amount):
    response = post(api, order(amount=amount))

    assert response.status_code == 400
    assert "amount" in response.json(), response.json()
    assert not Saga.objects.exists()


def test_amounts_outside_the_limits_are_refused(api, settings):
    settings.REMITTANCE_MIN_USDC, settings.REMITTANCE_MAX_USDC = Decimal(1), Decimal(100)

    assert post(api, order(amount="0.99"), key="a").status_code == 400
    assert post(api, order(amount="100.0000001"), key="b").status_code == 400
    assert post(api, order(amount="100"), key="c").status_code == 202
    assert post(api, order(amount="1.0000001"), key="d").status_code == 202


def test_seven_decimals_are_the_assets_precision(api):
    response = post(api, order(amount="0.1234567", ), key="p")
    assert response.status_code == 400  # below the minimum, but the format passed
    assert "between" in response.json()["amount"][0]
    assert post(api, order(amount="1.1234567"), key="q").status_code == 202


@pytest.mark.parametrize("changes, field", [
    ({"corridor": "USDC-EUR"}, "corridor"),
    ({"corridor": "usdc-inr"}, "corridor"),
    ({"send_currency": "XLM"}, "send_currency"),
    ({"receive_currency": "EUR"}, "receive_currency"),
])
def test_unknown_corridor_or_currency_is_refused(api, changes, field):
    response = post(api, order(**changes))

    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert not Saga.objects.exists()


@pytest.mark.parametrize("missing", ["name", "account_number", "ifsc"])
def test_missing_beneficiary_fields_are_refused(api, missing):
    beneficiary = order()["beneficiary"]
    del beneficiary[missing]

    response = post(api, order(beneficiary=beneficiary))

    assert response.status_code == 400
    assert missing in response.json()["beneficiary"], response.json()
    assert not Saga.objects.exists()


@pytest.mark.parametrize("beneficiary, field", [
    (None, "beneficiary"),
    ({"name": "A", "account_number": "12-34", "ifsc": "HDFC0001234"}, "account_number"),
    ({"name": "A", "account_number": "50100123456789", "ifsc": "hdfc0001234"}, "ifsc"),
    ({"name": "", "account_number": "50100123456789", "ifsc": "HDFC0001234"}, "name"),
])
def test_malformed_beneficiary_fields_are_refused(api, beneficiary, field):
    body = order(beneficiary=beneficiary)
    if beneficiary is None:
        del body["beneficiary"]

    response = post(api, body)

    assert response.status_code == 400
    errors = response.json()
    assert field in (errors if field == "beneficiary" else errors["beneficiary"]), errors


def test_a_replayed_key_returns_the_same_remittance(api, no_outside):
    first = post(api, order())
    again = post(api, order(amount="25.5"))  # the same amount, written differently

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert Saga.objects.count() == 1
    assert no_outside == []  # non-transactional test: on_commit never ran, nothing queued


def test_a_conflicting_key_is_refused_and_changes_nothing(api):
    first = post(api, order())
    before = Saga.objects.get().input

    response = post(api, order(amount="26"))

    assert response.status_code == 409
    assert "Idempotency-Key" in response.json()["detail"]
    assert Saga.objects.count() == 1 and Saga.objects.get().input == before
    assert Saga.objects.get().pk == first.json()["id"]


def test_keys_belong_to_their_partner(api):
    _, other_key = remittances.partner_create(name="globex", stellar_account=PARTNER_ACCOUNT)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_key}")

    mine, theirs = post(api, order()), post(other, order(amount="30"))

    assert (mine.status_code, theirs.status_code) == (202, 202)
    assert mine.json()["memo"] != theirs.json()["memo"]


@pytest.mark.parametrize("key", [None, "", "has space", "x" * 256, "caf\u00e9"])
def test_an_idempotency_key_is_required(api, key):
    response = post(api, order(), key=key)

    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["detail"]
    assert not Saga.objects.exists()


def test_horizon_down_at_creation_is_503_and_nothing_is_created(api, monkeypatch):
    def down(account):
        raise stellar.HorizonUnavailable("connection refused")

    monkeypatch.setattr(stellar, "latest_payment_cursor", down)

    response = post(api, order())

    assert response.status_code == 503
    assert not Saga.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_same_key_at_the_same_moment_makes_one_saga(partner_key, no_outside):
    barrier = threading.Barrier(4)
    results = []

    def one():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {partner_key}")
        barrier.wait()
        try:
            response = post(client, order())
            results.append((response.status_code, response.json()["id"]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    assert len(results) == 4
    assert {status for status, _ in results} == {202}
    assert len({saga_id for _, saga_id in results}) == 1
    assert Saga.objects.count() == 1
    assert no_outside == [Saga.objects.get().pk]  # one run enqueued, after its commit


# --- authentication -----------------------------------------------------------------

@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer cpk_nope_nope",
    "Bearer not-a-key", "Token {key}", "Bearer {key}x",
])
def test_no_or_wrong_credentials_are_401(partner_key, header):
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header.format(key=partner_key))

    created = post(client, order())
    read = client.get(f"{URL}/1")

    assert (created.status_code, read.status_code) == (401, 401)
    assert created.headers["WWW-Authenticate"].startswith("Bearer")
    assert not Saga.objects.exists()


def test_an_inactive_partner_is_refused(api):
    Partner.objects.update(is_active=False)

    assert post(api, order()).status_code == 401


def test_the_key_is_stored_hashed_and_printed_once(capsys):
    call_command("create_partner", "initech", "--account", PARTNER_ACCOUNT)

    printed = capsys.readouterr().out
    key = printed.rsplit(" ", 1)[-1].strip()
    partner = Partner.objects.get(name="initech")
    assert key.startswith("cpk_") and len(key) > 40
    assert key not in (partner.key_hash, partner.key_prefix)
    assert remittances.partner_authenticate(key) == partner
    assert remittances.partner_authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) \
        is None


# --- read ---------------------------------------------------------------------------

def test_get_shows_status_steps_and_bookings_to_its_partner_only(api):
    saga_id = post(api, order()).json()["id"]
    ledger.post(idempotency_key=f"{saga_id}:0", kind="bridge.fill", saga_id=saga_id,
                reference="a" * 64,
                lines=[Line("hub", "USDC", Decimal("25.5")),
                       Line("partner:acme", "USDC", Decimal("-25.5"))])
    _, other_key = remittances.partner_create(name="globex", stellar_account=PARTNER_ACCOUNT)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_key}")

    mine = api.get(f"{URL}/{saga_id}")
    theirs = other.get(f"{URL}/{saga_id}")

    assert mine.status_code == 200
    body = mine.json()
    assert (body["id"], body["status"]) == (saga_id, "running")
    assert [s["kind"] for s in body["steps"]] == [
        "bridge.fill", "fx.convert", "anchor.fund", "anchor.payout"]
    assert body["bookings"] == [{
        "kind": "bridge.fill", "reference": "a" * 64, "idempotency_key": f"{saga_id}:0",
        "created_at": body["bookings"][0]["created_at"],
        "postings": [{"account": "hub", "currency": "USDC", "amount": "25.5000000"},
                     {"account": "partner:acme", "currency": "USDC",
                      "amount": "-25.5000000"}]}]
    assert theirs.status_code == 404
    assert api.get(f"{URL}/999999").status_code == 404


def test_the_openapi_schema_describes_the_api():
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    schema = response.json()
    assert {"/api/remittances", "/api/remittances/{saga_id}"} <= set(schema["paths"])
    create = schema["paths"]["/api/remittances"]["post"]
    assert {"202", "400", "401", "409"} <= set(create["responses"])
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header"
               for p in create["parameters"])
    assert schema["components"]["securitySchemes"]["partnerKey"]["scheme"] == "bearer"


def test_deeply_nested_json_is_a_400_not_a_500(api):
    body = "[" * 3000 + "]" * 3000

    response = api.post(URL, body, content_type="application/json",
                        HTTP_IDEMPOTENCY_KEY="key-deep")

    assert response.status_code == 400
    assert not Saga.objects.exists()


def test_an_amount_with_a_trailing_newline_is_refused(api):
    response = post(api, order(amount="5\n"))

    assert response.status_code == 400
    assert not Saga.objects.exists()
