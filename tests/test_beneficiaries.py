"""Whose account is it (payouts/beneficiaries.py): before the first payout of a withdrawal
the payout guard has RazorpayX validate the fund account and compares the bank's
registered name with the name the customer typed. Driven end to end: the wallet starts a
withdrawal in the sandbox AP, fills the form, pays USDC on the sandbox Horizon, and the
poller (as beat runs it) decides; the sandbox RazorpayX answers each account as the test
chose (``validation_account``). Protection switched off once: with FAV_REQUIRED False
the mismatched account is paid."""

from __future__ import annotations

import pytest
from django.conf import settings

from anchor import pii
from payouts import poller
from payouts.models import (
    FundAccountValidation,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from tests.flows import (
    ap,
    assert_payout_once,
    pay_and_wait_for_ap,
    razorpayx,
    sandbox_payouts,
    settle,
    start_withdrawal,
    unique_account_number,
    validation_account,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def withdraw_to(sbx, number: str, name: str = "Asha Verma") -> str:
    wallet, transaction_id, pay = start_withdrawal(sbx, account_number=number, name=name)
    pay_and_wait_for_ap(wallet, pay)
    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP observer")
    return transaction_id


def in_review(transaction_id: str) -> WithdrawalRequest | None:
    poller.poll_withdrawals()
    return WithdrawalRequest.objects.filter(transaction_id=transaction_id,
                                            status="manual_review").first()


def validations_of(sbx, fund_account_id: str) -> list[dict]:
    listed = razorpayx(sbx, "GET", "/fund_accounts/validations",
                       params={"count": 100, "account_number": settings.RAZORPAYX_ACCOUNT_NUMBER})
    assert listed.status_code == 200, listed.text
    return [v for v in listed.json()["items"] if v["fund_account"]["id"] == fund_account_id]


def test_a_matching_name_is_validated_once_then_paid_once(clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number,
                       registered_name="MS ASHA  VERMA").raise_for_status()
    transaction_id = withdraw_to(clean_sandbox, number)

    settle(transaction_id)

    assert_payout_once(clean_sandbox, transaction_id)
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    row = FundAccountValidation.objects.get(fund_account_id=request.fund_account_id)
    assert (row.decision, row.status, row.account_status) == ("verified", "completed", "active")
    assert row.name_score == 1
    assert b"ASHA" not in bytes(row.registered_name)
    assert pii.unseal(row.registered_name) == b"MS ASHA  VERMA"
    assert len(validations_of(clean_sandbox, request.fund_account_id)) == 1


@pytest.mark.parametrize("required", [True, False], ids=["guarded", "fav_off"])
def test_a_name_mismatch_goes_to_review_and_is_never_paid(clean_sandbox, settings,
                                                         required):
    settings.FAV_REQUIRED = required
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number,
                       registered_name="Rahul Mehta").raise_for_status()
    transaction_id = withdraw_to(clean_sandbox, number)

    if not required:  # the protection off: the stranger's account is paid
        settle(transaction_id)
        assert len(sandbox_payouts(clean_sandbox, transaction_id)) == 1
        return
    request = wait_for(lambda: in_review(transaction_id), what="request in review")

    assert "name mismatch" in request.review_reason
    poller.poll_withdrawals()
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
    assert not WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists()
    row = FundAccountValidation.objects.get(fund_account_id=request.fund_account_id)
    assert row.decision == "refused" and row.name_score < settings.FAV_NAME_MATCH_THRESHOLD


@pytest.mark.parametrize("policy", [False, True])
def test_an_invalid_account_goes_to_review_or_by_policy_its_usdc_back(clean_sandbox,
                                                                      settings, policy):
    """Issue 13 §3: a withdrawal that can never be paid has its USDC refunded on chain by
    policy (WITHDRAWAL_REFUND_FOR_GOOD) or by an operator from the review queue."""
    settings.WITHDRAWAL_REFUND_FOR_GOOD = policy
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number,
                       account_status="invalid").raise_for_status()
    transaction_id = withdraw_to(clean_sandbox, number)

    request = wait_for(lambda: in_review(transaction_id), what="request in review")

    assert "is invalid" in request.review_reason
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
    if not policy:
        for _ in range(2):
            poller.poll_withdrawals()
        assert not WithdrawalRefund.objects.filter(transaction_id=transaction_id).exists()
        return
    tx = wait_for(lambda: poller.poll_withdrawals() is not None and
                  ap(transaction_id)["status"] == "refunded" and ap(transaction_id),
                  what="the USDC refunded")
    refund = WithdrawalRefund.objects.get(transaction_id=transaction_id)
    assert refund.status == "completed" and refund.amount == request.received_amount
    assert [p["id"] for p in tx["refunds"]["payments"]] == [refund.tx_hash]


def test_a_pending_validation_waits_and_pays_once_it_completes(clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, pending_s=2).raise_for_status()
    transaction_id = withdraw_to(clean_sandbox, number)

    counts = wait_for(lambda: (c := poller.poll_withdrawals()).get("beneficiary_pending")
                      and c, what="a pass that found the validation pending")

    assert counts["beneficiary_pending"] == 1
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
    wait_for(lambda: (poller.poll_withdrawals() and False) or
             WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists(),
             timeout=20, interval=0.5, what="the payout once the bank answered")
    settle(transaction_id)
    assert_payout_once(clean_sandbox, transaction_id)


def test_a_validation_pending_too_long_goes_to_review(clean_sandbox, settings):
    settings.FAV_PENDING_REVIEW_S = 0.5
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, pending_s=60).raise_for_status()
    transaction_id = withdraw_to(clean_sandbox, number)

    request = wait_for(lambda: in_review(transaction_id), what="request in review")

    assert "has not answered" in request.review_reason
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
