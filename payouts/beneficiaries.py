"""Whose account is it? Before the first payout to a fund account, RazorpayX fund account
validation (penny drop for a bank account, VPA check for UPI; razorpay/TREASURY.md §6)
must say the account is active, and the name the bank holds must match the name the
customer gave (payouts/fav.py ``name_match``, threshold FAV_NAME_MATCH_THRESHOLD).
Corridor decides, not RazorpayX: a mismatch, an invalid account or a failed check goes
to a person (the withdrawal's ``manual_review``), never to a payout.

``check`` is called by the payout guard before it claims a payout (payouts/guard.py
``payout_run``), so no caller can pay an unverified account. One
``fund_account_validations`` row per fund account, locked while it is decided: two
workers never create two validations (each one is charged). The validation's reference
is ``fav-<fund account id>``, so a retry after a lost answer finds the first one
(``fav.create_validation``). A validation still ``created`` (the bank has not answered)
is asked again on the next pass; one pending longer than FAV_PENDING_REVIEW_S, or
RazorpayX unreachable that long, goes to a person too.

``FAV_REQUIRED`` False (a setting: RazorpayX offers FAV only on RazorpayX Lite and not in
test mode, TREASURY §0.6) skips the check; production says so at startup as a warning
(corridor/checks.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from anchor import pii
from anchor import razorpay as rzp
from payouts import fav
from payouts.models import FundAccountValidation, WithdrawalRequest

log = logging.getLogger(__name__)
Decision = FundAccountValidation.Decision
VERIFIED, WAITING, REFUSED = "verified", "waiting", "refused"


@dataclass(frozen=True)
class Verdict:
    """``outcome``: ``verified`` (pay), ``waiting`` (ask again later) or ``refused`` (a
    person decides); ``reason`` says why in words for the operators' queue."""

    outcome: str
    reason: str = ""


def expected_name(request: WithdrawalRequest) -> str | None:
    """The account holder's name the customer gave, or None if it was not kept."""
    if request.beneficiary_name is None:
        return None
    return pii.unseal(request.beneficiary_name).decode()


def check(request: WithdrawalRequest) -> Verdict:
    """May ``request``'s fund account be paid? Creates or reads its validation (at most
    one per fund account) and decides. Never raises for RazorpayX trouble (``waiting``,
    then ``refused`` past FAV_PENDING_REVIEW_S)."""
    if not settings.FAV_REQUIRED:
        return Verdict(VERIFIED, "fund account validation is off (FAV_REQUIRED)")
    with transaction.atomic():
        row, _ = FundAccountValidation.objects.select_for_update().get_or_create(
            fund_account_id=request.fund_account_id,
            defaults={"reference": f"fav-{request.fund_account_id}"[:40]})
        if row.decision != Decision.PENDING:
            return Verdict(VERIFIED if row.decision == Decision.VERIFIED else REFUSED,
                           row.reason)
        try:
            validation = (fav.fetch_validation(row.validation_id) if row.validation_id
                          else fav.create_validation(fund_account_id=row.fund_account_id,
                                                     reference=row.reference))
        except (rzp.RazorpayError, fav.ValidationRefused) as exc:
            return _still_pending(row, f"RazorpayX: {exc}")
        row.validation_id, row.status = validation.id, validation.status
        row.account_status = validation.account_status or ""
        row.utr = validation.utr or ""
        row.fee_paise = validation.fee_paise
        if validation.registered_name:
            row.registered_name = pii.seal(validation.registered_name.encode())
        verdict = _decide(row, validation, expected_name(request))
        row.save()
        return verdict


def _decide(row: FundAccountValidation, validation: fav.Validation,
            name: str | None) -> Verdict:
    if validation.status == "created":
        return _pending_verdict(row, "the bank has not answered the validation yet")
    if validation.status == "failed":
        return _refuse(row, f"fund account validation {validation.id} failed (a technical "
                            "failure at RazorpayX or the bank): validate again or decide")
    if not validation.active:
        return _refuse(row, f"the bank says account {row.fund_account_id} is "
                            f"{validation.account_status or 'invalid'}")
    if name is None:
        return _refuse(row, "no holder name was kept for this withdrawal: compare the "
                            "registered name by hand")
    match = fav.name_match(validation.registered_name, name)
    row.name_score = Decimal(str(match.score)).quantize(Decimal("0.0001"))
    if not match.matched:
        return _refuse(row, f"name mismatch: the bank's registered name scores "
                            f"{match.score:.2f} against the name given (threshold "
                            f"{match.threshold:.2f}); see the validation {validation.id}")
    row.decision, row.reason = Decision.VERIFIED, f"registered name matches ({match.score:.2f})"
    return Verdict(VERIFIED, row.reason)


def _refuse(row: FundAccountValidation, reason: str) -> Verdict:
    row.decision, row.reason = Decision.REFUSED, reason
    return Verdict(REFUSED, reason)


def _pending_verdict(row: FundAccountValidation, reason: str) -> Verdict:
    age = timezone.now() - row.created_at
    if age > timedelta(seconds=settings.FAV_PENDING_REVIEW_S):
        return _refuse(row, f"{reason}, for {age}")
    row.reason = reason
    return Verdict(WAITING, reason)


def _still_pending(row: FundAccountValidation, reason: str) -> Verdict:
    verdict = _pending_verdict(row, reason)
    row.save()
    return verdict
