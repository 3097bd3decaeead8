"""The remittance saga end to end (sagas/plans/remittance.py): a partner asks through
the API, pays USDC to the hub on the sandbox's Stellar, and Corridor converts, funds the
sandbox's SEP-31 receiving anchor from the hub and waits for its payout — or
compensates, ending with an on-chain refund to the partner, or stops for a person.

Everything outside Corridor is the sandbox over real HTTP: Horizon, the anchor (with its
fault switches) and the partner's wallet. Sagas are driven in this process (as the
Celery task would) or by a ``manage.py run_saga`` process SIGKILLed at a crash point.

Checks in every test: the saga's end state, its steps, its bookings (kinds, and every
account but ``hub`` netting to zero once settled), the payments on chain under each
reference (counted: at most one each), and DESIGN.md §8 invariant 3 for the hub: the
ledger's hub USDC moved exactly as the hub account's USDC on chain during the test.
The protection switched off once: REMITTANCE_CHAIN_LOOKUP=False pays twice after the
same crash, and the hub check catches it."""

from __future__ import annotations

import base64
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django import db
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient
from stellar_sdk import Server, TransactionBuilder
from stellar_sdk.client.requests_client import RequestsClient

from anchor import stellar
from corridor import invariants
from ledger import services as ledger
from ledger.models import Entry, Posting
from sagas import anchor31, engine, hub, remittances
from sagas.models import HubPayment, Saga, SagaEvent, SagaStep
from sagas.plans.remittance import AnchorFund
from sandbox import keys
from tests import rewind
from tests.flows import drive, rejected_first, run_manage, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

D = Decimal
S = Saga.Status
AMOUNT = "25.5"
FORWARD_KINDS = ["bridge.fill", "fx.convert", "anchor.fund", "anchor.payout"]


@pytest.fixture(autouse=True)
def corridor_on_sandbox(clean_sandbox, settings, monkeypatch):
    """Corridor pointed at the sandbox's anchor; runs driven here, not by Celery."""
    settings.ANCHOR31_URL = f"{clean_sandbox.url}/anchor31"
    monkeypatch.setattr(engine, "_enqueue", lambda saga_id, delay: None)
    return clean_sandbox


@pytest.fixture
def partner_wallet(corridor_on_sandbox):
    return corridor_on_sandbox.http.get("/anchor31/sandbox/partner").raise_for_status().json()


@pytest.fixture
def api(partner_wallet) -> APIClient:
    _, key = remittances.partner_create(name="acme", stellar_account=partner_wallet["account"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def hub_chain():
    """The hub's USDC on chain when the test started (the sandbox lives for the whole
    session, so each test compares its own movements)."""
    return chain_usdc()


# --- helpers ------------------------------------------------------------------------

_keys = iter(range(10**6))


def create(api: APIClient, amount: str = AMOUNT) -> dict:
    response = api.post("/api/remittances", {
        "amount": amount, "send_currency": "USDC", "receive_currency": "INR",
        "corridor": "USDC-INR",
        "beneficiary": {"name": "Asha Verma", "account_number": "50100123456789",
                        "ifsc": "HDFC0001234"}},
        format="json", HTTP_IDEMPOTENCY_KEY=f"k-{time.time_ns()}-{next(_keys)}")
    assert response.status_code == 202, response.json()
    return response.json()


def partner_pays(sandbox, remittance: dict, amount: str | None = None) -> str:
    reply = sandbox.http.post("/anchor31/sandbox/partner/pay", json={
        "destination": remittance["hub_account"], "amount": amount or remittance["amount"],
        "memo_type": remittance["memo_type"], "memo": remittance["memo"]})
    assert reply.status_code == 200, reply.text
    return reply.json()["hash"]


def ends(saga_id: int, status: str, worker: str = "driver") -> None:
    """Drive the saga to its end and check it is ``status``, saying why if not."""
    got = drive(saga_id, worker, timeout=30.0).status
    if got != status:
        saga = Saga.objects.get(pk=saga_id)
        trail = list(SagaEvent.objects.filter(saga=saga).order_by("id")
                     .values_list("idx", "event", "detail"))
        pytest.fail(f"saga {saga_id} ended {got}, not {status}: {saga.error}\n{trail}")


def chain_usdc() -> Decimal:
    return stellar.asset_balance(hub.hub_address(), stellar.usdc()) or D(0)


def hub_ledger() -> Decimal:
    return ledger.balance(account="hub", currency="USDC")


def transfers(memo: str, *, source: str, destination: str) -> list[stellar.Transfer]:
    return [t for t in stellar.find_transfers_by_reference(hub.hub_address(), memo, "")
            if t.source == source and t.destination == destination]


def anchor_pays_hub(sandbox, memo: str, amount: str) -> str:
    """The receiving anchor (its sandbox key) pays ``amount`` USDC to the hub under
    ``memo`` (an id memo), as a second refund would; returns the hash once applied."""
    server = Server(f"{sandbox.url}/horizon",
                    client=RequestsClient(num_retries=0, request_timeout=10, post_timeout=10))
    source = server.load_account(keys.ANCHOR31.public_key)
    envelope = (TransactionBuilder(source, settings.STELLAR_NETWORK_PASSPHRASE, base_fee=100)
                .append_payment_op(hub.hub_address(), stellar.usdc(), amount)
                .add_id_memo(int(memo)).set_timeout(30).build())
    envelope.sign(keys.ANCHOR31)
    return server.submit_transaction(envelope, skip_memo_required_check=True)["hash"]


def kinds(saga_id: int) -> list[str]:
    return list(Entry.objects.filter(saga_id=saga_id).order_by("id")
                .values_list("kind", flat=True))


def net(saga_id: int) -> dict:
    totals: dict = defaultdict(Decimal)
    for code, ccy, amount in Posting.objects.filter(entry__saga_id=saga_id).values_list(
            "account__code", "account__currency", "amount"):
        totals[(code, ccy)] += amount
    return {key: value for key, value in totals.items() if value}


def steps(saga_id: int) -> list[tuple[str, str]]:
    return list(SagaStep.objects.filter(saga_id=saga_id).order_by("idx")
                .values_list("kind", "status"))


def events(saga_id: int, name: str) -> list:
    return list(SagaEvent.objects.filter(saga_id=saga_id, event=name).order_by("id")
                .values_list("idx", flat=True))


def fund_intent(saga_id: int) -> dict:
    return SagaStep.objects.get(saga_id=saga_id, kind="anchor.fund").intent


def assert_hub_matches_chain(hub_chain_before: Decimal) -> None:
    assert ledger.trial_balance().ok
    assert chain_usdc() - hub_chain_before == hub_ledger(), \
        f"chain moved {chain_usdc() - hub_chain_before}, ledger says {hub_ledger()}"


# --- outcomes -------------------------------------------------------------------------

def test_a_completed_remittance_books_every_leg_and_pays_the_anchor_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain):
    remittance = create(api)
    partner_hash = partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.COMPLETED)

    saga_id = remittance["id"]
    assert steps(saga_id) == [(kind, "done") for kind in FORWARD_KINDS]
    assert kinds(saga_id) == FORWARD_KINDS
    fill = Entry.objects.get(saga_id=saga_id, kind="bridge.fill")
    assert fill.reference == partner_hash
    intent = fund_intent(saga_id)
    paid = transfers(intent["memo"], source=hub.hub_address(), destination=intent["account"])
    assert [(t.amount, t.memo_type) for t in paid] == [(D(AMOUNT), "id")]
    assert Entry.objects.get(saga_id=saga_id, kind="anchor.fund").reference == paid[0].tx_hash
    assert net(saga_id) == {}  # hub in, hub out; fx, payable, anchor and partner settled
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []
    assert_hub_matches_chain(hub_chain)
    shown = api.get(f"/api/remittances/{saga_id}").json()
    assert shown["status"] == "completed"
    assert [b["kind"] for b in shown["bookings"]] == FORWARD_KINDS
    fx = next(b for b in shown["bookings"] if b["kind"] == "fx.convert")
    assert {"account": "payable:beneficiaries", "currency": "INR",
            "amount": f"-{remittance['quote']['receive_amount']}00000"} in fx["postings"]


def test_anchor_rejects_before_funding_the_partner_is_refunded_on_chain_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch):
    corridor_on_sandbox.fault("anchor31.reject_before_funding", times=1)
    rejected_first(monkeypatch)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.COMPENSATED)

    saga_id = remittance["id"]
    assert steps(saga_id) == [("bridge.fill", "compensated"), ("fx.convert", "compensated"),
                              ("anchor.fund", "failed"), ("anchor.payout", "pending")]
    assert "rejected" in SagaStep.objects.get(saga_id=saga_id, idx=2).error
    assert events(saga_id, "step.compensated") == [1, 0]
    assert kinds(saga_id) == ["bridge.fill", "fx.convert", "fx.convert.undo",
                              "bridge.unfill", "bridge.refund"]
    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    assert Entry.objects.get(saga_id=saga_id, kind="bridge.refund").reference == \
        refunds[0].tx_hash
    intent = fund_intent(saga_id)
    assert transfers(intent["memo"], source=hub.hub_address(),
                     destination=intent["account"]) == []  # the anchor was never paid
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_anchor_refunds_after_funding_compensated_with_its_refund_booked(
        api, corridor_on_sandbox, partner_wallet, hub_chain):
    corridor_on_sandbox.fault("anchor31.refund_after_funding", times=1)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.COMPENSATED)

    saga_id = remittance["id"]
    assert steps(saga_id) == [("bridge.fill", "compensated"), ("fx.convert", "compensated"),
                              ("anchor.fund", "compensated"), ("anchor.payout", "failed")]
    assert events(saga_id, "step.compensated") == [2, 1, 0]
    assert kinds(saga_id) == ["bridge.fill", "fx.convert", "anchor.fund", "anchor.refund",
                              "fx.convert.undo", "bridge.unfill", "bridge.refund"]
    intent = fund_intent(saga_id)
    back = transfers(intent["memo"], source=intent["account"], destination=hub.hub_address())
    assert [t.amount for t in back] == [D(AMOUNT)]
    assert Entry.objects.get(saga_id=saga_id, kind="anchor.refund").reference == back[0].tx_hash
    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    assert Entry.objects.filter(saga_id=saga_id, kind__in=["bridge.unfill", "bridge.refund"]
                                ).count() == 2
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_an_anchor_refunding_more_than_it_was_paid_is_booked_and_stopped_for_review(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch):
    """Chaos seed 7 (CI, 2026-12-03): the receiving anchor refunded twice, and the
    compensation stopped for a person without booking what had reached the hub: its
    USDC on chain stood 24.5 above the ledger's. Whatever reaches the hub is booked;
    the excess shows on the anchor's account as owed back. (Fails with the bookings
    of ManualReviewError dropped.)"""
    corridor_on_sandbox.fault("anchor31.refund_after_funding", times=1)
    original, extra = AnchorFund.compensate, []

    def compensate_after_a_second_refund(self, ctx, output):
        if not extra:  # the anchor's own refund first, then one more under its memo
            wait_for(lambda: anchor31.get_transaction(output["anchor_tx_id"])["status"]
                     == "refunded", what="the anchor's refund")
            extra.append(anchor_pays_hub(corridor_on_sandbox, output["memo"], AMOUNT))
        return original(self, ctx, output)

    monkeypatch.setattr(AnchorFund, "compensate", compensate_after_a_second_refund)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.MANUAL_REVIEW)

    saga_id = remittance["id"]
    saga = Saga.objects.get(pk=saga_id)
    assert f"more than the {AMOUNT} it was paid" in saga.error
    assert extra[0] in saga.error
    assert steps(saga_id) == [("bridge.fill", "done"), ("fx.convert", "done"),
                              ("anchor.fund", "compensating"), ("anchor.payout", "failed")]
    intent = fund_intent(saga_id)
    back = transfers(intent["memo"], source=intent["account"], destination=hub.hub_address())
    assert [t.amount for t in back] == [D(AMOUNT), D(AMOUNT)]
    assert sorted(Entry.objects.filter(saga_id=saga_id, kind="anchor.refund")
                  .values_list("reference", flat=True)) == sorted(t.tx_hash for t in back)
    assert net(saga_id)[("anchor:anchor31", "USDC")] == -D(AMOUNT)  # owed back
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []
    assert_hub_matches_chain(hub_chain)


