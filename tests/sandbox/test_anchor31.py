"""The SEP-31 receiving anchor and the partner wallet of the sandbox
(``sandbox.anchor31``), over real HTTP.

Each test creates SEP-31 transactions as Corridor's hub (``sandbox-sep31:<hub>``), pays
the anchor from the hub with stellar-sdk on the sandbox Horizon (the hub is funded once
per module through the partner wallet), and reads the outcome from ``GET
/anchor31/transactions/{id}``, the sandbox-only inspection (status history, payments,
refunds) and Horizon itself. The settle delay is 0.1 s here (fault
``anchor31.step_delay``); ledgers close every 0.25 s (``tests.conftest``).
"""

from __future__ import annotations

import time
from datetime import datetime
from decimal import Decimal

import httpx
import pytest
from django.conf import settings
from stellar_sdk import Asset, Keypair, Server, TransactionBuilder
from stellar_sdk.client.requests_client import RequestsClient

from sandbox import keys

pytestmark = pytest.mark.django_db(transaction=True)

HUB = keys.HUB.public_key
PARTNER = keys.PARTNER.public_key
ANCHOR = keys.ANCHOR31.public_key
ISSUER = keys.USDC_ISSUER.public_key
USDC = Asset("USDC", ISSUER)
AUTH = {"Authorization": f"Bearer sandbox-sep31:{HUB}"}
UINT64_MAX = 2**64 - 1
FIELDS = {"transaction": {"receiver_account_number": "123456789012",
                          "receiver_ifsc": "HDFC0000123", "type": "IMPS"}}
BODY = {"amount": "10", "asset_code": "USDC", "asset_issuer": ISSUER,
        "sender_id": "sender-1", "receiver_id": "receiver-1", "fields": FIELDS}
FINAL = {"completed", "error", "refunded", "expired"}


# --- helpers -------------------------------------------------------------------------------


