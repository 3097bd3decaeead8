"""SEP-31 receiving in the AP stand-in, over real HTTP (SEP31-RECEIVE.md §2-3, §6.4, §7):
the SA's endpoints, the JSON-RPC table for kind ``receive`` with its traps, the events,
the observer's notify, and the foreign sending anchor (sandbox/sender31.py) up to its
payment. Corridor does not act on SEP-31 yet: the tests call ``request_onchain_funds``
themselves, as Corridor will. Quotes come from Corridor's real ``/callbacks/rate`` and
customers from its real ``/callbacks/customer`` (the ``live_server``)."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import httpx
import pytest
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from sandbox import keys
from sandbox.sender31 import Payment, SendingAnchor, new_memo
from tests.conftest import reference_path
from tests.flows import platform_call as call
from tests.flows import platform_result as result
from tests.flows import platform_rpc as rpc
from tests.flows import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

USDC = f"stellar:USDC:{keys.USDC_ISSUER.public_key}"
INR = "iso4217:INR"
DISTRIBUTION = keys.DISTRIBUTION.public_key
EXAMPLE_CIRCLE_USDC_ISSUER = "GBBD47IF6LWK7P7MDEVSCWR7DPUWV3NY3DTQEVFL4NAT4AQH3ZLLFLA5"


# --- helpers ------------------------------------------------------------------------------


def refused(sandbox, method: str, **params) -> dict:
    reply = call(sandbox, method, **params)
    assert "error" in reply, reply
    return reply["error"]


def events(sandbox, transaction_id: str | None = None) -> list[dict]:
    query = {"transaction_id": transaction_id} if transaction_id else {}
    return httpx.get(f"{sandbox.url}/ap/sandbox/events", params=query,
                     timeout=10).json()["events"]


def observed(sandbox, **query) -> list[dict]:
    return httpx.get(f"{sandbox.url}/ap/sandbox/observer", params=query,
                     timeout=10).json()["payments"]


def get(sandbox, transaction_id: str) -> dict:
    return result(sandbox, "get_transaction", transaction_id=transaction_id)


def force(sandbox, transaction_id: str, **state) -> dict:
    response = httpx.post(f"{sandbox.url}/ap/sandbox/transactions/{transaction_id}",
                          json=state, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def request_funds(sandbox, transaction_id: str, memo: str | None = None) -> dict:
    return result(sandbox, "request_onchain_funds", transaction_id=transaction_id,
                  destination_account=DISTRIBUTION, memo=memo or new_memo())


@pytest.fixture
def ap(clean_sandbox):
    """The sandbox with the AP stand-in emptied before and after the test."""
    httpx.post(f"{clean_sandbox.url}/ap/sandbox/reset", timeout=10).raise_for_status()
    yield clean_sandbox
    httpx.post(f"{clean_sandbox.url}/ap/sandbox/reset", timeout=10).raise_for_status()


def sa_url(sa):
    """A handle with ``.url`` for the RPC helpers, from the SA's base URL."""
    return type("Sandbox", (), {"url": sa.base_url})


@pytest.fixture
def sa(ap) -> SendingAnchor:
    agent = SendingAnchor(ap.url)
    agent.ensure_account()
    agent.authenticate()
    return agent


@pytest.fixture
def created(sa):
    """A SEP-31 transaction of 100 USDC on a firm quote, in ``pending_receiver``."""
    return sa.start(amount="100")


# --- SA endpoints -------------------------------------------------------------------------


def test_info_has_aps_shape_and_our_receive_config(sa):
    example = json.loads(reference_path(
        "anchor-platform", "examples", "sep31-info.response.json").read_text())
    info = sa._checked(sa.http.get("/ap/sep/sep31/info", headers=sa._headers()), "info")

    assert set(info) == set(example)
    usdc = info["receive"]["USDC"]
    assert set(usdc) == set(example["receive"]["USDC"])
    assert usdc == {"enabled": True, "quotes_supported": True, "quotes_required": True,
                    "min_amount": 1, "max_amount": 5000,
                    "funding_methods": ["IMPS", "NEFT", "UPI"]}
    assert httpx.get(f"{sa.base_url}/ap/sep/sep31/info").status_code == 403