def test_anchor_fails_after_funding_stops_for_review_without_compensating(
        api, corridor_on_sandbox, partner_wallet, hub_chain):
    corridor_on_sandbox.fault("anchor31.fail_payout", times=1)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.MANUAL_REVIEW)

    saga_id = remittance["id"]
    saga = Saga.objects.get(pk=saga_id)
    assert "no refund" in saga.error
    assert steps(saga_id) == [("bridge.fill", "done"), ("fx.convert", "done"),
                              ("anchor.fund", "done"), ("anchor.payout", "failed")]
    assert events(saga_id, "saga.compensating") == []
    assert events(saga_id, "step.compensated") == []
    assert kinds(saga_id) == ["bridge.fill", "fx.convert", "anchor.fund"]
    assert net(saga_id) == {("anchor:anchor31", "USDC"): D(AMOUNT),
                            ("fx:USDC-INR", "USDC"): -D(AMOUNT),
                            ("fx:USDC-INR", "INR"): D(remittance["quote"]["receive_amount"]),
                            ("payable:beneficiaries", "INR"):
                                -D(remittance["quote"]["receive_amount"])}
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []
    assert_hub_matches_chain(hub_chain)


def test_a_payment_landing_just_after_the_anchor_rejected_is_refunded_and_compensated(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """The race the pre-payment status check narrows: the anchor rejects the transaction
    while the hub's payment is on its way. The anchor reports ``error`` with no refund
    for a moment, then refunds: the payout leg waits out the grace period instead of
    calling it "funded, no refund", and the saga compensates."""
    monkeypatch.setattr(AnchorFund, "_check_not_rejected", staticmethod(lambda intent: None))
    settings.REMITTANCE_ERROR_REFUND_GRACE_S = 10.0  # the refund lands in ~1 s; slow CI too
    corridor_on_sandbox.fault("anchor31.reject_before_funding", times=1)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.COMPENSATED)

    saga_id = remittance["id"]
    assert events(saga_id, "step.compensated") == [2, 1, 0]
    assert kinds(saga_id) == ["bridge.fill", "fx.convert", "anchor.fund", "anchor.refund",
                              "fx.convert.undo", "bridge.unfill", "bridge.refund"]
    assert len(transfers(remittance["memo"], source=hub.hub_address(),
                         destination=partner_wallet["account"])) == 1
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_partner_never_pays_the_remittance_expires_with_nothing_to_undo(
        api, settings, hub_chain):
    settings.REMITTANCE_FUNDING_DEADLINE_S = 0.5
    remittance = create(api)

    ends(remittance["id"], S.COMPENSATED)

    saga_id = remittance["id"]
    assert steps(saga_id) == [("bridge.fill", "failed"), ("fx.convert", "pending"),
                              ("anchor.fund", "pending"), ("anchor.payout", "pending")]
    assert "expired" in SagaStep.objects.get(saga_id=saga_id, idx=0).error
    assert events(saga_id, "step.compensated") == []
    assert kinds(saga_id) == []
    assert not HubPayment.objects.filter(saga_id=saga_id).exists()
    assert_hub_matches_chain(hub_chain)


def test_a_payment_on_time_hidden_by_a_lagging_horizon_is_not_left_unbooked(
        api, corridor_on_sandbox, settings, hub_chain):
    """Found by the stale-read attacker: the partner paid before ``fund_by``, but
    Horizon's history lagged (``horizon.lookup_lag``) past the deadline, and
    ``bridge.fill`` took its one read ("no payment under the reference") as proof that
    the remittance was never funded: the saga compensated as expired, and the partner's
    on-time USDC sat on the hub unbooked and unrefunded (invariant 3 broke: the hub's
    ledger no longer matched the chain). Now an empty read is proof only
    REMITTANCE_FUNDING_GRACE_S after ``fund_by``; Horizon catching up inside it funds
    the remittance. (With the grace at 0 this test fails: compensated, hub != chain.)"""
    settings.REMITTANCE_FUNDING_DEADLINE_S = 1.5
    settings.REMITTANCE_FUNDING_GRACE_S = 4.0
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)  # on time: long before fund_by
    corridor_on_sandbox.fault("horizon.lookup_lag", ledgers=100_000)
    past_fund_by = time.monotonic() + settings.REMITTANCE_FUNDING_DEADLINE_S + 1.0

    while time.monotonic() < past_fund_by:  # a worker polling behind the lagging Horizon
        engine.run(remittance["id"], "driver", dispatch=False)
        time.sleep(0.2)
    assert Saga.objects.get(pk=remittance["id"]).status in Saga.OPEN_STATUSES
    corridor_on_sandbox.clear_faults()  # Horizon caught up, inside the grace

    assert drive(remittance["id"], "driver", timeout=30.0).status == S.COMPLETED
    assert "bridge.fill" in kinds(remittance["id"])
    assert_hub_matches_chain(hub_chain)


def test_a_payment_that_does_not_match_stops_for_review(api, corridor_on_sandbox, hub_chain):
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance, amount="25.4")

    ends(remittance["id"], S.MANUAL_REVIEW)

    assert "do not match" in Saga.objects.get(pk=remittance["id"]).error
    assert kinds(remittance["id"]) == []
    # The short payment sits on the hub unbooked until a person acts: the check sees it.
    assert chain_usdc() - hub_chain == D("25.4") and hub_ledger() == 0


def test_anchor_5xx_while_polling_is_retried_then_completes(api, corridor_on_sandbox,
                                                           hub_chain):
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    saga_id = remittance["id"]
    wait_for(lambda: engine.run(saga_id, "driver", dispatch=False) and
             SagaStep.objects.get(saga_id=saga_id, kind="anchor.fund").status == "done",
             timeout=20, interval=0.05, what="the anchor funded")
    corridor_on_sandbox.fault("anchor31.http_5xx", times=3)

    ends(saga_id, S.COMPLETED)

    payout = SagaStep.objects.get(saga_id=saga_id, kind="anchor.payout")
    assert payout.attempts == 3  # each 503 was a retry, none was taken as an outcome
    assert events(saga_id, "step.retry") == [3, 3, 3]
    assert_hub_matches_chain(hub_chain)


# --- crashes between "paid" and "recorded" ---------------------------------------------

def _crash_then_rescue(api, sandbox, *, crash_at: str, fault: str | None = None) -> dict:
    if fault:
        sandbox.fault(fault, times=1)
    remittance = create(api)
    partner_pays(sandbox, remittance)
    killed = run_manage("run_saga", str(remittance["id"]), "--worker", "victim",
                        crash_at=crash_at)
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    return remittance


@pytest.mark.parametrize("lookup", [True, False], ids=["look-up on", "look-up off"])
def test_a_crash_after_the_hub_paid_the_anchor_is_found_by_memo_not_paid_again(
        api, corridor_on_sandbox, settings, hub_chain, lookup):
    if not lookup:  # a float so that a second payment can happen at all
        corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={
            "account": hub.hub_address(), "amount": AMOUNT}).raise_for_status()
    remittance = _crash_then_rescue(api, corridor_on_sandbox,
                                    crash_at="remittance.anchor_fund.paid")
    saga_id = remittance["id"]
    assert steps(saga_id)[2] == ("anchor.fund", "running")  # paid, nothing recorded
    assert kinds(saga_id) == ["bridge.fill", "fx.convert"]
    settings.REMITTANCE_CHAIN_LOOKUP = lookup

    ends(saga_id, S.COMPLETED, worker="rescuer")

    intent = fund_intent(saga_id)
    paid = transfers(intent["memo"], source=hub.hub_address(), destination=intent["account"])
    if lookup:
        assert len(paid) == 1
        assert Entry.objects.get(saga_id=saga_id, kind="anchor.fund").reference == \
            paid[0].tx_hash
        assert_hub_matches_chain(hub_chain)
    else:
        assert len(paid) == 2  # the protection is what stops this
        with pytest.raises(AssertionError, match="chain moved"):  # and invariant 3 sees it
            assert_hub_matches_chain(hub_chain + D(AMOUNT))  # (the float was there before)


