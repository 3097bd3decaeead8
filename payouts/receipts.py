"""Corridor's own view of USDC arriving for withdrawals (DESIGN.md §5 step 1).

``scan`` pages Horizon's payments into our withdrawal account from a stored cursor and
keeps each one (``stellar_receipts``); ``verify`` decides, from those rows alone,
whether a withdrawal was paid: destination ours, asset USDC of our issuer, memo, the
sender AP recorded, amounts under one memo summed, no more decimals than AP's asset
allows, and no other open withdrawal sharing the memo (AP PR #1929)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from stellar_sdk import MuxedAccount

from anchor import stellar
from payouts.models import ChainCursor, StellarReceipt, WithdrawalRequest

PAGE = 200


def withdraw_account() -> str:
    return stellar.distribution_keypair().public_key


def _base_account(address: str) -> str:
    if address.startswith("M"):
        return MuxedAccount.from_account(address).account_id
    return address


def scan(*, max_pages: int = 20) -> int:
    """Read new payments into our account; returns how many were stored. Raises
    stellar.HorizonUnavailable."""
    account = withdraw_account()
    state, _ = ChainCursor.objects.get_or_create(account=account)
    cursor, stored = state.cursor, 0
    for _ in range(max_pages):
        try:
            page = (stellar.server().payments().for_account(account).join("transactions")
                    .cursor(cursor).order(desc=False).limit(PAGE).call())
        except Exception as exc:  # the SDK raises several types for one outage
            raise stellar.HorizonUnavailable(str(exc)) from exc
        records = page["_embedded"]["records"]
        for record in records:
            cursor = record["paging_token"]
            if record.get("type") != "payment" or record.get("to") != account:
                continue
            if not record.get("transaction_successful", True):
                continue
            stored += _store(record)
        ChainCursor.objects.filter(pk=state.pk).update(cursor=cursor)
        if len(records) < PAGE:
            break
    return stored


def _store(record: dict) -> int:
    tx = record.get("transaction") or {}
    asset = "native" if record.get("asset_type") == "native" else (
        f"{record.get('asset_code')}:{record.get('asset_issuer')}")
    try:
        with transaction.atomic():
            StellarReceipt.objects.create(
                paging_token=record["paging_token"], tx_hash=record["transaction_hash"],
                from_account=record.get("from_muxed") or record.get("from", ""),
                to_account=record.get("to", ""), asset=asset, amount=Decimal(record["amount"]),
                memo_type=tx.get("memo_type", "none"), memo=tx.get("memo", ""),
                created_at=datetime.fromisoformat(record["created_at"].replace("Z", "+00:00")))
    except IntegrityError:
        return 0
    return 1


@dataclass
class Verdict:
    """``ok`` (paid in full), ``waiting`` (nothing yet, or short inside the grace
    period), ``review`` (never pay: ``reason``). ``received`` is the USDC total."""

    outcome: str
    received: Decimal = Decimal(0)
    reason: str = ""
    evidence: list[dict] = field(default_factory=list)
    first_hash: str = ""
    first_at: datetime | None = None


def verify(request: WithdrawalRequest, *, ap_source: str) -> Verdict:
    receipts = list(StellarReceipt.objects.filter(
        memo_type=request.memo_type or "id", memo=request.memo,
        to_account=withdraw_account()).order_by("paging_token"))
    if not receipts:
        return Verdict("waiting")
    evidence = [{"tx_hash": r.tx_hash, "from": r.from_account, "asset": r.asset,
                 "amount": format(r.amount, "f"), "memo": r.memo} for r in receipts]
    first = receipts[0]
    verdict = Verdict("waiting", evidence=evidence, first_hash=first.tx_hash,
                      first_at=first.created_at)
    usdc = f"{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"
    if any(r.asset != usdc for r in receipts):
        verdict.outcome, verdict.reason = "review", "wrong asset under this memo"
        return verdict
    shared = WithdrawalRequest.objects.filter(memo=request.memo,
                                              memo_type=request.memo_type).exclude(pk=request.pk)
    if shared.exists():
        verdict.outcome = "review"
        verdict.reason = "memo shared by two withdrawals: cannot tell whose payment this is"
        return verdict
    expected_source = _base_account(ap_source) if ap_source else ""
    if expected_source and any(_base_account(r.from_account) != expected_source
                               for r in receipts):
        verdict.outcome, verdict.reason = "review", "payment from an unexpected account"
        return verdict
    quantum = Decimal(1).scaleb(-settings.WITHDRAW_ASSET_DECIMALS)
    if any(r.amount != r.amount.quantize(quantum) for r in receipts):
        verdict.outcome = "review"
        verdict.reason = (f"amount has more than {settings.WITHDRAW_ASSET_DECIMALS} decimals "
                          "(AP refuses it and leaves the withdrawal stuck)")
        return verdict
    verdict.received = sum((r.amount for r in receipts), Decimal(0))
    if verdict.received >= request.amount_in:
        verdict.outcome = "ok"
        if verdict.received > request.amount_in:
            verdict.reason = f"over-paid by {verdict.received - request.amount_in}"
        return verdict
    verdict.reason = f"short: received {verdict.received} of {request.amount_in}"
    return verdict


def unmatched_receipts() -> list[StellarReceipt]:
    """Payments into our account whose memo names no withdrawal of ours."""
    known = WithdrawalRequest.objects.values_list("memo", flat=True)
    return list(StellarReceipt.objects.exclude(memo__in=known).order_by("paging_token"))