def test_a_transaction_on_a_firm_quote_is_created_pending_receiver_with_the_quotes_amounts(
        ap, sa, created):
    txn = sa.transaction(created.transaction_id)
    quote = created.quote

    assert txn["status"] == "pending_receiver"
    assert (txn["amount_in"], txn["amount_in_asset"]) == (quote["sell_amount"], USDC)
    assert (txn["amount_out"], txn["amount_out_asset"]) == (quote["buy_amount"], INR)
    assert txn["fee_details"]["total"] == quote["fee"]["total"]
    assert txn["quote_id"] == quote["id"]
    assert "stellar_account_id" not in txn and "updated_at" not in txn
    example = json.loads(reference_path(
        "anchor-platform", "examples", "sep31-get-transaction-with-quote.expected.json"
    ).read_text())["transaction"]
    assert set(example) <= set(txn)

    [created_event] = [e for e in events(ap, created.transaction_id)]
    assert created_event["type"] == "transaction_created"
    payload = created_event["payload"]["transaction"]
    assert {k: payload[k] for k in ("sep", "kind", "status", "funding_method", "quote_id",
                                    "client_name", "customers", "creator")} == {
        "sep": "31", "kind": "receive", "status": "pending_receiver",
        "funding_method": "IMPS", "quote_id": quote["id"], "client_name": "foreignSender",
        "customers": {"sender": {"id": created.sender_id},
                      "receiver": {"id": created.receiver_id}},
        "creator": {"account": sa.account}}
    assert payload["amount_out"] == {"amount": quote["buy_amount"], "asset": INR}
    assert "transfer_received_at" not in payload
    wait_for(lambda: events(ap, created.transaction_id)[0]["delivered"], timeout=15,
             what="transaction_created delivered to Corridor")


def test_ap_does_no_kyc_check_a_made_up_receiver_is_accepted(sa):
    """PR #1459: sender and receiver ids are stored unverified."""
    quote = sa.firm_quote("100")
    transaction_id = sa.create_transaction(amount=quote["sell_amount"], sender_id="nobody",
                                           receiver_id="made-up", quote_id=quote["id"])

    txn = get(sa_url(sa), transaction_id)
    assert (txn["status"], txn["customers"]) == (
        "pending_receiver", {"sender": {"id": "nobody"}, "receiver": {"id": "made-up"}})


def test_only_its_creator_sees_a_transaction(ap, sa, created):
    other = httpx.post(f"{ap.url}/ap/sep/sandbox-token", json={"account": keys.HUB.public_key},
                       timeout=10).json()["token"]
    response = httpx.get(f"{ap.url}/ap/sep/sep31/transactions/{created.transaction_id}",
                         headers={"Authorization": f"Bearer {other}"}, timeout=10)

    assert response.status_code == 404
    assert response.json() == {
        "error": f"transaction (id={created.transaction_id}) is not found"}
    assert httpx.get(f"{ap.url}/ap/sep/sep31/transactions/{created.transaction_id}",
                     timeout=10).status_code == 403


def _post(sa, body: dict) -> httpx.Response:
    return sa.http.post("/ap/sep/sep31/transactions", json=body, headers=sa._headers())