@pytest.mark.parametrize("lookup", [True, False], ids=["look-up on", "look-up off"])
def test_a_crash_after_the_refund_to_the_partner_refunds_once(
        api, corridor_on_sandbox, partner_wallet, settings, hub_chain, lookup):
    if not lookup:
        corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={
            "account": hub.hub_address(), "amount": AMOUNT}).raise_for_status()
    remittance = _crash_then_rescue(api, corridor_on_sandbox,
                                    crash_at="remittance.partner_refund.paid",
                                    fault="anchor31.reject_before_funding")
    saga_id = remittance["id"]
    assert steps(saga_id)[0] == ("bridge.fill", "done")  # refunded on chain, not recorded
    settings.REMITTANCE_CHAIN_LOOKUP = lookup

    ends(saga_id, S.COMPENSATED, worker="rescuer")

    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    if lookup:
        assert [t.amount for t in refunds] == [D(AMOUNT)]
        assert kinds(saga_id).count("bridge.refund") == 1
        assert net(saga_id) == {}
        assert_hub_matches_chain(hub_chain)
    else:
        assert [t.amount for t in refunds] == [D(AMOUNT), D(AMOUNT)]
        with pytest.raises(AssertionError, match="chain moved"):
            assert_hub_matches_chain(hub_chain + D(AMOUNT))


# --- money that arrives after Corridor stopped waiting (issue 25 §1) --------------------

def saga_beat_sweeps() -> None:
    """Every saga task on beat but the resume (``drive`` runs the saga itself), called
    as beat calls it: the sweeps that look at sagas no worker is driving."""
    import importlib

    from corridor.schedules import periodic_tasks

    for _, task, _ in periodic_tasks():
        if task.startswith("sagas.tasks.") and task != "sagas.tasks.resume_sagas":
            module, name = task.rsplit(".", 1)
            getattr(importlib.import_module(module), name)()


def funded_then_failed(api, sandbox, monkeypatch, *, hold_refund_s: float,
                       once_seen=None) -> dict:
    """A remittance whose anchor failed the transaction while the hub's payment was on
    its way (``reject_before_funding`` after the pre-payment check): the anchor reports
    ``error`` with no refund, and refunds the payment ``hold_refund_s`` seconds after it
    saw it. ``once_seen()`` runs as soon as the anchor has seen the payment (its record
    names the payment's hash), inside the hold, whatever ``anchor.fund`` is doing. Returns
    the remittance once ``anchor.fund`` is done (the hub paid)."""
    monkeypatch.setattr(AnchorFund, "_check_not_rejected", staticmethod(lambda intent: None))
    sandbox.fault("anchor31.reject_before_funding", times=1)
    sandbox.fault("anchor31.step_delay", seconds=hold_refund_s)
    remittance = create(api)
    partner_pays(sandbox, remittance)
    saga_id = remittance["id"]
    pending = [once_seen] if once_seen else []

    def funded() -> bool:
        step = SagaStep.objects.get(saga_id=saga_id, kind="anchor.fund")
        if step.status != "done":  # no further: the payout's read is the test's
            engine.run(saga_id, "driver", dispatch=False)
            step.refresh_from_db()
        if pending and step.intent.get("anchor_tx_id") and anchor31.get_transaction(
                step.intent["anchor_tx_id"]).get("stellar_transaction_id"):
            pending.pop()()
        return step.status == "done" and not pending

    wait_for(funded, timeout=30, interval=0.05, what="the anchor funded")
    return remittance


def review_reason(saga_id: int) -> str:
    from sagas.models import ReviewItem

    item = ReviewItem.objects.filter(key=f"saga:{saga_id}").first()
    return item.reason if item else ""


