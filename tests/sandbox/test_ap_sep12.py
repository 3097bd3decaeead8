"""SEP-12 through the AP stand-in, over real HTTP, forwarded to Corridor's real
``/callbacks/customer`` (the ``live_server``) as AP-4.3.0 does (SEP31-RECEIVE.md
§5.1-5.5): identity from the token, memo checks, ``transaction_id`` -> the transaction's
customer, non-SEP-9 fields dropped, multipart files, status mapping, ``customer_updated``.
Where Corridor cannot produce an answer (a 500, the multipart bytes themselves), a
scripted callback stands in (``ROOT_URLCONF`` = this module)."""

from __future__ import annotations

import httpx
import pytest
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from anchor import customers
from anchor.models import Customer, CustomerFile
from sandbox import keys
from sandbox.sender31 import RECEIVER_FIELDS, SENDER_FIELDS, SenderError, SendingAnchor, new_memo

pytestmark = pytest.mark.django_db(transaction=True)

JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 64


@pytest.fixture
def ap(clean_sandbox):
    httpx.post(f"{clean_sandbox.url}/ap/sandbox/reset", timeout=10).raise_for_status()
    yield clean_sandbox
    httpx.post(f"{clean_sandbox.url}/ap/sandbox/reset", timeout=10).raise_for_status()


@pytest.fixture
def sa(ap) -> SendingAnchor:
    agent = SendingAnchor(ap.url)
    agent.authenticate()
    return agent


def token(sandbox, account: str, memo: str | None = None) -> dict:
    body = {"account": account, **({"memo": memo} if memo else {})}
    value = httpx.post(f"{sandbox.url}/ap/sep/sandbox-token", json=body, timeout=10).json()["token"]
    return {"Authorization": f"Bearer {value}"}


def customer_events(sandbox) -> list[dict]:
    rows = httpx.get(f"{sandbox.url}/ap/sandbox/events", timeout=10).json()["events"]
    return [e["payload"] for e in rows if e["type"] == "customer_updated"]


def test_put_json_registers_the_customer_in_corridor_and_drops_non_sep9_fields(ap, sa):
    memo = new_memo()
    customer_id = sa.put_customer(type="sep31-receiver", memo=memo, fields={
        **RECEIVER_FIELDS, "pan": "ABCDE1234F", "ifsc": "HDFC0001234", "vpa": "a@upi",
        "organization.name": "Acme", "family_name": "V", "mobile_number_format": "E.164"})

    stored = Customer.objects.get(pk=customer_id)
    assert (stored.account, stored.memo, stored.memo_type, stored.type) == (
        sa.account, memo, "id", "sep31-receiver")
    assert set(stored.provided) == set(RECEIVER_FIELDS)
    assert customers.personal_data(stored)["bank_number"] == "HDFC0001234"
    assert customer_events(ap) == [{"customer": {"id": customer_id}}]

    again = sa.put_customer(type="sep31-receiver", memo=memo, fields={"city": "Pune"},
                            encoding="form")
    assert again == customer_id
    assert customers.personal_data(Customer.objects.get(pk=customer_id))["city"] == "Pune"
    assert customer_events(ap) == [{"customer": {"id": customer_id}}] * 2


def test_get_answers_corridors_status_for_a_registered_and_an_unknown_customer(ap, sa):
    memo = new_memo()
    customer_id = sa.put_customer(type="sep31-sender", memo=memo, fields=SENDER_FIELDS)

    known = sa.get_customer(id=customer_id, type="sep31-sender")
    fresh = sa.get_customer(memo=new_memo(), type="sep31-receiver")

    assert known["id"] == customer_id and known["status"] == "ACCEPTED"
    assert set(known["provided_fields"]) == set(SENDER_FIELDS)
    assert fresh["status"] == "NEEDS_INFO" and "id" not in fresh
    assert {"bank_account_number", "bank_number"} <= set(fresh["fields"])