class Anchor:
    """The anchor's HTTP API as the hub calls it, plus the sandbox-only views."""

    def __init__(self, sandbox):
        self.url = f"{sandbox.url}/anchor31"
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def create(self, **overrides) -> dict:
        body = {**BODY, **overrides}
        response = self.http.post("/transactions", json=body, headers=AUTH)
        assert response.status_code == 201, response.text
        return response.json()

    def get(self, transaction_id: str) -> dict:
        response = self.http.get(f"/transactions/{transaction_id}", headers=AUTH)
        assert response.status_code == 200, response.text
        return response.json()["transaction"]

    def wait(self, transaction_id: str, statuses: set[str], timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            tx = self.get(transaction_id)
            if tx["status"] in statuses:
                return tx
            if time.monotonic() > deadline:
                raise AssertionError(f"{transaction_id} stayed {tx['status']}: {tx}")
            time.sleep(0.05)

    def inspect(self, transaction_id: str | None = None) -> dict:
        response = self.http.get("/sandbox/transactions")
        assert response.status_code == 200, response.text
        body = response.json()
        if transaction_id is None:
            return body
        [found] = [t for t in body["transactions"] if t["id"] == transaction_id]
        return found

    def ids(self) -> set[str]:
        return {t["id"] for t in self.inspect()["transactions"]}

    def history(self, transaction_id: str) -> list[str]:
        return [h["status"] for h in self.inspect(transaction_id)["history"]]


class Payer:
    """The hub (its secret comes from ``sandbox_keypair("hub")``) paying with stellar-sdk."""

    def __init__(self, sandbox):
        self.keypair = keys.HUB
        self.horizon = f"{sandbox.url}/horizon"
        client = RequestsClient(num_retries=0, request_timeout=10, post_timeout=10)
        self.server = Server(self.horizon, client=client)

    def pay(self, amount: str, *, memo_id: str | None = None, memo_text: str | None = None,
            asset: Asset = USDC, destination: str = ANCHOR) -> str:
        account = self.server.load_account(self.keypair.public_key)
        builder = TransactionBuilder(account, settings.STELLAR_NETWORK_PASSPHRASE,
                                     base_fee=100).set_timeout(30)
        builder.append_payment_op(destination, asset, amount)
        if memo_id is not None:
            builder.add_id_memo(int(memo_id))
        if memo_text is not None:
            builder.add_text_memo(memo_text)
        envelope = builder.build()
        envelope.sign(self.keypair)
        return self.server.submit_transaction(envelope)["hash"]

    def usdc(self, account: str = HUB) -> Decimal:
        return usdc_balance(self.horizon, account)


def usdc_balance(horizon: str, account: str) -> Decimal:
    data = httpx.get(f"{horizon}/accounts/{account}", timeout=10).json()
    [line] = [b for b in data["balances"] if b.get("asset_code") == "USDC"
              and b.get("asset_issuer") == ISSUER]
    return Decimal(line["balance"])


def partner_pay(sandbox, **body) -> httpx.Response:
    return httpx.post(f"{sandbox.url}/anchor31/sandbox/partner/pay", json=body, timeout=30)


def horizon_tx(sandbox, tx_hash: str) -> tuple[dict, list[dict]]:
    """The transaction resource and its payments on the sandbox Horizon."""
    base = f"{sandbox.url}/horizon/transactions/{tx_hash}"
    tx = httpx.get(base, timeout=10).json()
    payments = httpx.get(f"{base}/payments", timeout=10).json()["_embedded"]["records"]
    return tx, payments


def gaps(anchor: Anchor, transaction_id: str) -> list[float]:
    times = [datetime.fromisoformat(h["at"].replace("Z", "+00:00"))
             for h in anchor.inspect(transaction_id)["history"]]
    return [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]


@pytest.fixture(scope="module")
def hub(sandbox) -> Payer:
    """The hub with 1,000 USDC, paid by the partner wallet."""
    response = partner_pay(sandbox, destination=HUB, amount="1000")
    assert response.status_code == 200, response.text
    return Payer(sandbox)


@pytest.fixture
def anchor(clean_sandbox) -> Anchor:
    clean_sandbox.fault("anchor31.step_delay", seconds=0.1)
    return Anchor(clean_sandbox)


def assert_refunded_on_chain(sandbox, anchor: Anchor, tx: dict, paid_hash: str) -> None:
    """``tx`` is ``refunded`` in full by one payment from the anchor back to the hub,
    with the transaction's memo, in a ledger."""
    assert tx["status"] == "refunded"
    assert tx["refunded"] is True
    assert tx["amount_out"] == "0.0000000"
    assert tx["stellar_transaction_id"] == paid_hash
    [refund] = tx["refunds"]["payments"]
    assert tx["refunds"] == {"amount_refunded": "10.0000000", "amount_fee": "0.0000000",
                             "payments": [{"id": refund["id"], "id_type": "stellar",
                                           "amount": "10.0000000", "fee": "0.0000000"}]}
    on_chain, payments = horizon_tx(sandbox, refund["id"])
    assert on_chain["successful"] is True
    assert (on_chain["source_account"], on_chain["memo_type"], on_chain["memo"]) == (
        ANCHOR, "id", tx["stellar_memo"])
    assert [(p["from"], p["to"], p["asset_code"], p["asset_issuer"], p["amount"])
            for p in payments] == [(ANCHOR, HUB, "USDC", ISSUER, "10.0000000")]
    [sent] = anchor.inspect(tx["id"])["refund_payments"]
    assert (sent["hash"], sent["status"], sent["destination"]) == (refund["id"], "completed",
                                                                   HUB)


# --- the fixed world -----------------------------------------------------------------------


def test_world_creates_hub_partner_and_anchor_with_usdc_trustlines(sandbox):
    horizon = f"{sandbox.url}/horizon"
    first = httpx.get(f"{horizon}/accounts/{HUB}/operations",
                      params={"order": "asc", "limit": 1}, timeout=10).json()
    world_hash = first["_embedded"]["records"][0]["transaction_hash"]

    ops = httpx.get(f"{horizon}/transactions/{world_hash}/operations",
                    params={"limit": 20}, timeout=10).json()["_embedded"]["records"]

    assert [(o["type"], o.get("account") or o.get("trustor") or o.get("to"))
            for o in ops] == [
        ("create_account", HUB), ("create_account", PARTNER), ("create_account", ANCHOR),
        ("change_trust", HUB), ("change_trust", PARTNER), ("change_trust", ANCHOR),
        ("payment", PARTNER), ("payment", ANCHOR)]
    assert [o["starting_balance"] for o in ops[:3]] == ["10000.0000000"] * 3
    assert [(o["from"], o["amount"], o["asset_code"]) for o in ops[6:]] == [
        (ISSUER, "1000000.0000000", "USDC")] * 2  # the hub gets none
    assert HUB == "GANBGMMVHZ5CFXCQWUZYPAQJ4IUOH27V33I6F46KLRJB3HKL6LVQ2IMB"
    assert PARTNER == "GBR5EOMXSVA5S3QQGQJXQ6N6XP6CSLSZRHOCB5AG5AZ7KI2Q7X7W3MYK"
    assert ANCHOR == "GAOXUXDEWYCG3QL2GMHP4ZRFR5KVMPM6KQDR7LLFAZ62VFYR4256ORF2"


# --- authentication, info, validation ------------------------------------------------------


BAD_HEADERS = [None, "Bearer", "Bearer sandbox-sep31:GNOTANACCOUNT", "Bearer not-a-jwt",
               f"Basic {HUB}"]


def test_every_sep31_endpoint_needs_a_token(anchor):
    known = anchor.ids()

    answers = {}
    for header in BAD_HEADERS:
        headers = {"Authorization": header} if header else {}
        answers[header] = [
            (a.status_code, a.json()) for a in (
                anchor.http.get("/info", headers=headers),
                anchor.http.post("/transactions", json=BODY, headers=headers),
                anchor.http.get("/transactions/whatever", headers=headers))]

    assert answers == {h: [(403, {"error": "forbidden"})] * 3 for h in BAD_HEADERS}
    assert anchor.ids() == known


def test_an_ap_sep10_token_authenticates_too(anchor, sandbox):
    token = httpx.post(f"{sandbox.url}/ap/sep/sandbox-token", json={"account": PARTNER},
                       timeout=10).json()["token"]

    response = anchor.http.get("/info", headers={"Authorization": f"Bearer {token}"})

    assert response.status_code == 200


def test_info_receives_usdc_of_the_sandbox_issuer(anchor):
    response = anchor.http.get("/info", headers=AUTH)

    assert response.status_code == 200
    usdc = response.json()["receive"]["USDC"]
    assert (usdc["quotes_supported"], usdc["fee_fixed"], usdc["fee_percent"]) == (False, 0, 0)
    assert (usdc["min_amount"], usdc["max_amount"]) == (0.01, 1000000)
    assert list(usdc["sep12"]["sender"]["types"]) == ["sep31-sender"]
    assert list(usdc["sep12"]["receiver"]["types"]) == ["sep31-receiver"]
    fields = usdc["fields"]["transaction"]
    assert sorted(fields) == ["receiver_account_number", "receiver_ifsc", "type"]
    assert fields["type"]["choices"] == ["IMPS", "NEFT"] and fields["type"]["optional"]


MISSING_FIELDS = {"receiver_account_number": {
    "description": "bank account number of the receiver"}}


INVALID = [
    ({"amount": None}, {"error": "amount is required"}),
    ({"amount": "ten"}, {"error": "amount 'ten' is not a number"}),
    ({"amount": "-1"}, {"error": "amount must be positive"}),
    ({"amount": "1.12345678"}, {"error": "amount has more than 7 decimal places"}),
    ({"amount": "0.001"}, {"error": "amount is below min_amount 0.01"}),
    ({"amount": "1000000.5"}, {"error": "amount is above max_amount 1000000"}),
    ({"asset_code": "EURC"},
     {"error": "asset_code EURC is not supported: GET /info lists the assets"}),
    ({"asset_issuer": HUB},
     {"error": f"asset_issuer {HUB} does not issue the USDC this anchor receives"}),
    ({"quote_id": "q-1"},
     {"error": "quotes are not supported: quote_id and destination_asset must be absent"}),
    ({"sender_id": None}, {"error": "customer_info_needed", "type": "sep31-sender"}),
    ({"receiver_id": ""}, {"error": "customer_info_needed", "type": "sep31-receiver"}),
    ({"fields": {"transaction": {"receiver_ifsc": "HDFC0000123"}}},
     {"error": "transaction_info_needed", "fields": {"transaction": MISSING_FIELDS}}),
    ({"fields": {"transaction": {**FIELDS["transaction"], "type": "SWIFT"}}},
     {"error": "fields.transaction.type must be one of IMPS, NEFT"}),
    ({"fields": {"transaction": {**FIELDS["transaction"], "receiver_ifsc": "hdfc123"}}},
     {"error": "fields.transaction.receiver_ifsc is not an IFSC (e.g. HDFC0000123)"}),
    ({"refund_memo": "42"},
     {"error": "refund_memo and refund_memo_type must be given together"}),
    ({"refund_memo": "x" * 29, "refund_memo_type": "text"},
     {"error": "refund_memo: a text memo is at most 28 bytes"}),
]


def test_invalid_requests_are_refused_with_sep31_errors(anchor):
    known = anchor.ids()

    answers = [anchor.http.post("/transactions", json={**BODY, **overrides}, headers=AUTH)
               for overrides, _ in INVALID]

    assert [(a.status_code, a.json()) for a in answers] == [(400, e) for _, e in INVALID]
    assert anchor.ids() == known


def test_a_body_that_is_not_a_json_object_is_refused(anchor):
    answers = [anchor.http.post("/transactions", content=b"{", headers=AUTH),
               anchor.http.post("/transactions", json=[BODY], headers=AUTH)]

    assert [(a.status_code, a.json()) for a in answers] == [
        (400, {"error": "request body must be JSON"}),
        (400, {"error": "request body must be a JSON object"})]


def test_amount_may_be_a_json_number_and_issuer_may_be_left_out(anchor):
    created = anchor.http.post(
        "/transactions", headers=AUTH, content=(
            b'{"amount": 12.5, "asset_code": "USDC", "sender_id": "s", "receiver_id": "r",'
            b' "fields": {"transaction": {"receiver_account_number": "123456789",'
            b' "receiver_ifsc": "SBIN0001234"}}}'),
    )

    assert created.status_code == 201, created.text
    tx = anchor.get(created.json()["id"])
    assert (tx["amount_in"], tx["amount_in_asset"]) == ("12.5000000", f"stellar:USDC:{ISSUER}")


def test_unknown_or_foreign_transactions_are_404(anchor):
    mine = anchor.create()
    other = {"Authorization": f"Bearer sandbox-sep31:{PARTNER}"}

    answers = [anchor.http.get("/transactions/no-such-id", headers=AUTH),
               anchor.http.get(f"/transactions/{mine['id']}", headers=other)]

    assert [a.status_code for a in answers] == [404, 404]
    assert answers[0].json() == {"error": "transaction no-such-id not found"}


# --- the status machine --------------------------------------------------------------------


def test_happy_path_pending_sender_to_completed(anchor, hub, sandbox):
    before = hub.usdc()
    created = anchor.create()
    assert set(created) == {"id", "stellar_account_id", "stellar_memo_type", "stellar_memo"}
    assert (created["stellar_account_id"], created["stellar_memo_type"]) == (ANCHOR, "id")
    assert created["stellar_memo"].isdigit() and 1 <= int(created["stellar_memo"]) <= UINT64_MAX
    waiting = anchor.get(created["id"])
    assert waiting["status"] == "pending_sender"
    assert "stellar_transaction_id" not in waiting and "completed_at" not in waiting

    paid = hub.pay("10", memo_id=created["stellar_memo"])
    tx = anchor.wait(created["id"], FINAL)

    assert tx["status"] == "completed", tx
    assert anchor.history(created["id"]) == ["pending_sender", "pending_stellar",
                                             "pending_receiver", "completed"]
    assert {k: tx[k] for k in ("amount_in", "amount_out", "amount_fee", "stellar_account_id",
                               "stellar_memo_type", "stellar_memo", "stellar_transaction_id",
                               "refunded")} == {
        "amount_in": "10.0000000", "amount_out": "10.0000000", "amount_fee": "0.0000000",
        "stellar_account_id": ANCHOR, "stellar_memo_type": "id",
        "stellar_memo": created["stellar_memo"], "stellar_transaction_id": paid,
        "refunded": False}
    assert tx["amount_in_asset"] == f"stellar:USDC:{ISSUER}"
    assert tx["fee_details"] == {"total": "0.0000000", "asset": f"stellar:USDC:{ISSUER}"}
    assert tx["external_transaction_id"].isdigit() and len(tx["external_transaction_id"]) == 12
    assert tx["started_at"].endswith("Z") and tx["completed_at"] >= tx["started_at"]
    assert "refunds" not in tx
    seen = anchor.inspect(created["id"])
    assert [(p["outcome"], p["stellar_transaction_id"], p["from"], p["amount"])
            for p in seen["payments"]] == [("matched", paid, HUB, "10.0000000")]
    assert seen["refund_payments"] == []
    assert hub.usdc() == before - 10


def test_a_second_payment_with_the_same_memo_is_kept_as_a_duplicate(anchor, hub):
    created = anchor.create(amount="1")
    hub.pay("1", memo_id=created["stellar_memo"])
    anchor.wait(created["id"], FINAL)

    again = hub.pay("1", memo_id=created["stellar_memo"])

    deadline = time.monotonic() + 5
    while len(anchor.inspect(created["id"])["payments"]) < 2:
        assert time.monotonic() < deadline, "the second payment was not seen"
        time.sleep(0.05)
    seen = anchor.inspect(created["id"])
    assert [(p["outcome"], p["stellar_transaction_id"]) for p in seen["payments"]][1] == (
        "duplicate", again)
    assert seen["status"] == "completed" and seen["refund_payments"] == []


@pytest.mark.parametrize(("amount", "asset", "message"), [
    ("9", USDC, "was 9.0000000, expected 10.0000000"),
    ("10.5", USDC, "was 10.5000000, expected 10.0000000"),
    ("10", Asset.native(), f"was native, expected USDC:{ISSUER}"),
])
def test_a_wrong_payment_is_an_error_and_is_not_refunded(anchor, hub, amount, asset, message):
    created = anchor.create()

    paid = hub.pay(amount, memo_id=created["stellar_memo"], asset=asset)
    tx = anchor.wait(created["id"], FINAL)

    assert tx["status"] == "error"
    assert tx["status_message"] == f"payment {paid} {message}"
    assert tx["stellar_transaction_id"] == paid
    time.sleep(0.3)
    assert anchor.history(created["id"]) == ["pending_sender", "error"]
    assert anchor.inspect(created["id"])["refund_payments"] == []


def test_payments_are_matched_by_memo_type_and_value_only(anchor, hub):
    created = anchor.create(amount="1")

    as_text = hub.pay("1", memo_text=created["stellar_memo"][:28])
    unknown = hub.pay("1", memo_id="7")

    deadline = time.monotonic() + 5
    while True:
        unmatched = {p["stellar_transaction_id"]: p
                     for p in anchor.inspect()["unmatched_payments"]}
        if {as_text, unknown} <= set(unmatched):
            break
        assert time.monotonic() < deadline, "the payments were not seen"
        time.sleep(0.05)
    assert {unmatched[h]["outcome"] for h in (as_text, unknown)} == {"no_match"}
    assert anchor.get(created["id"])["status"] == "pending_sender"


# --- faults ----------------------------------------------------------------------------------


def test_reject_before_funding_errors_at_once_and_refunds_a_late_payment(anchor, hub,
                                                                        clean_sandbox):
    clean_sandbox.fault("anchor31.reject_before_funding", times=1)
    before = hub.usdc()
    rejected = anchor.create()
    spared = anchor.create()  # times counts transactions

    tx = anchor.wait(rejected["id"], FINAL)
    assert (tx["status"], tx["status_message"]) == (
        "error", "rejected by the receiving anchor before funding")
    assert "refunds" not in tx and anchor.inspect(rejected["id"])["payments"] == []

    paid = hub.pay("10", memo_id=rejected["stellar_memo"])
    tx = anchor.wait(rejected["id"], {"refunded"})

    assert_refunded_on_chain(clean_sandbox, anchor, tx, paid)
    assert anchor.history(rejected["id"]) == ["pending_sender", "error", "refunded"]
    assert hub.usdc() == before
    assert anchor.get(spared["id"])["status"] == "pending_sender"


def test_refund_after_funding_sends_the_full_amount_back_with_the_same_memo(anchor, hub,
                                                                           clean_sandbox):
    clean_sandbox.fault("anchor31.refund_after_funding", times=1)
    before = hub.usdc()
    created = anchor.create()

    paid = hub.pay("10", memo_id=created["stellar_memo"])
    tx = anchor.wait(created["id"], FINAL)

    assert_refunded_on_chain(clean_sandbox, anchor, tx, paid)
    assert tx["status_message"] == "refunded to the sending anchor"
    assert anchor.history(created["id"]) == ["pending_sender", "pending_stellar", "refunded"]
    assert hub.usdc() == before
    nxt = anchor.create(amount="1")  # the switch fired once: the next one completes
    hub.pay("1", memo_id=nxt["stellar_memo"])
    assert anchor.wait(nxt["id"], FINAL)["status"] == "completed"


def test_refund_uses_the_refund_memo_when_one_was_given(anchor, hub, clean_sandbox):
    clean_sandbox.fault("anchor31.refund_after_funding", times=1)
    created = anchor.create(amount="1", refund_memo="rem-77", refund_memo_type="text")

    hub.pay("1", memo_id=created["stellar_memo"])
    tx = anchor.wait(created["id"], FINAL)

    assert tx["status"] == "refunded"
    on_chain, _ = horizon_tx(clean_sandbox, tx["refunds"]["payments"][0]["id"])
    assert (on_chain["memo_type"], on_chain["memo"]) == ("text", "rem-77")


def test_a_refund_whose_post_times_out_is_reposted_never_paid_twice(anchor, hub, clean_sandbox):
    clean_sandbox.fault("anchor31.refund_after_funding", times=1)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1, account=ANCHOR)
    created = anchor.create(amount="2")

    hub.pay("2", memo_id=created["stellar_memo"])
    tx = anchor.wait(created["id"], FINAL)

    assert tx["status"] == "refunded"
    [sent] = anchor.inspect(created["id"])["refund_payments"]
    assert "504" in sent["last_error"] or "Timeout" in sent["last_error"]
    page = httpx.get(f"{clean_sandbox.url}/horizon/accounts/{ANCHOR}/payments",
                     params={"order": "desc", "limit": 50, "join": "transactions"},
                     timeout=10).json()["_embedded"]["records"]
    refunds = [p for p in page if p.get("from") == ANCHOR
               and p["transaction"].get("memo") == created["stellar_memo"]]
    assert [(p["transaction_hash"], p["to"], p["amount"]) for p in refunds] == [
        (sent["hash"], HUB, "2.0000000")]


