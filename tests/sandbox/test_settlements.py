"""Settlements of the Razorpay (pay-ins) stand-in and Corridor's read clients for them
(razorpay/TREASURY.md §3), over real HTTP.

The sandbox runs with ``SANDBOX_SETTLEMENT_CYCLE_S=1`` (tests/conftest.py): a payment
captured during second k settles at the start of second k + 2, with every payment captured
during second k. Payments are made through ``tests.sandbox.test_razorpay``'s helpers, their
webhooks recorded by its ``receiver`` fixture. Other tests of the session settle payments
too, so every assertion picks out this test's own rows.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import httpx
import pytest

from anchor import razorpay as rzp
from sandbox.razorpay.payins import fee_and_tax
from tests.flows import wait_for
from tests.sandbox import razorpay_calls
from tests.sandbox.razorpay_calls import (
    auth,
    error,
    paid_order,
    reference,
)


@pytest.fixture
def receiver(settings, clean_sandbox):
    """The recording webhook receiver (tests/sandbox/razorpay_calls.py)."""
    yield from razorpay_calls.receiving(settings, clean_sandbox)

IST = ZoneInfo("Asia/Kolkata")
CYCLE_S = 1
# docs api/settlements/entity (no reference payload file holds a settlement entity)
SETTLEMENT_KEYS = ["id", "entity", "amount", "status", "fees", "tax", "utr", "created_at"]


def get(sandbox, path: str, **params) -> httpx.Response:
    return httpx.get(f"{sandbox.url}/razorpay/v1{path}", params=params, auth=auth(), timeout=10)


def ist_day(unix: int) -> date:
    return datetime.fromtimestamp(unix, tz=IST).date()


def recon(sandbox, day: date, **params) -> list[dict]:
    """Every recon row of ``day`` (paged by 1000)."""
    rows, skip = [], 0
    while True:
        response = get(sandbox, "/settlements/recon/combined", year=f"{day.year}",
                       month=f"{day.month:02d}", day=f"{day.day:02d}", count=1000, skip=skip,
                       **params)
        assert response.status_code == 200, response.text
        page = response.json()["items"]
        rows += page
        if len(page) < 1000:
            return rows
        skip += 1000


def today() -> date:
    return datetime.now(tz=IST).date()


def settled_rows(sandbox, payment_ids: list[str], timeout: float = 10.0) -> dict[str, dict]:
    """The recon rows of ``payment_ids`` once all of them are settled."""

    def found():
        days = {today()}
        rows = {r["entity_id"]: r for d in days for r in recon(sandbox, d)
                if r["entity_id"] in payment_ids}
        return rows if len(rows) == len(payment_ids) else None

    return wait_for(found, timeout=timeout, what=f"settlement of {payment_ids}")


def rows_of(sandbox, settlement_id: str, day: date) -> list[dict]:
    return [r for r in recon(sandbox, day) if r["settlement_id"] == settlement_id]


def pay(sandbox, **body) -> tuple[dict, dict]:
    order, paid = paid_order(sandbox, **body)
    return order, paid["payment"]


# --- the cycle and the shapes ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_captured_payment_settles_after_the_cycle_in_the_docs_shapes(sandbox, receiver):  # noqa: F811
    ref_row = next(r for r in reference("api_settlement_recon_combined.json")["items"]
                   if r["type"] == "payment")

    order, payment = pay(sandbox, method="upi")

    assert payment["id"] not in {r["entity_id"] for r in recon(sandbox, today())}
    row = settled_rows(sandbox, [payment["id"]])[payment["id"]]
    fee, tax = fee_and_tax(order["amount"])
    assert list(row) == list(ref_row)
    assert row | {"settlement_id": None, "settlement_utr": None, "settled_at": None} == {
        "entity_id": payment["id"], "type": "payment", "debit": 0,
        "credit": order["amount"] - fee, "amount": order["amount"], "currency": "INR",
        "fee": fee, "tax": tax, "on_hold": False, "settled": True,
        "created_at": payment["created_at"], "settled_at": None, "settlement_id": None,
        "posted_at": None, "credit_type": "default", "description": None, "notes": [],
        "payment_id": None, "settlement_utr": None, "order_id": order["id"],
        "order_receipt": order["receipt"], "method": "upi", "card_network": None,
        "card_issuer": None, "card_type": None, "dispute_id": None}
    assert (row["fee"], row["tax"]) == (payment["fee"], payment["tax"])
    # captured during second k, settled at the start of second k + 2 or later
    assert row["settled_at"] >= payment["created_at"] + 2 * CYCLE_S
    settlement = get(sandbox, f"/settlements/{row['settlement_id']}").json()
    assert list(settlement) == SETTLEMENT_KEYS
    assert settlement | {"amount": None, "created_at": None} == {
        "id": row["settlement_id"], "entity": "settlement", "amount": None,
        "status": "processed", "fees": 0, "tax": 0, "utr": row["settlement_utr"],
        "created_at": None}
    assert settlement["id"].startswith("setl_") and len(settlement["utr"]) == 16
    assert settlement["created_at"] == row["settled_at"]
    members = rows_of(sandbox, settlement["id"], ist_day(row["settled_at"]))
    assert settlement["amount"] == sum(r["credit"] - r["debit"] for r in members)


@pytest.mark.django_db(transaction=True)
def test_payments_captured_in_one_cycle_share_one_settlement(sandbox, receiver):  # noqa: F811
    payments = [pay(sandbox, method=m)[1] for m in ("upi", "netbanking", "card", "upi")]

    rows = settled_rows(sandbox, [p["id"] for p in payments])

    for a in payments:
        for b in payments:
            same_cycle = a["created_at"] // CYCLE_S == b["created_at"] // CYCLE_S
            assert (rows[a["id"]]["settlement_id"] == rows[b["id"]]["settlement_id"]) == (
                same_cycle), (a, b)
    card = rows[payments[2]["id"]]
    assert (card["method"], card["card_network"], card["card_type"]) == ("card", "Visa",
                                                                         "debit")


@pytest.mark.django_db(transaction=True)
def test_a_late_capture_settles_from_its_capture_time(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpay.payment_failed_then_captured", times=1, delay_s=1.2)

    _, payment = pay(sandbox)

    row = settled_rows(sandbox, [payment["id"]])[payment["id"]]
    assert row["settled_at"] >= payment["created_at"] + 1 + 2 * CYCLE_S
    assert row["created_at"] == payment["created_at"]


@pytest.mark.django_db(transaction=True)
def test_a_processed_refund_is_deducted_from_the_next_settlement(sandbox, receiver):  # noqa: F811
    ref_row = next(r for r in reference("api_settlement_recon_combined.json")["items"]
                   if r["type"] == "refund")
    order, payment = pay(sandbox, method="upi")
    created = httpx.post(f"{sandbox.url}/razorpay/v1/payments/{payment['id']}/refund",
                         json={"amount": 10000, "notes": {"why": "test"}}, auth=auth(),
                         timeout=10)
    assert created.status_code == 200, created.text
    refund = created.json()

    rows = settled_rows(sandbox, [payment["id"], refund["id"]])

    row = rows[refund["id"]]
    assert list(row) == list(ref_row)
    assert row | {"settlement_id": None, "settlement_utr": None, "settled_at": None} == {
        "entity_id": refund["id"], "type": "refund", "debit": 10000, "credit": 0,
        "amount": 10000, "currency": "INR", "fee": 0, "tax": 0, "on_hold": False,
        "settled": True, "created_at": refund["created_at"], "settled_at": None,
        "settlement_id": None, "posted_at": None, "credit_type": "default",
        "description": None, "notes": {"why": "test"}, "payment_id": payment["id"],
        "settlement_utr": None, "order_id": order["id"], "order_receipt": order["receipt"],
        "method": "upi", "card_network": None, "card_issuer": None, "card_type": None,
        "dispute_id": None}
    fetched = get(sandbox, f"/refunds/{refund['id']}").json()
    assert fetched["status"] == "processed"
    # the payment settles whole (its refund is a row of its own), the refund at the first
    # boundary after its processing
    assert rows[payment["id"]]["credit"] == order["amount"] - fee_and_tax(order["amount"])[0]
    assert row["settled_at"] > refund["created_at"]
    settlement = get(sandbox, f"/settlements/{row['settlement_id']}").json()
    members = rows_of(sandbox, row["settlement_id"], ist_day(row["settled_at"]))
    assert refund["id"] in {r["entity_id"] for r in members}
    assert settlement["amount"] == sum(r["credit"] - r["debit"] for r in members)
    item = next(i for i in rzp.settlement_recon(ist_day(row["settled_at"]))
                if i.entity_id == refund["id"])
    assert (item.type, item.debit_paise, item.net_paise, item.payment_id) == (
        "refund", 10000, -10000, payment["id"])


# --- listing, paging and errors ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_recon_pages_with_count_and_skip_in_a_stable_order(sandbox, receiver):  # noqa: F811
    payments = [pay(sandbox)[1] for _ in range(3)]
    settled_rows(sandbox, [p["id"] for p in payments])
    day = today()

    def walk() -> tuple[list, list]:
        """The day's rows at once and one by one. The session's sandbox keeps settling
        earlier tests' payments: a walk during which the day grew is walked again."""
        for _ in range(5):
            everything = recon(sandbox, day)
            one_by_one = []
            for skip in range(len(everything) + 1):
                page = get(sandbox, "/settlements/recon/combined", year=day.year,
                           month=day.month, day=day.day, count=1, skip=skip).json()
                assert page["entity"] == "collection" and page["count"] == len(page["items"])
                one_by_one += page["items"]
            if recon(sandbox, day) == everything:
                return everything, one_by_one
        raise AssertionError("the day's settlements never stood still for one walk")

    everything, one_by_one = walk()
    assert one_by_one == everything
    settled = [r["settled_at"] for r in everything]
    assert settled == sorted(settled)
    month = get(sandbox, "/settlements/recon/combined", year=day.year, month=day.month,
                count=1000).json()["items"]
    assert {r["entity_id"] for r in everything} <= {r["entity_id"] for r in month}
    assert get(sandbox, "/settlements/recon/combined", year=2001, month=1,
               day=1).json() == {"entity": "collection", "count": 0, "items": []}
    default = get(sandbox, "/settlements/recon/combined", year=day.year, month=day.month,
                  day=day.day).json()
    assert default["items"] == everything[:10]