def test_a_refund_landing_behind_a_lagging_horizon_after_the_grace_is_booked_and_refunded(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """Issue 25, chaos seed 1 on a busy machine, replayed step by step: ``anchor.payout``
    read the anchor's transaction as ``error`` and waited REMITTANCE_ERROR_REFUND_GRACE_S
    for a refund; the anchor's refund landed on the hub just after, behind a lagging
    Horizon (``horizon.lookup_lag``: history behind; the anchor's own submission
    answered 504, so its record still said ``error``); one read after the grace decided
    "the anchor failed a payout it was funded for, with no refund" and nothing looked at
    that refund again: the USDC sat on the hub unbooked, the partner was not repaid and
    the review item said "no refund" while the refund was on chain. Now the refund is
    booked and the partner repaid once, whatever the order of arrivals, and the review
    queue never says "no refund" once the refund is on chain."""
    settings.REMITTANCE_ERROR_REFUND_GRACE_S = 1.0
    sandbox = corridor_on_sandbox
    # The anchor's submission of its refund answers 504 although it applied, and, once
    # the anchor has seen the hub's payment (its watcher reads Horizon's history too: a
    # lag before that and it never refunds; CI, loaded, the refund then landed in the
    # next test), Horizon's history lags (state is current), within the hold: the
    # anchor's record stays ``error`` while its refund is on chain.
    sandbox.fault("horizon.submit_504_after_apply", account=keys.ANCHOR31.public_key)
    remittance = funded_then_failed(
        api, sandbox, monkeypatch, hold_refund_s=4.0,
        once_seen=lambda: sandbox.fault("horizon.lookup_lag", ledgers=400))
    saga_id, intent = remittance["id"], fund_intent(remittance["id"])
    # anchor.fund is done (the hub's payment left): the partner's payment plus the refund
    wait_for(lambda: chain_usdc() == hub_chain + D(AMOUNT), timeout=30,
             what="the anchor's refund on chain (the hub's balance)")
    assert anchor31.get_transaction(intent["anchor_tx_id"])["status"] == "error"
    assert transfers(intent["memo"], source=intent["account"],
                     destination=hub.hub_address()) == []  # history does not show it yet

    engine.run(saga_id, "driver", dispatch=False)  # the read after the grace
    assert "no refund" not in review_reason(saga_id)  # the chain holds the refund
    sandbox.clear_faults()  # Horizon catches up; the anchor's record says refunded
    deadline = time.monotonic() + 30
    while Saga.objects.get(pk=saga_id).status != S.COMPENSATED and \
            time.monotonic() < deadline:
        saga_beat_sweeps()
        engine.run(saga_id, "driver", dispatch=False)
        time.sleep(0.2)

    saga = Saga.objects.get(pk=saga_id)
    assert saga.status == S.COMPENSATED, f"{saga.status}: {saga.error}"
    back = transfers(intent["memo"], source=intent["account"], destination=hub.hub_address())
    assert [t.amount for t in back] == [D(AMOUNT)]
    assert Entry.objects.get(saga_id=saga_id, kind="anchor.refund").reference == \
        back[0].tx_hash
    assert events(saga_id, "step.compensated") == [2, 1, 0]
    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def stopped_for_no_refund(api, sandbox, monkeypatch, settings, *, hold_refund_s: float
                          ) -> dict:
    """A remittance in manual_review for "funded, with no refund", decided on a Horizon
    that was current (the decision was right when taken); the anchor refunds
    ``hold_refund_s`` seconds after it saw the payment, i.e. after the decision."""
    settings.REMITTANCE_ERROR_REFUND_GRACE_S = 1.0
    remittance = funded_then_failed(api, sandbox, monkeypatch, hold_refund_s=hold_refund_s)
    ends(remittance["id"], S.MANUAL_REVIEW)
    intent = fund_intent(remittance["id"])
    assert anchor31.get_transaction(intent["anchor_tx_id"])["status"] == "error", \
        "the anchor refunded before the decision: raise hold_refund_s"
    reason = Saga.objects.get(pk=remittance["id"]).error
    assert "with no refund" in reason and "as of ledger" in reason  # with its evidence
    return remittance


def test_a_refund_arriving_after_the_review_decision_is_confirmed_then_compensated(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """Issue 25 §1: a saga in manual_review because "the anchor failed a payout it was
    funded for, with no refund" leaves review by itself once the anchor's refund is
    confirmed, on chain AND in the anchor's own record, and compensates last step first,
    audited as an operator's action would be (``auto.compensate``, worker
    ``system:late-money``, the evidence in the detail). While only one side shows the
    refund, the review item is rewritten with what each side says (never "no refund"
    once the anchor says it refunded) and nothing moves."""
    sandbox = corridor_on_sandbox
    remittance = stopped_for_no_refund(api, sandbox, monkeypatch, settings,
                                       hold_refund_s=5.0)
    saga_id, intent = remittance["id"], fund_intent(remittance["id"])
    wait_for(lambda: anchor31.get_transaction(intent["anchor_tx_id"])["status"]
             == "refunded", timeout=40, what="the anchor's late refund")
    sandbox.fault("horizon.lookup_lag", ledgers=400)  # history no longer shows it

    saga_beat_sweeps()  # the anchor's record says refunded; Horizon's history does not

    saga = Saga.objects.get(pk=saga_id)
    assert saga.status == S.MANUAL_REVIEW
    hashes = [p["id"] for p in anchor31.get_transaction(intent["anchor_tx_id"])
              ["refunds"]["payments"]]
    assert "no refund" not in review_reason(saga_id)
    assert hashes[0] in review_reason(saga_id) and "says refunded" in review_reason(saga_id)
    assert [e.worker for e in SagaEvent.objects.filter(saga_id=saga_id,
                                                       event="review.evidence")] == \
        ["system:late-money"]
    assert "anchor.refund" not in kinds(saga_id)  # one side is not a confirmation
    saga_beat_sweeps()  # the same evidence again: no second audit row
    assert SagaEvent.objects.filter(saga_id=saga_id, event="review.evidence").count() == 1

    sandbox.clear_faults()  # Horizon catches up: both sides agree
    deadline = time.monotonic() + 30
    while Saga.objects.get(pk=saga_id).status != S.COMPENSATED and \
            time.monotonic() < deadline:
        saga_beat_sweeps()
        engine.run(saga_id, "driver", dispatch=False)
        time.sleep(0.2)

    saga = Saga.objects.get(pk=saga_id)
    assert saga.status == S.COMPENSATED, f"{saga.status}: {saga.error}"
    [auto] = SagaEvent.objects.filter(saga_id=saga_id, event="auto.compensate")
    assert auto.worker == "system:late-money"
    assert [c["hash"] for c in auto.detail["evidence"]["chain"]] == hashes
    assert auto.detail["evidence"]["anchor_status"] == "refunded"
    assert "with no refund" not in auto.detail["reason"]  # the evidence reason it replaced
    assert events(saga_id, "step.compensated") == [2, 1, 0]
    assert kinds(saga_id) == ["bridge.fill", "fx.convert", "anchor.fund", "anchor.refund",
                              "fx.convert.undo", "bridge.unfill", "bridge.refund"]
    assert Entry.objects.get(saga_id=saga_id, kind="anchor.refund").reference == hashes[0]
    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_an_anchor_refund_after_the_compensation_deadline_is_confirmed_by_the_sweep(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """``anchor.fund``'s compensation waits REMITTANCE_REFUND_DEADLINE_S for the anchor's
    refund, counted from when the compensation started, then stops for a person ("no
    refund from the anchor by ...") on a Horizon history that reaches the deadline. An
    operator's "compensate" starts one too: the wait was counted from each read (no
    ``saga.compensating`` event), so the deadline never came and a saga whose anchor
    never refunds waited, compensating, out of the review queue, for ever. The anchor's
    refund after the stop is confirmed by the late-money sweep (chain and the anchor's
    record), which compensates the saga by itself, booking the refund once."""
    from django.contrib.auth.models import User

    from sagas import operations

    sandbox = corridor_on_sandbox
    remittance = stopped_for_no_refund(api, sandbox, monkeypatch, settings,
                                       hold_refund_s=15.0)
    saga_id, intent = remittance["id"], fund_intent(remittance["id"])
    settings.REMITTANCE_REFUND_DEADLINE_S = 1.0
    olga = User.objects.create_superuser("olga", "olga@example.com", "x" * 16)
    operations.saga_compensate(saga_id=saga_id, operator=olga,
                               note="the anchor says it is refunding")

    past = time.monotonic() + settings.REMITTANCE_REFUND_DEADLINE_S + 3.0
    while Saga.objects.get(pk=saga_id).status == S.COMPENSATING and time.monotonic() < past:
        engine.run(saga_id, "driver", dispatch=False)
        time.sleep(0.2)
    saga = Saga.objects.get(pk=saga_id)
    assert saga.status == S.MANUAL_REVIEW, f"{saga.status}: {saga.error}"
    assert "no refund from the anchor by" in saga.error and "as of ledger" in saga.error
    assert anchor31.get_transaction(intent["anchor_tx_id"])["status"] == "error"
    assert "anchor.refund" not in kinds(saga_id)

    wait_for(lambda: anchor31.get_transaction(intent["anchor_tx_id"])["status"]
             == "refunded", timeout=40, what="the anchor's late refund")
    saga = drive_with_sweeps(saga_id, S.COMPENSATED)

    assert saga.status == S.COMPENSATED, f"{saga.status}: {saga.error}"
    [auto] = SagaEvent.objects.filter(saga_id=saga_id, event="auto.compensate")
    assert auto.worker == "system:late-money"
    back = transfers(intent["memo"], source=intent["account"], destination=hub.hub_address())
    assert [t.amount for t in back] == [D(AMOUNT)]
    assert [c["hash"] for c in auto.detail["evidence"]["chain"]] == [back[0].tx_hash]
    assert Entry.objects.get(saga_id=saga_id, kind="anchor.refund").reference == \
        back[0].tx_hash
    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_an_operator_who_acted_first_wins_over_the_late_money_sweep(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """The sweep's reopening is conditional on the saga still being in manual_review for
    the reason it read: an operator who closed it first (settled outside Corridor) keeps
    it closed, and the sweep moves no money and books nothing."""
    from django.contrib.auth.models import User

    from sagas import operations

    remittance = stopped_for_no_refund(api, corridor_on_sandbox, monkeypatch, settings,
                                       hold_refund_s=5.0)
    saga_id, intent = remittance["id"], fund_intent(remittance["id"])
    olga = User.objects.create_superuser("olga", "olga@example.com", "x" * 16)
    operations.saga_close(saga_id=saga_id, outcome="compensated", operator=olga,
                          note="the anchor will refund; settled with the partner by phone")
    wait_for(lambda: anchor31.get_transaction(intent["anchor_tx_id"])["status"]
             == "refunded", timeout=40, what="the anchor's late refund")
    reason = Saga.objects.get(pk=saga_id).error

    saga_beat_sweeps()
    assert operations.saga_auto_compensate(
        saga_id=saga_id, actor="system:late-money", reason_was=reason, note="late",
        evidence={}) is False

    saga = Saga.objects.get(pk=saga_id)
    assert (saga.status, saga.error) == (S.COMPENSATED, reason)
    assert not SagaEvent.objects.filter(saga_id=saga_id, event__in=[
        "auto.compensate", "review.evidence"]).exists()
    assert kinds(saga_id) == ["bridge.fill", "fx.convert", "anchor.fund"]
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []


def drive_with_sweeps(saga_id: int, status: str, timeout: float = 30.0) -> Saga:
    """What beat and the workers do together: the saga sweeps, then a run, until the
    saga is ``status`` (or the time is up); returns the saga."""
    deadline = time.monotonic() + timeout
    while Saga.objects.get(pk=saga_id).status != status and time.monotonic() < deadline:
        saga_beat_sweeps()
        engine.run(saga_id, "driver", dispatch=False)
        time.sleep(0.2)
    return Saga.objects.get(pk=saga_id)


def test_a_partner_payment_after_the_funding_deadline_is_booked_and_returned_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings):
    """Issue 25 §1: ``bridge.fill`` gives up at ``fund_by`` + REMITTANCE_FUNDING_GRACE_S
    and the saga ends compensated (expired); "a payment arriving after the funding
    deadline is not refunded automatically (it is visible on the hub, unbooked)" broke
    the books (hub on chain != ledger) and kept the partner's USDC. Now the late
    payment, matched by memo (the reference), source (the partner's account), amount
    and asset, is booked in the transaction that reopens the saga, and returned to its
    sender through the hub's outbox, exactly once, however many sweeps see it."""
    settings.REMITTANCE_FUNDING_DEADLINE_S = 0.5
    settings.REMITTANCE_FUNDING_GRACE_S = 0.5
    remittance = create(api)
    ends(remittance["id"], S.COMPENSATED)
    saga_id = remittance["id"]
    assert "expired" in SagaStep.objects.get(saga_id=saga_id, idx=0).error

    late = partner_pays(corridor_on_sandbox, remittance)  # after Corridor stopped waiting
    wait_for(lambda: saga_beat_sweeps() or Saga.objects.get(pk=saga_id).status
             == S.COMPENSATING, timeout=20, what="the sweep seeing the late payment")
    saga = drive_with_sweeps(saga_id, S.COMPENSATED)
    for _ in range(3):  # later sweeps see the same payment: nothing more
        saga_beat_sweeps()

    assert saga.status == S.COMPENSATED, f"{saga.status}: {saga.error}"
    assert kinds(saga_id) == ["bridge.fill", "bridge.unfill", "bridge.refund"]
    assert Entry.objects.get(saga_id=saga_id, kind="bridge.fill").reference == late
    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    [auto] = SagaEvent.objects.filter(saga_id=saga_id, event="auto.late_funding")
    assert auto.worker == "system:late-money" and auto.detail["evidence"]["hash"] == late
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_a_late_partner_payment_that_does_not_match_goes_to_review_with_its_evidence(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings):
    """A late payment under the reference that does not match (here: short) is not
    guessed at: the expired saga goes to manual_review with the payment's evidence
    (hash, sender, amount, asset), so the USDC on the hub has an owner in the queue."""
    settings.REMITTANCE_FUNDING_DEADLINE_S = 0.5
    settings.REMITTANCE_FUNDING_GRACE_S = 0.5
    remittance = create(api)
    ends(remittance["id"], S.COMPENSATED)
    late = partner_pays(corridor_on_sandbox, remittance, amount="25.4")

    saga = drive_with_sweeps(remittance["id"], S.MANUAL_REVIEW)

    assert saga.status == S.MANUAL_REVIEW
    assert late in saga.error and "does not match" in saga.error and "25.4" in saga.error
    assert kinds(remittance["id"]) == []
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []


# --- a second payment under a remittance's reference (issue 25 §1) ---------------------

def returns_of(payment_hash: str, *, destination: str) -> list[stellar.Transfer]:
    """The hub's payments to ``destination`` that return the payment ``payment_hash``
    (a hash memo naming it: sagas/latemoney.py ``excess_check``)."""
    memo = base64.b64encode(bytes.fromhex(payment_hash)).decode()
    return [t for t in stellar.find_transfers_by_reference(hub.hub_address(), memo, "")
            if t.source == hub.hub_address() and t.destination == destination]


def assert_excess_returned_once(saga_id: int, excess: str, partner: str,
                                hub_chain_before: Decimal) -> None:
    """The second payment ``excess`` is booked (owed back), returned to ``partner`` once
    under its hash, the return booked under the return's hash, both audited, and the
    hub's books equal the chain."""
    assert_hub_matches_chain(hub_chain_before)
    assert [t.amount for t in returns_of(excess, destination=partner)] == [D(AMOUNT)]
    [booked] = Entry.objects.filter(saga_id=saga_id, kind="remittance.excess")
    [back] = Entry.objects.filter(saga_id=saga_id, kind="remittance.excess_return")
    assert booked.reference == excess
    assert back.reference == returns_of(excess, destination=partner)[0].tx_hash
    assert [e.worker for e in SagaEvent.objects.filter(
        saga_id=saga_id, event__in=["auto.excess", "auto.excess_returned"])] \
        == ["system:late-money"] * 2
    assert ledger.balance(account="owed:remittance-excess", currency="USDC") == 0
    assert net(saga_id) == {}


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep on", "sweep off"])
def test_a_second_payment_after_the_fill_was_booked_is_booked_and_returned_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, sweep):
    """Found by ``manage.py chaos`` (a partner retrying while Horizon lagged): a second
    payment under the reference after ``bridge.fill`` booked the first sat on the hub
    unbooked and unreturned for ever (hub on chain != ledger). Now the late-money sweep
    books it (owed back to its sender) with an audit row, and returns it through the
    hub's outbox under its hash, once, however many sweeps see it. Sweep off (the
    chaos switch ``late_money``): the hub check catches the unbooked USDC."""
    settings.LATE_MONEY_SWEEP = sweep
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    ends(remittance["id"], S.COMPLETED)
    excess = partner_pays(corridor_on_sandbox, remittance)  # the partner's retry

    for _ in range(3):
        saga_beat_sweeps()

    if not sweep:
        with pytest.raises(AssertionError, match="chain moved"):
            assert_hub_matches_chain(hub_chain)
        return
    assert kinds(remittance["id"]) == FORWARD_KINDS + ["remittance.excess",
                                                       "remittance.excess_return"]
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)


@pytest.mark.parametrize("scan_cursor", [True, False], ids=["cursor on", "cursor off"])
def test_a_settled_remittances_look_for_excess_reads_only_what_is_new(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, monkeypatch,
        scan_cursor):
    """20-seed loaded campaign at ddb9ea8, seed 15: every sweep, each remittance settled
    within LATE_MONEY_FUNDING_WINDOW_S (30 days) read the hub's whole payment history
    since it started; the Horizon reads grew with sagas times history until the
    sandbox's Horizon answered 504s and the customers' wallets could not be created
    (and past 50 pages a saga's look was "unreadable" for ever). Now each look goes on
    from where its last one stopped: a second look with nothing new reads no payment,
    and a payment arriving later is still returned once. Cursor off: the second look
    reads everything again."""
    settings.LATE_MONEY_SCAN_CURSOR = scan_cursor
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    ends(remittance["id"], S.COMPLETED)
    read: list[int] = []
    unpatched = stellar.transfers_page

    def counted(account, cursor, *, limit):
        page, last = unpatched(account, cursor, limit=limit)
        read.append(len(page))
        return page, last

    monkeypatch.setattr(stellar, "transfers_page", counted)
    from sagas import latemoney

    assert latemoney.excess_check(saga_id=remittance["id"]) == "unchanged"
    first_look = sum(read)
    assert first_look >= 1  # the fill at least
    read.clear()
    assert latemoney.excess_check(saga_id=remittance["id"]) == "unchanged"
    if not scan_cursor:  # the protection switched off: the same history read again
        assert sum(read) >= first_look
        return
    assert sum(read) == 0
    excess = partner_pays(corridor_on_sandbox, remittance)  # a later retry is still seen
    wait_for(lambda: latemoney.excess_check(saga_id=remittance["id"]) == "returned",
             timeout=20, what="the later payment returned")
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)


