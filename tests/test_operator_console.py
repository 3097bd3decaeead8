"""The operator console (Django admin, DESIGN.md §1 "Operators"): the manual-review
queue, the actions and their permissions, the read views.

Every action is driven as an operator drives it: Django's test client, logged in as a
member of the ``operators`` or ``auditors`` group the migration made, posting the action
from the changelist (-> the confirmation page), then the confirmation form (-> the
service). States that need the outside world are reached through the sandbox over real
HTTP, as tests/test_deposit_flow.py and tests/test_withdrawal_flow.py reach them.

Each action: its page says what will happen; it changes the state and writes exactly
one audit row naming the operator and the note, in the same transaction as the change;
a refusal (permission, state, evidence) changes nothing and writes no audit row."""

from __future__ import annotations

import itertools
import time
from decimal import Decimal

import pytest
from django.apps import apps as django_apps
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote as admin_quote
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from anchor import platform, reconciler, releases, stellar
from anchor import razorpay as rzp
from anchor.models import (
    ApTransactionEvent,
    DepositOrder,
    DepositRelease,
    InboundEvent,
    ReleaseEvent,
)
from ledger import services as ledger
from payouts import operations as payout_ops
from payouts import poller
from payouts.models import (
    PayoutAttempt,
    PayoutEvent,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from payouts.withdrawals import quote
from sagas import engine, plans
from sagas import operations as saga_ops
from sagas.legs import Leg, LegOutcome, ManualReviewError, Plan
from sagas.models import ReviewItem, Saga, SagaEvent, SagaStep
from sagas.plans.testing import LEGS, LedgerLeg
from tests.factories import (
    ApTransactionEventFactory,
    DepositOrderFactory,
    DepositPaymentFactory,
    DepositReleaseFactory,
    PayoutAttemptFactory,
    PayoutEventFactory,
    ReleaseEventFactory,
    StellarReceiptFactory,
    WithdrawalPayoutFactory,
    WithdrawalRefundFactory,
    WithdrawalRequestFactory,
)
from tests.flows import (
    NOTE,
    Wallet,
    ap,
    assert_released_once,
    changelist,
    confirm,
    confirmation_page,
    paid_deposit,
    paid_withdrawal,
    refused,
    sandbox_payouts,
    settle,
    short_withdrawal,
    start_and_pay,
    sync_groups,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

_refs = itertools.count()


# --- people ----------------------------------------------------------------------------

@pytest.fixture
def groups():
    """The groups exactly as the migration makes them (transactional tests empty the
    tables after each test; the migration's own function puts them back)."""
    sync_groups(django_apps, connection.schema_editor())
    return Group.objects.get(name="operators"), Group.objects.get(name="auditors")


def _staff(username: str, group: Group) -> User:
    user = User.objects.create_user(username=username, is_staff=True)
    user.groups.add(group)
    return user


@pytest.fixture
def operator(groups, client):
    user = _staff("alice", groups[0])
    client.force_login(user)
    return user


@pytest.fixture
def auditor(groups, client):
    user = _staff("audrey", groups[1])
    client.force_login(user)
    return user


# --- driving an action through the admin -------------------------------------------------


def forged(client, model: str, action: str, pk, **fields) -> None:
    """Someone without the action's permission posts it anyway (both steps): Django's
    admin does not offer it, so the POST runs nothing and renders the plain list."""
    for extra in ({}, {"post": "yes", "note": NOTE, **fields}):
        response = client.post(changelist(model), {"action": action,
                                                   ACTION_CHECKBOX_NAME: [pk], **extra},
                               follow=True)
        assert response.status_code == 200
        assert "What will happen" not in response.content.decode()
        assert [str(m) for m in response.context["messages"]] in ([], ["No action selected."])


def assert_one_audit_row(rows, *, event: str, operator: User) -> None:
    rows = list(rows)
    assert [(r.event, r.operator, r.note) for r in rows] == [(event, operator.username, NOTE)]


# --- groups and permissions -------------------------------------------------------------------

ACTION_PERMS = {
    "anchor.redrive_release", "anchor.expire_ap_transaction", "payouts.confirm_payout_paid",
    "payouts.mark_payout_failed", "payouts.new_payout_attempt",
    "payouts.accept_short_withdrawal", "payouts.refund_withdrawal", "payouts.refund_receipt",
    "sagas.resume_saga", "anchor.review_customer", "anchor.refund_deposit",
    "sagas.retry_saga_step", "sagas.compensate_saga", "sagas.resolve_saga",
    "treasury.resolve_break",
}


def _perms(group: Group) -> set[str]:
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}


@pytest.mark.django_db(transaction=False)
def test_the_migration_makes_operators_and_auditors(groups):
    """The groups as the migration's own function makes them (``groups``: run again,
    since a transactional test that ran before on this worker emptied the tables; the
    suite runs in several processes, so no order is promised)."""
    operators, auditors = (_perms(g) for g in groups)

    assert ACTION_PERMS <= operators
    assert operators - ACTION_PERMS == auditors
    assert all(p.split(".")[1].startswith("view_") for p in auditors)
    assert {"sagas.view_saga", "sagas.view_reviewitem", "ledger.view_account",
            "anchor.view_depositrelease", "payouts.view_withdrawalpayout",
            "django_celery_beat.view_periodictask"} <= auditors
    assert not any(p.split(".")[1].startswith(("add_", "change_", "delete_"))
                   for p in operators)


# --- sagas (ledger-only plan: no sandbox) -----------------------------------------------------

GATE = {"open": False}


class GateLeg(Leg):
    """A leg that stops the saga for a person until the test opens the gate (as an anchor
    failing a payout it was funded for does, DESIGN.md §6)."""

    kind = "ops.gate"

    def forward(self, ctx):
        if not GATE["open"]:
            raise ManualReviewError("the receiving anchor failed a funded payout")
        return LegOutcome(output={"passed": True})


@pytest.fixture
def gate_plan():
    GATE["open"] = False
    plans.get("testing")  # load the shipped plans first
    fill = dict(LEGS)["test.fill"]
    plans.register(Plan("ops.testing", (LedgerLeg("test.fill", fill), GateLeg())))
    yield
    plans.unregister("ops.testing")


def stopped_saga() -> Saga:
    """A saga that booked its first leg and stopped in manual_review at the second."""
    saga = engine.start(kind="ops.testing", reference=f"ops-{time.time_ns()}-{next(_refs)}",
                        input={"amount": "10.00", "currency": "USDC"}, dispatch=False)
    assert engine.run(saga.pk, "worker-1", dispatch=False).status == "manual_review"
    return Saga.objects.get(pk=saga.pk)


def operator_events(saga: Saga):
    return SagaEvent.objects.filter(saga=saga, event__startswith="operator.")


def assert_saga_audit(saga: Saga, event: str, operator: User) -> SagaEvent:
    rows = list(operator_events(saga))
    assert [(r.event, r.worker, r.detail["operator"], r.detail["note"]) for r in rows] == \
        [(event, f"operator:{operator.username}", operator.username, NOTE)]
    return rows[0]


def test_the_queue_lists_a_stopped_saga_and_an_operator_resumes_it(gate_plan, operator,
                                                                    client):
    saga = stopped_saga()
    queue = client.get(changelist("sagas_reviewitem"), {"q": saga.reference})
    assert queue.status_code == 200
    assert [(i.kind, i.object_id, i.amount, i.currency) for i in
            queue.context["cl"].result_list] == [("saga", saga.pk, Decimal("10.00"), "USDC")]
    assert "the receiving anchor failed a funded payout" in queue.content.decode()
    assert reverse("admin:sagas_saga_change", args=[saga.pk]) in queue.content.decode()

    page = confirmation_page(client, "sagas_saga", "resume", saga.pk)
    assert "Set the saga back to running" in page
    GATE["open"] = True
    shown = confirm(client, "sagas_saga", "resume", saga.pk)

    assert shown == [f"Saga {saga.pk} ({saga.reference}) is now completed."]
    saga.refresh_from_db()
    assert saga.status == "completed"
    event = assert_saga_audit(saga, "operator.resume", operator)
    assert (event.detail["from"], event.detail["to"]) == ("manual_review", "running")
    done = SagaEvent.objects.filter(saga=saga, event="step.done", idx=1).get()
    assert done.detail["attempt"] == 2  # the attempt budget it had left
    assert not ReviewItem.objects.filter(key=f"saga:{saga.pk}").exists()


def test_retry_step_gives_the_stopped_step_a_fresh_budget(gate_plan, operator, client):
    saga = stopped_saga()
    assert "Give step 1 (ops.gate) a fresh attempt budget" in confirmation_page(
        client, "sagas_saga", "retry_step", saga.pk)
    GATE["open"] = True

    confirm(client, "sagas_saga", "retry_step", saga.pk)

    saga.refresh_from_db()
    assert saga.status == "completed"
    event = assert_saga_audit(saga, "operator.retry_step", operator)
    assert (event.idx, event.detail["attempts"]) == (1, 1)
    done = SagaEvent.objects.filter(saga=saga, event="step.done", idx=1).get()
    assert done.detail["attempt"] == 1


def test_compensate_undoes_the_completed_steps(gate_plan, operator, client):
    saga = stopped_saga()
    assert "0 test.fill" in confirmation_page(client, "sagas_saga", "compensate", saga.pk)

    confirm(client, "sagas_saga", "compensate", saga.pk)

    saga.refresh_from_db()
    assert saga.status == "compensated"
    assert_saga_audit(saga, "operator.compensate", operator)
    assert list(SagaStep.objects.filter(saga=saga).values_list("status", flat=True)) == [
        "compensated", "failed"]
    assert ledger.balance(account="test:hub", currency="USDC") == 0
    assert ledger.trial_balance().ok


def test_close_as_resolved_runs_nothing_and_books_nothing(gate_plan, operator, client):
    saga = stopped_saga()
    entries = ledger.balances()
    assert "no money moves and no ledger entry" in confirmation_page(
        client, "sagas_saga", "close", saga.pk)

    confirm(client, "sagas_saga", "close", saga.pk, outcome="compensated")

    saga.refresh_from_db()
    assert (saga.status, saga.wake_at, saga.lease_owner) == ("compensated", None, "")
    event = assert_saga_audit(saga, "operator.close", operator)
    assert event.detail["outcome"] == "compensated"
    assert ledger.balances() == entries
    assert list(SagaStep.objects.filter(saga=saga).values_list("status", flat=True)) == [
        "done", "failed"]


def _saga_version(saga: Saga) -> tuple:
    with connection.cursor() as cur:
        cur.execute("SELECT xmin::text FROM sagas WHERE id = %s", [saga.pk])
        xmin = cur.fetchone()[0]
    steps = list(SagaStep.objects.filter(saga=saga).values_list("status", "attempts"))
    return xmin, steps, SagaEvent.objects.filter(saga=saga).count()


def test_refusals_change_nothing_and_write_no_audit_row(gate_plan, groups, client, monkeypatch):
    saga = stopped_saga()
    before = _saga_version(saga)
    auditor = _staff("audrey", groups[1])
    client.force_login(auditor)

    # No permission: the action is not offered, and a forged POST runs nothing.
    for action in ("resume", "retry_step", "compensate", "close"):
        forged(client, "sagas_saga", action, saga.pk, outcome="completed")
    with pytest.raises(saga_ops.OperationRefused):
        saga_ops.saga_resume(saga_id=saga.pk, operator=auditor, note=NOTE)
    assert _saga_version(saga) == before

    # The audit row and the change commit together: the row failing undoes the change.
    operator = _staff("alice", groups[0])
    monkeypatch.setattr(saga_ops, "operator_name", lambda user: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        saga_ops.saga_close(saga_id=saga.pk, outcome="completed", operator=operator,
                            note=NOTE)
    monkeypatch.undo()
    assert _saga_version(saga) == before

    # A saga that is not in manual_review is refused.
    client.force_login(operator)
    GATE["open"] = True
    confirm(client, "sagas_saga", "resume", saga.pk)
    saga.refresh_from_db()
    assert saga.status == "completed"
    after = _saga_version(saga)
    assert refused(confirm(client, "sagas_saga", "compensate", saga.pk))
    assert _saga_version(saga) == after
    assert operator_events(saga).count() == 1


# --- read views -------------------------------------------------------------------------------

CONSOLE_APPS = ("anchor", "payouts", "sagas", "ledger", "django_celery_beat")


def console_rows() -> None:
    """One row of each console table, as the flows leave them (the flows themselves are
    driven in the sandbox tests below)."""
    release = DepositReleaseFactory(status="manual_review", last_error="attempts exhausted")
    DepositOrderFactory(transaction_id=release.transaction_id)
    DepositPaymentFactory(transaction_id=release.transaction_id)
    ReleaseEventFactory(release=release, event="release.redrive", operator="alice",
                        note=NOTE, detail={"chain": "dead"})
    request = WithdrawalRequestFactory(
        status="manual_review", amount_in=Decimal(10), fee=Decimal("0.5"),
        amount_out=Decimal(798), amount_out_paise=79800, rate=Decimal(84),
        beneficiary_type="vpa", beneficiary_display="as***@okhdfc", contact_id="cont_1",
        fund_account_id="fa_1", memo="4242", memo_type="id", received_amount=Decimal("9.5"),
        review_reason="short: received 9.5 of 10; grace period over",
        chain_evidence=[{"tx_hash": "ab" * 32, "amount": "9.5000000"}])
    StellarReceiptFactory(
        paging_token="123", tx_hash="ab" * 32, from_account="G" + "A" * 55,
        to_account="G" + "B" * 55, asset="USDC:G" + "C" * 55, amount=Decimal("9.5"),
        memo_type="id", memo="4242")
    payout = WithdrawalPayoutFactory(status="reversed", amount_paise=79800,
                                     fund_account_id="fa_2", reference="UTR000111",
                                     last_error="reversed by the bank")
    PayoutAttemptFactory(payout=payout, number=1, provider_payout_id="pout_1",
                         provider_status="reversed")
    PayoutEventFactory(payout=payout, event="payout.confirm_paid", operator="alice", note=NOTE)
    WithdrawalRefundFactory(
        request=request, status="submitting", destination="G" + "A" * 55,
        amount=Decimal("9.5"), source_account="G" + "B" * 55, sequence=7, envelope_xdr="AAAA",
        tx_hash="cd" * 32)
    ApTransactionEventFactory(kind="deposit", event="ap.expired", operator="alice", note=NOTE)


def test_an_auditor_opens_every_read_view_and_sees_no_action(gate_plan, auditor, client):
    stopped_saga()
    console_rows()
    call_command("setup_periodic_tasks")
    queue = client.get(changelist("sagas_reviewitem")).context["cl"].result_list
    assert sorted(i.kind for i in queue) == ["payout", "release", "saga", "withdrawal"]
    assert [i.since for i in queue] == sorted(i.since for i in queue)  # oldest first
    assert [i.reason for i in queue if i.kind == "withdrawal"] == [
        "refund submitting: "]  # a refund in flight shows instead of the old reason
    release = next(i for i in queue if i.kind == "release")
    acts = client.get(changelist("anchor_depositrelease"), {"id__exact": release.object_id})
    assert [r.pk for r in acts.context["cl"].result_list] == [release.object_id]
    registered = [(model, model_admin) for model, model_admin in admin.site._registry.items()
                  if model._meta.app_label in CONSOLE_APPS]
    assert {m._meta.label for m, _ in registered} >= {
        "anchor.DepositRelease", "anchor.ReleaseEvent", "anchor.ApTransactionEvent",
        "payouts.WithdrawalPayout", "payouts.WithdrawalRequest", "payouts.PayoutEvent",
        "sagas.Saga", "sagas.ReviewItem", "ledger.Account", "ledger.Entry",
        "django_celery_beat.PeriodicTask"}
    for model, model_admin in registered:
        opts = model._meta
        response = client.get(changelist(f"{opts.app_label}_{opts.model_name}"))
        assert response.status_code == 200, opts.label
        assert response.context["action_form"] is None, opts.label
        first = model_admin.get_queryset(response.wsgi_request).first()
        if first is not None and model is not ReviewItem:
            page = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change",
                                      args=[admin_quote(first.pk)]))
            assert page.status_code == 200, opts.label
            assert 'name="_save"' not in page.content.decode(), opts.label

    assert client.get(reverse("admin:index")).status_code == 200
    trial = client.get(reverse("admin:ledger_account_trial_balance"))
    assert trial.status_code == 200
    assert "Balanced" in trial.content.decode()
    assert client.get(reverse("admin:anchor_aptransactionevent_expire")).status_code == 403
    saga_page = client.get(reverse("admin:sagas_saga_change", args=[Saga.objects.get().pk]))
    assert "saga.manual_review" in saga_page.content.decode()  # the event timeline


