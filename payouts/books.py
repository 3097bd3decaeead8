"""The withdrawal side's postings (ledger/chart.py rules 3-6), read from the rows the
state change just wrote. Each function runs inside the transaction of that state change
(its caller's ``transaction.atomic``), so the entry commits or rolls back with it, and
each is idempotent by the chart's key (a replayed state change posts nothing new).

Amounts: USDC from the withdrawal request (``amount_in``, ``fee``: the quote AP holds),
INR paid from the payout row (``amount_paise``: what RazorpayX was asked to pay), the
provider's fees and tax from the payout row (stored from its entity when processed).
A payout without a request row (none in production; some unit tests make one) books
nothing."""

from __future__ import annotations

import logging
from decimal import Decimal

from ledger import chart
from payouts.models import StellarReceipt, WithdrawalPayout, WithdrawalRefund, WithdrawalRequest

log = logging.getLogger(__name__)


def received(request: WithdrawalRequest, amount: Decimal) -> None:
    """Rule 3: ``amount`` USDC verified for ``request`` (it moved to funds_verified)."""
    chart.payout_received(kind=request.kind, transaction_id=request.transaction_id,
                          received=amount)


def _request(transaction_id: str) -> WithdrawalRequest | None:
    request = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
    if request is None:
        log.warning("payout %s has no withdrawal request: not booked", transaction_id)
    return request


def _charge(payout: WithdrawalPayout) -> tuple[Decimal, Decimal]:
    """(provider fee without tax, tax) in rupees; 0 where RazorpayX reported none."""
    fees, tax = payout.fees_paise or 0, payout.tax_paise or 0
    return chart.rupees(fees - tax), chart.rupees(tax)


def paid(payout: WithdrawalPayout) -> None:
    """Rule 4: ``payout`` (as just moved to completed) paid its INR."""
    request = _request(payout.transaction_id)
    if request is None:
        return
    provider_fee, tax = _charge(payout)
    if chart.posted(chart.paid_key(request.kind, request.transaction_id)):
        return  # paid once already (an operator's confirmation after a review)
    chart.payout_paid(kind=request.kind, transaction_id=request.transaction_id,
                      amount_in=request.amount_in, fee=request.fee,
                      amount_out=chart.rupees(payout.amount_paise), provider_fee=provider_fee,
                      tax=tax, received=request.received_amount)


def reversed_(payout: WithdrawalPayout) -> None:
    """Rule 5: ``payout`` (as just moved to reversed) came back from the bank. A payout
    whose ``processed`` was never seen here is booked paid first."""
    request = _request(payout.transaction_id)
    if request is None:
        return
    provider_fee, tax = _charge(payout)
    if not chart.posted(chart.received_key(request.kind, request.transaction_id)) and \
            request.received_amount is not None:
        received(request, request.received_amount)
    chart.payout_reversed(kind=request.kind, transaction_id=request.transaction_id,
                          amount_out=chart.rupees(payout.amount_paise),
                          provider_fee=provider_fee, tax=tax,
                          paid={"amount_in": request.amount_in, "fee": request.fee})


def confirmed_paid(payout: WithdrawalPayout, previous: str) -> None:
    """An operator confirmed ``payout`` paid (payouts/operations.py
    ``payout_confirm_paid``): from ``reversed`` the rupees held again left
    (``payout_repaid``); from ``manual_review`` rule 4, unless it was booked already."""
    request = _request(payout.transaction_id)
    if request is None:
        return
    if previous == WithdrawalPayout.Status.REVERSED:
        chart.payout_repaid(kind=request.kind, transaction_id=request.transaction_id,
                            amount_out=chart.rupees(payout.amount_paise))
    else:
        paid(payout)


def refund_landed(refund: WithdrawalRefund) -> None:
    """Rule 6: ``refund`` (as just moved to submitted) sent its USDC back on chain."""
    if refund.request_id is not None:
        request = WithdrawalRequest.objects.get(pk=refund.request_id)
        payout = WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).first()
        back = None
        if payout is not None and chart.posted(
                f"{request.kind}:{request.transaction_id}:reversed"):
            back = {"amount_in": request.amount_in, "fee": request.fee,
                    "amount_out": chart.rupees(payout.amount_paise)}
        chart.request_refund_landed(refund_id=refund.pk, kind=request.kind,
                                    transaction_id=request.transaction_id,
                                    amount=refund.amount, reversed_=back)
        return
    receipt = StellarReceipt.objects.get(pk=refund.receipt_id)
    owner = _booked_owner(receipt)
    chart.receipt_refund_landed(
        refund_id=refund.pk, receipt_id=receipt.pk, amount=refund.amount,
        kind=owner.kind if owner else None,
        transaction_id=owner.transaction_id if owner else "")


def _booked_owner(receipt: StellarReceipt) -> WithdrawalRequest | None:
    """The request whose rule 3 booked this receipt: one whose memo it carries, whose
    verified receipts (``chain_evidence``) include its transaction, and whose received
    entry exists. None when no rule booked it."""
    for request in WithdrawalRequest.objects.filter(memo=receipt.memo)[:2] if receipt.memo \
            else ():
        hashes = {e.get("tx_hash") for e in request.chain_evidence or []
                  if isinstance(e, dict)}
        if receipt.tx_hash in hashes and chart.posted(
                chart.received_key(request.kind, request.transaction_id)):
            return request
    return None