RECON_ERRORS = [
    ({"month": "06"}, "The year field is required.", "year"),
    ({"year": "22", "month": "06"}, "The year must be 4 digits.", "year"),
    ({"year": "2022"}, "The month field is required.", "month"),
    ({"year": "2022", "month": "13"}, "The month is not a valid month.", "month"),
    ({"year": "2022", "month": "06", "day": "123"}, "The day must be between 1 and 2 digits.",
     "day"),
    ({"year": "2022", "month": "02", "day": "30"}, "The day is not a valid day.", "day"),
    ({"year": "2022", "month": "06", "count": "0"}, "The count must be at least 1.", "count"),
    ({"year": "2022", "month": "06", "count": "1001"},
     "The count may not be greater than 1000.", "count"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("params", "description", "field"), RECON_ERRORS)
def test_recon_refuses_bad_dates_and_counts(sandbox, params, description, field):
    response = get(sandbox, "/settlements/recon/combined", **params)

    assert response.status_code == 400
    assert response.json() == error(description, field)


@pytest.mark.django_db(transaction=True)
def test_settlements_list_newest_first_with_bounds_and_paging(sandbox, receiver):  # noqa: F811
    payments = [pay(sandbox)[1] for _ in range(2)]
    rows = settled_rows(sandbox, [p["id"] for p in payments])
    ours = {r["settlement_id"] for r in rows.values()}
    newest = max(r["settled_at"] for r in rows.values())

    listed = get(sandbox, "/settlements", count=100, to=newest).json()["items"]
    paged = [get(sandbox, "/settlements", count=1, skip=i, to=newest).json()["items"][0]
             for i in range(len(listed))]

    assert paged == listed
    assert ours <= {s["id"] for s in listed}
    created = [s["created_at"] for s in listed]
    assert created == sorted(created, reverse=True)
    assert all(list(s) == SETTLEMENT_KEYS for s in listed)
    assert get(sandbox, "/settlements", **{"from": newest + 3600}).json()["items"] == []
    assert get(sandbox, "/settlements").json()["count"] <= 10
    assert get(sandbox, "/settlements", count=0).json() == error(
        "The count must be at least 1.", "count")
    assert get(sandbox, "/settlements", **{"from": 5}).json() == error(
        "from must be between 946684800 and 4765046400", "from")
    unknown = get(sandbox, "/settlements/setl_00000000000000")
    assert (unknown.status_code, unknown.json()) == (400, error(
        "The id provided does not exist", None))
    assert httpx.get(f"{sandbox.url}/razorpay/v1/settlements", timeout=10).status_code == 401


# --- faults -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_fault_omit_payment_leaves_it_out_of_every_settlement(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpay.settlement_omit_payment", times=1)
    _, left_out = pay(sandbox)
    _, normal = pay(sandbox)

    row = settled_rows(sandbox, [normal["id"]])[normal["id"]]
    wait_for(lambda: datetime.now(tz=UTC).timestamp() > row["settled_at"] + 2 * CYCLE_S)

    assert left_out["id"] not in {r["entity_id"] for r in recon(sandbox, today())}
    assert get(sandbox, f"/payments/{left_out['id']}").json()["status"] == "captured"


@pytest.mark.django_db(transaction=True)
def test_fault_omit_payment_listed_pays_less_than_the_rows(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpay.settlement_omit_payment", times=1, listed=True)
    _, unpaid = pay(sandbox)

    row = settled_rows(sandbox, [unpaid["id"]])[unpaid["id"]]
    settlement = get(sandbox, f"/settlements/{row['settlement_id']}").json()
    members = rows_of(sandbox, row["settlement_id"], ist_day(row["settled_at"]))

    assert row["settled"] is True
    assert settlement["amount"] == sum(r["credit"] - r["debit"] for r in members) - row[
        "credit"]


@pytest.mark.django_db(transaction=True)
def test_fault_fee_mismatch_charges_another_fee_than_the_payment_shows(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpay.settlement_fee_mismatch", times=1, fee_extra=150, tax_extra=27)
    order, payment = pay(sandbox)

    row = settled_rows(sandbox, [payment["id"]])[payment["id"]]
    fetched = get(sandbox, f"/payments/{payment['id']}").json()

    assert (fetched["fee"], fetched["tax"]) == fee_and_tax(order["amount"])
    assert (row["fee"], row["tax"]) == (fetched["fee"] + 150, fetched["tax"] + 27)
    assert row["credit"] == order["amount"] - row["fee"]
    settlement = get(sandbox, f"/settlements/{row['settlement_id']}").json()
    members = rows_of(sandbox, row["settlement_id"], ist_day(row["settled_at"]))
    assert settlement["amount"] == sum(r["credit"] - r["debit"] for r in members)


@pytest.mark.django_db(transaction=True)
def test_fault_settlement_delay_settles_cycles_later(sandbox, receiver):  # noqa: F811
    sandbox.fault("razorpay.settlement_delay", times=1, cycles=2)
    _, late = pay(sandbox)
    _, normal = pay(sandbox)

    rows = settled_rows(sandbox, [late["id"], normal["id"]])

    assert rows[late["id"]]["settled_at"] >= late["created_at"] + 4 * CYCLE_S
    assert rows[late["id"]]["settlement_id"] != rows[normal["id"]]["settlement_id"]
    assert rows[normal["id"]]["settled_at"] < rows[late["id"]]["settled_at"]


# --- Corridor's clients -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_clients_read_settlements_and_recon_as_typed_paise(sandbox, receiver):  # noqa: F811
    order, payment = pay(sandbox)
    row = settled_rows(sandbox, [payment["id"]])[payment["id"]]
    day = ist_day(row["settled_at"])

    items = rzp.settlement_recon(day)
    listed = rzp.settlements(since=datetime.fromtimestamp(row["settled_at"], tz=UTC))
    one = rzp.settlement(row["settlement_id"])

    assert [i.entity_id for i in items] == [r["entity_id"] for r in recon(sandbox, day)]
    item = next(i for i in items if i.entity_id == payment["id"])
    fee, tax = fee_and_tax(order["amount"])
    assert (item.type, item.amount_paise, item.fee_paise, item.tax_paise, item.credit_paise,
            item.debit_paise, item.net_paise) == (
        "payment", order["amount"], fee, tax, order["amount"] - fee, 0, order["amount"] - fee)
    assert (item.order_id, item.order_receipt, item.settlement_id, item.settlement_utr,
            item.payment_id, item.settled) == (
        order["id"], order["receipt"], one.settlement_id, one.utr, None, True)
    assert item.created_at == datetime.fromtimestamp(payment["created_at"], tz=UTC)
    assert item.settled_at == one.created_at
    assert one.settlement_id in {s.settlement_id for s in listed}
    assert len({s.settlement_id for s in listed}) == len(listed)
    assert one.amount == rzp.paise_to_rupees(one.amount_paise)
    assert one.amount_paise == sum(i.net_paise for i in items
                                   if i.settlement_id == one.settlement_id)
    with pytest.raises(rzp.SettlementNotFound):
        rzp.settlement("setl_00000000000000")


@pytest.mark.django_db(transaction=True)
def test_clients_page_past_one_page_and_refuse_unreadable_rows(sandbox, settings,
                                                               monkeypatch):
    monkeypatch.setattr(rzp, "RECON_PAGE", 1)
    monkeypatch.setattr(rzp, "SETTLEMENTS_PAGE", 1)
    day = today()

    assert [i.entity_id for i in rzp.settlement_recon(day)] == [
        r["entity_id"] for r in recon(sandbox, day)]
    until = datetime.now(tz=UTC)
    listed = get(sandbox, "/settlements", count=100, to=int(until.timestamp())).json()["items"]
    assert [s.settlement_id for s in rzp.settlements(until=until)][:100] == [
        s["id"] for s in listed]

    with pytest.raises(rzp.RazorpayError, match="not integer paise"):
        rzp.ReconItem.parse({"entity_id": "pay_x", "amount": 100.0, "credit": 98,
                             "debit": 0, "fee": 2, "tax": 0})
    settings.RAZORPAY_KEY_SECRET = "wrong"
    with pytest.raises(rzp.RazorpayError, match="401"):
        rzp.settlement_recon(day)