def test_an_operator_is_offered_the_actions(operator, client):
    offered = {}
    for model in ("sagas_saga", "anchor_depositrelease", "payouts_withdrawalpayout",
                  "payouts_withdrawalrequest", "anchor_depositorder"):
        response = client.get(changelist(model))
        offered[model] = [name for name, _ in
                          response.context["action_form"].fields["action"].choices if name]
    assert offered == {
        "sagas_saga": ["resume", "retry_step", "compensate", "close"],
        "anchor_depositrelease": ["redrive"],
        "payouts_withdrawalpayout": ["confirm_paid", "mark_failed", "new_attempt"],
        "payouts_withdrawalrequest": ["accept_short", "refund", "expire_in_ap"],
        "anchor_depositorder": ["expire_in_ap"],
    }
    # Beat schedules: readable, but their own actions need the change permission.
    assert client.get(changelist("django_celery_beat_periodictask")).context[
        "action_form"] is None


# --- deposit releases (sandbox) -------------------------------------------------------------

@pytest.fixture
def sbx(clean_sandbox):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    return clean_sandbox


def reconcile_until(transaction_id: str, status: str) -> DepositRelease:
    def reached():
        reconciler.reconcile_releases()
        release = DepositRelease.objects.get(transaction_id=transaction_id)
        return release if release.status == status else None

    return wait_for(reached, timeout=20, interval=0.5, what=f"release {status}")


