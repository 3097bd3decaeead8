"""The interactive withdrawal: validate what the customer typed, register the
beneficiary with the provider, and ``request_onchain_funds`` (AP: incomplete ->
pending_user_transfer_start; AP picks the memo, NOTES §1.5)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_DOWN, Decimal, InvalidOperation

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from anchor import pii, platform, stellar, submissions
from anchor import razorpay as rzp
from common.crashpoints import crash_point
from payouts import refunds
from payouts.guard import provider
from payouts.models import StellarReceipt, WithdrawalRequest
from payouts.providers.base import Beneficiary, ProviderError

log = logging.getLogger(__name__)
IFSC = re.compile(r"^[A-Z]{4}0[A-Z0-9]{6}$")
ACCOUNT_NUMBER = re.compile(r"^[0-9A-Za-z]{5,35}$")
VPA = re.compile(r"^[A-Za-z0-9.\-_]{2,256}@[A-Za-z][A-Za-z0-9]{1,63}$")
NAME = re.compile(r"^[A-Za-z][A-Za-z .'\-]{1,48}[A-Za-z.]$")


class WithdrawalInputError(ValueError):
    """Field errors for the form: ``errors`` maps field name -> message."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class WithdrawalStateError(Exception):
    """AP's transaction cannot take this step."""


@dataclass(frozen=True)
class WithdrawQuote:
    """amount_in and fee in USDC, amount_out in INR (paise exact)."""

    amount_in: Decimal
    fee: Decimal
    amount_out: Decimal
    rate: Decimal


def parse_form(data) -> tuple[Decimal, Beneficiary]:
    """Validate the form; raise WithdrawalInputError with one message per field."""
    errors: dict[str, str] = {}
    amount = None
    raw = (data.get("amount") or "").strip()
    try:
        if not raw or any(c not in "0123456789." for c in raw):
            raise InvalidOperation
        amount = Decimal(raw)
        quantum = Decimal(1).scaleb(-settings.WITHDRAW_ASSET_DECIMALS)
        if amount != amount.quantize(quantum):
            errors["amount"] = f"Use at most {settings.WITHDRAW_ASSET_DECIMALS} decimal places."
        elif amount < settings.WITHDRAW_MIN_USDC:
            errors["amount"] = f"The minimum withdrawal is {settings.WITHDRAW_MIN_USDC} USDC."
        elif amount > settings.WITHDRAW_MAX_USDC:
            errors["amount"] = f"The maximum withdrawal is {settings.WITHDRAW_MAX_USDC} USDC."
    except InvalidOperation:
        errors["amount"] = "Enter an amount in USDC, for example 25 or 25.50."
    name = " ".join((data.get("name") or "").split())
    if not NAME.fullmatch(name):
        errors["name"] = "Enter the account holder's name (3-50 letters)."
    kind = data.get("method") or "bank_account"
    if kind not in ("bank_account", "vpa"):
        errors["method"] = "Choose a bank account or a UPI ID."
    beneficiary = Beneficiary(name=name, kind="vpa" if kind == "vpa" else "bank_account")
    if kind == "vpa":
        vpa = (data.get("vpa") or "").strip()
        if not VPA.fullmatch(vpa):
            errors["vpa"] = "Enter a UPI ID such as name@bank."
        beneficiary.vpa = vpa
    else:
        account = (data.get("account_number") or "").replace(" ", "")
        ifsc = (data.get("ifsc") or "").strip().upper()
        if not ACCOUNT_NUMBER.fullmatch(account):
            errors["account_number"] = "Enter the bank account number (5-35 letters or digits)."
        if not IFSC.fullmatch(ifsc):
            errors["ifsc"] = "Enter the 11-character IFSC, such as HDFC0001234."
        beneficiary.account_number, beneficiary.ifsc = account, ifsc
    if errors:
        raise WithdrawalInputError(errors)
    return amount, beneficiary


def quote(amount_in: Decimal) -> WithdrawQuote:
    fee = settings.WITHDRAW_FEE_USDC
    net = amount_in - fee
    if net <= 0:
        raise WithdrawalInputError({"amount": "The amount does not cover the fee."})
    rate = settings.WITHDRAW_RATE_INR_PER_USDC
    amount_out = (net * rate).quantize(Decimal("0.01"), rounding=ROUND_DOWN)
    return WithdrawQuote(amount_in=amount_in, fee=fee, amount_out=amount_out, rate=rate)