def test_a_refund_reposted_behind_a_lagging_horizon_is_paid_once(anchor, hub, clean_sandbox):
    """Chaos seed 7 (CI, 2026-12-03): the refund's POST answered 504 after it applied,
    the re-POST met ``tx_bad_seq`` while history lagged, and the anchor took that for a
    dead envelope and paid the refund again; Corridor's hub then held 2 USDC the ledger
    had not booked. A consumed sequence is not proof (horizon/NOTES.md §2.6, corrected)."""
    clean_sandbox.fault("anchor31.refund_after_funding", times=1)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1, account=ANCHOR)
    before = hub.usdc()
    created = anchor.create(amount="2")

    hub.pay("2", memo_id=created["stellar_memo"])
    clean_sandbox.fault("horizon.lookup_lag", ledgers=12)  # 3 s at 0.25 s ledgers
    deadline = time.monotonic() + 20
    while not any("tx_bad_seq" in r["last_error"]  # a re-POST met the lag
                  for r in anchor.inspect(created["id"])["refund_payments"]):
        assert time.monotonic() < deadline, anchor.inspect(created["id"])
        time.sleep(0.1)
    time.sleep(1.5)  # one more retry of the anchor's, lag still on
    clean_sandbox.fault("horizon.lookup_lag", times=0)
    tx = anchor.wait(created["id"], FINAL)

    assert tx["status"] == "refunded"
    page = httpx.get(f"{clean_sandbox.url}/horizon/accounts/{ANCHOR}/payments",
                     params={"order": "desc", "limit": 50, "join": "transactions"},
                     timeout=10).json()["_embedded"]["records"]
    refunds = [p["amount"] for p in page if p.get("from") == ANCHOR
               and p["transaction"].get("memo") == created["stellar_memo"]]
    assert refunds == ["2.0000000"]
    assert hub.usdc() == before