def test_multipart_files_reach_corridor_as_octet_stream_named_after_the_java_field(ap, sa):
    customer_id = sa.put_customer(type="sep31-sender", memo=new_memo(), fields=SENDER_FIELDS,
                                  files={"photo_id_front": JPEG, "not_a_field": b"x"})

    [stored] = CustomerFile.objects.filter(customer_id=customer_id)
    assert (stored.field, stored.content_type, stored.size) == (
        "photo_id_front", "image/jpeg", len(JPEG))


def test_a_text_value_for_a_binary_field_or_a_bad_date_is_refused_by_ap(ap, sa):
    for fields, error in (({"photo_id_front": "abc"}, "'photo_id_front' is a binary field: "
                           "send it as a multipart/form-data file"),
                          ({"birth_date": "12/04/1985"},
                           "Invalid 'birth_date'. Expected format: YYYY-MM-DD")):
        with pytest.raises(SenderError) as caught:
            sa.put_customer(type="sep31-sender", memo=new_memo(), fields=fields)
        assert (caught.value.status, caught.value.body) == (400, {"error": error})
    assert not Customer.objects.exists()
    assert customer_events(ap) == []


def test_corridors_400_and_404_reach_the_sa_with_corridors_text(ap, sa):
    with pytest.raises(SenderError) as bad:
        sa.put_customer(type="sep31-receiver", memo=new_memo(),
                        fields={**RECEIVER_FIELDS, "bank_number": "NOT-AN-IFSC"})
    assert bad.value.status == 400
    assert bad.value.body["error"].startswith("bank_number must be an IFSC")

    someone = SendingAnchor(ap.url, keypair=keys.HUB)
    theirs = someone.put_customer(type="sep31-sender", memo=new_memo(), fields=SENDER_FIELDS)
    response = sa.http.get("/ap/sep/sep12/customer", params={"id": theirs},
                           headers=sa._headers())
    assert (response.status_code, response.json()) == (
        404, {"error": f"customer {theirs} not found"})
    assert customer_events(ap) == [{"customer": {"id": theirs}}]


def test_corridor_refusing_aps_token_is_a_403(ap, sa, settings):
    settings.AP_CALLBACK_AUTH_SECRET = "another-secret-0123456789abcdef0123456789"
    response = sa.http.get("/ap/sep/sep12/customer", params={"memo": "1"},
                           headers=sa._headers())
    assert (response.status_code, response.json()) == (403, {"error": "forbidden"})


def test_account_and_memo_come_from_the_token(ap):
    account = keys.HUB.public_key
    with_memo = token(ap, account, memo="55")

    put = httpx.put(f"{ap.url}/ap/sep/sep12/customer", headers=with_memo, timeout=10,
                    json={"type": "sep31-sender", **SENDER_FIELDS})
    assert put.status_code == 202, put.text
    stored = Customer.objects.get(pk=put.json()["id"])
    assert (stored.account, stored.memo, stored.memo_type) == (account, "55", "id")

    cases = [({"memo": "56"}, 403, "The memo specified does not match the memo ID "
                                   "authorized via SEP-10"),
             ({"account": keys.PARTNER.public_key}, 403,
              "The account specified does not match authorization token")]
    for params, status, error in cases:
        response = httpx.get(f"{ap.url}/ap/sep/sep12/customer", headers=with_memo,
                             params=params, timeout=10)
        assert (response.status_code, response.json()) == (status, {"error": error})
    bad_memo = httpx.get(f"{ap.url}/ap/sep/sep12/customer", headers=token(ap, account),
                         params={"memo": "x1", "memo_type": "id"}, timeout=10)
    assert (bad_memo.status_code, bad_memo.json()) == (
        400, {"error": "Invalid 'memo' for 'memo_type'"})
    assert httpx.get(f"{ap.url}/ap/sep/sep12/customer", timeout=10).status_code == 403


