"""The RazorpayX account statement and balance of the sandbox, and Corridor's read clients
for them (razorpay/TREASURY.md §4.2, §5), over real HTTP.

Payouts are made through ``tests.sandbox.razorpayx_calls``; its ``receiver``
fixture records their webhooks, sets the settle delay to 0.2 s and waits on the way out
until every payout of the test is at rest. Tests run one after another in a session, so
the balance moves only by this test's rows while it runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from anchor import razorpay as rzp
from payouts import statement as client
from sandbox.razorpay.payouts import fee_and_tax
from tests.flows import wait_for
from tests.sandbox import razorpayx_calls
from tests.sandbox.razorpayx_calls import (
    ACCOUNT_NUMBER,
    api,
    bank_account,
    create_payout,
    deliveries,
    error,
    events,
    get_payout,
    received,
    reference,
    status_of,
    vpa_account,
)


@pytest.fixture
def receiver(settings, clean_sandbox):
    """The recording webhook receiver (tests/sandbox/razorpayx_calls.py)."""
    yield from razorpayx_calls.receiving(settings, clean_sandbox)

# docs api/x/transactions/entity and fetch-all (no reference payload file holds a payout
# or bank transfer row): keys in the docs' order
TRANSACTION_KEYS = ["id", "entity", "account_number", "amount", "currency", "credit", "debit",
                    "balance", "source", "created_at"]
PAYOUT_SOURCE_KEYS = ["id", "entity", "fund_account_id", "amount", "notes", "fees", "tax",
                      "status", "utr", "mode", "created_at", "fee_type"]
BANK_TRANSFER_SOURCE_KEYS = ["id", "entity", "payer_name", "payer_account", "payer_ifsc",
                             "mode", "bank_reference", "amount"]
# docs api/x/account-validation/balance-fetch, current_account sample (TREASURY §4.2)
BALANCE_KEYS = ["entity", "currency", "account_number", "account_type", "bank_name",
                "bank_code", "amount", "available_amount", "refreshed_at"]


def transactions(sandbox, **params) -> httpx.Response:
    return api(sandbox, "GET", "/transactions", params={"account_number": ACCOUNT_NUMBER,
                                                        **params})


def whole_statement(sandbox) -> list[dict]:
    """Every row, newest first."""
    rows, skip = [], 0
    while True:
        page = transactions(sandbox, count=100, skip=skip).json()["items"]
        rows += page
        if len(page) < 100:
            return rows
        skip += 100


def rows_of(sandbox, payout_id: str) -> list[dict]:
    """The payout's rows, oldest first."""
    return [r for r in reversed(whole_statement(sandbox))
            if payout_id in (r["source"]["id"], r["source"].get("payout_id"))]


def balance(sandbox) -> int:
    items = api(sandbox, "GET", "/banking_balances").json()["items"]
    return next(i["amount"] for i in items if i["account_number"] == ACCOUNT_NUMBER)


def top_up(sandbox, **body) -> httpx.Response:
    return httpx.post(f"{sandbox.url}/razorpay/sandbox/banking_balances/topup", json=body,
                      timeout=10)


# --- rows and shapes ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_payout_is_one_debit_row_with_fees_taken_from_the_balance(sandbox, receiver):  # noqa: F811
    before = balance(sandbox)
    fees, tax = fee_and_tax("IMPS")

    payout, _ = create_payout(sandbox, bank_account(sandbox), mode="IMPS", amount=40000)
    processed = status_of(sandbox, payout["id"], "processed")

    [row] = rows_of(sandbox, payout["id"])
    assert list(row) == TRANSACTION_KEYS and list(row["source"]) == PAYOUT_SOURCE_KEYS
    assert row["id"].startswith("txn_")
    assert {k: row[k] for k in ("entity", "account_number", "amount", "currency", "credit",
                                "debit", "balance")} == {
        "entity": "transaction", "account_number": ACCOUNT_NUMBER, "amount": 40000,
        "currency": "INR", "credit": 0, "debit": 40000, "balance": before - 40000 - fees}
    assert row["source"] == {
        "id": payout["id"], "entity": "payout", "fund_account_id": payout["fund_account_id"],
        "amount": 40000, "notes": payout["notes"], "fees": fees, "tax": tax,
        "status": "processed", "utr": processed["utr"], "mode": "IMPS",
        "created_at": payout["created_at"], "fee_type": None}
    assert balance(sandbox) == row["balance"]
    assert api(sandbox, "GET", f"/transactions/{row['id']}").json() == row