def test_fail_payout_ends_in_error_and_keeps_the_money(anchor, hub, clean_sandbox):
    clean_sandbox.fault("anchor31.fail_payout", times=1)
    before = hub.usdc()
    created = anchor.create()

    paid = hub.pay("10", memo_id=created["stellar_memo"])
    tx = anchor.wait(created["id"], FINAL)

    assert (tx["status"], tx["status_message"]) == ("error",
                                                    "payout failed at the receiving bank")
    assert tx["stellar_transaction_id"] == paid
    assert anchor.history(created["id"]) == ["pending_sender", "pending_stellar",
                                             "pending_receiver", "error"]
    time.sleep(0.5)  # several settle delays: nothing more happens
    assert anchor.get(created["id"])["status"] == "error"
    assert "refunds" not in anchor.get(created["id"])
    assert anchor.inspect(created["id"])["refund_payments"] == []
    assert hub.usdc() == before - 10


def test_fail_payout_then_refund_says_error_first_and_refunds_later(anchor, hub,
                                                                    clean_sandbox):
    clean_sandbox.fault("anchor31.fail_payout_then_refund", times=1)
    before = hub.usdc()
    created = anchor.create()

    paid = hub.pay("10", memo_id=created["stellar_memo"])
    failed = anchor.wait(created["id"], FINAL)
    assert (failed["status"], failed["status_message"]) == (
        "error", "payout failed at the receiving bank")
    assert "refunds" not in failed and hub.usdc() == before - 10
    tx = anchor.wait(created["id"], {"refunded"})  # SANDBOX_ANCHOR31_LATE_REFUND_S later

    assert_refunded_on_chain(clean_sandbox, anchor, tx, paid)
    assert anchor.history(created["id"]) == ["pending_sender", "pending_stellar",
                                             "pending_receiver", "error", "refunded"]
    assert hub.usdc() == before