def test_transaction_id_names_the_receiver_or_else_the_sender(ap, sa):
    sent = sa.start(amount="100")

    def asked(kind: str, who=sa) -> httpx.Response:
        return who.http.get("/ap/sep/sep12/customer", headers=who._headers(),
                            params={"transaction_id": sent.transaction_id, "type": kind})

    assert asked("sep31-receiver").json()["id"] == sent.receiver_id
    assert asked("sep31-sender").json()["id"] == sent.sender_id
    assert asked("").json()["id"] == sent.sender_id  # no type: the sender
    other = asked("sep31-whatever")  # forwarded as the sender's id, with that type
    assert (other.status_code, other.json()) == (
        400, {"error": "type 'sep31-whatever' is not one of sep31-sender, sep31-receiver, "
                       "sep24-customer"})
    stranger = SendingAnchor(ap.url, keypair=keys.HUB)
    response = asked("sep31-receiver", stranger)
    assert (response.status_code, response.json()) == (
        404, {"error": f"transaction (id={sent.transaction_id}) is not found"})


def test_delete_erases_the_customer_then_answers_user_not_found(ap, sa):
    memo = new_memo()
    customer_id = sa.put_customer(type="sep31-sender", memo=memo, fields=SENDER_FIELDS)

    def delete(account: str) -> httpx.Response:
        return sa.http.request("DELETE", f"/ap/sep/sep12/customer/{account}",
                               headers=sa._headers(), json={"memo": memo})

    assert delete(keys.HUB.public_key).status_code == 403
    assert Customer.objects.get(pk=customer_id).deleted_at is None
    assert delete(sa.account).status_code == 200
    assert Customer.objects.get(pk=customer_id).deleted_at is not None
    again = delete(sa.account)
    assert (again.status_code, again.json()) == (404, {"error": "User not found."})


# --- a scripted callback, for what Corridor never answers --------------------------------


class Script:
    reply: tuple[int, dict] = (200, {"id": "c-1"})
    seen: list = []


@csrf_exempt
def _customer(request):
    Script.seen.append({"method": request.method, "content_type": request.content_type,
                        "body": request.body})
    status, body = Script.reply
    return JsonResponse(body, status=status)


@csrf_exempt
def _event(request):
    return JsonResponse({})


urlpatterns = [path("callbacks/customer", _customer), path("callbacks/event", _event)]


@pytest.fixture
def scripted(settings, sa):
    settings.ROOT_URLCONF = __name__
    Script.reply, Script.seen = (200, {"id": "c-1"}), []
    return sa


def test_the_multipart_conversion_as_ap_sends_it(scripted):
    scripted.put_customer(type="sep31-sender", memo="9", fields={"first_name": "Ana",
                                                                 "pan": "X"},
                          files={"photo_proof_of_income": JPEG})

    [seen] = Script.seen
    assert seen["method"] == "PUT" and seen["content_type"] == "multipart/form-data"
    body = seen["body"]
    assert (b'name="photo_proof_of_income"; filename="photoProofOfIncome"\r\n'
            b"Content-Type: application/octet-stream") in body
    for part in (b'name="first_name"', b'name="type"', b'name="memo"', b'name="account"',
                 b'name="memo_type"'):
        assert part in body
    assert b'name="pan"' not in body


@pytest.mark.parametrize(("reply", "status", "error"), [
    ((500, {"error": "boom"}), 502, "internal server error"),
    ((422, {"error": "no"}), 400, "no"),
    ((200, {"id": "c-1"}), 502, "internal server error"),  # a GET answer without status
])
def test_other_answers_map_as_aps_integration_helper_does(scripted, reply, status, error):
    Script.reply = reply
    response = scripted.http.get("/ap/sep/sep12/customer", params={"id": "c-1"},
                                 headers=scripted._headers())
    assert (response.status_code, response.json()) == (status, {"error": error})


def test_a_put_answer_without_id_is_a_502_and_publishes_nothing(ap, scripted):
    Script.reply = (200, {"status": "ACCEPTED"})
    with pytest.raises(SenderError) as caught:
        scripted.put_customer(type="sep31-sender", memo="9", fields={"first_name": "Ana"})
    assert caught.value.status == 502
    assert customer_events(ap) == []
