"""Reconciliation (treasury/reconcile.py, issue 13 §2): real flows against the sandbox
over HTTP (its Razorpay settles every payment after two 1-second "days", its RazorpayX
keeps a statement), the real PostgreSQL, and the faults the sandbox's providers can
show: a settlement that leaves a payment out, a settlement fee that differs, a late
settlement, a statement fee that differs, a reversal only the statement shows.

The sandbox is shared by the whole session, so its settlements and statement also carry
other tests' money (absent from this test's database): each test asserts the breaks of
its own references, and that its flow adds no unexplained balance difference."""

from __future__ import annotations

import csv
import io
import time
from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from anchor import operations as deposit_operations
from anchor import razorpay as rzp
from anchor import refunds, releases
from anchor.models import DepositPayment, DepositRefund
from common.console import OperationRefused
from ledger import chart
from ledger import services as ledger
from ledger.models import Entry
from sagas.models import ReviewItem
from tests.flows import (
    Wallet,
    paid_deposit,
    settle,
    sync_groups,
    wait_for,
)
from tests.recon import paid_withdrawal
from treasury import operations, report
from treasury.models import Break, BreakEvent, ReconRun
from treasury.reconcile import open_distribution, open_razorpayx, reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def recon(settings, clean_sandbox):
    settings.TREASURY_SETTLEMENT_WINDOW_S = 3600.0  # T+2 of 1-second days: well inside
    settings.TREASURY_STATEMENT_GRACE_S = 0.0
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    open_distribution()
    return clean_sandbox


def mine(*references: str) -> list[tuple[str, str, str]]:
    return sorted((b.source, b.kind, b.reference) for b in Break.objects.filter(
        reference__in=references, status=Break.Status.OPEN))


def balance_breaks(source: str) -> dict[str, Decimal]:
    """The open balance breaks of ``source``. (The distribution account's is left to its
    own test and to the demo: this database is emptied between tests while the sandbox
    chain keeps every earlier test's USDC, whose receipts a later poll ingests again.)"""
    return {b.key: b.difference for b in Break.objects.filter(
        kind=Break.Kind.BALANCE_DIFFERS, status=Break.Status.OPEN, source=source)}


def settled_deposit(sandbox) -> DepositPayment:
    """A deposit paid, released, and its payment settled by the sandbox's Razorpay."""
    wallet = Wallet(sandbox)
    transaction_id = paid_deposit(sandbox, wallet)
    releases.release_start(transaction_id=transaction_id)
    assert settle(transaction_id).status == "completed"
    return DepositPayment.objects.get(transaction_id=transaction_id)


def until_settled(payment: DepositPayment) -> None:
    """Reconcile until the payment's settlement is booked (it settles at T+2 sandbox
    days, 2-3 s)."""
    wait_for(lambda: reconcile().status == "done" and chart.posted(
        chart.settled_key(payment.payment_id)), timeout=15, interval=0.5,
        what=f"settlement of {payment.payment_id} booked")


def razorpay_recon() -> list:
    """Every settlement recon row of today and yesterday (Asia/Kolkata)."""
    today = datetime.now(tz=ZoneInfo("Asia/Kolkata")).date()
    return [*rzp.settlement_recon(today - timedelta(days=1)), *rzp.settlement_recon(today)]


# --- Razorpay settlements -----------------------------------------------------------------

def test_a_settled_deposit_is_matched_and_its_fee_and_tax_booked_with_no_break(recon):
    before = reconcile()
    payment = settled_deposit(recon)

    until_settled(payment)
    run = reconcile()

    assert before.status == run.status == ReconRun.Status.DONE
    assert mine(payment.payment_id) == []
    lines = {(p.account.code, p.account.currency): p.amount for p in Entry.objects.get(
        idempotency_key=chart.settled_key(payment.payment_id)).postings.select_related("account")}
    fee = lines[(chart.PROVIDER_FEES, "INR")] + lines[(chart.TAXES, "INR")]
    assert lines[(chart.RAZORPAY_PENDING, "INR")] == -chart.rupees(payment.amount_paise)
    assert lines[(chart.BANK_SETTLEMENTS, "INR")] == chart.rupees(payment.amount_paise) - fee
    assert fee > lines[(chart.TAXES, "INR")] > 0
    assert ledger.balance(account=chart.RAZORPAY_PENDING, currency="INR") == 0
    count = Entry.objects.count()
    reconcile()
    assert Entry.objects.count() == count  # a rerun books nothing twice
    assert ledger.trial_balance().ok