@pytest.mark.parametrize(("change", "error"), [
    ({"asset_code": None}, "asset_code cannot be empty"),
    ({"asset_code": "EURC"}, f"asset EURC:{keys.USDC_ISSUER.public_key} is not supported."),
    ({"amount": None}, "amount cannot be empty"),
    ({"amount": "ten"}, "amount is invalid"),
    ({"amount": "-5"}, "amount should be positive"),
    ({"amount": "0.5"}, "sell_amount less than min limit"),
    ({"amount": "5001"}, "sell_amount exceeds max limit"),
    ({"funding_method": None}, "funding_method cannot be empty"),
    ({"funding_method": "SWIFT"}, "invalid funding method SWIFT for asset USDC, supported "
                                  "types are [IMPS, NEFT, UPI]"),
    ({"fields": None}, "'fields' field cannot be empty"),
    ({"sender_id": None}, "sender_id cannot be empty"),
    ({"receiver_id": ""}, "receiver_id cannot be empty"),
    ({"quote_id": None}, "quotes_required is set to true; quote id cannot be empty"),
    ({"quote_id": "q-unknown"}, "quote(id=q-unknown) was not found."),
    ({"amount": "99"}, "Quote sell amount [QUOTE_SELL] is different from the SEP-31 "
                       "transaction amount [99]"),
])
def test_each_bad_request_gets_aps_400_and_creates_nothing(ap, sa, change, error):
    quote = sa.firm_quote("100")
    body = {"amount": quote["sell_amount"], "asset_code": "USDC",
            "asset_issuer": keys.USDC_ISSUER.public_key, "sender_id": "s", "receiver_id": "r",
            "funding_method": "IMPS", "fields": {"transaction": {}}, "quote_id": quote["id"],
            **change}
    body = {k: v for k, v in body.items() if v is not None}

    response = _post(sa, body)

    assert response.status_code == 400
    assert response.json() == {"error": error.replace("QUOTE_SELL", quote["sell_amount"])}
    assert result(ap, "get_transactions", sep="31")["records"] == []
    assert [e["type"] for e in events(ap)] == ["quote_created"]


def test_an_expired_quote_is_refused_with_its_expiry(ap, sa, settings):
    settings.QUOTE_FIRM_TTL_S = 1
    quote = sa.firm_quote("100")
    time.sleep(1.2)

    response = _post(sa, {"amount": quote["sell_amount"], "asset_code": "USDC",
                          "sender_id": "s", "receiver_id": "r", "funding_method": "IMPS",
                          "fields": {}, "quote_id": quote["id"]})

    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith(f"quote(id={quote['id']}) has expired at 20") and error[-1] == "Z"


def test_one_quote_backs_two_transactions_on_ap_4_3(sa):
    """§6.4: 4.3.0 never links a quote to a transaction (single use only from 4.4.0)."""
    quote = sa.firm_quote("100")
    first = sa.create_transaction(amount=quote["sell_amount"], sender_id="s", receiver_id="r",
                                  quote_id=quote["id"])
    second = sa.create_transaction(amount=quote["sell_amount"], sender_id="s",
                                   receiver_id="r", quote_id=quote["id"])

    assert first != second
    assert [get(sa_url(sa), t)["quote_id"] for t in (first, second)] == [quote["id"]] * 2


def test_a_malformed_body_or_no_token_is_refused(ap, sa):
    response = sa.http.post("/ap/sep/sep31/transactions", content=b"[1]",
                            headers={**sa._headers(), "Content-Type": "application/json"})
    assert (response.status_code, response.json()) == (
        400, {"error": "Your request body is wrong in some way."})
    assert httpx.post(f"{ap.url}/ap/sep/sep31/transactions", json={},
                      timeout=10).status_code == 403


# --- the RPC table --------------------------------------------------------------------------

STATUSES = ["pending_sender", "pending_stellar", "pending_customer_info_update",
            "pending_transaction_info_update", "pending_receiver", "pending_external",
            "completed", "refunded", "expired", "error", "pending_anchor"]
OPEN = [s for s in STATUSES if s not in ("completed", "refunded", "expired", "error")]
# SEP31-RECEIVE.md §3.2, written out independently of the implementation:
# method -> [(status, funds received or None for either)].
ALLOWED = {
    "request_onchain_funds": [("pending_receiver", False)],
    "notify_onchain_funds_received": [("pending_sender", None)],
    "notify_customer_info_updated": [("pending_receiver", None),
                                     ("pending_customer_info_update", None)],
    "notify_offchain_funds_pending": [("pending_receiver", None)],
    "notify_offchain_funds_sent": [("pending_receiver", None), ("pending_external", None)],
    "notify_refund_sent": [("pending_receiver", None), ("pending_stellar", None)],
    "notify_transaction_error": [(s, None) for s in OPEN],
    "notify_transaction_expired": [(s, False) for s in OPEN],
    "notify_transaction_recovery": [("error", True), ("expired", True)],
    "notify_offchain_funds_received": [], "notify_offchain_funds_available": [],
    "notify_amounts_updated": [], "notify_refund_pending": [],
    "notify_transaction_on_hold": [], "request_offchain_funds": [], "request_trust": [],
    "notify_trust_set": [], "notify_onchain_funds_sent": [],
    "notify_interactive_flow_completed": [],
}
TARGET = {"request_onchain_funds": "pending_sender",
          "notify_onchain_funds_received": "pending_receiver",
          "notify_customer_info_updated": "pending_receiver",
          "notify_offchain_funds_pending": "pending_external",
          "notify_offchain_funds_sent": "completed", "notify_refund_sent": "pending_anchor",
          "notify_transaction_error": "error", "notify_transaction_expired": "expired",
          "notify_transaction_recovery": "pending_receiver"}


