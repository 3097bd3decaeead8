"""Issue 10 §5 part B: declared status machines, conditional UPDATEs, one webhook
dedupe service.

- Each of ``deposit_releases``, ``withdrawal_payouts`` and ``withdrawal_refunds``
  declares ``TRANSITIONS``; every declared pair moves the row, every other pair raises
  ``IllegalTransition`` and writes nothing, and a conditional UPDATE that lost the race
  (the status changed underneath) moves nothing.
- An operator's new payout attempt restarts the guard's clocks (``clock_started_at``)
  and never rewrites ``created_at``.
- No app code branches on the text of ``last_error``.
- ``anchor.inbox.record_and_apply``: a duplicate delivery applies nothing, and an apply
  that raises leaves no dedupe row, for Razorpay payments and RazorpayX payouts alike.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import itertools
import json
import threading
import time
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from anchor import deposits
from anchor.models import DepositPayment, DepositRelease, InboundEvent
from anchor.transitions import IllegalTransition, TransitionLost
from payouts import guard
from payouts import operations as payout_ops
from payouts.models import PayoutAttempt, StellarReceipt, WithdrawalPayout, WithdrawalRefund
from tests.factories import DepositOrderFactory, DepositReleaseFactory
from tests.flows import wait_for
from tests.inbound import applied_outcome

ROOT = Path(__file__).resolve().parent.parent
APP_DIRS = ("anchor", "payouts", "sagas", "corridor", "ledger")
_ids = itertools.count()


# --- rows in a given status ------------------------------------------------------------

def _release(status: str) -> DepositRelease:
    return DepositReleaseFactory(status=status, last_error="before")


def _payout(status: str) -> WithdrawalPayout:
    return WithdrawalPayout.objects.create(transaction_id=str(uuid.uuid4()), status=status,
                                           amount_paise=85000, fund_account_id="fa_T1",
                                           last_error="before")


def _refund(status: str) -> WithdrawalRefund:
    n = next(_ids)
    receipt = StellarReceipt.objects.create(
        paging_token=f"pt{uuid.uuid4().hex[:20]}", tx_hash=uuid.uuid4().hex * 2,
        from_account="G" + "A" * 55, to_account="G" + "B" * 55, asset="USDC:G" + "C" * 55,
        amount=Decimal("10"), memo_type="none", created_at=timezone.now())
    return WithdrawalRefund.objects.create(
        receipt=receipt, transaction_id=f"receipt:{receipt.pk}", status=status,
        destination="G" + "A" * 55, amount=Decimal("10"), source_account="G" + "D" * 55,
        sequence=1000 + n, envelope_xdr="AAAA", tx_hash=uuid.uuid4().hex * 2,
        max_time=timezone.now(), last_error="before")


MACHINES = {DepositRelease: _release, WithdrawalPayout: _payout, WithdrawalRefund: _refund}


def _pairs(declared: bool):
    for model in MACHINES:
        statuses = [s.value for s in model.Status]
        for source, target in itertools.product(statuses, statuses):
            if (target in model.TRANSITIONS[source]) == declared:
                yield pytest.param(model, source, target,
                                   id=f"{model.__name__}:{source}->{target}")


def _row(model, pk) -> dict:
    return model.objects.values().get(pk=pk)


def test_every_status_has_a_row_in_its_table():
    for model in MACHINES:
        assert set(model.TRANSITIONS) == {s.value for s in model.Status}, model.__name__
        for targets in model.TRANSITIONS.values():
            assert targets <= {s.value for s in model.Status}


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "source", "target"), list(_pairs(declared=True)))
def test_every_declared_transition_moves_the_row(model, source, target):
    row = MACHINES[model](source)
    before = _row(model, row.pk)

    moved = model.transition(row.pk, source, target, require=True, last_error="after")

    after = _row(model, row.pk)
    assert moved is True
    assert (after["status"], after["last_error"]) == (target, "after")
    assert after["updated_at"] > before["updated_at"]
    assert after["created_at"] == before["created_at"]


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "source", "target"), list(_pairs(declared=False)))
def test_a_transition_not_in_the_table_raises_and_changes_nothing(model, source, target):
    row = MACHINES[model](source)
    before = _row(model, row.pk)

    with pytest.raises(IllegalTransition, match=f"{source} -> {target} is not a declared"):
        model.transition(row.pk, source, target, last_error="after")
    # One illegal source among legal ones refuses the whole UPDATE too.
    legal = model.sources_of(target)
    with pytest.raises(IllegalTransition):
        model.transition(row.pk, (*legal, source), target, last_error="after")

    assert _row(model, row.pk) == before


def _every_status():
    for model in MACHINES:
        for status in model.Status:
            yield pytest.param(model, status.value, id=f"{model.__name__}:{status.value}")


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "status"), list(_every_status()))
def test_a_note_never_replaces_the_reason_of_a_row_in_the_operators_queue(model, status):
    """``StatusMachine.note`` writes ``last_error`` on a working row and leaves the
    reason of a row in one of its ``REASON_STATUSES`` (what sagas.ReviewItem shows)."""
    row = MACHINES[model](status)

    wrote = model.note(row.pk, "submit outcome unknown: HTTP 500")

    kept = status in model.REASON_STATUSES
    assert wrote is not kept
    assert _row(model, row.pk)["last_error"] == (
        "before" if kept else "submit outcome unknown: HTTP 500")
    assert model.Status.MANUAL_REVIEW in model.REASON_STATUSES


@pytest.mark.django_db
@pytest.mark.parametrize("model", list(MACHINES))
def test_a_transition_that_lost_the_race_moves_nothing(model):
    S = model.Status
    row = MACHINES[model](S.SUBMITTING if model is not WithdrawalPayout else S.PROCESSING)
    source = row.status
    target = S.SUBMITTED if model is not WithdrawalPayout else S.COMPLETED
    # Another worker moved it on between our read and our write.
    model.objects.filter(pk=row.pk).update(status=S.MANUAL_REVIEW, last_error="theirs")
    before = _row(model, row.pk)

    assert model.transition(row.pk, source, target, last_error="ours") is False
    with pytest.raises(TransitionLost):
        model.transition(row.pk, source, target, require=True, last_error="ours")

    assert _row(model, row.pk) == before


@pytest.mark.django_db
def test_a_where_condition_that_no_longer_holds_moves_nothing():
    release = _release(DepositRelease.Status.SUBMITTING)
    before = _row(DepositRelease, release.pk)

    from django.db.models import Q
    moved = DepositRelease.transition(release.pk, "submitting", "submitted",
                                      where=Q(tx_hash="an old hash"), last_error="")

    assert moved is False
    assert _row(DepositRelease, release.pk) == before


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_on_one_row_move_it_exactly_once():
    """Real concurrent connections: one drive marks the release submitted while another
    sends it to review; the conditional UPDATE lets exactly one of them win."""
    release = _release(DepositRelease.Status.SUBMITTING)
    barrier = threading.Barrier(2)
    results: dict[str, bool] = {}

    def worker(target: str) -> None:
        try:
            barrier.wait(timeout=5)
            results[target] = DepositRelease.transition(release.pk, "submitting", target,
                                                        last_error=f"by {target}")
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in ("submitted",
                                                                     "manual_review")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)

    assert sorted(results.values()) == [False, True]
    winner = next(t for t, moved in results.items() if moved)
    after = _row(DepositRelease, release.pk)
    assert (after["status"], after["last_error"]) == (winner, f"by {winner}")


@pytest.mark.django_db
def test_a_failure_code_belongs_to_the_failed_status_only():
    release = _release(DepositRelease.Status.SUBMITTING)
    DepositRelease.transition(release.pk, "submitting", "failed",
                              failure_code=DepositRelease.FailureCode.NO_TRUST)
    assert _row(DepositRelease, release.pk)["failure_code"] == "op_no_trust"

    DepositRelease.transition(release.pk, "failed", "submitting", last_error="rebuilt")

    assert _row(DepositRelease, release.pk)["failure_code"] == ""


# --- the payout's clocks ------------------------------------------------------------------

@pytest.fixture
def sbx(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return clean_sandbox


@pytest.mark.django_db(transaction=True)
def test_an_operator_retry_restarts_the_clock_and_never_rewrites_created_at(sbx):
    from tests.flows import ap, sandbox_payouts, settle, start_withdrawal

    wallet, transaction_id, pay = start_withdrawal(sbx)
    sbx.fault("razorpayx.fail_payout", times=1)
    wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    payout = wait_for(lambda: (p := settle(transaction_id, rounds=3)) is not None and
                      p.status == "failed" and p, what="payout failed")
    first = PayoutAttempt.objects.get(payout=payout)
    assert first.provider_status == "failed"
    created_at, clock = payout.created_at, payout.clock_started_at
    assert clock == created_at or abs(clock - created_at) < timedelta(seconds=1)
    operator = User.objects.create_superuser("olga", "olga@example.com", "x" * 16)
    minted_after = timezone.now()

    payout_ops.payout_new_attempt(payout_id=payout.pk, operator=operator,
                                  note="ticket OPS-7: bank fixed the account")

    payout = settle(transaction_id)
    assert (payout.status, payout.attempts) == ("completed", 2)
    assert payout.created_at == created_at  # the first claim's time stays
    assert payout.clock_started_at >= minted_after  # the guard's clocks restarted
    assert ap(transaction_id)["status"] == "completed"
    assert sorted(p["status"] for p in sandbox_payouts(sbx, transaction_id)) == [
        "failed", "processed"]


@pytest.mark.django_db
def test_the_guards_clock_reads_clock_started_at_not_created_at(settings):
    """A payout first claimed long ago whose current attempt just started is not sent to
    review for an unknown outcome; one whose attempt started long ago is."""
    settings.PAYOUT_UNKNOWN_REVIEW_S = 60.0
    long_ago = timezone.now() - timedelta(seconds=600)
    fresh, stale = _payout("processing"), _payout("processing")
    WithdrawalPayout.objects.filter(pk__in=[fresh.pk, stale.pk]).update(created_at=long_ago)
    WithdrawalPayout.objects.filter(pk=stale.pk).update(clock_started_at=long_ago)

    assert guard._unknown_too_long(WithdrawalPayout.objects.get(pk=fresh.pk)).status == \
        "processing"
    assert guard._unknown_too_long(WithdrawalPayout.objects.get(pk=stale.pk)).status == \
        "manual_review"


# --- no branching on last_error's text ------------------------------------------------------

_TEXT_METHODS = {"startswith", "endswith", "find", "rfind", "index", "count", "split",
                 "partition", "lower", "upper", "casefold", "strip", "removeprefix",
                 "removesuffix", "__contains__"}


def _is_last_error(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "last_error") or (
        isinstance(node, ast.Name) and node.id == "last_error")


def last_error_text_branches(source: str, filename: str) -> list[str]:
    """Places in ``source`` that read meaning out of ``last_error``'s text: a string
    method called on it, ``in`` / ``==`` against it, a regex over it, an ORM text lookup
    (``last_error__startswith=...``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in _TEXT_METHODS and \
                _is_last_error(node.value):
            found.append(f"{where} last_error.{node.attr}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn) and _is_last_error(right):
                    found.append(f"{where} ... in last_error")
                elif isinstance(op, ast.Eq | ast.NotEq) and any(map(_is_last_error, operands)):
                    found.append(f"{where} last_error compared")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                    func.value.id in ("re", "regex") and any(map(_is_last_error, node.args)):
                found.append(f"{where} re.{func.attr}(last_error)")
            for kw in node.keywords:
                if kw.arg and kw.arg.startswith("last_error__"):
                    found.append(f"{where} {kw.arg}=")
    return found


def test_the_scanner_finds_each_kind_of_branch():
    code = ("if r.last_error.startswith('op_no_trust'): pass\n"
            "if 'x' in r.last_error: pass\n"
            "if r.last_error == 'x': pass\n"
            "re.match('op_', r.last_error)\n"
            "Release.objects.filter(last_error__contains='x')\n"
            "if r.last_error: pass\n"            # truthiness: fine
            "text = f'({r.last_error})'\n")      # display: fine
    assert len(last_error_text_branches(code, "x.py")) == 5


def test_no_app_code_branches_on_the_text_of_last_error():
    found = []
    for app in APP_DIRS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            found += last_error_text_branches(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []


# --- one dedupe service for both providers' webhooks ---------------------------------------

def _sign(body: bytes) -> str:
    return hmac.new(settings.RAZORPAY_WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()


def _post(client, path: str, event: dict, event_id: str):
    body = json.dumps(event, separators=(",", ":")).encode()
    return client.post(path, body, content_type="application/json",
                       HTTP_X_RAZORPAY_SIGNATURE=_sign(body), HTTP_X_RAZORPAY_EVENT_ID=event_id)


def _payment_event(order) -> dict:
    return {"entity": "event", "event": "payment.captured", "contains": ["payment"],
            "payload": {"payment": {"entity": {
                "id": f"pay_T{next(_ids):012d}", "entity": "payment",
                "amount": order.amount_in_paise, "currency": "INR", "status": "captured",
                "order_id": order.order_id, "method": "upi", "captured": True,
                "created_at": int(time.time())}}}}


class Spy:
    """Calls the real function and counts the calls that ``match`` (the sandbox may
    deliver webhooks of its own meanwhile); ``fail_first`` raises on the first matching
    call (a crash half-way through applying, which the real parts cannot be made to do
    on cue)."""

    def __init__(self, real, *, fail_first: bool = False, match=lambda **kw: True):
        self.real, self.fail_first, self.match, self.calls = real, fail_first, match, 0

    def __call__(self, *args, **kwargs):
        if self.match(**kwargs):
            self.calls += 1
            if self.fail_first and self.calls == 1:
                raise RuntimeError("worker died half-way through applying")
        return self.real(*args, **kwargs)


@pytest.mark.django_db
def test_a_duplicate_razorpay_payment_event_is_applied_once(client, monkeypatch):
    order = DepositOrderFactory()
    spy = Spy(deposits.payment_record)
    monkeypatch.setattr(deposits, "payment_record", spy)
    event = _payment_event(order)

    first = _post(client, "/webhooks/razorpay/payments", event, "evt_dup_pay")
    again = _post(client, "/webhooks/razorpay/payments", event, "evt_dup_pay")

    assert (first.status_code, first.json()) == (200, {"outcome": "received"})
    assert (again.status_code, again.json()) == (200, {"outcome": "duplicate"})
    assert applied_outcome("razorpay", "evt_dup_pay") == "recorded"
    assert spy.calls == 1
    assert list(InboundEvent.objects.values_list("source", "event_id", "outcome")) == [
        ("razorpay", "evt_dup_pay", "recorded")]
    assert DepositPayment.objects.count() == 1


@pytest.mark.django_db
def test_a_razorpay_payment_apply_that_raises_leaves_its_row_waiting_for_a_later_drain(
        client, monkeypatch):
    order = DepositOrderFactory()
    spy = Spy(deposits.payment_record, fail_first=True)
    monkeypatch.setattr(deposits, "payment_record", spy)
    event = _payment_event(order)
    client.raise_request_exception = False

    crashed = _post(client, "/webhooks/razorpay/payments", event, "evt_crash_pay")

    # Durable before the 2xx; the drain's apply crashed and rolled back, the row waits.
    assert crashed.json() == {"outcome": "received"}
    assert applied_outcome("razorpay", "evt_crash_pay") == "received"
    assert not DepositPayment.objects.exists()

    redelivered = _post(client, "/webhooks/razorpay/payments", event, "evt_crash_pay")

    assert redelivered.json() == {"outcome": "duplicate"}
    assert applied_outcome("razorpay", "evt_crash_pay") == "recorded"  # a later drain
    assert spy.calls == 2
    assert list(InboundEvent.objects.values_list("event_id", "outcome")) == [
        ("evt_crash_pay", "recorded")]
    assert DepositPayment.objects.get().payment_id == \
        event["payload"]["payment"]["entity"]["id"]


def _processed_event(sbx, payout: WithdrawalPayout) -> dict:
    from tests.flows import sandbox_payouts

    settled = wait_for(lambda: [p for p in sandbox_payouts(sbx, payout.transaction_id)
                                if p["status"] == "processed"], what="payout processed")
    entity = {"id": payout.provider_payout_id, "entity": "payout",
              "amount": payout.amount_paise, "currency": "INR", "status": "processed",
              "utr": settled[0]["utr"], "reference_id": payout.transaction_id,
              "status_details": {}}
    return {"entity": "event", "event": "payout.processed", "contains": ["payout"],
            "payload": {"payout": {"entity": entity}}, "created_at": int(time.time())}


def _processing_payout(sbx) -> WithdrawalPayout:
    from tests.flows import processing_payout

    return processing_payout(sbx)


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_razorpayx_payout_event_is_applied_once(sbx, client, monkeypatch):
    from payouts import webhooks
    from tests.flows import ap

    payout = _processing_payout(sbx)
    event = _processed_event(sbx, payout)
    spy = Spy(webhooks.payout_webhook_apply, match=lambda **kw: kw.get("event") == event)
    monkeypatch.setattr(webhooks, "payout_webhook_apply", spy)

    first = _post(client, "/webhooks/razorpay/payouts", event, "evt_dup_pout")
    again = _post(client, "/webhooks/razorpay/payouts", event, "evt_dup_pout")

    assert first.json() == {"outcome": "received"}
    assert again.json() == {"outcome": "duplicate"}
    assert applied_outcome("razorpayx", "evt_dup_pout") == "processing->completed"
    assert spy.calls == 1
    assert list(InboundEvent.objects.filter(source="razorpayx", event_id="evt_dup_pout")
                .values_list("outcome", flat=True)) == ["processing->completed"]
    payout.refresh_from_db()
    assert payout.status == "completed" and payout.ap_completed_at is not None
    assert ap(payout.transaction_id)["status"] == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_razorpayx_apply_that_raises_leaves_its_row_waiting_for_a_later_drain(
        sbx, client, monkeypatch):
    from payouts import webhooks
    from tests.flows import ap

    payout = _processing_payout(sbx)
    event = _processed_event(sbx, payout)
    spy = Spy(webhooks.payout_webhook_apply, fail_first=True,
              match=lambda **kw: kw.get("event") == event)
    monkeypatch.setattr(webhooks, "payout_webhook_apply", spy)
    client.raise_request_exception = False

    crashed = _post(client, "/webhooks/razorpay/payouts", event, "evt_crash_pout")

    # Durable before the 2xx; the drain's apply crashed and rolled back, the row waits.
    assert crashed.json() == {"outcome": "received"}
    assert InboundEvent.objects.get(source="razorpayx", event_id="evt_crash_pout"
                                    ).processed_at is None
    payout.refresh_from_db()
    assert (payout.status, payout.reference, payout.ap_completed_at) == ("processing", "", None)

    redelivered = _post(client, "/webhooks/razorpay/payouts", event, "evt_crash_pout")

    assert redelivered.json() == {"outcome": "duplicate"}
    assert applied_outcome("razorpayx", "evt_crash_pout") == "processing->completed"
    assert spy.calls == 2
    assert list(InboundEvent.objects.filter(source="razorpayx", event_id="evt_crash_pout")
                .values_list("outcome", flat=True)) == ["processing->completed"]
    payout.refresh_from_db()
    assert payout.status == "completed" and payout.ap_completed_at is not None
    assert ap(payout.transaction_id)["status"] == "completed"