def test_a_settlement_fee_that_differs_is_one_break_with_both_sides(recon):
    recon.fault("razorpay.settlement_fee_mismatch", times=1, fee_extra=100, tax_extra=0)
    payment = settled_deposit(recon)

    until_settled(payment)
    reconcile()

    assert mine(payment.payment_id) == [("razorpay", "amount_differs", payment.payment_id)]
    found = Break.objects.get(reference=payment.payment_id)
    assert found.outside["fee"] == found.books["payment_fee"] + 100
    assert found.difference == Decimal("-1.00")
    item = ReviewItem.objects.get(key=f"break:{found.pk}")
    assert (item.kind, item.reference, item.amount) == ("break", payment.payment_id,
                                                        Decimal("-1.00"))


def test_a_payment_no_settlement_carries_is_a_break_only_after_the_window(recon, settings):
    recon.fault("razorpay.settlement_omit_payment", times=1)
    payment = settled_deposit(recon)

    reconcile()
    assert mine(payment.payment_id) == []  # inside its settlement window: not a break

    settings.TREASURY_SETTLEMENT_WINDOW_S = 0.0
    reconcile()
    assert mine(payment.payment_id) == [("razorpay", "missing_outside", payment.payment_id)]


def test_a_late_settlement_inside_the_window_is_no_break_and_is_booked_when_it_comes(recon):
    recon.fault("razorpay.settlement_delay", times=1, cycles=1)
    payment = settled_deposit(recon)

    until_settled(payment)
    reconcile()

    assert mine(payment.payment_id) == []


def test_a_settlement_short_of_its_rows_is_a_break_on_the_settlement(recon):
    recon.fault("razorpay.settlement_omit_payment", times=1, listed=True)
    payment = settled_deposit(recon)

    until_settled(payment)
    reconcile()

    found = Break.objects.filter(kind="amount_differs", books__payments__contains=[
        payment.payment_id], status="open")
    assert [b.source for b in found] == ["razorpay"]
    assert found[0].reference.startswith("setl_")
    assert found[0].difference < 0


def refunded_deposit(sandbox, operator) -> tuple[DepositPayment, DepositRefund]:
    """A deposit paid, then refunded whole through Razorpay by an operator (no release),
    the refund driven to completed as the task and the sweep would."""
    transaction_id = paid_deposit(sandbox, Wallet(sandbox))
    claimed = deposit_operations.deposit_refund(transaction_id=transaction_id,
                                                operator=operator, note="test refund")
    refund = wait_for(lambda: (lambda r: r if r.status == "completed" else None)(
        refunds.refund_drive(refund_id=claimed.pk)), timeout=20, interval=0.3,
        what="refund completed")
    return DepositPayment.objects.get(transaction_id=transaction_id), refund


def test_a_refunded_deposit_settles_with_its_refund_deducted_and_no_break(recon, operator):
    payment, refund = refunded_deposit(recon, operator)

    wait_for(lambda: reconcile().status == "done" and chart.posted(
        chart.settled_key(payment.payment_id)) and chart.posted(
        chart.settled_key(refund.refund_id)), timeout=15, interval=0.5,
        what="the payment's settlement and its refund's deduction booked")
    reconcile()

    assert mine(payment.payment_id, refund.refund_id) == []
    ours = [b.key for b in Break.objects.filter(kind="amount_differs", status="open")
            if payment.payment_id in b.books.get("payments", [])
            or refund.refund_id in b.books.get("refunds", [])]
    assert ours == []  # no settlement that carries them is off
    rows = {r.entity_id: r for r in razorpay_recon()}
    credit, debit = (rows[payment.payment_id].credit_paise, rows[refund.refund_id].debit_paise)
    assert debit == refund.amount_paise == payment.amount_paise
    # bank:settlements holds what Razorpay settled for them: the payment's credit less the
    # refund deducted; nothing is left on razorpay:pending
    assert ledger.balance(account=chart.BANK_SETTLEMENTS, currency="INR") == chart.rupees(
        credit - debit)
    assert ledger.balance(account=chart.RAZORPAY_PENDING, currency="INR") == 0
    assert ledger.trial_balance().ok