def test_two_payments_seen_together_book_the_first_and_return_the_second(
        api, corridor_on_sandbox, partner_wallet, hub_chain):
    """``bridge.fill`` seeing two matching payments at once stopped the saga for a
    person ("do not match") with both unbooked on the hub. Now the first is the fill,
    the saga completes, and the sweep returns the second once."""
    remittance = create(api)
    first = partner_pays(corridor_on_sandbox, remittance)
    excess = partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.COMPLETED)
    for _ in range(3):
        saga_beat_sweeps()

    assert Entry.objects.get(saga_id=remittance["id"], kind="bridge.fill").reference == first
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)


def test_a_second_payment_on_a_compensated_saga_is_not_taken_for_its_refund(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch):
    """The engine's compensation refunds the partner the fill (same account, same
    amount, under the reference) and the sweep returns the excess: neither's look-up
    may take the other's payment for its own (the return goes under a hash memo naming
    the payment it returns). Two payments, the anchor rejects: two payments back."""
    corridor_on_sandbox.fault("anchor31.reject_before_funding", times=1)
    rejected_first(monkeypatch)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    excess = partner_pays(corridor_on_sandbox, remittance)

    ends(remittance["id"], S.COMPENSATED)
    for _ in range(3):
        saga_beat_sweeps()

    refunds = transfers(remittance["memo"], source=hub.hub_address(),
                        destination=partner_wallet["account"])
    assert [t.amount for t in refunds] == [D(AMOUNT)]
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)


def test_two_sweeps_at_once_return_the_excess_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain):
    """Two late-money sweeps (beat's and a redelivered one) on the same second payment
    at the same moment: one booking, one payment back, one return booked."""
    from sagas import latemoney

    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    ends(remittance["id"], S.COMPLETED)
    excess = partner_pays(corridor_on_sandbox, remittance)
    start = threading.Barrier(2)

    def sweep(_: int) -> str:
        try:
            start.wait(timeout=10)
            return latemoney.excess_check(saga_id=remittance["id"])
        finally:
            db.connection.close()

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(sweep, range(2)))

    saga_beat_sweeps()  # whichever waited finishes
    assert "returned" in outcomes, outcomes
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)


@pytest.mark.parametrize("lookup", [True, False], ids=["look-up on", "look-up off"])
def test_a_sweep_killed_between_returning_and_booking_returns_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, lookup):
    """A sweep SIGKILLed right after Horizon applied the return, before booking it: the
    next sweep finds the return on chain by its memo (the payment's hash) and books it;
    it never pays again. Look-up off (REMITTANCE_CHAIN_LOOKUP): it pays twice, and the
    hub check catches it."""
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    ends(remittance["id"], S.COMPLETED)
    excess = partner_pays(corridor_on_sandbox, remittance)

    crashed = run_manage("shell", "-c", "from sagas import latemoney; "
                         f"latemoney.excess_check(saga_id={remittance['id']})",
                         crash_at="remittance.excess_return.paid")
    assert crashed.returncode == -9, crashed.stderr
    assert len(returns_of(excess, destination=partner_wallet["account"])) == 1
    assert not Entry.objects.filter(kind="remittance.excess_return").exists()

    settings.REMITTANCE_CHAIN_LOOKUP = lookup
    float_usdc = D(0)
    if not lookup:  # a float on the hub, so that a second return can happen at all
        float_usdc = D("100")
        corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={
            "account": hub.hub_address(), "amount": str(float_usdc)}).raise_for_status()
    for _ in range(2):
        saga_beat_sweeps()
    if not lookup:
        assert len(returns_of(excess, destination=partner_wallet["account"])) == 2
        with pytest.raises(AssertionError, match="chain moved"):
            assert_hub_matches_chain(hub_chain + float_usdc)
        return
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)


def test_two_late_payments_after_the_deadline_one_reopens_the_other_is_returned(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings):
    """Two matching partner payments after the remittance expired (a partner retrying
    late) went to review with both unbooked. Now the oldest reopens the saga as its
    fill (its compensation repays it under the reference) and the other is returned as
    excess under its hash: two payments in, two back, the hub's books = chain."""
    settings.REMITTANCE_FUNDING_DEADLINE_S = 0.5
    settings.REMITTANCE_FUNDING_GRACE_S = 0.5
    remittance = create(api)
    ends(remittance["id"], S.COMPENSATED)
    first = partner_pays(corridor_on_sandbox, remittance)
    excess = partner_pays(corridor_on_sandbox, remittance)

    wait_for(lambda: saga_beat_sweeps() or Saga.objects.get(pk=remittance["id"]).status
             == S.COMPENSATING, timeout=20, what="the sweep seeing the late payments")
    drive_with_sweeps(remittance["id"], S.COMPENSATED)
    for _ in range(3):
        saga_beat_sweeps()

    assert Entry.objects.get(saga_id=remittance["id"], kind="bridge.fill").reference == first
    assert [t.amount for t in transfers(remittance["memo"], source=hub.hub_address(),
                                        destination=partner_wallet["account"])] == [D(AMOUNT)]
    assert_excess_returned_once(remittance["id"], excess, partner_wallet["account"],
                                hub_chain)
def test_a_second_late_partner_payment_after_the_first_was_returned_is_not_left_unbooked(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings):
    """Attacker (issue 25 §1, "money that arrives anyway, at any later time"): the
    partner's wallet pays an expired remittance twice, the second payment after the
    sweep had returned the first. The sweep looked only at sagas whose ``bridge.fill``
    was still ``failed``; once the first late payment was returned that step is
    ``compensated``, so the second payment sat on the hub unbooked for ever with no
    owner in the queue (hub on chain != ledger). Now it is excess of a settled saga
    whose fill is booked: booked, returned to its sender under a hash memo naming it
    (never taken for the compensation's return of the first, under the reference), once."""
    settings.REMITTANCE_FUNDING_DEADLINE_S = 0.5
    settings.REMITTANCE_FUNDING_GRACE_S = 0.5
    remittance = create(api)
    saga_id = remittance["id"]
    ends(saga_id, S.COMPENSATED)
    first = partner_pays(corridor_on_sandbox, remittance)
    wait_for(lambda: saga_beat_sweeps() or Saga.objects.get(pk=saga_id).status
             == S.COMPENSATING, timeout=20, what="the sweep seeing the first late payment")
    assert drive_with_sweeps(saga_id, S.COMPENSATED).status == S.COMPENSATED

    second = partner_pays(corridor_on_sandbox, remittance)  # the wallet paid again
    wait_for(lambda: saga_beat_sweeps() or Entry.objects.filter(
        idempotency_key=f"remittance.excess_return:{second}").exists(),
        timeout=30, what="the second late payment returned")
    for _ in range(3):
        saga_beat_sweeps()

    saga = Saga.objects.get(pk=saga_id)
    assert saga.status == S.COMPENSATED, f"{saga.status}: {saga.error}"
    assert Entry.objects.get(saga_id=saga_id, kind="bridge.fill").reference == first
    assert Entry.objects.filter(saga_id=saga_id, kind="remittance.excess").count() == 1
    assert [t.amount for t in transfers(remittance["memo"], source=hub.hub_address(),
                                        destination=partner_wallet["account"])] == [D(AMOUNT)]
    assert [t.amount for t in returns_of(second, destination=partner_wallet["account"])] \
        == [D(AMOUNT)]
    assert_hub_matches_chain(hub_chain)