@pytest.mark.parametrize("fault", ["anchor31.slow", "anchor31.step_delay"])
def test_slow_and_step_delay_space_every_status_step(anchor, hub, clean_sandbox, fault):
    clean_sandbox.fault(fault, times=1 if fault == "anchor31.slow" else None, seconds=0.4)
    created = anchor.create(amount="1")

    hub.pay("1", memo_id=created["stellar_memo"])
    tx = anchor.wait(created["id"], FINAL)

    assert tx["status"] == "completed"
    assert anchor.history(created["id"]) == ["pending_sender", "pending_stellar",
                                             "pending_receiver", "completed"]
    assert all(gap >= 0.39 for gap in gaps(anchor, created["id"])[1:])


def test_http_5xx_answers_503_for_the_next_calls_and_does_nothing(anchor, clean_sandbox):
    clean_sandbox.fault("anchor31.http_5xx", times=2)
    known = anchor.ids()

    answers = [anchor.http.post("/transactions", json=BODY, headers=AUTH),
               anchor.http.get("/info", headers=AUTH),
               anchor.http.post("/transactions", json=BODY, headers=AUTH)]

    assert [(a.status_code, a.json().get("error")) for a in answers[:2]] == [
        (503, "service unavailable")] * 2
    assert answers[2].status_code == 201
    assert anchor.ids() - known == {answers[2].json()["id"]}