def test_a_refund_row_the_books_do_not_know_is_a_break(recon):
    payment = settled_deposit(recon)
    # someone refunds part of it on Razorpay's side (the dashboard): no deposit refund here
    made = httpx.post(f"{recon.url}/razorpay/v1/payments/{payment.payment_id}/refund",
                      json={"amount": 1000}, auth=(settings.RAZORPAY_KEY_ID,
                                                   settings.RAZORPAY_KEY_SECRET), timeout=10)
    assert made.status_code == 200, made.text
    refund_id = made.json()["id"]

    wait_for(lambda: reconcile() and mine(refund_id), timeout=15, interval=0.5,
             what="the unknown refund row seen")

    assert mine(refund_id) == [("razorpay", "missing_in_books", refund_id)]
    found = Break.objects.get(reference=refund_id)
    assert found.difference == Decimal("-10.00") and found.outside["type"] == "refund"
    assert not chart.posted(chart.settled_key(refund_id))


def test_a_refund_in_the_books_no_settlement_deducts_is_a_break_after_the_window(recon,
                                                                                settings):
    # The books hold a refund processed (its rule booked) that Razorpay never deducted.
    refund = DepositRefund.objects.create(
        transaction_id="tx-refund-unseen", status="processed", payment_id="pay_Unseen000001",
        amount_paise=50000, currency="INR", receipt="rcpt-unseen", idempotency_key="key-unseen",
        refund_id="rfnd_Unseen000001", trigger="operator", reason="test", operator="tina",
        processed_at=timezone.now())
    chart.deposit_refunded(refund_id=refund.pk, payment_id=refund.payment_id,
                           transaction_id=refund.transaction_id, amount=Decimal("500.00"))

    reconcile()
    assert mine(refund.refund_id) == []  # inside its settlement window: not a break

    settings.TREASURY_SETTLEMENT_WINDOW_S = 0.0
    reconcile()
    assert mine(refund.refund_id) == [("razorpay", "missing_outside", refund.refund_id)]
    assert Break.objects.get(reference=refund.refund_id).difference == Decimal("500.00")


# --- RazorpayX statement and balance ------------------------------------------------------

def test_a_paid_withdrawal_matches_its_statement_row_and_the_balance(recon):
    reconcile()
    baseline = balance_breaks("razorpayx")

    payout = paid_withdrawal(recon)
    reconcile()

    assert mine(payout.provider_payout_id, f"reversal:{payout.provider_payout_id}") == []
    assert balance_breaks("razorpayx") == baseline


def test_a_statement_fee_that_differs_is_one_break_and_explains_the_balance(recon):
    reconcile()
    baseline = balance_breaks("razorpayx")
    recon.fault("razorpayx.statement_fee_mismatch", times=1, fees_extra=100, tax_extra=0)

    payout = paid_withdrawal(recon)
    reconcile()

    assert mine(payout.provider_payout_id) == [
        ("razorpayx", "amount_differs", payout.provider_payout_id)]
    assert Break.objects.get(reference=payout.provider_payout_id).difference == Decimal("-1.00")
    assert balance_breaks("razorpayx") == baseline  # the row break explains the balance


def test_a_reversal_only_the_statement_shows_is_a_break_missing_in_the_books(recon):
    # Reversed well after it was paid: Corridor books it paid first (a reversal before
    # Corridor read "processed" is one Corridor rightly sees reversed on GET /payouts).
    recon.fault("razorpayx.reversal_statement_only", times=1, after_s=3)
    payout = paid_withdrawal(recon)
    reference = f"reversal:{payout.provider_payout_id}"

    wait_for(lambda: reconcile() and mine(reference), timeout=30, interval=0.5,
             what="the reversal seen")

    found = Break.objects.get(reference=reference)
    assert (found.source, found.kind, found.books["booked"]) == (
        "razorpayx", "missing_in_books", "paid, not reversed")
    assert found.difference == chart.rupees(payout.amount_paise + payout.fees_paise)


# --- Horizon -------------------------------------------------------------------------------

def test_usdc_the_books_do_not_know_is_a_break_on_the_distribution_account(recon):
    from anchor import stellar

    reconcile()
    distribution = stellar.distribution_keypair().public_key
    assert f"horizon:balance_differs:{distribution}" not in balance_breaks("horizon")

    # The issuer mints 7 USDC into it (a treasury move nobody booked).
    recon.http.post("/horizon/sandbox/fund", json={"account": distribution, "amount": "7"}
                    ).raise_for_status()
    key = f"horizon:balance_differs:{distribution}"
    wait_for(lambda: reconcile() and key in balance_breaks("horizon"), timeout=10,
             interval=0.5, what="the distribution account's break")

    # (the hub may show one too: its chain keeps earlier tests' USDC, this database not)
    assert balance_breaks("horizon")[key] == Decimal("7")