@pytest.mark.django_db(transaction=True)
def test_a_reversal_credits_amount_and_fees_as_the_webhook_says(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.3)
    ref_entity = reference("webhook_transaction_created_reversal.json")["payload"][
        "transaction"]["entity"]
    before = balance(sandbox)
    fees, tax = fee_and_tax("UPI")

    payout, _ = create_payout(sandbox, vpa_account(sandbox), amount=25000)
    got = received(receiver, payout["id"], 5)

    debit, credit = rows_of(sandbox, payout["id"])
    webhook = got[4]["body"]["payload"]["transaction"]["entity"]
    assert events(got)[-1] == "transaction.created"
    assert credit == webhook  # same id, same running balance
    # the reference file's keys are sorted: compare sets, and the docs' order for the row
    assert set(credit) == set(ref_entity) and set(credit["source"]) == set(
        ref_entity["source"])
    assert list(credit) == TRANSACTION_KEYS
    assert (credit["credit"], credit["debit"], credit["amount"]) == (25000 + fees, 0,
                                                                    25000 + fees)
    assert {k: credit["source"][k] for k in ("entity", "payout_id", "fee", "tax", "utr")} == {
        "entity": "reversal", "payout_id": payout["id"], "fee": fees, "tax": tax,
        "utr": get_payout(sandbox, payout["id"])["utr"]}
    assert debit["source"]["status"] == "reversed"
    assert credit["balance"] == before == balance(sandbox)