@pytest.fixture
def payment_hash(sa) -> str:
    """A real USDC payment on the sandbox ledger, under a memo nothing waits for."""
    return sa.pay({"id": "-", "stellar_account_id": DISTRIBUTION, "stellar_memo": new_memo(),
                   "amount_in": "1"})[0]


def _params(method: str, stellar_hash: str) -> dict:
    return {"request_onchain_funds": {"destination_account": DISTRIBUTION, "memo": "42"},
            "notify_onchain_funds_received": {"stellar_transaction_id": stellar_hash},
            "notify_refund_sent": {"refund": {
                "id": "r1", "amount": {"amount": "1", "asset": USDC},
                "amount_fee": {"amount": "0", "asset": USDC}}},
            "notify_transaction_recovery": {"message": "again"},
            }.get(method, {"message": "m"})


@pytest.mark.parametrize("method", sorted(ALLOWED))
def test_each_method_is_allowed_exactly_where_ap_4_3_allows_it(ap, created, payment_hash,
                                                                method):
    for status in STATUSES:
        for funded in (False, True):
            force(ap, created.transaction_id, status=status, funds_received=funded,
                  clear_refunds=True)
            reply = call(ap, method, transaction_id=created.transaction_id,
                         **_params(method, payment_hash))
            allowed = any(s == status and f in (None, funded) for s, f in ALLOWED[method])
            where = f"{method} from {status}, funds received {funded}"
            if allowed:
                assert "result" in reply, (where, reply)
                assert reply["result"]["status"] == TARGET[method], where
            else:
                assert reply["error"] == {
                    "id": created.transaction_id, "code": -32600,
                    "message": f"RPC method[{method}] is not supported. Status[{status}], "
                               f"kind[receive], protocol[31], funds received"
                               f"[{'true' if funded else 'false'}]"}, where


def test_request_customer_info_update_no_longer_exists(ap, created):
    assert refused(ap, "request_customer_info_update",
                   transaction_id=created.transaction_id) == {
        "id": created.transaction_id, "code": -32601,
        "message": "No matching RPC method[request_customer_info_update]"}


@pytest.mark.parametrize(("params", "message"), [
    ({"destination_account": DISTRIBUTION}, "memo and memo_type are required"),
    ({"memo": "7"}, "destination_account is required"),
    ({"memo": "abc", "destination_account": DISTRIBUTION}, "Invalid id memo: abc"),
    ({"memo": str(2**64), "destination_account": DISTRIBUTION},
     f"Invalid id memo: {2**64} is out of uint64 range"),
    ({"memo": "7", "destination_account": DISTRIBUTION,
      "amount_out": {"amount": "1", "asset": USDC}, "amount_in": {"amount": "1", "asset": USDC},
      "fee_details": {"total": "0", "asset": USDC}},
     "amount_out.asset should be non-stellar asset"),
])
def test_request_onchain_funds_needs_account_and_memo(ap, created, params, message):
    error = refused(ap, "request_onchain_funds", transaction_id=created.transaction_id,
                    **params)

    assert (error["code"], error["message"]) == (-32602, message)
    assert get(ap, created.transaction_id)["status"] == "pending_receiver"