# --- the run, the operators, the report ---------------------------------------------------

def test_an_unreadable_provider_fails_the_run_and_changes_no_break(recon, settings):
    kept = Break.objects.create(key="razorpay:missing_outside:pay_x", source="razorpay",
                                kind="missing_outside", reference="pay_x",
                                account=chart.RAZORPAY_PENDING, currency="INR",
                                difference=Decimal("-1"), first_run=reconcile(),
                                last_run=ReconRun.objects.first())
    settings.RAZORPAY_API_URL = "http://127.0.0.1:9/v1"

    run = reconcile()

    assert run.status == "failed" and "RazorpayError" in run.error
    kept.refresh_from_db()
    assert kept.status == "open"  # a missing answer never clears (nor opens) a break


@pytest.fixture
def operator(client):
    from django.apps import apps as django_apps

    sync_groups(django_apps, connection.schema_editor())
    user = User.objects.create_user(username="tina", is_staff=True)
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get(name="operators"))
    client.force_login(user)
    return user


def test_an_operator_explains_a_break_with_a_balanced_audited_adjusting_entry(recon,
                                                                            operator):
    recon.fault("razorpay.settlement_fee_mismatch", times=1, fee_extra=100, tax_extra=0)
    payment = settled_deposit(recon)
    until_settled(payment)
    reconcile()
    found = Break.objects.get(reference=payment.payment_id)
    nobody = User.objects.create_user(username="nobody", is_staff=True)

    with pytest.raises(OperationRefused):
        operations.break_explain(break_id=found.pk, operator=nobody, amount="-1.00",
                                 note="fee")
    with pytest.raises(OperationRefused):
        operations.break_explain(break_id=found.pk, operator=operator, amount="abc",
                                 note="the fee Razorpay charged on top")
    done = operations.break_explain(break_id=found.pk, operator=operator, amount="-1.00",
                                    note="Razorpay's extra ₹1 fee, ticket RZP-7")

    assert done.status == "explained" and done.adjusting_key == f"adjust:{found.key}"
    entry = Entry.objects.get(idempotency_key=done.adjusting_key)
    assert sum(p.amount for p in entry.postings.all()) == 0
    event = BreakEvent.objects.get(break_row=found)
    assert (event.action, event.operator) == ("explain", "tina")
    assert not ReviewItem.objects.filter(key=f"break:{found.pk}").exists()
    with pytest.raises(OperationRefused):  # once
        operations.break_explain(break_id=found.pk, operator=operator, amount="-1.00",
                                 note="again")
    reconcile()
    done.refresh_from_db()
    assert done.status == "explained"  # seen again, still explained


def test_the_daily_report_page_and_csv_agree_with_the_ledger(recon, operator, client):
    payment = settled_deposit(recon)
    until_settled(payment)
    day = ReconRun.objects.first().day

    rows = {(r.account, r.currency): r for r in report.daily_report(day)}
    page = client.get(f"/admin/treasury/reconrun/report/?day={day}")
    text = client.get(f"/admin/treasury/reconrun/report/?day={day}&format=csv")

    for (code, currency), row in rows.items():
        assert row.closing == ledger.balance(account=code, currency=currency), code
        assert row.closing == row.opening + row.debits + row.credits
    assert rows[(chart.BANK_SETTLEMENTS, "INR")].debits > 0
    assert page.status_code == 200 and b"bank:settlements" in page.content
    assert text["Content-Type"] == "text/csv"
    parsed = list(csv.DictReader(io.StringIO(text.content.decode())))
    assert {(r["account"], r["currency"]) for r in parsed} == set(rows)
    reconcile_now = client.post("/admin/treasury/reconrun/reconcile/")
    assert reconcile_now.status_code == 302
    assert BreakEvent.objects.filter(action="reconcile", operator="tina").exists()


def test_without_the_permission_the_report_and_reconcile_now_are_refused(recon, client):
    user = User.objects.create_user(username="ivy", is_staff=True)
    client.force_login(user)

    assert client.get("/admin/treasury/reconrun/report/").status_code == 403
    assert client.post("/admin/treasury/reconrun/reconcile/").status_code == 403
    assert not ReconRun.objects.filter(trigger="operator").exists()


