"""One rule for the fate of a stored Stellar envelope (anchor/envelopes.py; DESIGN.md §4
step 3, horizon/NOTES.md §2.6 rule 3), against the sandbox's lagging Horizons over real
HTTP, in every outbox that uses it: deposit releases, withdrawal refunds (and their beat
sweep), the hub's sends (bridge refund, anchor funding).

The adversary's cases (issue 10):

1. a submit answered 504 although the payment applied, then hash lookups that answer 404
   while the account already shows the new sequence (``horizon.lookup_lag``): the
   re-drive must never send a second payment;
2. the lookup made before the envelope landed and the deadness check after it
   (``horizon.split_nodes``: the lookup served by a node behind, the account read by a
   current one): never a second payment either;
3. both again for a withdrawal refund and for the hub's sends;
4. a refund stuck after a 504 finishes by its sweep, without an operator;
5. an unknown fault name is an error (also in tests/sandbox/test_horizon.py).

The protection switched off once: ``ENVELOPE_RULE = "naive"`` (the old rule) pays twice
in case 1 for every outbox. Payments are counted on the sandbox's ledger after the
faults are cleared (a lagging Horizon would hide them from the count too).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient
from stellar_sdk import Keypair

from anchor import platform, reconciler, releases, stellar
from anchor.models import DepositRelease, ReleaseEvent
from ledger.models import Entry
from payouts import operations as payout_ops
from payouts.models import WithdrawalRefund, WithdrawalRequest
from sagas import engine, hub, remittances
from sagas.models import HubPayment, Saga, SagaEvent
from tests.factories import (
    DepositReleaseFactory,
    StellarReceiptFactory,
    WithdrawalRequestFactory,
)
from tests.flows import (
    Wallet,
    assert_released_once,
    paid_deposit,
    rejected_first,
    settle,
    short_withdrawal,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FOREVER = 100_000  # ledgers of lag: until the test clears the fault
NOTE = "refund the short payment"
D = Decimal


# --- the rule itself, on envelopes built here --------------------------------------------

def _source(sandbox) -> Keypair:
    keypair = Keypair.random()
    sandbox.http.get("/horizon/friendbot", params={"addr": keypair.public_key}
                     ).raise_for_status()
    return keypair


def _envelope(source: Keypair, sequence: int, *, amount: str = "1", timeout: float = 30):
    """A signed native payment from ``source`` on ``sequence`` (not submitted) and its
    max_time."""
    from django.conf import settings
    from stellar_sdk import Account, Asset, TransactionBuilder

    max_time = int(time.time() + timeout)
    builder = TransactionBuilder(Account(source.public_key, sequence - 1),
                                 network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE,
                                 base_fee=100)
    builder.add_time_bounds(0, max_time)
    builder.append_payment_op(stellar.distribution_keypair().public_key, Asset.native(),
                              amount)
    envelope = builder.build()
    envelope.sign(source)
    return envelope, datetime.fromtimestamp(max_time, UTC)


def _fate(source: Keypair, envelope, max_time: datetime, **kw):
    from anchor import envelopes

    return envelopes.envelope_fate(tx_hash=envelope.hash_hex(), source_account=source.public_key,
                                   sequence=envelope.transaction.sequence, max_time=max_time,
                                   **kw)


def test_fate_landed_alive_and_dead_by_both_proofs(clean_sandbox):
    source = _source(clean_sandbox)
    sequence = stellar.account_sequence(source.public_key) + 1
    ours, max_time = _envelope(source, sequence)
    other, _ = _envelope(source, sequence, amount="2")
    expired, past = _envelope(source, sequence, timeout=-2)

    alive = _fate(source, ours, max_time)
    bounded = _fate(source, ours, max_time, max_ledger=2)  # L >= max_ledger - 1
    too_late = _fate(source, expired, past)
    stellar.submit(other.to_xdr())
    consumed = _fate(source, ours, max_time)
    landed = _fate(source, other, max_time)

    assert alive.state == "alive", alive
    assert bounded.state == "dead", bounded
    assert too_late.state == "dead" and "after its max_time" in too_late.reason, too_late
    assert consumed.state == "dead", consumed  # (b): its sequence went to another hash
    assert consumed.evidence["consumed_by"] == other.hash_hex()
    assert (landed.state, landed.successful) == ("landed", True)
    assert landed.transaction["hash"] == other.hash_hex()


def test_fate_is_unknown_not_dead_while_the_consumer_is_not_indexed(clean_sandbox):
    source = _source(clean_sandbox)
    ours, max_time = _envelope(source, stellar.account_sequence(source.public_key) + 1)
    stellar.submit(ours.to_xdr())
    clean_sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)

    lagging = _fate(source, ours, max_time)
    clean_sandbox.clear_faults()
    caught_up = _fate(source, ours, max_time)

    assert lagging.state == "unknown", lagging
    assert lagging.evidence["account_sequence"] == str(ours.transaction.sequence)
    assert caught_up.state == "landed", caught_up


@pytest.mark.parametrize("first", ["behind", "current"])
def test_a_landing_between_the_reads_never_reads_as_dead(clean_sandbox, first):
    """Two nodes at two heights behind one address: whichever answers which read, the
    envelope that landed between the heights is landed or alive, never dead."""
    from sandbox.keys import sandbox_keypair

    # An account of the fixed world (ledger 1), so the node behind knows it too;
    # friendbot reads this minion's sequence afresh for every account it creates.
    source = sandbox_keypair("friendbot-minion-8")
    ours, max_time = _envelope(source, stellar.account_sequence(source.public_key) + 1)
    stellar.submit(ours.to_xdr())
    clean_sandbox.fault("horizon.split_nodes", ledgers=FOREVER, first=first)

    fate = _fate(source, ours, max_time)

    assert fate.state == {"behind": "alive", "current": "landed"}[first], fate


# --- 1 and 2: deposit releases ------------------------------------------------------------

def _reconcile_once():
    """One reconciler pass once the release is old enough for it (as beat would)."""
    from django.conf import settings

    time.sleep(settings.RECONCILER_AGE_S + 0.1)
    reconciler.reconcile_releases()


@pytest.mark.parametrize("rule", ["strict", "naive"])
def test_a_504_then_a_lagging_lookup_never_pays_a_deposit_twice(clean_sandbox, settings, rule):
    settings.ENVELOPE_RULE = rule
    # the naive rule alone: the rebuild's look for a lost successor (anchor/releases.py
    # _rebuild) would catch the second rebuild too
    settings.RELEASE_LOST_SUCCESSOR_CHECK = rule == "strict"
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    first = releases.release_start(transaction_id=transaction_id)
    assert (first.status, first.attempts) == ("submitting", 1)  # applied, answered 504
    clean_sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)

    _reconcile_once()  # the re-drive, behind a Horizon that has not indexed it
    during = DepositRelease.objects.get(transaction_id=transaction_id)
    clean_sandbox.clear_faults()
    release = settle(transaction_id)

    if rule == "naive":
        assert len(wallet.usdc_payments()) == 2  # what the strict rule prevents
        return
    assert [p["transaction_hash"] for p in wallet.usdc_payments()] == [first.tx_hash]
    assert (during.status, during.attempts, during.tx_hash) == (
        "submitting", 1, first.tx_hash)
    assert "unknown" in during.last_error
    assert release.status == "completed"
    assert assert_released_once(wallet, transaction_id).tx_hash == first.tx_hash


@pytest.mark.parametrize("first", ["behind", "current"])
def test_a_deposit_landing_between_lookup_and_deadness_check_is_paid_once(clean_sandbox,
                                                                           first):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    first_release = releases.release_start(transaction_id=transaction_id)
    assert first_release.status == "submitting"
    # Reads alternate between a node that has not seen the landing and one that has:
    # whichever read comes first, the landing falls between two of them.
    clean_sandbox.fault("horizon.split_nodes", ledgers=FOREVER, first=first)

    _reconcile_once()
    clean_sandbox.clear_faults()
    release = settle(transaction_id)

    assert release.status == "completed"
    assert assert_released_once(wallet, transaction_id).tx_hash == first_release.tx_hash


def _reviewed_for_an_unknown_fate(sandbox, settings):
    """A paid deposit whose envelope landed behind a 504 while Horizon's history lags
    for ever: the reconciler, pass after pass, until the release is in review for an
    unknown fate; then Horizon catches up (the faults cleared). Returns (wallet,
    transaction id, the first release, the release in review)."""
    wallet = Wallet(sandbox)
    transaction_id = paid_deposit(sandbox, wallet)
    sandbox.fault("horizon.submit_504_after_apply", times=1)
    first = releases.release_start(transaction_id=transaction_id)
    sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)

    def in_review():
        reconciler.reconcile_releases()
        return DepositRelease.objects.filter(transaction_id=transaction_id,
                                             status="manual_review").first()

    review = wait_for(in_review, timeout=settings.STELLAR_TX_TIMEOUT_S
                      + settings.ENVELOPE_UNKNOWN_REVIEW_S + 10, interval=0.3,
                      what="manual_review after the unknown period")
    sandbox.clear_faults()
    return wallet, transaction_id, first, review


def test_an_envelope_unknown_for_too_long_goes_to_review_never_rebuilt(clean_sandbox,
                                                                       settings):
    wallet, transaction_id, first, review = _reviewed_for_an_unknown_fate(clean_sandbox,
                                                                         settings)

    assert (review.tx_hash, review.attempts) == (first.tx_hash, 1)
    assert "envelope fate unknown" in review.last_error
    assert f"'account_sequence': '{first.sequence}'" in review.last_error  # the evidence
    assert [p["transaction_hash"] for p in wallet.usdc_payments()] == [first.tx_hash]
    assert platform.get_transaction(transaction_id)["status"] == "pending_anchor"


@pytest.mark.parametrize("resume", [True, False], ids=["resume on", "resume off"])
def test_a_review_for_an_unknown_fate_is_withdrawn_once_the_envelope_shows_landed(
        clean_sandbox, settings, monkeypatch, resume):
    """20-seed loaded campaign at 3c81d47, seed 5: a release went to a person because
    Horizon could not place its envelope in time (lag faults), and stayed there after
    Horizon caught up and showed it landed: the customer had the USDC, AP still waited
    in pending_anchor, the books lacked the release, and the review said "unknown"
    against the chain. Now the reconciler asks the rule again and, the envelope landed,
    completes the release as any landing (booked once, AP told), audited as Corridor's.
    Resume off: it stays in review."""
    if not resume:
        monkeypatch.setattr(releases, "resume_landed_review", lambda release: None)
    wallet, transaction_id, first, _ = _reviewed_for_an_unknown_fate(clean_sandbox, settings)

    for _ in range(3):
        reconciler.reconcile_releases()
    release = DepositRelease.objects.get(transaction_id=transaction_id)
    if not resume:  # the protection switched off: the review stays, AP still waits
        assert release.status == "manual_review"
        assert platform.get_transaction(transaction_id)["status"] == "pending_anchor"
        return
    release = settle(transaction_id)
    assert release.status == "completed", release.last_error
    assert assert_released_once(wallet, transaction_id).tx_hash == first.tx_hash
    assert Entry.objects.filter(idempotency_key=f"deposit:{transaction_id}:released"
                                ).count() == 1
    assert list(ReleaseEvent.objects.filter(release=release).values_list("event", flat=True)
                ) == ["release.review_unknown_fate", "release.review_withdrawn"]


def test_only_a_review_for_an_unknown_fate_is_asked_again(clean_sandbox, settings):
    """The reconciler's second look picks releases by their latest audit row, never by
    the text of ``last_error``: one the rule stopped for an unknown fate is picked; once
    an operator's action follows (its own row), or for a review the rule did not write,
    it is not."""
    _, transaction_id, _, review = _reviewed_for_an_unknown_fate(clean_sandbox, settings)
    assert [r.pk for r in releases.unknown_fate_reviews()] == [review.pk]
    ReleaseEvent.objects.create(release=review, event="release.redrive",
                                operator="ops", note="looked at it")
    assert list(releases.unknown_fate_reviews()) == []


@pytest.mark.parametrize("turns", [True, False], ids=["turns on", "turns off"])
def test_reviews_for_an_unknown_fate_take_turns_so_none_is_starved(monkeypatch, turns):
    """Stop 34's review: the reconciler asked about the oldest 50 such reviews only, so
    50 that stayed unresolved kept the 51st (whose envelope may have landed) from ever
    being asked again. Now they take turns, wrapping round. Turns off (every pass from
    the start): the third of three, two a pass, is never asked."""
    reviews = [DepositReleaseFactory(status="manual_review") for _ in range(3)]
    for release in reviews:
        ReleaseEvent.objects.create(release=release, event=releases.UNKNOWN_FATE_EVENT,
                                    operator="system", note="unknown")
    monkeypatch.setitem(releases._review_turn, "after", 0)
    asked = set()
    for _ in range(3):
        if not turns:
            releases._review_turn["after"] = 0
        asked |= {r.pk for r in releases.unknown_fate_reviews(limit=2)}
    assert (asked == {r.pk for r in reviews}) is turns


def test_the_operator_check_reads_unknown_as_not_off_chain(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    release = releases.release_start(transaction_id=transaction_id)
    clean_sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)

    check = releases.release_chain_check(release)

    assert check.state == "unknown" and not check.provably_off_chain, check
    assert check.detail["tx_hash"] == release.tx_hash


# --- 3 and 4: withdrawal refunds -----------------------------------------------------------

def _operator() -> User:
    return User.objects.create_superuser("op", "op@example.com", "pw")


def _short_withdrawal(sbx, settings) -> tuple[Wallet, WithdrawalRequest]:
    return short_withdrawal(sbx, settings)


def _refunds_on_chain(wallet: Wallet) -> list[dict]:
    distribution = stellar.distribution_keypair().public_key
    return [p for p in wallet.usdc_payments() if p["from"] == distribution]


@pytest.fixture
def sbx(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return clean_sandbox


@pytest.mark.parametrize("rule", ["strict", "naive"])
def test_a_refund_after_a_504_behind_a_lagging_horizon_pays_once(sbx, settings, rule):
    settings.ENVELOPE_RULE = rule
    wallet, request = _short_withdrawal(sbx, settings)
    operator = _operator()
    sbx.fault("horizon.submit_504_after_apply", times=1)
    first = payout_ops.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                  note=NOTE)
    assert first.status == "submitting"
    sbx.fault("horizon.lookup_lag", ledgers=FOREVER)

    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    during = payout_ops.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                   note=NOTE)  # the operator tries again
    sbx.clear_faults()
    refund = payout_ops.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                   note=NOTE)

    if rule == "naive":
        assert len(_refunds_on_chain(wallet)) == 2
        return
    assert (during.status, during.tx_hash, during.attempts) == (
        "submitting", first.tx_hash, 1)
    assert refund.status == "completed"
    assert [p["transaction_hash"] for p in _refunds_on_chain(wallet)] == [first.tx_hash]
    tx = platform.get_transaction(request.transaction_id)
    assert tx["status"] == "refunded"
    assert [p["id"] for p in tx["refunds"]["payments"]] == [first.tx_hash]


@pytest.mark.parametrize("first_node", ["behind", "current"])
def test_a_refund_landing_between_the_reads_pays_once(sbx, settings, first_node):
    wallet, request = _short_withdrawal(sbx, settings)
    operator = _operator()
    sbx.fault("horizon.submit_504_after_apply", times=1)
    first = payout_ops.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                  note=NOTE)
    sbx.fault("horizon.split_nodes", ledgers=FOREVER, first=first_node)

    payout_ops.withdrawal_refund_on_chain(request_id=request.pk, operator=operator, note=NOTE)
    sbx.clear_faults()
    refund = WithdrawalRefund.objects.get(pk=first.pk)
    if refund.status != "completed":
        refund = payout_ops.withdrawal_refund_on_chain(request_id=request.pk,
                                                       operator=operator, note=NOTE)

    assert refund.status == "completed"
    assert [p["transaction_hash"] for p in _refunds_on_chain(wallet)] == [first.tx_hash]


def test_the_refund_sweep_finishes_a_refund_stuck_after_a_504(sbx, settings):
    from corridor.schedules import periodic_tasks
    from payouts import tasks

    wallet, request = _short_withdrawal(sbx, settings)
    sbx.fault("horizon.submit_504_after_apply", times=1)
    stuck = payout_ops.withdrawal_refund_on_chain(request_id=request.pk,
                                                  operator=_operator(), note=NOTE)
    assert stuck.status == "submitting" and "unknown" in stuck.last_error
    assert tasks.sweep_refunds() == {}  # younger than REFUND_SWEEP_AGE_S: left alone

    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    counts = tasks.sweep_refunds()  # what beat runs; no operator

    refund = WithdrawalRefund.objects.get(pk=stuck.pk)
    assert counts == {"completed": 1}
    assert (refund.status, refund.tx_hash, refund.attempts) == ("completed", stuck.tx_hash, 1)
    assert [p["transaction_hash"] for p in _refunds_on_chain(wallet)] == [stuck.tx_hash]
    assert platform.get_transaction(request.transaction_id)["status"] == "refunded"
    assert ("withdrawal refund sweep", "payouts.tasks.sweep_refunds",
            settings.REFUND_SWEEP_PERIOD_S) in periodic_tasks()


def test_ap_32603_on_the_refund_notify_is_asked_again_not_sent_to_review(sbx, settings):
    """Found by the stale-read attacker: AP's -32603 ("modified by another request", its
    optimistic lock, NOTES §1.6: re-read and retry) on ``notify_refund_sent`` was taken
    as AP refusing the refund for good: the refund went to manual_review with the USDC
    back on chain, AP stayed ``pending_anchor`` for ever (the wallet shows the
    withdrawal still in progress) and no console action drives a refund in review. Now
    the refund stays ``submitted`` and the sweep tells AP again."""
    from payouts import tasks

    wallet, request = _short_withdrawal(sbx, settings)
    sbx.fault("ap.rpc_32603", times=1, methods=["notify_refund_sent"])
    first = payout_ops.withdrawal_refund_on_chain(request_id=request.pk,
                                                  operator=_operator(), note=NOTE)
    assert [p["transaction_hash"] for p in _refunds_on_chain(wallet)] == [first.tx_hash]
    assert first.status == "submitted", first.last_error
    assert "-32603" in first.last_error

    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    assert tasks.sweep_refunds() == {"completed": 1}
    tx = platform.get_transaction(request.transaction_id)
    assert tx["status"] == "refunded"
    assert [p["id"] for p in tx["refunds"]["payments"]] == [first.tx_hash]
    assert len(_refunds_on_chain(wallet)) == 1


# --- 3: the hub's sends (sagas/hub.py) ---------------------------------------------------

@pytest.fixture
def remit(clean_sandbox, settings, monkeypatch):
    """Corridor pointed at the sandbox's anchor; sagas driven here, not by Celery; a USDC
    float on the hub so that a second payment could happen at all."""
    settings.ANCHOR31_URL = f"{clean_sandbox.url}/anchor31"
    monkeypatch.setattr(engine, "_enqueue", lambda saga_id, delay: None)
    partner = clean_sandbox.http.get("/anchor31/sandbox/partner").raise_for_status().json()
    _, key = remittances.partner_create(name=f"p{time.time_ns()}",
                                        stellar_account=partner["account"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    clean_sandbox.http.post("/horizon/sandbox/fund", json={
        "account": hub.hub_address(), "amount": "25.5"}).raise_for_status()
    return clean_sandbox, client, partner


def _remittance(sandbox, client) -> dict:
    response = client.post("/api/remittances", {
        "amount": "25.5", "send_currency": "USDC", "receive_currency": "INR",
        "corridor": "USDC-INR",
        "beneficiary": {"name": "Asha Verma", "account_number": "50100123456789",
                        "ifsc": "HDFC0001234"}},
        format="json", HTTP_IDEMPOTENCY_KEY=f"k-{time.time_ns()}")
    assert response.status_code == 202, response.json()
    remittance = response.json()
    sandbox.http.post("/anchor31/sandbox/partner/pay", json={
        "destination": remittance["hub_account"], "amount": remittance["amount"],
        "memo_type": remittance["memo_type"], "memo": remittance["memo"]}).raise_for_status()
    return remittance


def _run(saga_id: int) -> str:
    return engine.run(saga_id, "driver", dispatch=False).status


def _drive_for(saga_id: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _run(saga_id) in Saga.OPEN_STATUSES:
        time.sleep(0.05)


def _drive_to_end(saga_id: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while (status := _run(saga_id)) in Saga.OPEN_STATUSES:
        assert time.monotonic() < deadline, f"saga {saga_id} still {status}"
        time.sleep(0.05)
    return status


def _hub_payments(memo: str, destination: str) -> list[stellar.Transfer]:
    return [t for t in stellar.find_transfers_by_reference(hub.hub_address(), memo, "")
            if t.source == hub.hub_address() and t.destination == destination]


@pytest.mark.parametrize(("leg", "rule", "fault"), [
    ("bridge refund", "strict", "lookup_lag"), ("bridge refund", "naive", "lookup_lag"),
    ("anchor funding", "strict", "lookup_lag"),
    ("bridge refund", "strict", "split_nodes:behind"),
    ("bridge refund", "strict", "split_nodes:current")])
def test_a_hub_send_after_a_504_behind_a_lagging_horizon_pays_once(remit, settings, monkeypatch,
                                                                   leg, rule, fault):
    """After the 504, the leg retries behind a Horizon that has not indexed the payment
    (lookup_lag), or behind two nodes at two heights (split_nodes, either first)."""
    sandbox, client, partner = remit
    settings.ENVELOPE_RULE = rule
    # the naive side shows the rule's own failure: the hub's history-coverage wait before
    # any envelope (sagas/hub.py, a rebuild too since stop 34) would hold its rebuild
    settings.HUB_HISTORY_COVERAGE_CHECK = rule != "naive"
    if leg == "bridge refund":  # the anchor refuses: the partner is refunded from the hub
        sandbox.fault("anchor31.reject_before_funding", times=1)
        rejected_first(monkeypatch)  # else the hub may fund the anchor first and take the 504
    sandbox.fault("horizon.submit_504_after_apply", times=1, account=hub.hub_address())
    remittance = _remittance(sandbox, client)
    saga_id = remittance["id"]
    key = f"{saga_id}:0:undo" if leg == "bridge refund" else f"{saga_id}:2"

    def posted():  # the hub's envelope stored and posted once (answered 504)
        _run(saga_id)
        return HubPayment.objects.filter(key=key).first()

    first = wait_for(posted, timeout=20, interval=0.05, what="the hub's first envelope")
    if leg == "bridge refund":  # the 504 went to the refund: the anchor was never funded
        assert not HubPayment.objects.filter(key=f"{saga_id}:2").exists()
    if fault == "lookup_lag":
        sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)
    else:
        sandbox.fault("horizon.split_nodes", ledgers=FOREVER, first=fault.split(":")[1])
    if rule == "naive":  # drive until the naive rule, seeing the sequence consumed, rebuilds
        wait_for(lambda: _run(saga_id) and HubPayment.objects.get(pk=first.pk).rebuilds,
                 timeout=20, interval=0.05, what="the naive rule's rebuild")
    else:
        _drive_for(saga_id, 1.5)  # retries behind a Horizon that has not indexed the payment
    during = HubPayment.objects.get(pk=first.pk)
    sandbox.clear_faults()
    status = _drive_to_end(saga_id)

    if leg == "bridge refund":
        memo, destination, end = remittance["memo"], partner["account"], Saga.Status.COMPENSATED
    else:
        intent = engine_intent(saga_id)
        memo, destination, end = intent["memo"], intent["account"], Saga.Status.COMPLETED
    paid = _hub_payments(memo, destination)
    if rule == "naive":
        assert len(paid) >= 2, paid
        return
    trail = list(SagaEvent.objects.filter(saga_id=saga_id).values_list("event", "detail"))
    assert status == end, trail
    assert (during.tx_hash, during.rebuilds) == (first.tx_hash, 0)
    assert [t.tx_hash for t in paid] == [first.tx_hash]


def engine_intent(saga_id: int) -> dict:
    from sagas.models import SagaStep

    return SagaStep.objects.get(saga_id=saga_id, kind="anchor.fund").intent


# --- muxed senders ---------------------------------------------------------------------

def _receipt(request: WithdrawalRequest, sender: str) -> None:
    from django.conf import settings
    from django.utils import timezone

    StellarReceiptFactory(
        from_account=sender, to_account=stellar.distribution_keypair().public_key,
        asset=f"{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}",
        amount=request.amount_in, memo_type=request.memo_type, memo=request.memo,
        created_at=timezone.now())


@pytest.mark.parametrize(("paid_by", "outcome"), [(77, "ok"), (78, "review"),
                                                  (None, "review")])
def test_a_withdrawal_from_a_muxed_account_is_settled_only_by_its_own_id(paid_by, outcome):
    from stellar_sdk import MuxedAccount

    from payouts import receipts

    base = Keypair.random().public_key
    muxed = {n: MuxedAccount(base, n).account_muxed for n in (77, 78)}
    request = WithdrawalRequestFactory(memo=str(time.time_ns()), memo_type="id",
                                       amount_in=D("10"), fee=D("0.5"), amount_out=D("798"),
                                       amount_out_paise=79800, rate=D("84"),
                                       source_account=muxed[77])
    _receipt(request, muxed[paid_by] if paid_by else base)

    verdict = receipts.verify(request, ap_source=muxed[77])

    assert verdict.outcome == outcome, verdict
    if outcome == "review":
        assert verdict.reason == "payment from an unexpected account"


def test_a_plain_account_still_matches_its_muxed_payments():
    from stellar_sdk import MuxedAccount

    from payouts import receipts

    base = Keypair.random().public_key
    assert receipts.sender_matches(MuxedAccount(base, 5).account_muxed, base)
    assert receipts.sender_matches(base, base)
    assert not receipts.sender_matches(Keypair.random().public_key, base)


def test_switching_on_an_unknown_fault_is_an_error_in_process_too():
    from sandbox.control import faults

    with pytest.raises(faults.UnknownFault, match="horizon.lookup_lagg"):
        faults.set_fault("horizon.lookup_lagg")