def test_a_short_refund_the_anchor_records_without_its_fee_does_not_reopen_the_saga(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """Attacker (issue 25 §1): the anchor refunds late, but less than it was paid, and
    its record's refund fee does not explain what it kept (``anchor31.refund_short``:
    1 USDC short, fee 0). The sweep called that "confirmed" (chain and record agree on
    the sum and the hashes) and reopened the saga; the compensation, which books a
    short refund only when the record's fee explains the rest, waited and stopped again
    after REMITTANCE_REFUND_DEADLINE_S saying "no refund from the anchor by ..." (with a
    refund on chain), and the next sweep reopened it again: the saga left review every
    deadline, under an operator's confirmation page, for ever. Now the sweep confirms
    only what the compensation can complete: the saga stays in review, its reason says
    what came back and that a person decides, and nothing moves."""
    settings.REMITTANCE_REFUND_DEADLINE_S = 1.0
    sandbox = corridor_on_sandbox
    sandbox.fault("anchor31.refund_short", short="1", fee="0")
    remittance = stopped_for_no_refund(api, sandbox, monkeypatch, settings,
                                       hold_refund_s=5.0)
    saga_id, intent = remittance["id"], fund_intent(remittance["id"])
    wait_for(lambda: anchor31.get_transaction(intent["anchor_tx_id"])["status"]
             == "refunded", timeout=40, what="the anchor's late, short refund")
    back = transfers(intent["memo"], source=intent["account"], destination=hub.hub_address())
    assert [t.amount for t in back] == [D(AMOUNT) - 1]

    deadline = time.monotonic() + 8  # several refund deadlines
    while time.monotonic() < deadline:
        saga_beat_sweeps()
        engine.run(saga_id, "driver", dispatch=False)
        time.sleep(0.2)

    saga = Saga.objects.get(pk=saga_id)
    assert SagaEvent.objects.filter(saga_id=saga_id, event="auto.compensate").count() == 0
    assert saga.status == S.MANUAL_REVIEW, f"{saga.status}: {saga.error}"
    assert "no refund" not in saga.error and back[0].tx_hash in saga.error
    assert "a person decides" in saga.error
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []
    # and the short refund that did arrive is booked with the reason that names it, once
    # (the loaded campaign's seed 1: 9.25 USDC on the hub, 0 in the ledger)
    assert [e.reference for e in Entry.objects.filter(kind="anchor.refund",
                                                      saga_id=saga_id)] == [back[0].tx_hash]
    assert_hub_matches_chain(hub_chain)


def test_a_late_short_refund_whose_fee_the_record_states_is_confirmed_and_compensated(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, settings):
    """The other side of the rule above: a late refund 1 USDC short whose record states
    a refund fee of 1 USDC is what the compensation books (the partner bears the fee),
    so the sweep confirms it once and the saga ends compensated, the partner repaid
    what came back."""
    sandbox = corridor_on_sandbox
    sandbox.fault("anchor31.refund_short", short="1", fee="1")
    remittance = stopped_for_no_refund(api, sandbox, monkeypatch, settings,
                                       hold_refund_s=5.0)
    saga_id, intent = remittance["id"], fund_intent(remittance["id"])
    wait_for(lambda: anchor31.get_transaction(intent["anchor_tx_id"])["status"]
             == "refunded", timeout=40, what="the anchor's late, short refund")

    saga = drive_with_sweeps(saga_id, S.COMPENSATED)

    assert saga.status == S.COMPENSATED, f"{saga.status}: {saga.error}"
    assert SagaEvent.objects.filter(saga_id=saga_id, event="auto.compensate").count() == 1
    assert "anchor.refund_fee" in kinds(saga_id)
    assert [t.amount for t in transfers(remittance["memo"], source=hub.hub_address(),
                                        destination=partner_wallet["account"])] == \
        [D(AMOUNT) - 1]
    assert net(saga_id) == {}
    assert_hub_matches_chain(hub_chain)


def test_a_hub_payment_whose_commits_were_lost_is_not_paid_again(
        api, corridor_on_sandbox, hub_chain):
    """A failover loses every commit of a saga's run after the hub paid the
    receiving anchor (issue 25 §2; tests/rewind.py) while Horizon and the anchor keep
    theirs; the saga runs again from its first leg. The anchor leg finds the hub's
    payment with no record of it and stops for a person instead of paying the anchor's
    new transaction (SEP-31 cannot find the first one from anything Corridor still
    holds); the payment it found is booked as the funding, so the hub's books equal
    its chain while a person matches it to the anchor's transaction."""
    # given a funded remittance whose run paid the anchor from the hub, then died (and
    # a float on the hub, so that a second payment could happen at all)
    corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={
        "account": hub.hub_address(), "amount": AMOUNT}).raise_for_status()
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    before = rewind.mark()
    killed = run_manage("run_saga", str(remittance["id"]), "--worker", "victim",
                        crash_at="remittance.anchor_fund.paid")
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    paid_before = fund_intent(remittance["id"])

    # when the failover loses every commit of that run (legs, bookings, hub payment)
    lost = rewind.rewind(before)
    assert lost["saga_hub_payments"] == 1

    # then the saga runs again, finds the hub's unrecorded payment to the anchor and
    # stops for a person instead of paying the anchor's new transaction a second time
    ends(remittance["id"], S.MANUAL_REVIEW, worker="rescuer")
    saga = Saga.objects.get(pk=remittance["id"])
    assert "already paid this anchor" in saga.error and paid_before["memo"] in saga.error
    assert len(transfers(paid_before["memo"], source=hub.hub_address(),
                         destination=paid_before["account"])) == 1
    intent = SagaStep.objects.get(saga_id=saga.pk, kind="anchor.fund").intent
    assert intent is None or transfers(intent["memo"], source=hub.hub_address(),
                                       destination=intent["account"]) == []
    # and the hub's payment it found is booked with the stop: the hub's books equal its
    # chain while the saga waits for a person (the float funded above is not the books')
    assert_hub_matches_chain(hub_chain + D(AMOUNT))


@pytest.mark.parametrize("coverage", [True, False], ids=["coverage on", "coverage off"])
def test_a_lost_hub_payment_hidden_by_a_lagging_history_is_not_paid_again(
        api, corridor_on_sandbox, hub_chain, settings, coverage):
    """20-seed loaded chaos at a927fb9, seed 5 (traced from its databases): the failover
    lost saga 135's anchor.fund run after the hub paid the anchor 115.25 USDC under the
    anchor's first memo; the next run's look for such a payment read a Horizon whose
    history lagged behind it, found nothing, and paid the anchor's new transaction
    too. Now a leg key's first hub envelope waits until the history shows the hub's
    sequence as the state reads it, then looks, then builds on that very sequence.
    Coverage off: the anchor is paid twice."""
    settings.HUB_HISTORY_COVERAGE_CHECK = coverage
    # given a funded remittance whose run paid the anchor from the hub, then died (and
    # a float on the hub, so that a second payment could happen at all)
    corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={
        "account": hub.hub_address(), "amount": AMOUNT}).raise_for_status()
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    before = rewind.mark()
    killed = run_manage("run_saga", str(remittance["id"]), "--worker", "victim",
                        crash_at="remittance.anchor_fund.paid")
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    paid_before = fund_intent(remittance["id"])

    # when the failover loses every commit of that run, and Horizon's history lags
    # 40 ledgers (10 s) behind its state while the saga runs again
    corridor_on_sandbox.fault("horizon.lookup_lag", ledgers=40)
    assert rewind.rewind(before)["saga_hub_payments"] == 1
    result = drive(remittance["id"], "rescuer", timeout=40.0)
    corridor_on_sandbox.clear_faults()

    since = Saga.objects.get(pk=remittance["id"]).stellar_cursor  # this saga's start
    to_anchor = [t for t in stellar.transfers_after(hub.hub_address(), since)
                 if t.source == hub.hub_address() and t.destination == paid_before["account"]]
    if not coverage:  # the protection switched off: the anchor's new memo is paid too
        assert len(to_anchor) == 2, to_anchor
        return
    # then the saga waited for the history, found the hub's unrecorded payment, and
    # stopped for a person instead of paying the anchor's new transaction
    saga = Saga.objects.get(pk=remittance["id"])
    assert result.status == S.MANUAL_REVIEW, f"{result.status}: {saga.error}"
    assert "already paid this anchor" in saga.error and paid_before["memo"] in saga.error
    assert [t.memo for t in to_anchor] == [paid_before["memo"]]
    assert_hub_matches_chain(hub_chain + D(AMOUNT))


@pytest.mark.parametrize("coverage", [True, False], ids=["coverage on", "coverage off"])
def test_a_lost_hub_rebuild_hidden_by_a_lagging_history_is_not_paid_again(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, monkeypatch,
        coverage):
    """The attacker's review at stop 34 (sagas/hub.py: only a leg key's first envelope
    waited for the history): the stored envelope E_a of a refund to the partner was
    dropped and another hub payment used its sequence (E_a dead); the next run built
    E_b, which refunded the partner, and a failover lost that run's commits (the row
    back to E_a); the run after read a history that showed E_a's consumer but not E_b,
    took E_a for dead and nothing paid, and built E_c: the partner refunded twice
    (no counterparty record stops it, as the anchor's does for its funding). Now every
    envelope, the first or a rebuild, waits for a history that shows the hub's
    sequence, looks, and asks ``before_first``. Coverage off: refunded twice."""
    settings.HUB_HISTORY_COVERAGE_CHECK = coverage
    settings.STELLAR_TX_TIMEOUT_S = 30  # E_c outlives the held ledger clock
    sandbox = corridor_on_sandbox
    float_usdc = 2 * D(AMOUNT)  # a float on the hub, to pay twice beside the other payment
    sandbox.http.post("/horizon/sandbox/fund", json={
        "account": hub.hub_address(), "amount": str(float_usdc)}).raise_for_status()
    sandbox.fault("anchor31.reject_before_funding", times=1)
    rejected_first(monkeypatch)
    remittance = create(api)
    partner_pays(sandbox, remittance)
    # given the compensation's refund to the partner, its envelope E_a dropped
    sandbox.fault("horizon.submit_drop", wait_s=0.5)
    wait_for(lambda: engine.run(remittance["id"], "first", dispatch=False) and
             HubPayment.objects.filter(saga_id=remittance["id"]).exists(),
             timeout=30, what="the partner refund's first envelope stored")
    sandbox.clear_faults()
    e_a = HubPayment.objects.get(saga_id=remittance["id"])
    # and another hub payment on E_a's sequence (E_a can never land)
    other = stellar.build_payment_from(
        source=stellar.hub_keypair(), sequence=e_a.sequence,
        destination=partner_wallet["account"], amount=D("0.5"), memo_type="text",
        memo="another saga", max_time=int(time.time()) + 30)
    assert stellar.submit(other.to_xdr()).kind == "applied"
    before = rewind.mark()
    # when the next run rebuilds, E_b refunds the partner, and the failover loses that run
    killed = run_manage("run_saga", str(remittance["id"]), "--worker", "victim",
                        crash_at="remittance.partner_refund.paid")
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    e_b = HubPayment.objects.get(saga_id=remittance["id"]).tx_hash
    assert e_b != e_a.tx_hash
    assert rewind.rewind(before)["saga_hub_payments"] == 2  # E_b's version out, E_a's in
    wait_for(lambda: not Saga.objects.filter(pk=remittance["id"],
                                             lease_until__gt=timezone.now()).exists(),
             timeout=30, what="the saga's lease free")
    # and the run after reads a history that shows E_a's consumer, not E_b (the
    # ledger clock held, so the lag stays put while the run decides)
    e_b_ledger = stellar.find_transaction(e_b)["ledger"]
    sandbox.fault("horizon.close_hold")
    latest = int(sandbox.http.get("/horizon/").json()["history_latest_ledger"])
    sandbox.fault("horizon.lookup_lag", ledgers=latest - e_b_ledger + 1)
    assert stellar.find_transaction(e_b) is None
    try:
        deadline = time.monotonic() + 4.0  # runs for a few seconds, the lag held
        while time.monotonic() < deadline:
            engine.run(remittance["id"], "rescuer", dispatch=False)
            after = HubPayment.objects.get(saga_id=remittance["id"]).tx_hash
            if after != e_a.tx_hash:
                break
            time.sleep(0.2)
    finally:
        sandbox.clear_faults()
    assert (after == e_a.tx_hash) is coverage  # on: waited for the history; off: E_c
    ends(remittance["id"], S.COMPENSATED)

    def partner_refunds() -> list[stellar.Transfer]:
        return [t for t in transfers(remittance["memo"], source=hub.hub_address(),
                                     destination=partner_wallet["account"])
                if t.amount == D(AMOUNT)]

    if not coverage:  # the protection switched off: E_c, queued, refunds the partner again
        wait_for(lambda: len(partner_refunds()) == 2, timeout=10, what="E_c applied")
        return
    time.sleep(1.0)  # a few ledgers: nothing else was queued to land
    refunds = partner_refunds()
    assert [t.tx_hash for t in refunds] == [e_b]
    assert_hub_matches_chain(hub_chain + float_usdc - D("0.5"))  # the other: not booked