# --- the partner wallet ----------------------------------------------------------------------


def test_partner_wallet_pays_usdc_with_a_memo(clean_sandbox):
    sandbox = clean_sandbox
    shown = httpx.get(f"{sandbox.url}/anchor31/sandbox/partner", timeout=10).json()
    assert shown["account"] == PARTNER
    before = Decimal(shown["usdc_balance"])

    response = partner_pay(sandbox, destination=HUB, amount="1.5", memo_type="text",
                           memo="rem-42")

    assert response.status_code == 200, response.text
    tx, payments = horizon_tx(sandbox, response.json()["hash"])
    assert (tx["source_account"], tx["memo_type"], tx["memo"]) == (PARTNER, "text", "rem-42")
    assert [(p["from"], p["to"], p["asset_code"], p["amount"]) for p in payments] == [
        (PARTNER, HUB, "USDC", "1.5000000")]
    after = httpx.get(f"{sandbox.url}/anchor31/sandbox/partner", timeout=10).json()
    assert Decimal(after["usdc_balance"]) == before - Decimal("1.5")


def test_partner_wallet_id_and_hash_memos(clean_sandbox):
    cases = [("id", "18446744073709551615", ("id", "18446744073709551615")),
             ("hash", "ab" * 32, ("hash", "q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s="))]

    memos = []
    for memo_type, memo, _ in cases:
        response = partner_pay(clean_sandbox, destination=HUB, amount="0.1",
                               memo_type=memo_type, memo=memo)
        assert response.status_code == 200, response.text
        tx, _ = horizon_tx(clean_sandbox, response.json()["hash"])
        memos.append((tx["memo_type"], tx["memo"]))

    assert memos == [expected for _, _, expected in cases]