def withdrawal_submit(*, transaction_id: str, amount_in: Decimal,
                      beneficiary: Beneficiary) -> WithdrawalRequest:
    """The interactive withdrawal's one transition: register ``beneficiary`` with the
    provider (RazorpayX contact + fund account: identical details return the existing
    ones, NOTES §2.2-2.3, so a repeat moves no money), store our WithdrawalRequest
    (``amount_in``: Decimal, USDC), then ``request_onchain_funds`` (AP: incomplete ->
    pending_user_transfer_start; AP picks the memo, NOTES §1.5). Safe under any number
    of simultaneous calls (anchor/submissions.py): only the holder of the submission's
    claim calls the provider or AP, with no database transaction or lock held across
    a call; a repeat after it is done returns the stored request and calls nothing.

    A resumed claim (the previous holder died or gave up) re-reads AP first: if AP
    already took the request, the stored row is completed with AP's memo; if AP is
    still ``incomplete``, this submission's details replace the stored ones (no AP
    call was made on them yet). Bank details are never stored, so the sweeper can
    only finish a stored request; it forgets an intent that has none.

    Returns the WithdrawalRequest. Raises SubmissionInFlight (another request is
    making it: call nothing), WithdrawalStateError, ProviderError (details refused),
    provider and platform errors (the claim is released for a retry)."""
    existing = WithdrawalRequest.objects.filter(transaction_id=transaction_id,
                                                funds_requested_at__isnull=False).first()
    if existing is not None:
        return existing
    claim = submissions.claim(transaction_id=transaction_id, kind="withdrawal",
                              amount_in=amount_in)
    if claim is None:
        return WithdrawalRequest.objects.get(transaction_id=transaction_id)
    return _withdrawal_drive(claim, amount_in, beneficiary)


class _NothingToResume(Exception):
    """A lapsed withdrawal intent with no stored request: without the customer's bank
    details (never stored) it cannot be completed; the form is offered again."""


def _funds_requested(tx: dict) -> bool:
    return tx.get("status") not in ("incomplete", "expired", "error")


def _withdrawal_drive(claim: submissions.Claim, amount_in: Decimal | None,
                      beneficiary: Beneficiary | None) -> WithdrawalRequest:
    transaction_id = claim.transaction_id
    try:
        ap_tx = platform.get_transaction(transaction_id)
        if ap_tx is None or ap_tx.get("kind") != "withdrawal":
            raise WithdrawalStateError("This withdrawal does not exist.")
        request = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
        if ap_tx["status"] == "incomplete":
            if beneficiary is not None:
                request = _register(claim, ap_tx, amount_in, beneficiary)
            elif request is None:
                raise _NothingToResume(transaction_id)
            crash_point("withdrawal_submit.request_stored")
            ap_tx = _request_onchain_funds(request)
        elif request is None or not _funds_requested(ap_tx):
            raise WithdrawalStateError(f"This withdrawal is already {ap_tx['status']}.")
        _require_pay_instructions(ap_tx)
    except (WithdrawalStateError, ProviderError, _NothingToResume) as exc:
        submissions.release(claim, error=str(exc), forget=True)
        raise
    except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
        submissions.release(claim, error=f"{type(exc).__name__}: {exc}", forget=False)
        raise

    def mark_requested():
        WithdrawalRequest.objects.filter(pk=request.pk).update(
            memo=str(ap_tx.get("memo") or ""), memo_type=ap_tx.get("memo_type") or "id",
            destination=ap_tx.get("destination_account") or "",
            source_account=ap_tx.get("source_account") or request.source_account,
            funds_requested_at=timezone.now())

    submissions.finish(claim, also=mark_requested)
    request.refresh_from_db()
    return request


def _require_pay_instructions(ap_tx: dict) -> None:
    """A transaction past ``incomplete`` that carries no ``memo`` or
    ``destination_account`` is not one AP's ``request_onchain_funds`` made (it sets both,
    NOTES §1.5): a stale or lagging read after a -32603 that was never applied (chaos
    seed 7). A pay page built from it would ask for USDC with no memo, which no one
    could match to this withdrawal. Raises PlatformError (the claim is released; the
    customer's retry, or the sweeper, asks AP again)."""
    if not ap_tx.get("memo") or not ap_tx.get("destination_account"):
        raise platform.PlatformError(
            f"AP shows {ap_tx.get('status')} without the memo and account that "
            "request_onchain_funds sets: not taken as funds requested")