def rescued_after_the_rewind(remittance: dict, partner_wallet: dict
                             ) -> tuple[Saga, list[stellar.Transfer]]:
    """Run the saga again as another worker after a rewind, until it stops or the hub
    funds anyone but the partner with the remittance's amount. Returns the saga and those
    fundings made since the rewind (the session's chain keeps earlier tests')."""
    def funded() -> list:
        return [t for t in stellar.find_transfers_by_reference(hub.hub_address(), None)
                if t.source == hub.hub_address() and t.tx_hash not in earlier
                and t.destination != partner_wallet["account"] and t.amount == D(AMOUNT)]

    earlier: set = set()
    earlier = {t.tx_hash for t in funded()}
    wait_for(lambda: engine.run(remittance["id"], "rescuer", dispatch=False).status
             not in Saga.OPEN_STATUSES or funded(), timeout=30,
             what="the saga stopped, or the anchor funded",
             explain=lambda: list(SagaEvent.objects.filter(saga_id=remittance["id"])
                                  .order_by("-id").values_list("idx", "event", "detail")[:4]))
    return Saga.objects.get(pk=remittance["id"]), funded()


@pytest.mark.parametrize("check", [True, False], ids=["check on", "check off"])
def test_a_partner_refund_whose_commits_were_lost_is_not_followed_by_funding_the_anchor(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, check):
    """Chaos seed 3 with two burners (traced from its databases): the receiving anchor
    refused before funding, the compensation refunded the partner's 11.25 USDC under
    the reference, then a failover lost every commit of that run (steps, bookings, the
    hub payment row) while the chain kept the refund. The saga ran again from its first
    leg, matched the partner's payment again and funded the anchor's new transaction:
    the hub paid 11.25 twice, the ledger held neither. Now the fill leg finds the hub's
    unrecorded refund to the partner under the reference and stops for a person,
    booking the fill and the refund as the compensation does; nothing goes to the
    anchor. Check off (this look and the anchor leg's): the anchor is funded and the
    hub's books differ from its chain."""
    from sagas.plans.remittance import AnchorFund, BridgeFill

    unpatched = AnchorFund.__dict__["_check_not_rejected"]
    if not check:  # both looks: the anchor leg's (below) would also stop it
        monkeypatch.setattr(BridgeFill, "_check_no_lost_refund",
                            staticmethod(lambda ctx, moved, first, fill: None))
        monkeypatch.setattr(AnchorFund, "_check_no_lost_partner_refund",
                            staticmethod(lambda ctx: None))
    corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={  # a float on the hub,
        "account": hub.hub_address(), "amount": AMOUNT}).raise_for_status()  # to pay twice
    corridor_on_sandbox.fault("anchor31.reject_before_funding", times=1)
    rejected_first(monkeypatch)
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    before = rewind.mark()
    ends(remittance["id"], S.COMPENSATED)
    [refund] = transfers(remittance["memo"], source=hub.hub_address(),
                         destination=partner_wallet["account"])
    assert rewind.rewind(before)["saga_hub_payments"] == 1
    monkeypatch.setattr(AnchorFund, "_check_not_rejected", unpatched)  # the next one is not

    saga, funded = rescued_after_the_rewind(remittance, partner_wallet)
    if not check:
        assert funded, f"{saga.status}: {saga.error}"  # the anchor was paid after all
        with pytest.raises(AssertionError, match="chain moved"):
            assert_hub_matches_chain(hub_chain + D(AMOUNT))
        return
    assert saga.status == S.MANUAL_REVIEW, saga.error
    assert "already refunded the partner" in saga.error and refund.tx_hash in saga.error
    assert funded == []
    assert kinds(saga.pk) == ["bridge.fill", "bridge.unfill", "bridge.refund"]
    assert net(saga.pk).get(("hub", "USDC"), D(0)) == 0
    assert_hub_matches_chain(hub_chain + D(AMOUNT))


@pytest.mark.parametrize("check, guard", [(True, True), (False, True), (True, False)],
                         ids=["check on", "check off", "undo guard off"])
def test_a_lost_partner_refund_after_the_conversion_is_not_followed_by_funding_the_anchor(
        api, corridor_on_sandbox, partner_wallet, hub_chain, monkeypatch, check, guard):
    """20-seed loaded campaign at 3c81d47, seed 6 (read from its database): as above,
    but the failover lost only the commits after the conversion (the anchor leg's
    intent, the compensation, the hub payment row), so the saga resumed at the anchor
    leg, past the fill leg's look: it funded the anchor's new transaction, and the hub
    paid 12.25 USDC twice. Now the anchor leg's look before its first envelope finds
    the unrecorded refund to the partner and stops for a person, booking the
    compensation as it happened. Check off: the anchor is funded.

    Then an operator presses "compensate" (the preview offers to undo the conversion
    and the fill, still ``done``): stop 34's review found the conversion undone twice
    in the books (the look had booked it already) and the partner's account short.
    ``FxConvert.compensate`` books no second undo. Guard off: the saga's books no
    longer net to zero."""
    from django.contrib.auth.models import User

    from sagas import operations
    from sagas.plans.remittance import AnchorFund, FxConvert

    if not guard:
        monkeypatch.setattr(FxConvert, "_undone_already", staticmethod(lambda ctx: False))

    unpatched = AnchorFund.__dict__["_check_not_rejected"]
    if not check:
        monkeypatch.setattr(AnchorFund, "_check_no_lost_partner_refund",
                            staticmethod(lambda ctx: None))
    corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={  # a float on the hub,
        "account": hub.hub_address(), "amount": AMOUNT}).raise_for_status()  # to pay twice
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    killed = run_manage("run_saga", str(remittance["id"]), "--worker", "victim",
                        crash_at="saga.forward.1.after_commit")  # filled and converted
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    before = rewind.mark()
    corridor_on_sandbox.fault("anchor31.reject_before_funding", times=1)
    rejected_first(monkeypatch)
    ends(remittance["id"], S.COMPENSATED)
    [refund] = transfers(remittance["memo"], source=hub.hub_address(),
                         destination=partner_wallet["account"])
    assert rewind.rewind(before)["saga_hub_payments"] == 1
    assert SagaStep.objects.get(saga_id=remittance["id"], kind="fx.convert").status == "done"
    monkeypatch.setattr(AnchorFund, "_check_not_rejected", unpatched)  # the next one is not

    saga, funded = rescued_after_the_rewind(remittance, partner_wallet)
    if not check:
        assert funded, f"{saga.status}: {saga.error}"  # the anchor was paid after all
        return
    assert saga.status == S.MANUAL_REVIEW, saga.error
    assert "already refunded the partner" in saga.error and refund.tx_hash in saga.error
    assert funded == []
    assert kinds(saga.pk) == ["bridge.fill", "fx.convert", "fx.convert.undo",
                              "bridge.unfill", "bridge.refund"]
    assert net(saga.pk) == {}  # every account of the saga nets to zero, the hub too
    assert_hub_matches_chain(hub_chain + D(AMOUNT))

    olga = User.objects.create_superuser("olga", "olga@example.com", "x" * 16)
    operations.saga_compensate(saga_id=saga.pk, operator=olga, note="undo what is left")
    drive(saga.pk, "driver", timeout=20.0)
    saga = Saga.objects.get(pk=saga.pk)
    assert funded == [] and len(transfers(remittance["memo"], source=hub.hub_address(),
                                          destination=partner_wallet["account"])) == 1
    if not guard:  # the protection switched off: the conversion undone twice
        assert kinds(saga.pk).count("fx.convert.undo") == 2
        assert net(saga.pk) != {}
        return
    assert saga.status == S.COMPENSATED, saga.error
    assert kinds(saga.pk).count("fx.convert.undo") == 1
    assert net(saga.pk) == {}
    assert_hub_matches_chain(hub_chain + D(AMOUNT))


# --- USDC under a memo no saga owns (issue 25 §2: the saga's commits lost) -------------

def hub_returns() -> list[Saga]:
    """The ``hub_return`` sagas the late-money sweep started, driven as a worker would
    (run_saga is not published in these tests), oldest first."""
    for saga in Saga.objects.filter(kind="hub_return", status__in=Saga.OPEN_STATUSES):
        engine.run(saga.pk, "driver", dispatch=False)
    return list(Saga.objects.filter(kind="hub_return").order_by("id"))