REFUSED_PAYS = [
    ({"destination": "GNOPE", "amount": "1"}, "destination must be a G... or M... account"),
    ({"destination": HUB, "amount": "1.12345678"},
     "amount must be positive with at most 7 decimal places"),
    ({"destination": HUB, "amount": "x"}, "amount must be a decimal string"),
    ({"destination": HUB, "amount": "1", "memo_type": "text", "memo": "y" * 29},
     "a text memo is at most 28 bytes"),
    ({"destination": HUB, "amount": "1", "memo_type": "id", "memo": str(2**64)},
     "an id memo is a decimal unsigned 64-bit integer"),
    ({"destination": HUB, "amount": "1", "memo_type": "return", "memo": "1"},
     "memo_type must be id, text or hash"),
]


def test_partner_wallet_refuses_bad_requests(clean_sandbox):
    before = httpx.get(f"{clean_sandbox.url}/anchor31/sandbox/partner", timeout=10).json()

    answers = [partner_pay(clean_sandbox, **body) for body, _ in REFUSED_PAYS]

    assert [(a.status_code, a.json()["error"]) for a in answers] == [
        (400, error) for _, error in REFUSED_PAYS]
    after = httpx.get(f"{clean_sandbox.url}/anchor31/sandbox/partner", timeout=10).json()
    assert after == before


def test_partner_wallet_reports_a_failed_payment(clean_sandbox):
    stranger = Keypair.random().public_key  # no such account

    response = partner_pay(clean_sandbox, destination=stranger, amount="1")

    assert response.status_code == 400
    assert response.json()["result_codes"] == {"transaction": "tx_failed",
                                               "operations": ["op_no_destination"]}