def _register(claim: submissions.Claim, ap_tx: dict, amount_in: Decimal,
              beneficiary: Beneficiary) -> WithdrawalRequest:
    """Register the beneficiary (intent committed first) and store the request."""
    q = quote(amount_in)
    submissions.advance(claim, "setup_requested", amount_in=q.amount_in)
    contact_id, fund_account_id = provider().register_beneficiary(
        beneficiary=beneficiary, reference=claim.transaction_id)
    crash_point("withdrawal_submit.setup_created")
    return submissions.advance(claim, "request_stored", also=lambda: (
        WithdrawalRequest.objects.update_or_create(
            transaction_id=claim.transaction_id, defaults={
                "amount_in": q.amount_in, "fee": q.fee, "amount_out": q.amount_out,
                "amount_out_paise": rzp.rupees_to_paise(q.amount_out), "rate": q.rate,
                "beneficiary_type": beneficiary.kind,
                "beneficiary_display": beneficiary.masked(),
                "beneficiary_name": pii.seal(beneficiary.name.encode()),
                "contact_id": contact_id,
                "fund_account_id": fund_account_id,
                "source_account": ap_tx.get("source_account") or ""})[0]))


def _request_onchain_funds(request: WithdrawalRequest) -> dict:
    """``request_onchain_funds`` once; returns AP's transaction (memo, account). A
    -32600 (already applied) or -32603 (AP's optimistic lock) is re-read and counts as
    done only if AP left ``incomplete``."""
    usdc = f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
    try:
        return platform.rpc_once(
            "request_onchain_funds",
            {"transaction_id": request.transaction_id,
             "message": "Send the USDC with the memo shown",
             "amount_in": {"amount": format(request.amount_in, "f"), "asset": usdc},
             "amount_out": {"amount": format(request.amount_out, "f"),
                            "asset": settings.AP_FIAT_ASSET},
             "fee_details": {"total": format(request.fee, "f"), "asset": usdc}},
            reached=_funds_requested)
    except platform.RpcError as exc:
        if exc.code != platform.INTERNAL_ERROR:
            raise
        current = platform.get_transaction(request.transaction_id)
        if current is None or not _funds_requested(current):
            raise
        return current


def request_rebuild(*, ap_tx: dict) -> WithdrawalRequest | None:
    """A SEP-24 withdrawal AP took (``request_onchain_funds`` applied: past
    ``incomplete`` with its memo and withdraw account) with no request in Corridor: the
    row a failover lost with its last commits (issue 25 §2), while AP and RazorpayX kept
    what it was made of. Rebuilt from them, as ``withdrawal_submit`` stored it:

    - amounts from AP: ``amount_expected`` (what our call asked for; AP's observer may
      overwrite ``amount_in`` with what arrived, NOTES §4.4, USDC) whose quote must give
      AP's ``amount_out`` (INR) and ``fee_details.total`` (USDC); memo, memo type,
      withdraw account and source account from AP;
    - the payee from RazorpayX: the contact registered under the transaction id
      (``reference_id``, ``register_beneficiary``) and its fund account; when RazorpayX
      holds payouts under that reference, the fund account they paid. Exactly one, or
      nothing is rebuilt (a person's, logged).

    Stored ``awaiting_funds`` with funds requested (``created_at`` AP's ``started_at``),
    so the poller verifies the receipts and pays through the guard as usual (a payout
    RazorpayX already made is rebuilt, not made again: ``guard.payout_rebuild`` and the
    derived attempt key). When a receipt
    under its memo was refunded on its own meanwhile (an operator sent the "unknown
    memo" USDC back), the request is stored ``manual_review`` instead: that USDC is no
    longer ours to pay out (a raised receipt's refund whose row a failover lost too is
    looked for on chain and rebuilt first, ``refunds.receipt_refund_rebuild``; Horizon
    unreadable: nothing is rebuilt this pass); and ``manual_review`` when AP shows it
    ``refunded``, where
    the refund sweep rebuilds its lost refund from AP and the chain
    (``payouts.refunds.refund_rebuild``). Returns the new request, or None (not a withdrawal of ours
    to rebuild, a row exists, the amounts or the payee do not fit). Raises
    rzp.RazorpayError (asked again on the next pass)."""
    transaction_id = ap_tx["id"]
    memo, account = str(ap_tx.get("memo") or ""), ap_tx.get("destination_account") or ""
    if ap_tx.get("kind") != "withdrawal" or not _funds_requested(ap_tx) or not memo \
            or not account:
        return None
    if WithdrawalRequest.objects.filter(transaction_id=transaction_id).exists():
        return None
    amount_in = _ap_decimal(ap_tx, "amount_expected") or _ap_decimal(ap_tx, "amount_in")
    try:
        q = quote(amount_in)
    except WithdrawalInputError:
        q = None
    told = (_ap_decimal(ap_tx, "amount_out"),
            Decimal(str((ap_tx.get("fee_details") or {}).get("total") or "0")))
    if q is None or told != (q.amount_out, q.fee):
        log.error("withdrawal %s not rebuilt: AP holds %s for %s USDC, our quote %s",
                  transaction_id, told, amount_in, q and (q.amount_out, q.fee))
        return None
    payee = _registered_payee(transaction_id)
    if payee is None:
        return None
    memo_type = ap_tx.get("memo_type") or "id"
    try:
        for receipt_id in StellarReceipt.objects.filter(
                memo_type=memo_type, memo=memo, settled_at__isnull=True, refund__isnull=True
                ).exclude(review_reason="").values_list("pk", flat=True):
            refunds.receipt_refund_rebuild(receipt_id=receipt_id)
    except stellar.HorizonUnavailable as exc:
        log.warning("withdrawal %s not rebuilt yet: its receipts' refunds cannot be looked "
                    "for on chain: %s", transaction_id, exc)
        return None
    refunded = StellarReceipt.objects.filter(memo_type=memo_type, memo=memo,
                                             refund__isnull=False).first()
    status, reason = WithdrawalRequest.Status.AWAITING_FUNDS, ""
    if refunded is not None:
        status = WithdrawalRequest.Status.MANUAL_REVIEW
        reason = (f"rebuilt after a lost commit: its receipt {refunded.tx_hash} was refunded "
                  "on its own meanwhile (an unknown memo): not paid out, a person decides")
    elif ap_tx.get("status") == "refunded":
        status = WithdrawalRequest.Status.MANUAL_REVIEW
        reason = ("rebuilt after a lost commit: AP shows it refunded (its refund is rebuilt "
                  "from AP and the chain by the refund sweep)")
    with transaction.atomic():
        request, created = WithdrawalRequest.objects.get_or_create(
            transaction_id=transaction_id, defaults={
                "kind": WithdrawalRequest.Kind.WITHDRAWAL, "status": status,
                "review_reason": reason, "amount_in": q.amount_in, "fee": q.fee,
                "amount_out": q.amount_out,
                "amount_out_paise": rzp.rupees_to_paise(q.amount_out), "rate": q.rate,
                "beneficiary_type": payee.beneficiary.kind,
                "beneficiary_display": payee.beneficiary.masked(),
                "beneficiary_name": pii.seal(payee.beneficiary.name.encode()),
                "contact_id": payee.contact_id, "fund_account_id": payee.fund_account_id,
                "destination": account, "memo": memo, "memo_type": memo_type,
                "source_account": ap_tx.get("source_account") or "",
                "funds_requested_at": timezone.now()})
        # Its age as AP started it: a refund of its USDC is looked for on chain from
        # then on (payouts/refunds.py ``refund_rebuild``), not from this rebuild.
        WithdrawalRequest.objects.filter(pk=request.pk).update(
            created_at=_started_at(ap_tx) or request.created_at)
    if not created:
        return None
    request.refresh_from_db()
    log.warning("withdrawal %s: request rebuilt from AP and RazorpayX (%s, %s; a lost "
                "commit)%s", transaction_id, payee.contact_id, payee.fund_account_id,
                f": {reason}" if reason else "")
    return request