def test_request_onchain_funds_tells_the_sa_where_to_pay_and_ignores_memo_type(ap, sa, created):
    txn = result(ap, "request_onchain_funds", transaction_id=created.transaction_id,
                 destination_account=DISTRIBUTION, memo="18446744073709551615",
                 memo_type="text")

    assert (txn["status"], txn["destination_account"], txn["memo"], txn["memo_type"]) == (
        "pending_sender", DISTRIBUTION, "18446744073709551615", "id")
    seen = sa.transaction(created.transaction_id)
    assert (seen["stellar_account_id"], seen["stellar_memo"], seen["stellar_memo_type"]) == (
        DISTRIBUTION, "18446744073709551615", "id")
    assert [(e["type"], e["status"]) for e in events(ap, created.transaction_id)] == [
        ("transaction_created", "pending_receiver"),
        ("transaction_status_changed", "pending_sender")]


# --- the whole path ---------------------------------------------------------------------


def test_happy_path_sa_pays_observer_notifies_payout_completes(ap, sa, created):
    memo = new_memo()
    request_funds(ap, created.transaction_id, memo)

    paid = sa.finish(created, timeout=10)

    [stellar_hash] = paid.hashes
    txn = wait_for(lambda: (t := result(ap, "get_transaction",
                                        transaction_id=created.transaction_id))["status"]
                   == "pending_receiver" and t, timeout=15, what="observer notify")
    assert txn["transfer_received_at"]
    assert txn["source_account"] == sa.account
    assert txn["amount_in"] == {"amount": f"{Decimal(created.quote['sell_amount']):.7f}",
                                "asset": USDC}
    [stellar] = txn["stellar_transactions"]
    assert stellar["id"] == stellar_hash
    assert stellar["payments"][0]["destination_account"] == DISTRIBUTION
    assert stellar["payments"][0]["amount"]["asset"] == f"USDC:{keys.USDC_ISSUER.public_key}"
    [seen] = observed(ap, transaction_id=created.transaction_id)
    assert seen["outcome"] == "notified"
    assert seen["rpc_request"]["method"] == "notify_onchain_funds_received"
    assert set(seen["rpc_request"]["params"]) == {"transaction_id", "message",
                                                  "stellar_transaction_id", "amount_in"}

    result(ap, "notify_offchain_funds_pending", transaction_id=created.transaction_id,
           external_transaction_id="pout_1")
    done = result(ap, "notify_offchain_funds_sent", transaction_id=created.transaction_id,
                  external_transaction_id="UTR123", message="paid")

    assert (done["status"], done["external_transaction_id"]) == ("completed", "UTR123")
    assert done["completed_at"]
    assert sa.transaction(created.transaction_id)["required_info_message"] == "paid"
    assert [(e["type"], e["status"]) for e in events(ap, created.transaction_id)] == [
        ("transaction_created", "pending_receiver"),
        ("transaction_status_changed", "pending_sender"),
        ("transaction_status_changed", "pending_receiver"),
        ("transaction_status_changed", "pending_external"),
        ("transaction_status_changed", "completed")]
    wait_for(lambda: all(e["delivered"] for e in events(ap, created.transaction_id)),
             timeout=15, what="every event delivered to Corridor")


def test_trap_payout_is_accepted_before_any_usdc_arrived(ap, created):
    """§1.3 / §10.16: AP completes a SEP-31 transaction nobody paid."""
    done = result(ap, "notify_offchain_funds_sent", transaction_id=created.transaction_id,
                  external_transaction_id="UTR1")

    assert done["status"] == "completed"
    assert "transfer_received_at" not in done and "stellar_transactions" not in done


def test_trap_refund_before_funds_and_the_pending_anchor_dead_end(ap, created):
    """§3.3: a partial refund is accepted (even before funds) and parks the transaction
    in pending_anchor; only notify_transaction_error leads out, recovery needs funds."""
    tx_id = created.transaction_id
    refund = {"id": "rf1", "amount": {"amount": "1", "asset": USDC},
              "amount_fee": {"amount": "1", "asset": created.quote["fee"]["asset"]}}

    parked = result(ap, "notify_refund_sent", transaction_id=tx_id, refund=refund)

    assert parked["status"] == "pending_anchor"
    assert parked["refunds"]["payments"][0]["id_type"] == "stellar"
    assert Decimal(parked["refunds"]["amount_refunded"]["amount"]) == 2
    assert refused(ap, "notify_refund_sent", transaction_id=tx_id, refund=refund)[
        "code"] == -32600
    assert refused(ap, "notify_offchain_funds_sent", transaction_id=tx_id)["code"] == -32600
    assert result(ap, "notify_transaction_expired", transaction_id=tx_id,
                  message="late")["status"] == "expired"  # funds never arrived


