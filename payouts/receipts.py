"""Corridor's own view of USDC arriving for withdrawals (DESIGN.md §5 step 1).

``scan`` pages Horizon's payments into our withdrawal account from a stored cursor and
keeps each one (``stellar_receipts``); ``verify`` decides, from those rows alone,
whether a withdrawal was paid: destination ours, asset USDC of our issuer, memo, the
sender AP recorded, amounts under one memo summed, no more decimals than AP's asset
allows, and no other open withdrawal sharing the memo (AP PR #1929).

``classify_receipts`` (run by the poller) decides what each USDC receipt paid for. A
receipt is *consumed* when it counted towards a withdrawal's payout amount: the
receipts under a withdrawal's memo, oldest first, fill its ``amount_in`` once a payout
exists (any status but ``failed``: a failed payout paid nothing and the withdrawal's
own refund may still take the USDC back). Whatever is left over -- a second payment
after the payout, the excess of an overpayment, a payment with no or an unknown memo,
one under a memo two withdrawals share, one after the withdrawal was refunded -- is
*unconsumed* (payments from Corridor's own accounts, ``treasury_accounts``, never
are): once older than RECEIPT_GRACE_S it is raised in the operators' queue (kind
``receipt``) with its on-chain evidence, for an operator's "refund on chain"
(``payouts.operations.receipt_refund_on_chain``). One that arrived under the memo of an
expired SEP-31 receive (``late_for_expired_receives``) Corridor returns to its sender by
itself (``payouts.operations.late_receipt_refund``), the same way, once.

A receipt raised because its memo named no withdrawal ("unknown memo") is matched again
once one does (``rematch_raised``): the request a failover lost, rebuilt by the poller
from AP and RazorpayX (issue 25 §2). Its review is withdrawn unless a refund of it was
started (the operator's refund wins), and the same pass classifies it.

``scanned_through`` says how far the stored receipts cover Horizon's history: "nothing
was paid by T" is read from them only when it is at or past T."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from stellar_sdk import MuxedAccount

from anchor import stellar
from payouts.models import (
    ChainCursor,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)

PAGE = 200
BATCH = 200


def withdraw_account() -> str:
    return stellar.distribution_keypair().public_key


def base_account(address: str) -> str:
    """The G... account of ``address`` (itself unless it is a muxed M... address)."""
    if address.startswith("M"):
        return MuxedAccount.from_account(address).account_id
    return address


def sender_matches(sender: str, expected: str) -> bool:
    """Whether a receipt's sender (Horizon's ``from_muxed`` when the payment came from
    a muxed account, else ``from``) is the account AP recorded as the withdrawal's
    ``source_account``. A muxed (M...) source is one customer of a custodial G... (AP
    4.3.0 PR #1930 stores the M-address so two of them stay apart): it matches only its
    own M-address, id included. A G... source matches payments from that key, muxed or
    not (its holder signs for all of them)."""
    if expected.startswith("M"):
        return sender == expected
    return base_account(sender) == expected


def scan(*, max_pages: int = 20) -> int:
    """Read new payments into our account; returns how many were stored. Raises
    stellar.HorizonUnavailable."""
    return _scan(max_pages)[0]


def scanned_through(*, max_pages: int = 20) -> datetime | None:
    """The ledger close time (UTC) up to which every payment into our account is stored
    as a receipt: Horizon's history height read first (``stellar.history_height``: a
    node's history only grows), then a scan to the end of its history. None when the
    scan stopped after ``max_pages`` with more to read. A decision that "nothing was
    paid by T" rests on this being at or past T (issue 25 §1: a lagging Horizon hides
    on-time payments). Raises stellar.HorizonUnavailable."""
    _, closed_at = stellar.history_height()
    _, complete = _scan(max_pages)
    return closed_at if complete else None


def _scan(max_pages: int) -> tuple[int, bool]:
    """(receipts stored, whether the scan reached the end of Horizon's history)."""
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
            return stored, True
    return stored, False


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
    if ap_source and any(not sender_matches(r.from_account, ap_source) for r in receipts):
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


def usdc_asset() -> str:
    return f"{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"


def treasury_accounts() -> list[str]:
    """Accounts whose payments to us are Corridor's own treasury moves, not a
    customer's money: the USDC issuer (minting to the distribution account), the
    distribution account, the hub and the channel accounts."""
    return sorted({settings.STELLAR_USDC_ISSUER, withdraw_account(),
                   stellar.hub_keypair().public_key, *stellar.channel_keypairs()})


def open_receipts():
    """Customers' USDC receipts into our account not yet accounted for in full
    (``settled_at`` NULL; treasury moves excluded), served by
    ``stellar_receipts_open_idx``."""
    return StellarReceipt.objects.filter(
        settled_at__isnull=True, asset=usdc_asset(), to_account=withdraw_account()
    ).exclude(from_account__in=treasury_accounts())


def memo_requests(receipt: StellarReceipt):
    """The withdrawals whose memo this receipt carries (the match ``verify`` makes)."""
    if not receipt.memo or receipt.memo_type == "none":
        return WithdrawalRequest.objects.none()
    requests = WithdrawalRequest.objects.filter(memo=receipt.memo)
    if receipt.memo_type == "id":
        return requests.filter(memo_type__in=["", "id"])
    return requests.filter(memo_type=receipt.memo_type)


def late_for_expired_receives():
    """Raised receipts (past RECEIPT_GRACE_S, unsettled, no refund yet) under the id
    memo of an expired SEP-31 receive, oldest first, at most BATCH: USDC that arrived
    after Corridor stopped waiting for it, which Corridor returns to its sender
    (``payouts.operations.late_receipt_refund``, run by the poller)."""
    expired = WithdrawalRequest.objects.filter(kind=WithdrawalRequest.Kind.RECEIVE,
                                               status=WithdrawalRequest.Status.EXPIRED)
    return (open_receipts().exclude(review_reason="")
            .filter(refund__isnull=True, memo_type="id", memo__in=expired.values("memo"))
            .order_by("created_at", "paging_token")[:BATCH])


def unsettled_treasury():
    """Unsettled receipts from Corridor's own accounts, which the classifier settles as
    they are (``stellar_receipts_open_idx``; corridor/periodic.py)."""
    return StellarReceipt.objects.filter(settled_at__isnull=True,
                                         from_account__in=treasury_accounts())


def classifiable_receipts():
    """The classifier's query: open receipts not raised yet and older than
    RECEIPT_GRACE_S, oldest first, at most BATCH (``stellar_receipts_open_idx``)."""
    cutoff = timezone.now() - timedelta(seconds=settings.RECEIPT_GRACE_S)
    return (open_receipts().filter(review_reason="", created_at__lt=cutoff)
            .order_by("created_at", "paging_token")[:BATCH])


UNKNOWN_MEMO = "unknown memo: "


def raised_unknown():
    """Raised receipts whose memo named no withdrawal when they were raised, unsettled,
    with no refund started, oldest first, at most BATCH (``stellar_receipts_open_idx``;
    corridor/periodic.py): the ones ``rematch_raised`` looks at again."""
    return (open_receipts().filter(review_reason__startswith=UNKNOWN_MEMO,
                                   refund__isnull=True)
            .order_by("created_at", "paging_token")[:BATCH])


def rematch_raised() -> int:
    """Withdraw the review of each raised "unknown memo" receipt whose memo now names a
    withdrawal (a request rebuilt after a failover lost it, issue 25 §2), so the
    classifier matches it again: consumed by that withdrawal's payout, or waiting for
    it. Under the receipt's row lock, only while it is unsettled, still raised for that
    reason and no refund of it was started (``payouts.operations`` stores a receipt's
    refund under the same lock, and refuses a receipt no longer raised). Returns how
    many were withdrawn."""
    withdrawn = 0
    for receipt in list(raised_unknown()):
        if not memo_requests(receipt).exists():
            continue
        with transaction.atomic():
            current = StellarReceipt.objects.select_for_update().get(pk=receipt.pk)
            if current.settled_at is not None or \
                    not current.review_reason.startswith(UNKNOWN_MEMO) or \
                    WithdrawalRefund.objects.filter(receipt=current).exists():
                continue
            StellarReceipt.objects.filter(pk=current.pk).update(review_reason="",
                                                                reviewed_at=None)
        withdrawn += 1
    return withdrawn


def classify_receipts() -> dict[str, int]:
    """Allocate USDC receipts to the payouts they paid for and raise whatever no
    withdrawal consumed (module docstring). Reads unsettled receipts older than
    RECEIPT_GRACE_S, oldest first; idempotent (the allocation is recomputed from the
    rows, in paging order). Returns counts: consumed | raised | waiting (a withdrawal
    without a payout still owns it) | unraised (STRANDED_SWEEPERS=False: what is left
    over is not raised; consumption is still allocated) | rematched (``rematch_raised``)."""
    counts = {"consumed": 0, "raised": 0, "waiting": 0, "treasury": 0, "unraised": 0}
    # Treasury moves (module docstring) owe nobody anything: settled as they are.
    counts["treasury"] = unsettled_treasury().update(settled_at=timezone.now())
    counts["rematched"] = rematch_raised()
    rows = list(classifiable_receipts())
    for receipt in rows:
        outcome = _classify(receipt)
        counts[outcome] += 1
    return counts


def _classify(receipt: StellarReceipt) -> str:
    requests = list(memo_requests(receipt)[:3])
    if not requests:
        why = "no memo" if not receipt.memo or receipt.memo_type == "none" else \
            f"{UNKNOWN_MEMO}no withdrawal has {receipt.memo_type} memo {receipt.memo}"
        return _raise(receipt, why)
    if len(requests) > 1:
        return _raise(receipt, "memo shared by withdrawals " + ", ".join(
            r.transaction_id for r in requests) + ": cannot tell whose payment this is")
    request = requests[0]
    if request.status == WithdrawalRequest.Status.EXPIRED:
        return _raise(receipt, f"arrived after transaction {request.transaction_id} "
                               f"expired ({request.review_reason or 'expired'}): refund it")
    if WithdrawalRefund.objects.filter(request=request).exists():
        return _raise(receipt, f"arrived after withdrawal {request.transaction_id} was "
                               "refunded")
    payout = WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).first()
    if payout is None or payout.status == WithdrawalPayout.Status.FAILED:
        return "waiting"  # the withdrawal's own flow (and queue) owns it
    _allocate(request)
    receipt.refresh_from_db()
    if receipt.settled_at is not None:
        return "consumed"
    if receipt.consumed_amount == 0:
        return _raise(receipt, f"second payment: withdrawal {request.transaction_id} was "
                               f"already paid out for {request.amount_in} USDC "
                               f"(payout {payout.status})")
    return _raise(receipt, f"overpaid: {receipt.unconsumed} USDC above the "
                           f"{request.amount_in} USDC withdrawal {request.transaction_id} "
                           "paid out")


def _allocate(request: WithdrawalRequest) -> None:
    """Fill ``request.amount_in`` from its memo's receipts, oldest first (receipts
    refunded on their own are not counted)."""
    remaining = request.amount_in
    now = timezone.now()
    rows = (StellarReceipt.objects.filter(memo_type=request.memo_type or "id",
                                          memo=request.memo, asset=usdc_asset(),
                                          to_account=withdraw_account(), refund__isnull=True)
            .order_by("paging_token"))
    for row in rows:
        take = min(remaining, row.amount)
        remaining -= take
        StellarReceipt.objects.filter(pk=row.pk, settled_at__isnull=True).update(
            consumed_amount=take, transaction_id=request.transaction_id,
            settled_at=now if take == row.amount else None)


def _raise(receipt: StellarReceipt, reason: str) -> str:
    if not (settings.STRANDED_SWEEPERS and settings.RECEIPT_CLASSIFIER_RAISES):
        return "unraised"  # the sweeper switched off: allocation goes on, raising stops
    StellarReceipt.objects.filter(pk=receipt.pk, review_reason="").update(
        review_reason=reason[:2000], reviewed_at=timezone.now())
    return "raised"
