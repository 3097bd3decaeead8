"""Attack (a refund racing a release): a deposit whose release went to manual_review
before any envelope was built (destination missing) may be refunded (anchor/refunds.py
``_release_never_built``) or re-driven by an operator (anchor/operations.py
``release_redrive``). Two operators, two tabs: the re-drive's checks pass (no refund
yet), the other operator's refund claim commits, then the re-drive's transaction builds
and sends the envelope. ``release_prepare_redrive`` locks the release row only (not the
payment row both claims lock) and never looks at ``deposit_refunds`` again: the customer
gets the USDC and the rupees."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from anchor import operations, refunds, releases
from anchor.models import DepositPayment, DepositRefund
from common.console import OperationRefused
from tests.flows import Wallet, paid_deposit, purge_broker, sync_groups, wait_for
from tests.sandbox.razorpay_calls import sandbox_refunds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
S = DepositRefund.Status


@pytest.fixture
def operator(client):
    from django.apps import apps as django_apps
    from django.contrib.auth.models import Group, User

    sync_groups(django_apps, connection.schema_editor())
    user = User.objects.create_user(username="rita", is_staff=True)
    user.groups.add(Group.objects.get(name="operators"))
    return user


def test_a_refund_claimed_during_a_release_redrive_is_never_also_released(
        clean_sandbox, operator, settings, monkeypatch):
    purge_broker()
    settings.DESTINATION_MISSING_REVIEW_S = 0.5
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.ingest_behind", ledgers=200)
    time.sleep(0.6)
    release = releases.release_start(transaction_id=transaction_id)
    assert release.status == "manual_review" and not release.tx_hash
    clean_sandbox.clear_faults()
    clean_sandbox.fault("razorpay.refund_settle_delay", seconds=0.3)

    checked = operations._redrive_check

    def check_then_the_other_tab_refunds(release_id):
        check = checked(release_id)
        # Operator B, in another tab, refunds the INR between the check and the commit.
        operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                                  note="customer asked for the rupees back")
        return check

    monkeypatch.setattr(operations, "_redrive_check", check_then_the_other_tab_refunds)
    try:
        operations.release_redrive(release_id=release.pk, operator=operator,
                                   note="the account exists now")
    except OperationRefused:
        pass
    pk = DepositRefund.objects.get(transaction_id=transaction_id).pk
    wait_for(lambda: refunds.refund_drive(refund_id=pk).status in (
        S.COMPLETED, S.FAILED, S.MANUAL_REVIEW), timeout=20, interval=0.3, what="refund final")

    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    usdc = wallet.usdc_payments()
    inr = [r for r in sandbox_refunds(clean_sandbox, payment.payment_id)
           if r["status"] != "failed"]
    assert not (usdc and inr), f"both released ({usdc}) and refunded ({inr})"
    purge_broker()
