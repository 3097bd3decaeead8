"""The interactive withdrawal: validate what the customer typed, register the
beneficiary with the provider, and ``request_onchain_funds`` (AP: incomplete ->
pending_user_transfer_start; AP picks the memo, NOTES §1.5)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal, InvalidOperation

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from anchor import platform
from anchor import razorpay as rzp
from payouts.guard import provider
from payouts.models import WithdrawalRequest
from payouts.providers.base import Beneficiary

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
    """One transition per withdrawal; a repeat returns the stored request and asks AP
    nothing. Raises WithdrawalStateError, provider and platform errors."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)",
                           [zlib.crc32(f"withdrawal_submit:{transaction_id}".encode())])
        request = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
        if request is None:
            ap_tx = platform.get_transaction(transaction_id)
            if ap_tx is None or ap_tx.get("kind") != "withdrawal":
                raise WithdrawalStateError("This withdrawal does not exist.")
            if ap_tx["status"] != "incomplete":
                raise WithdrawalStateError(f"This withdrawal is already {ap_tx['status']}.")
            q = quote(amount_in)
            contact_id, fund_account_id = provider().register_beneficiary(
                beneficiary=beneficiary, reference=transaction_id)
            request = WithdrawalRequest.objects.create(
                transaction_id=transaction_id, amount_in=q.amount_in, fee=q.fee,
                amount_out=q.amount_out, amount_out_paise=rzp.rupees_to_paise(q.amount_out),
                rate=q.rate, beneficiary_type=beneficiary.kind,
                beneficiary_display=beneficiary.masked(), contact_id=contact_id,
                fund_account_id=fund_account_id,
                source_account=ap_tx.get("source_account") or "")
    if request.funds_requested_at is None:
        usdc = f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
        ap_tx = platform.rpc_once(
            "request_onchain_funds",
            {"transaction_id": transaction_id,
             "message": "Send the USDC with the memo shown",
             "amount_in": {"amount": format(request.amount_in, "f"), "asset": usdc},
             "amount_out": {"amount": format(request.amount_out, "f"),
                            "asset": settings.AP_FIAT_ASSET},
             "fee_details": {"total": format(request.fee, "f"), "asset": usdc}},
            reached=lambda tx: tx["status"] != "incomplete")
        WithdrawalRequest.objects.filter(pk=request.pk).update(
            memo=str(ap_tx.get("memo") or ""), memo_type=ap_tx.get("memo_type") or "id",
            destination=ap_tx.get("destination_account") or "",
            source_account=ap_tx.get("source_account") or request.source_account,
            funds_requested_at=timezone.now())
        request.refresh_from_db()
    return request