@pytest.mark.parametrize("intents", [True, False], ids=["intents on", "intents off"])
def test_an_anchor_refund_of_a_funding_whose_row_was_lost_is_not_taken_for_a_strangers(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, monkeypatch,
        intents):
    """20-seed loaded campaign at ffcbf26, seeds 7-9 (read from its database): saga
    120's funding of the anchor had no ``saga_hub_payments`` row (a failover lost it;
    the leg then found the payment on chain by its memo), so the anchor's refund under
    the funding's memo matched no hub payment row: the late-money sweep started a hub
    return that booked it in suspense (``hub.unmatched``), and the saga booked it too
    (``anchor.refund``): the hub's books 11.25 USDC above its chain, twice. Now the
    anchor leg's intent owns a payment from its account under its memo. Intents off:
    a hub return starts."""
    from sagas import latemoney

    if not intents:
        monkeypatch.setattr(latemoney, "funded_anchor_intents", lambda memos: [])
    settings.HUB_UNMATCHED_GRACE_S = 1.0
    remittance = create(api)
    partner_pays(corridor_on_sandbox, remittance)
    ends(remittance["id"], S.COMPLETED)
    intent = fund_intent(remittance["id"])
    HubPayment.objects.filter(saga_id=remittance["id"]).delete()  # the lost row
    saga_beat_sweeps()  # beat was running: the hub's scan is past the funding

    anchor_pays_hub(corridor_on_sandbox, intent["memo"], "1")  # the anchor sends back
    for _ in range(4):
        time.sleep(0.6)
        saga_beat_sweeps()

    returns = [s for s in hub_returns() if s.input.get("memo") == intent["memo"]]
    if not intents:
        assert returns, "the refund was taken for a stranger's"
        return
    assert returns == []


def remittance_lost_after_its_202(api) -> dict:
    """A remittance whose creation a failover lost after ``POST /api/remittances``
    answered 202 with the hub account and the memo (tests/rewind.py), while beat's
    late-money sweep had been watching the hub."""
    saga_beat_sweeps()  # beat was running: the hub's scan starts at its latest payment
    before = rewind.mark()
    remittance = create(api)
    lost = rewind.rewind(before)
    assert lost["sagas"] == 1
    assert not Saga.objects.filter(reference=remittance["memo"]).exists()
    return remittance


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep on", "sweep off"])
def test_a_payment_under_a_remittance_whose_saga_a_failover_lost_is_returned_once(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, sweep):
    """The loaded campaign (seeds 2 and 3, one burner): a failover lost the commits that
    created two remittances after their 202; the partner paid 10.25 and 12.25 USDC to
    the hub under their memos, which no saga owned, and nothing ever booked or returned
    them (``hub USDC on chain 142.0000000 != in the ledger 119.5000000``). Now the
    late-money sweep books such a payment in suspense (``hub.unmatched``, keyed on its
    hash) and returns it to its sender through the hub's outbox under a hash memo
    naming it, once, however many sweeps see it. Sweep off (``chaos --protection-off
    late_money``): the hub check catches the unbooked USDC."""
    settings.LATE_MONEY_SWEEP = sweep
    settings.HUB_UNMATCHED_GRACE_S = 1.0
    remittance = remittance_lost_after_its_202(api)
    paid = partner_pays(corridor_on_sandbox, remittance)  # as the 202 told it to

    wait_for(lambda: saga_beat_sweeps() or any(s.status == S.COMPLETED for s in hub_returns())
             or not sweep, timeout=30, what="the unmatched payment returned")
    for _ in range(3):  # later sweeps see the same payment: nothing more
        time.sleep(0.5)
        saga_beat_sweeps()
        hub_returns()

    # The campaign's saga check follows the remittance by its memo, not the lost id.
    figures = invariants.saga_figures([remittance["memo"]])
    if not sweep:
        assert hub_returns() == []
        with pytest.raises(AssertionError, match="chain moved"):
            assert_hub_matches_chain(hub_chain)
        assert figures.violations == [f"remittance {remittance['memo']}: its USDC reached "
                                      "the hub and no saga owns it"]
        return
    assert figures.violations == [] and figures.counts["sagas_completed"] == 1
    [saga] = hub_returns()
    assert saga.status == S.COMPLETED, saga.error
    assert saga.reference == f"unmatched:{paid}"
    assert [t.amount for t in returns_of(paid, destination=partner_wallet["account"])] \
        == [D(AMOUNT)]
    assert transfers(remittance["memo"], source=hub.hub_address(),
                     destination=partner_wallet["account"]) == []
    assert kinds(saga.pk) == ["hub.unmatched", "hub.return"]
    assert Entry.objects.get(kind="hub.unmatched").reference == paid
    assert net(saga.pk) == {}
    assert_hub_matches_chain(hub_chain)


@pytest.mark.parametrize("lookup", [True, False], ids=["look-up on", "look-up off"])
def test_a_lost_remittance_that_had_refunded_its_partner_is_not_returned_twice(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings, monkeypatch, lookup):
    """The saga's commits lost after it had moved the money: the anchor refused, the
    compensation refunded the partner under the reference, then a failover lost every
    commit since the remittance was created (saga, hub payment row, bookings). The
    partner's payment under the memo is unowned, and its return is already on chain:
    the return leg finds the hub's unrecorded refund to the sender and books it as the
    return, paying nothing. Look-up off (the unrecorded-payment check skipped): the
    partner is paid twice, and the hub check catches it."""
    from sagas.plans.hubreturn import HubReturn

    settings.HUB_UNMATCHED_GRACE_S = 1.0
    float_usdc = D(0)
    if not lookup:
        monkeypatch.setattr(HubReturn, "_lost_movements", staticmethod(lambda ctx, p: None))
        float_usdc = D("100")  # a float on the hub, so that a second return can happen
        corridor_on_sandbox.http.post("/horizon/sandbox/fund", json={
            "account": hub.hub_address(), "amount": str(float_usdc)}).raise_for_status()
    corridor_on_sandbox.fault("anchor31.reject_before_funding", times=1)
    rejected_first(monkeypatch)
    saga_beat_sweeps()
    before = rewind.mark()
    remittance = create(api)
    paid = partner_pays(corridor_on_sandbox, remittance)
    ends(remittance["id"], S.COMPENSATED)
    [refund] = transfers(remittance["memo"], source=hub.hub_address(),
                         destination=partner_wallet["account"])
    assert rewind.rewind(before)["sagas"] == 1

    wait_for(lambda: saga_beat_sweeps() or any(s.status == S.COMPLETED for s in hub_returns()),
             timeout=30, what="the unmatched payment settled")
    for _ in range(3):
        time.sleep(0.5)
        saga_beat_sweeps()
        hub_returns()

    again = returns_of(paid, destination=partner_wallet["account"])
    if not lookup:
        assert [t.amount for t in again] == [D(AMOUNT)]  # paid back a second time
        with pytest.raises(AssertionError, match="chain moved"):
            assert_hub_matches_chain(hub_chain + float_usdc)
        return
    [saga] = hub_returns()
    assert saga.status == S.COMPLETED, saga.error
    assert again == []
    assert Entry.objects.get(kind="hub.return").reference == refund.tx_hash
    assert Entry.objects.get(kind="hub.unmatched").reference == paid
    assert net(saga.pk) == {}
    assert_hub_matches_chain(hub_chain)


def test_a_lost_remittance_that_had_funded_the_anchor_stops_for_a_person(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings):
    """The saga's commits lost after its run paid the receiving anchor from the hub
    (SIGKILLed right after, then every commit since the remittance's creation lost):
    returning the partner's payment could pay twice (the anchor may pay the
    beneficiary). The return leg finds the hub's unrecorded payment of that amount and
    stops for a person with the evidence, paying nothing; the partner's payment stays
    booked in suspense and the hub's payment is booked as the anchor's funding, so the
    hub's books equal its chain while the person decides."""
    settings.HUB_UNMATCHED_GRACE_S = 1.0
    saga_beat_sweeps()
    before = rewind.mark()
    remittance = create(api)
    paid = partner_pays(corridor_on_sandbox, remittance)
    killed = run_manage("run_saga", str(remittance["id"]), "--worker", "victim",
                        crash_at="remittance.anchor_fund.paid")
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    funded = fund_intent(remittance["id"])
    [fund] = transfers(funded["memo"], source=hub.hub_address(), destination=funded["account"])
    assert rewind.rewind(before)["saga_hub_payments"] == 1

    wait_for(lambda: saga_beat_sweeps() or any(s.status == S.MANUAL_REVIEW
                                               for s in hub_returns()),
             timeout=30, what="the unmatched payment stopped for a person")
    for _ in range(3):
        time.sleep(0.5)
        saga_beat_sweeps()
        hub_returns()

    [saga] = hub_returns()
    assert saga.status == S.MANUAL_REVIEW
    assert fund.tx_hash in saga.error and "may have funded an anchor" in saga.error
    assert returns_of(paid, destination=partner_wallet["account"]) == []
    assert Entry.objects.get(kind="hub.unmatched").reference == paid
    assert Entry.objects.get(kind="anchor.fund").reference == fund.tx_hash
    assert_hub_matches_chain(hub_chain)


def test_usdc_under_a_memo_corridor_never_issued_is_booked_and_left_for_a_person(
        api, corridor_on_sandbox, partner_wallet, hub_chain, settings):
    """USDC at the hub under a memo that is no remittance reference (an id memo: the
    shape of an anchor's refund whose funding's record a failover lost, or a stranger's
    payment) is not the partner's money by any rule Corridor can prove: it is booked in
    suspense (the hub's books equal its chain) and its ``hub_return`` saga stops for a
    person, paying nothing back."""
    settings.HUB_UNMATCHED_GRACE_S = 1.0
    saga_beat_sweeps()
    paid = partner_pays(corridor_on_sandbox, {"hub_account": hub.hub_address(),
                                              "amount": AMOUNT, "memo_type": "id",
                                              "memo": "424242"})

    wait_for(lambda: saga_beat_sweeps() or any(s.status == S.MANUAL_REVIEW
                                               for s in hub_returns()),
             timeout=30, what="the unmatched payment stopped for a person")

    [saga] = hub_returns()
    assert "no reference Corridor issued" in saga.error and paid in saga.error
    assert returns_of(paid, destination=partner_wallet["account"]) == []
    assert kinds(saga.pk) == ["hub.unmatched"]
    assert_hub_matches_chain(hub_chain)