def _registered_payee(transaction_id: str):
    """The one fund account RazorpayX holds for the withdrawal (module helper of
    :func:`request_rebuild`), or None (none, or several that no payout tells apart)."""
    payees = provider().beneficiaries_by_reference(transaction_id)
    paid = {p.raw.get("fund_account_id") for p in provider().find_by_reference(transaction_id)}
    if paid - {None, ""}:
        payees = [b for b in payees if b.fund_account_id in paid]
    if len(payees) != 1:
        log.error("withdrawal %s not rebuilt: RazorpayX holds %d fund accounts under its "
                  "reference (%s)", transaction_id, len(payees),
                  ", ".join(b.fund_account_id for b in payees))
        return None
    return payees[0]


def _started_at(ap_tx: dict) -> datetime | None:
    """AP's ``started_at`` (ISO 8601, ``Z``), or None."""
    value = ap_tx.get("started_at")
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _ap_decimal(ap_tx: dict, name: str) -> Decimal:
    return Decimal(str((ap_tx.get(name) or {}).get("amount") or "0"))


def withdrawal_resume(transaction_id: str) -> str:
    """The sweeper's resume of a withdrawal submission whose claim lapsed
    (anchor/submissions.py): completes a stored request's AP call, or forgets an
    intent without one. Returns completed | released | skipped."""
    try:
        claim = submissions.claim(transaction_id=transaction_id, kind="withdrawal",
                                  amount_in=None)
    except submissions.SubmissionInFlight:
        return "skipped"
    if claim is None:
        return "skipped"
    if not claim.resumed:
        submissions.release(claim, error="nothing to resume", forget=True)
        return "skipped"
    try:
        _withdrawal_drive(claim, None, None)
    except (WithdrawalStateError, _NothingToResume):
        return "released"
    return "completed"


submissions.register_resumer("withdrawal", withdrawal_resume)