@pytest.mark.django_db(transaction=True)
def test_a_failed_payout_is_credited_back_without_a_transaction_webhook(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpayx.fail_payout", times=1)
    before = balance(sandbox)

    payout, _ = create_payout(sandbox, bank_account(sandbox))
    status_of(sandbox, payout["id"], "failed")

    debit, credit = rows_of(sandbox, payout["id"])
    assert (debit["debit"], credit["credit"]) == (29935, 29935 + fee_and_tax("IMPS")[0])
    assert credit["source"]["entity"] == "reversal" and credit["balance"] == before
    wait_for(lambda: all(d["delivered"] for d in deliveries(sandbox, entity_id=payout["id"])))
    assert "transaction.created" not in [d["event"] for d in deliveries(
        sandbox, entity_id=payout["id"])]


@pytest.mark.django_db(transaction=True)
def test_top_up_is_a_bank_transfer_credit(sandbox, receiver):  # noqa: F811
    before = balance(sandbox)

    response = top_up(sandbox, amount=5_000_00, payer_name="Corridor Treasury",
                      payer_account="0000000000000002", payer_ifsc="HDFC0000001", mode="IMPS")

    assert response.status_code == 200, response.text
    row = response.json()
    assert list(row) == TRANSACTION_KEYS and list(row["source"]) == BANK_TRANSFER_SOURCE_KEYS
    assert (row["credit"], row["debit"], row["amount"], row["balance"]) == (
        5_000_00, 0, 5_000_00, before + 5_000_00)
    assert row["source"] | {"id": None, "bank_reference": None} == {
        "id": None, "entity": "bank_transfer", "payer_name": "Corridor Treasury",
        "payer_account": "0000000000000002", "payer_ifsc": "HDFC0000001", "mode": "IMPS",
        "bank_reference": None, "amount": 5_000_00}
    assert row["source"]["id"].startswith("bt_") and row["source"]["bank_reference"]
    assert whole_statement(sandbox)[0] == row
    assert balance(sandbox) == before + 5_000_00
    for body, field in [({"amount": 99}, "amount"), ({"amount": 100.0}, "amount"),
                        ({"amount": 1000, "mode": "UPI"}, "mode"),
                        ({"amount": 1000, "utr": "x"}, "utr")]:
        refused = top_up(sandbox, **body)
        assert (refused.status_code, refused.json()["error"]["field"]) == (400, field), body
    assert balance(sandbox) == before + 5_000_00


@pytest.mark.django_db(transaction=True)
def test_banking_balances_show_our_lite_account_in_the_docs_shape(sandbox, receiver):  # noqa: F811
    response = api(sandbox, "GET", "/banking_balances")

    body = response.json()
    assert (response.status_code, body["entity"], body["count"]) == (200, "collection", 1)
    [item] = body["items"]
    assert list(item) == BALANCE_KEYS
    assert item | {"amount": None, "available_amount": None, "refreshed_at": None} == {
        "entity": "banking_balance", "currency": "INR", "account_number": ACCOUNT_NUMBER,
        "account_type": "razorpayx_lite", "bank_name": None, "bank_code": None,
        "amount": None, "available_amount": None, "refreshed_at": None}
    assert item["available_amount"] == item["amount"] == whole_statement(sandbox)[0]["balance"]
    assert abs(item["refreshed_at"] - datetime.now(tz=UTC).timestamp()) < 5
    lite = api(sandbox, "GET", "/banking_balances", params={"account_type": "razorpayx_lite"})
    assert lite.json()["items"] == [item | {"refreshed_at": lite.json()["items"][0][
        "refreshed_at"]}]
    assert api(sandbox, "GET", "/banking_balances",
               params={"account_type": "current_account"}).json()["items"] == []
    bad = api(sandbox, "GET", "/banking_balances", params={"account_type": "Current_Account"})
    assert (bad.status_code, bad.json()) == (400, error("The selected account type is invalid.",
                                                        "account_type"))


# --- statement paging, bounds and the running balance ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_statement_pages_newest_first_and_balances_run(sandbox, receiver):  # noqa: F811
    for amount in (1000, 2000, 3000):
        top_up(sandbox, amount=amount).raise_for_status()
    create_payout(sandbox, bank_account(sandbox))

    everything = whole_statement(sandbox)
    paged = [transactions(sandbox, count=1, skip=i).json()["items"][0]
             for i in range(min(len(everything), 8))]

    # ids: a payout row's source moves on (processing -> processed) between the reads
    assert [r["id"] for r in paged] == [r["id"] for r in everything[:len(paged)]]
    assert [r["credit"] for r in everything[1:4]] == [3000, 2000, 1000]
    oldest_first = list(reversed(everything))
    assert oldest_first[0]["source"]["entity"] == "bank_transfer"  # the opening balance
    assert oldest_first[0]["balance"] == oldest_first[0]["credit"]
    for previous, row in zip(oldest_first, oldest_first[1:], strict=False):
        fees = row["source"]["fees"] if row["source"]["entity"] == "payout" else 0
        assert row["balance"] == previous["balance"] + row["credit"] - row["debit"] - fees
    assert everything[0]["balance"] == balance(sandbox)
    newest = everything[0]["created_at"]
    assert transactions(sandbox, **{"from": newest + 1}).json()["items"] == []
    assert everything[0]["id"] in {r["id"] for r in transactions(
        sandbox, **{"from": newest, "to": newest}).json()["items"]}
    assert transactions(sandbox).json()["count"] <= 10


STATEMENT_ERRORS = [
    ({"account_number": None}, "The account number field is required.", "account_number"),
    ({"account_number": "0000000000000009"}, "The RazorpayX Account number is invalid",
     "account_number"),
    ({"count": "101"}, "The count must be between 1 and 100.", "count"),
    ({"count": "0"}, "The count must be between 1 and 100.", "count"),
    ({"from": "yesterday"}, "The from must be an integer.", "from"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("params", "description", "field"), STATEMENT_ERRORS)
def test_statement_refuses_bad_parameters(sandbox, params, description, field):
    query = {"account_number": ACCOUNT_NUMBER} | params
    response = api(sandbox, "GET", "/transactions",
                   params={k: v for k, v in query.items() if v is not None})

    assert (response.status_code, response.json()) == (400, error(description, field))


@pytest.mark.django_db(transaction=True)
def test_unknown_transaction_is_a_razorpay_400(sandbox):
    response = api(sandbox, "GET", "/transactions/txn_00000000000000")

    assert (response.status_code, response.json()) == (400, error(
        "The id provided does not exist", None))


# --- faults -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_fault_reversal_statement_only_sends_no_webhook(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpayx.reversal_statement_only", times=1, after_s=0.3)
    before = balance(sandbox)

    payout, _ = create_payout(sandbox, bank_account(sandbox))
    status_of(sandbox, payout["id"], "reversed")

    debit, credit = rows_of(sandbox, payout["id"])
    assert credit["source"]["entity"] == "reversal" and credit["balance"] == before
    wait_for(lambda: all(d["delivered"] for d in deliveries(sandbox, entity_id=payout["id"])))
    assert [d["event"] for d in deliveries(sandbox, entity_id=payout["id"])] == [
        "payout.initiated", "payout.updated", "payout.processed"]
    assert events(receiver.for_payout(payout["id"])) == [
        "payout.initiated", "payout.updated", "payout.processed"]


@pytest.mark.django_db(transaction=True)
def test_fault_statement_fee_mismatch_charges_other_fees_than_the_payout(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpayx.statement_fee_mismatch", times=1, fees_extra=118, tax_extra=18)
    before = balance(sandbox)
    fees, tax = fee_and_tax("IMPS")

    payout, _ = create_payout(sandbox, bank_account(sandbox), amount=50000)

    [row] = rows_of(sandbox, payout["id"])
    assert (get_payout(sandbox, payout["id"])["fees"], payout["tax"]) == (fees, tax)
    assert (row["source"]["fees"], row["source"]["tax"]) == (fees + 118, tax + 18)
    assert row["balance"] == before - 50000 - fees - 118 == balance(sandbox)


# --- Corridor's clients -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_clients_read_balance_and_the_whole_statement_oldest_first(sandbox, receiver,  # noqa: F811
                                                                   monkeypatch):
    sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=0.2)
    since = datetime.now(tz=UTC) - timedelta(seconds=1)
    topped = top_up(sandbox, amount=7_000_00).json()
    payout, _ = create_payout(sandbox, bank_account(sandbox), amount=12345)
    reversed_ = status_of(sandbox, payout["id"], "reversed")
    monkeypatch.setattr(client, "PAGE", 1)

    rows = client.statement(since, datetime.now(tz=UTC) + timedelta(seconds=1))
    now = client.balance()

    fees, tax = fee_and_tax("IMPS")
    assert [r.transaction_id for r in rows] == [
        r["id"] for r in reversed(whole_statement(sandbox))
        if r["created_at"] >= int(since.timestamp())]
    top, debit, credit = (next(r for r in rows if r.transaction_id == topped["id"]),
                          *[r for r in rows if r.payout_id == payout["id"]])
    assert (top.kind, top.credit_paise, top.bank_reference) == (
        "bank_transfer", 7_000_00, topped["source"]["bank_reference"])
    assert (debit.kind, debit.source_id, debit.debit_paise, debit.fees_paise, debit.tax_paise,
            debit.utr, debit.status, debit.mode, debit.balance_change_paise) == (
        "payout", payout["id"], 12345, fees, tax, reversed_["utr"], "reversed", "IMPS",
        -12345 - fees)
    assert (credit.kind, credit.credit_paise, credit.fees_paise, credit.utr,
            credit.balance_change_paise) == ("reversal", 12345 + fees, fees, reversed_["utr"],
                                             12345 + fees)
    for previous, row in zip(rows, rows[1:], strict=False):
        assert row.balance_paise == previous.balance_paise + row.balance_change_paise
    assert rows[-1].balance_paise == now.amount_paise == now.available_paise
    assert (now.account_number, now.account_type) == (ACCOUNT_NUMBER, "razorpayx_lite")
    assert now.available == rzp.paise_to_rupees(now.amount_paise)
    assert abs((now.refreshed_at - datetime.now(tz=UTC)).total_seconds()) < 5
    assert rows[0].created_at >= since.replace(microsecond=0)


@pytest.mark.django_db(transaction=True)
def test_clients_raise_clear_errors(sandbox, settings):
    with pytest.raises(rzp.RazorpayError, match="no banking_balance for account 999"):
        client.balance("999")
    with pytest.raises(rzp.RazorpayError, match="statement: HTTP 400"):
        client.statement(datetime.now(tz=UTC), datetime.now(tz=UTC), account_number="999")
    with pytest.raises(rzp.RazorpayError, match="not integer paise"):
        client.StatementRow.parse({"id": "txn_x", "amount": "100", "credit": 0, "debit": 100,
                                   "balance": 0, "source": {"entity": "payout"}})
    settings.RAZORPAY_API_URL = "http://127.0.0.1:9"
    with pytest.raises(rzp.RazorpayError, match="balance: ConnectError"):
        client.balance()