def test_redrive_pays_a_release_whose_envelope_is_provably_dead(sbx, operator, client,
                                                                settings):
    settings.RELEASE_MAX_ATTEMPTS = 1
    settings.STELLAR_TX_TIMEOUT_S = 1.5
    wallet = Wallet(sbx)
    transaction_id = paid_deposit(sbx, wallet)
    sbx.fault("horizon.submit_drop", times=1, wait_s=0.3)  # the submission is lost
    first = releases.release_start(transaction_id=transaction_id)
    assert first.status == "submitting"
    # The reconciler re-posts a live envelope; it gives up on it once it is dead.
    wait_for(lambda: stellar.latest_ledger_close_time() > first.max_time, what="max_time")
    release = reconcile_until(transaction_id, "manual_review")
    assert "attempts exhausted" in release.last_error
    assert wallet.usdc_payments() == []
    assert ReviewItem.objects.filter(key=f"release:{release.pk}").exists()

    page = confirmation_page(client, "anchor_depositrelease", "redrive", release.pk)
    assert "can never land" in page and "would be refused" not in page
    shown = confirm(client, "anchor_depositrelease", "redrive", release.pk)

    release.refresh_from_db()
    assert shown == [f"Release {transaction_id} re-driven: attempt 2, hash {release.tx_hash}, "
                     "now completed."]
    assert_released_once(wallet, transaction_id)
    assert_one_audit_row(ReleaseEvent.objects.filter(release=release),
                         event="release.redrive", operator=operator)
    event = ReleaseEvent.objects.get()
    assert (event.detail["chain"], event.detail["new_hash"]) == ("dead", release.tx_hash)