def test_treasury_open_books_the_distribution_opening_once(clean_sandbox, capsys):
    from django.core.management import call_command

    from anchor import stellar

    call_command("treasury_open")
    call_command("treasury_open")

    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("treasury_open: booked ") and "already booked" in out[1]
    chain = stellar.asset_balance(stellar.distribution_keypair().public_key, stellar.usdc())
    assert ledger.balance(account=chart.DISTRIBUTION, currency="USDC") == chain


def test_treasury_open_books_the_razorpayx_opening_once_and_the_recon_not_again(
        clean_sandbox, capsys):
    from django.core.management import call_command

    from payouts import statement

    # A fresh RazorpayX account, as make run, demo and chaos start with: its opening row
    # is made by the first read.
    httpx.post(f"{clean_sandbox.url}/razorpay/sandbox/payouts/reset", timeout=10
               ).raise_for_status()
    open_distribution()
    # The first read just before a second's end: the opening row is then stamped with the
    # next second (the statement is listed in whole seconds), and must still be booked
    # under its own key, not in the rest (else the reconciliation books it again).
    wait_for(lambda: time.time() % 1 > 0.99, timeout=2, interval=0.001,
             what="the end of a second")
    open_razorpayx(operator="test")
    call_command("treasury_open")

    outside = chart.rupees(statement.balance().amount_paise)
    assert outside > 0
    assert ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR") == outside
    assert capsys.readouterr().out.splitlines() == [
        "treasury_open: already booked (nothing to do)"]
    assert not Entry.objects.filter(idempotency_key="funding:razorpayx:opening").exists()
    funding = Entry.objects.filter(idempotency_key__startswith="funding:razorpayx:").count()
    reconcile()
    # the reconciliation books no statement row the opening booked already
    assert Entry.objects.filter(idempotency_key__startswith="funding:razorpayx:"
                                ).count() == funding
    assert ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR") == outside


def test_treasury_open_on_open_books_books_no_later_difference_as_opening(clean_sandbox):
    """make run runs treasury_open on every start: once the books hold the account, a
    difference that came later (here a payout nobody booked) is the reconciliation's
    break, never booked as the opening (the demo's statement-only reversal was)."""
    from django.core.management import call_command

    from payouts import statement
    from tests.flows import vpa_fund_account
    from tests.sandbox.razorpayx_calls import create_payout

    httpx.post(f"{clean_sandbox.url}/razorpay/sandbox/payouts/reset", timeout=10
               ).raise_for_status()
    open_distribution()
    open_razorpayx(operator="test")
    opened = ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR")
    unknown, _ = create_payout(clean_sandbox, vpa_fund_account(clean_sandbox), amount=50000)
    wait_for(lambda: chart.rupees(statement.balance().amount_paise) < opened,
             what="the unknown payout debited at RazorpayX")

    assert open_razorpayx(operator="test") == 0
    call_command("treasury_open")

    assert ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR") == opened
    assert not Entry.objects.filter(idempotency_key="funding:razorpayx:opening").exists()
    reconcile()
    assert Break.objects.filter(reference=unknown["id"], status="open").exists()


def test_make_run_opens_the_books_once_the_sandbox_answers(clean_sandbox):
    """scripts/run_dev.py's step after honcho started the sandbox: ``treasury_open`` in a
    process of its own against this database, as ``make run`` runs it."""
    import importlib.util
    import os
    from pathlib import Path

    from django.conf import settings as django_settings

    from anchor import stellar
    from payouts import statement

    path = Path(django_settings.BASE_DIR) / "scripts" / "run_dev.py"
    spec = importlib.util.spec_from_file_location("run_dev", path)
    run_dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_dev)
    db = django_settings.DATABASES["default"]
    env = {**os.environ, "SANDBOX_URL": clean_sandbox.url,
           "HORIZON_URL": django_settings.HORIZON_URL,
           "RAZORPAY_API_URL": django_settings.RAZORPAY_API_URL,
           "DATABASE_URL": f"postgresql://{db.get('USER') or 'postgres'}@{db['HOST']}:"
                           f"{db['PORT']}/{db['NAME']}"}

    assert run_dev.open_books(env, wait_s=60) == 0

    assert ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR") == chart.rupees(
        statement.balance().amount_paise)
    assert ledger.balance(account=chart.DISTRIBUTION, currency="USDC") == (
        stellar.asset_balance(stellar.distribution_keypair().public_key, stellar.usdc()))