def test_refunds_full_exceeding_missing_and_a_second_one(ap, sa, created):
    tx_id = created.transaction_id
    amount_in = Decimal(created.quote["sell_amount"])
    fee_asset = created.quote["fee"]["asset"]

    def refund(amount, fee="0", asset=USDC, fee_asset=fee_asset):
        return {"id": "rf", "amount": {"amount": str(amount), "asset": asset},
                "amount_fee": {"amount": fee, "asset": fee_asset}}

    assert refused(ap, "notify_refund_sent", transaction_id=tx_id) == {
        "id": tx_id, "code": -32602, "message": "refund is required"}
    assert refused(ap, "notify_refund_sent", transaction_id=tx_id,
                   refund=refund(amount_in + 1))["message"] == "Refund amount exceeds amount_in"
    assert refused(ap, "notify_refund_sent", transaction_id=tx_id,
                   refund=refund(1, asset=INR))["message"] == (
        "refund.amount.asset does not match transaction amount_in_asset")
    # partial refund, error, recovery (needs funds: the observer-free notify), again
    result(ap, "notify_refund_sent", transaction_id=tx_id, refund=refund(1))
    result(ap, "notify_transaction_error", transaction_id=tx_id, message="stuck")
    force(ap, tx_id, funds_received=True)
    assert result(ap, "notify_transaction_recovery",
                  transaction_id=tx_id)["status"] == "pending_receiver"
    assert refused(ap, "notify_refund_sent", transaction_id=tx_id,
                   refund=refund(amount_in - 1, "1")) == {
        "id": tx_id, "code": -32600,
        "message": "Multiple refunds aren't supported for kind[receive], protocol[31] and "
                   "action[notify_refund_sent]"}

    other = sa.start(amount="100")
    full = result(ap, "notify_refund_sent", transaction_id=other.transaction_id,
                  refund=refund(Decimal(other.quote["sell_amount"]) - 1, "1"))
    assert full["status"] == "refunded" and full["completed_at"]