def test_redrive_of_a_release_on_chain_is_refused(sbx, operator, client):
    wallet = Wallet(sbx)
    transaction_id = paid_deposit(sbx, wallet)
    sbx.fault("horizon.submit_504_after_apply", times=1)  # paid, but we were not told
    releases.release_start(transaction_id=transaction_id)
    platform.rpc("notify_transaction_error", {"transaction_id": transaction_id,
                                              "message": "moved by someone else"})
    release = reconcile_until(transaction_id, "manual_review")  # AP refused the hash
    platform.rpc("notify_transaction_recovery", {"transaction_id": transaction_id})
    assert ap(transaction_id)["status"] == "pending_anchor"
    before = DepositRelease.objects.values().get(pk=release.pk)

    page = confirmation_page(client, "anchor_depositrelease", "redrive", release.pk)
    assert "would be refused" in page and "is on chain" in page
    shown = confirm(client, "anchor_depositrelease", "redrive", release.pk)

    assert refused(shown) and "is on chain" in shown[0]
    assert DepositRelease.objects.values().get(pk=release.pk) == before
    assert not ReleaseEvent.objects.exists()
    assert len(wallet.usdc_payments()) == 1


# --- payouts (sandbox) ------------------------------------------------------------------------


def test_a_reversed_payout_paid_again_outside_is_confirmed_with_its_utr(sbx, groups, client,
                                                                        monkeypatch):
    sbx.fault("razorpayx.processed_then_reversed", times=1, after_s=3)  # time to apply processed
    _, transaction_id = paid_withdrawal(sbx)
    settle(transaction_id)
    payout = wait_for(lambda: WithdrawalPayout.objects.filter(
        transaction_id=transaction_id, status="reversed").first(), what="reversal")
    reversed_utr = payout.reference
    assert ReviewItem.objects.get(key=f"payout:{payout.pk}").status == "reversed"
    before = WithdrawalPayout.objects.values().get(pk=payout.pk)

    # An auditor's forged POST runs nothing.
    client.force_login(_staff("audrey", groups[1]))
    for action in ("confirm_paid", "mark_failed", "new_attempt"):
        forged(client, "payouts_withdrawalpayout", action, payout.pk, utr="NEFT12345678")
    operator = _staff("alice", groups[0])
    client.force_login(operator)
    # The audit row and the change commit together.
    monkeypatch.setattr(payout_ops, "_event", lambda **kw: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        payout_ops.payout_confirm_paid(payout_id=payout.pk, utr="NEFT12345678",
                                       operator=operator, note=NOTE)
    monkeypatch.undo()
    # The reversed payment's own UTR is not a payment.
    assert refused(confirm(client, "payouts_withdrawalpayout", "confirm_paid", payout.pk,
                           utr=reversed_utr))
    assert WithdrawalPayout.objects.values().get(pk=payout.pk) == before
    assert not PayoutEvent.objects.exists()

    page = confirmation_page(client, "payouts_withdrawalpayout", "confirm_paid", payout.pk)
    assert "AP already shows this withdrawal completed" in page
    shown = confirm(client, "payouts_withdrawalpayout", "confirm_paid", payout.pk,
                    utr="NEFT12345678")

    assert shown == [f"Payout {transaction_id} recorded paid with UTR NEFT12345678."]
    payout.refresh_from_db()
    assert (payout.status, payout.reference) == ("completed", "NEFT12345678")
    assert_one_audit_row(PayoutEvent.objects.filter(payout=payout),
                         event="payout.confirm_paid", operator=operator)
    assert PayoutEvent.objects.get().detail["previous_utr"] == reversed_utr
    assert len(sandbox_payouts(sbx, transaction_id)) == 1  # nothing was sent
    assert not ReviewItem.objects.filter(key=f"payout:{payout.pk}").exists()


def test_mark_failed_then_a_new_key_pays_once(sbx, operator, client, settings):
    """A payout stuck past the settlement window goes to review; the bank then fails it
    (the provider says failed); an operator marks it failed, and pays again under a new
    key to corrected bank details."""
    settings.PAYOUT_SETTLEMENT_WINDOW_S = 0.5
    sbx.fault("razorpayx.payout_stuck_processing", times=1)
    _, transaction_id = paid_withdrawal(sbx)
    payout = settle(transaction_id)
    assert payout.status == "manual_review"
    first = PayoutAttempt.objects.get(payout=payout)
    sbx.http.post(f"/razorpay/sandbox/payouts/{first.provider_payout_id}/settle",
                  json={"status": "failed"}).raise_for_status()
    wait_for(lambda: PayoutAttempt.objects.get(pk=first.pk).provider_status == "failed",
             what="payout.failed webhook")
    old_fund_account = payout.fund_account_id

    assert "the provider shows nothing under this withdrawal that could still pay" in \
        confirmation_page(client, "payouts_withdrawalpayout", "mark_failed", payout.pk)
    assert confirm(client, "payouts_withdrawalpayout", "mark_failed", payout.pk) == [
        f"Payout {transaction_id} marked failed."]
    payout.refresh_from_db()
    assert payout.status == "failed"
    assert_one_audit_row(PayoutEvent.objects.all(), event="payout.mark_failed",
                         operator=operator)

    page = confirmation_page(client, "payouts_withdrawalpayout", "new_attempt", payout.pk)
    assert "Mint attempt 2 with a NEW idempotency key" in page
    settings.PAYOUT_SETTLEMENT_WINDOW_S = 2.0
    minted_after = timezone.now()
    shown = confirm(client, "payouts_withdrawalpayout", "new_attempt", payout.pk,
                    name="Asha Rao", account_number="50100999988887", ifsc="HDFC0000123")

    # The settlement window counts from the new attempt, not from the first claim,
    # which keeps its time.
    assert shown == [f"Payout {transaction_id}: attempt 2 sent, now processing."]
    assert WithdrawalPayout.objects.get(pk=payout.pk).clock_started_at >= minted_after
    assert WithdrawalPayout.objects.get(pk=payout.pk).created_at == payout.created_at
    payout = settle(transaction_id)
    assert payout.status == "completed" and payout.ap_completed_at
    assert ap(transaction_id)["status"] == "completed"
    assert ap(transaction_id)["external_transaction_id"] == payout.reference
    second = PayoutAttempt.objects.get(payout=payout, number=2)
    assert second.idempotency_key != first.idempotency_key
    assert second.provider_status == "processed"
    paid = sandbox_payouts(sbx, transaction_id)
    assert sorted(p["status"] for p in paid) == ["failed", "processed"]
    assert payout.fund_account_id != old_fund_account
    assert WithdrawalRequest.objects.get(transaction_id=transaction_id
                                         ).beneficiary_display == "HDFC0000123 XXXX8887"
    assert_one_audit_row(PayoutEvent.objects.filter(event="payout.new_attempt"),
                         event="payout.new_attempt", operator=operator)
    assert PayoutEvent.objects.get(event="payout.new_attempt").detail["previous_key"] == \
        str(first.idempotency_key)


def test_a_payout_stuck_with_the_provider(sbx, operator, client, settings):
    """No new key and no "failed" while the provider still holds it processing; an
    operator who saw it paid confirms it with the UTR, and AP completes."""
    settings.PAYOUT_SETTLEMENT_WINDOW_S = 0.5
    sbx.fault("razorpayx.payout_stuck_processing", times=1)
    _, transaction_id = paid_withdrawal(sbx)
    payout = settle(transaction_id)
    assert payout.status == "manual_review" and "settlement window" in payout.last_error
    # The provider's last word on a stuck payout (payout.updated) touches the row too.
    wait_for(lambda: InboundEvent.objects.filter(
        source="razorpayx", event_type="payout.updated").exclude(outcome="").exists(),
        what="payout.updated applied")
    before = WithdrawalPayout.objects.values().get(pk=payout.pk)
    # updated_at aside: a late copy of the provider's webhook, applied by the drain, may
    # touch the attempt with the same values meanwhile; that is not the refused action.
    fields = [f.name for f in PayoutAttempt._meta.concrete_fields if f.name != "updated_at"]
    attempts = list(PayoutAttempt.objects.values(*fields))

    assert "would be refused" in confirmation_page(client, "payouts_withdrawalpayout",
                                                   "new_attempt", payout.pk)
    shown = confirm(client, "payouts_withdrawalpayout", "new_attempt", payout.pk)
    assert refused(shown) and "status for attempt 1 is 'processing'" in shown[0]
    shown = confirm(client, "payouts_withdrawalpayout", "mark_failed", payout.pk)
    assert refused(shown) and "(processing)" in shown[0]
    assert WithdrawalPayout.objects.values().get(pk=payout.pk) == before
    assert list(PayoutAttempt.objects.values(*fields)) == attempts
    assert not PayoutEvent.objects.exists()

    assert "Then tell AP notify_offchain_funds_sent" in confirmation_page(
        client, "payouts_withdrawalpayout", "confirm_paid", payout.pk)
    confirm(client, "payouts_withdrawalpayout", "confirm_paid", payout.pk, utr="412345678901")

    payout.refresh_from_db()
    assert (payout.status, payout.reference) == ("completed", "412345678901")
    assert payout.ap_completed_at is not None
    assert ap(transaction_id)["status"] == "completed"
    assert ap(transaction_id)["external_transaction_id"] == "412345678901"
    assert_one_audit_row(PayoutEvent.objects.all(), event="payout.confirm_paid",
                         operator=operator)
    assert len(sandbox_payouts(sbx, transaction_id)) == 1


# --- withdrawals (sandbox) --------------------------------------------------------------------


def test_accept_a_short_withdrawal_after_expiry_is_refused(sbx, operator, client, settings):
    _, request = short_withdrawal(sbx, settings)
    transaction_id = request.transaction_id
    assert ReviewItem.objects.get(key=f"withdrawal:{request.pk}").amount == Decimal("9.5")

    # Funds arrived: expiring it is refused and changes nothing.
    expire = reverse("admin:anchor_aptransactionevent_expire")
    page = client.get(expire, {"transaction_id": transaction_id}).content.decode()
    assert "would be refused" in page
    response = client.post(expire, {"transaction_id": transaction_id, "note": NOTE},
                           follow=True)
    assert refused([str(m) for m in response.context["messages"]])
    assert ap(transaction_id)["status"] == "pending_anchor"
    assert not ApTransactionEvent.objects.exists()

    expected = quote(Decimal("9.5")).amount_out
    page = confirmation_page(client, "payouts_withdrawalrequest", "accept_short", request.pk)
    assert f"₹{expected} for 9.5000000 USDC" in page
    confirm(client, "payouts_withdrawalrequest", "accept_short", request.pk)

    payout = settle(transaction_id)
    assert payout.status == "completed"
    assert payout.amount_paise == rzp.rupees_to_paise(expected)
    [paid] = sandbox_payouts(sbx, transaction_id)
    assert paid["amount"] == rzp.rupees_to_paise(expected)
    tx = ap(transaction_id)
    assert tx["status"] == "completed"
    assert Decimal(tx["amount_out"]["amount"]) == expected
    request.refresh_from_db()
    assert (request.status, request.amount_in) == ("funds_verified", Decimal("9.5"))
    assert_one_audit_row(PayoutEvent.objects.filter(request=request),
                         event="withdrawal.accept_short", operator=operator)


def test_refund_sends_the_usdc_back_once(sbx, operator, client, settings):
    wallet, request = short_withdrawal(sbx, settings)
    transaction_id = request.transaction_id
    distribution = payout_ops.receipts.withdraw_account()

    def refunds():
        return [p for p in wallet.usdc_payments() if p["from"] == distribution]

    page = confirmation_page(client, "payouts_withdrawalrequest", "refund", request.pk)
    assert f"Send 9.5000000 USDC from the distribution account back to {wallet.address}" in page
    shown = confirm(client, "payouts_withdrawalrequest", "refund", request.pk)

    assert shown == [f"Refund of 9.5000000 USDC to {wallet.address}: completed."]
    refund = WithdrawalRefund.objects.get()
    assert [(p["transaction_hash"], p["amount"]) for p in refunds()] == [
        (refund.tx_hash, "9.5000000")]
    tx = ap(transaction_id)
    assert tx["status"] == "refunded"
    assert [p["id"] for p in tx["refunds"]["payments"]] == [refund.tx_hash]
    assert_one_audit_row(PayoutEvent.objects.all(), event="withdrawal.refund",
                         operator=operator)
    assert not ReviewItem.objects.filter(key=f"withdrawal:{request.pk}").exists()

    # A repeat is refused: no second payment, no second audit row, no INR.
    assert refused(confirm(client, "payouts_withdrawalrequest", "refund", request.pk))
    for _ in range(2):
        poller.poll_withdrawals()
    assert len(refunds()) == 1
    assert PayoutEvent.objects.count() == 1
    assert sandbox_payouts(sbx, transaction_id) == []
    assert WithdrawalRequest.objects.get(pk=request.pk).status == "manual_review"


# --- any AP transaction (sandbox) ---------------------------------------------------------------

def test_expire_an_unpaid_deposit(sbx, operator, client):
    wallet = Wallet(sbx)
    transaction_id, order_id = start_and_pay(sbx, wallet, pay=False)
    order = DepositOrder.objects.get(order_id=order_id)
    expire = reverse("admin:anchor_aptransactionevent_expire")

    # From the deposit order's action to the confirmation page.
    response = client.post(changelist("anchor_depositorder"),
                           {"action": "expire_in_ap", ACTION_CHECKBOX_NAME: [order.pk]})
    assert response.status_code == 302 and response["Location"].startswith(expire)
    page = client.get(response["Location"]).content.decode()
    assert "What will happen" in page and "would be refused" not in page
    assert "notify_transaction_expired" in page
    response = client.post(expire, {"transaction_id": transaction_id, "note": NOTE},
                           follow=True)

    assert [str(m) for m in response.context["messages"]] == [
        f"AP transaction {transaction_id} expired."]
    assert ap(transaction_id)["status"] == "expired"
    order.refresh_from_db()
    assert order.status == "expired"
    assert_one_audit_row(ApTransactionEvent.objects.all(), event="ap.expired",
                         operator=operator)
    assert ApTransactionEvent.objects.get().kind == "deposit"


def test_a_saga_page_read_before_the_late_money_sweep_changed_its_case_is_refused(
        gate_plan, operator, client):
    """Attacker (issue 25 §1, "an operator who already acted wins" — and one who has
    not acted yet?): an operator opens "close as resolved" on a saga in review for "no
    refund" and settles with the partner by phone; meanwhile the late-money sweep
    rewrites the reason (``review.evidence``: the anchor says it refunded). The
    confirmation, posted from the page read before, closed the saga on evidence that
    was no longer true (the refund then lands on a saga nobody will book it for). Now
    the page carries a digest of the evidence it showed; a confirmation whose page is
    stale is refused and the page shown again with what is true now."""
    import re

    from sagas import operations

    saga = stopped_saga()
    page = confirmation_page(client, "sagas_saga", "close", saga.pk)
    token = re.search(r'name="seen" value="([0-9a-f]*)"', page)
    assert operations.saga_review_evidence(
        saga_id=saga.pk, actor="system:late-money", reason_was=saga.error,
        reason="a refund arrived after the saga stopped waiting: the anchor says refunded",
        evidence={})

    shown = confirm(client, "sagas_saga", "close", saga.pk, outcome="compensated",
                    seen=token.group(1) if token else "")

    saga.refresh_from_db()
    assert saga.status == "manual_review", shown
    assert refused(shown) and any("changed since" in m for m in shown)
    assert not operator_events(saga).exists()
    page = confirmation_page(client, "sagas_saga", "close", saga.pk)  # read it again
    assert "the anchor says refunded" in page
    confirm(client, "sagas_saga", "close", saga.pk, outcome="compensated",
            seen=re.search(r'name="seen" value="([0-9a-f]*)"', page).group(1))
    saga.refresh_from_db()
    assert saga.status == "compensated"