def _lenient(expected, actual, where="$") -> None:
    """AP's LENIENT comparison: extra keys allowed; amounts equal as numbers."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing"
            _lenient(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(expected) == len(actual), where
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _lenient(e, a, f"{where}[{i}]")
    elif isinstance(expected, str) and isinstance(actual, str):
        try:
            assert Decimal(expected) == Decimal(actual), where
        except ArithmeticError:
            assert expected == actual, where
    else:
        assert expected == actual, where


IGNORED = {"started_at", "updated_at", "completed_at", "transfer_received_at", "memo",
           "amount_in", "amount_expected", "amount_out", "fee_details", "client_name",
           "customers", "creator", "stellar_transactions"}


@pytest.mark.parametrize("example", ["sep31-complete-full-with-recovery",
                                     "sep31-refunded-short"])
def test_aps_recorded_sep31_batches_replay(ap, sa, created, example):
    """The recorded AP batches (SEP31-RECEIVE.md §8) on a transaction in pending_sender,
    paid with a memo the observer does not match, so the batch's own notify lands.
    Refund amounts stay the example's (1 + 1 fee), assets the sandbox's."""
    folder = ("anchor-platform", "examples")
    requests = reference_path(*folder, f"{example}.rpc-requests.json").read_text()
    responses = reference_path(*folder, f"{example}.rpc-responses.json").read_text()
    request_funds(ap, created.transaction_id)
    txn = sa.wait_for_status(created.transaction_id)
    [stellar_hash] = sa.pay(txn, Payment(memo=new_memo()))
    fill = {"%TX_ID%": created.transaction_id, "%TESTPAYMENT_TXN_HASH%": stellar_hash,
            EXAMPLE_CIRCLE_USDC_ISSUER: keys.USDC_ISSUER.public_key}
    for placeholder, value in fill.items():
        requests, responses = (requests.replace(placeholder, value),
                               responses.replace(placeholder, value))
    replies = rpc(ap, *json.loads(requests))

    for expected, reply in zip(json.loads(responses), replies, strict=True):
        assert "result" in reply, reply
        wanted = {k: v for k, v in expected["result"].items() if k not in IGNORED}
        _lenient(wanted, reply["result"], f"reply {reply['id']}")
        assert reply["result"]["customers"] == {"sender": {"id": created.sender_id},
                                                "receiver": {"id": created.receiver_id}}


# --- the observer and the SA's faults ---------------------------------------------------


def test_a_short_payment_is_accepted_and_overwrites_amount_in(ap, sa, created):
    """NOTES §4.4 for SEP-31: no check of the amount."""
    request_funds(ap, created.transaction_id)
    sa.finish(created, Payment(amount="99.5"), timeout=10)

    txn = wait_for(lambda: (t := result(ap, "get_transaction",
                                        transaction_id=created.transaction_id))["status"]
                   == "pending_receiver" and t, timeout=15, what="observer notify")
    assert txn["amount_in"]["amount"] == "99.5000000"
    assert txn["amount_out"]["amount"] == created.quote["buy_amount"]  # unchanged


def test_a_second_payment_matches_nothing(ap, sa, created):
    request_funds(ap, created.transaction_id)
    paid = sa.finish(created, Payment(times=2), timeout=10)

    assert len(paid.hashes) == 2
    wait_for(lambda: len([p for p in observed(ap) if p["stellar_transaction_id"]
                          in paid.hashes]) == 2, timeout=15, what="both payments observed")
    rows = observed(ap, transaction_id=created.transaction_id)
    outcomes = {p["stellar_transaction_id"]: p["outcome"] for p in observed(ap)}
    assert [outcomes[h] for h in paid.hashes] == ["notified", "no_match"]
    assert len(rows) == 1
    txn = result(ap, "get_transaction", transaction_id=created.transaction_id)
    assert len(txn["stellar_transactions"]) == 1


def test_a_payment_under_another_memo_or_none_leaves_it_pending_sender(ap, sa, created):
    request_funds(ap, created.transaction_id)
    [wrong] = sa.finish(created, Payment(memo=new_memo()), timeout=10).hashes
    never = sa.start(amount="100")
    request_funds(ap, never.transaction_id)
    assert sa.finish(never, Payment(times=0), timeout=10).hashes == []

    wait_for(lambda: any(p["stellar_transaction_id"] == wrong for p in observed(ap)),
             timeout=15, what="the wrong-memo payment observed")
    assert [p["outcome"] for p in observed(ap) if p["stellar_transaction_id"] == wrong] == [
        "no_match"]
    for tx_id in (created.transaction_id, never.transaction_id):
        assert sa.transaction(tx_id)["status"] == "pending_sender"


def test_two_pending_sender_rows_sharing_a_memo_get_neither_payment(ap, sa, created):
    second = sa.start(amount="100")
    request_funds(ap, created.transaction_id, "777")
    request_funds(ap, second.transaction_id, "777")
    [stellar_hash] = sa.finish(created, timeout=10).hashes

    row = wait_for(lambda: next((p for p in observed(ap)
                                 if p["stellar_transaction_id"] == stellar_hash), None),
                   timeout=15, what="payment observed")
    assert row["outcome"] == "lookup_error"
    for tx_id in (created.transaction_id, second.transaction_id):
        assert sa.transaction(tx_id)["status"] == "pending_sender"


def test_get_transactions_lists_sep31_apart_from_sep24(ap, created):
    assert [r["id"] for r in result(ap, "get_transactions", sep="31")["records"]] == [
        created.transaction_id]
    assert result(ap, "get_transactions", sep="24")["records"] == []


def test_the_http_trigger_runs_the_sa_until_it_paid(ap):
    started = httpx.post(f"{ap.url}/ap/sandbox/sender31/send",
                         json={"amount": "50", "timeout_s": 20}, timeout=60)
    assert started.status_code == 202, started.text
    run = started.json()
    assert run["state"] == "waiting"

    request_funds(ap, run["transaction_id"])

    done = wait_for(lambda: (r := httpx.get(
        f"{ap.url}/ap/sandbox/sender31/runs/{run['transaction_id']}", timeout=10).json()
    )["state"] != "waiting" and r, timeout=30, what="the SA paid")
    assert done["state"] == "paid" and len(done["hashes"]) == 1
    wait_for(lambda: result(ap, "get_transaction", transaction_id=run["transaction_id"])[
        "status"] == "pending_receiver", timeout=15, what="observer notify")
    bad = httpx.post(f"{ap.url}/ap/sandbox/sender31/send", json={"pay": {"times": 9}},
                     timeout=10)
    assert (bad.status_code, bad.json()) == (400, {
        "error": "pay.times must be an integer from 0 to 5"})


# --- notify_customer_info_updated against a scripted /customer ----------------------------


class Script:
    status: str | int = "ACCEPTED"
    seen: list = []


def _customer(request):
    Script.seen.append(dict(request.GET))
    if isinstance(Script.status, int):
        return JsonResponse({"error": "down"}, status=Script.status)
    return JsonResponse({"id": request.GET.get("id"), "status": Script.status})


@csrf_exempt
def _event(request):
    return JsonResponse({})


urlpatterns = [path("callbacks/customer", _customer), path("callbacks/event", _event),
               path("callbacks/customer/<str:cid>", _customer)]


def made_up(sa) -> str:
    """A transaction naming customers s1 / r1 nobody registered (AP does not check)."""
    quote = sa.firm_quote("100")
    return sa.create_transaction(amount=quote["sell_amount"], sender_id="s1",
                                 receiver_id="r1", quote_id=quote["id"])


@pytest.mark.parametrize(("status", "next_status"), [
    ("ACCEPTED", "pending_receiver"), ("PROCESSING", "pending_receiver"),
    ("NEEDS_INFO", "pending_customer_info_update"), ("REJECTED", "error")])
def test_customer_info_updated_follows_the_customers_status(ap, sa, settings, status,
                                                            next_status):
    tx_id = made_up(sa)
    settings.ROOT_URLCONF = __name__
    Script.status, Script.seen = status, []

    reply = result(ap, "notify_customer_info_updated", transaction_id=tx_id,
                   customer_id="r1", customer_type="sep31-receiver", message="why")

    assert reply["status"] == next_status
    assert Script.seen == [{"id": ["r1"], "transaction_id": [tx_id],
                            "type": ["sep31-receiver"]}]
    assert [(e["type"], e["payload"].get("customer")) for e in events(ap)
            if e["type"] != "quote_created"] == [
        ("transaction_created", None), ("transaction_status_changed", None),
        ("customer_updated", {"id": "r1"})]


@pytest.mark.parametrize(("status", "message"), [
    ("accepted", "No enum constant org.stellar.anchor.api.sep.sep12.Sep12Status.accepted"),
    (500, "internal server error"), (404, "down")])
def test_customer_info_updated_with_a_bad_answer_is_32603(ap, sa, settings, status,
                                                         message):
    tx_id = made_up(sa)
    settings.ROOT_URLCONF = __name__
    Script.status, Script.seen = status, []

    error = refused(ap, "notify_customer_info_updated", transaction_id=tx_id,
                    customer_id="r1")

    assert (error["code"], error["message"]) == (-32603, message)
    assert get(ap, tx_id)["status"] == "pending_receiver"
    assert [e["type"] for e in events(ap) if e["type"] != "quote_created"] == [
        "transaction_created"]


def test_rejected_needs_a_message(ap, sa, settings):
    tx_id = made_up(sa)
    settings.ROOT_URLCONF = __name__
    Script.status, Script.seen = "REJECTED", []

    assert refused(ap, "notify_customer_info_updated", transaction_id=tx_id,
                   customer_id="r1")["message"] == "message is required"
