"""Operator actions on withdrawals, and "expire any AP transaction" (the operator
console, DESIGN.md §1 "Operators", §5). Shape and shared rules: common/console.py
(one keyword-only service per action, external reads first, one transaction with the
change and its audit row, external writes after the commit, ``OperationRefused`` writes
nothing; a ``*_preview`` beside each for the confirmation page).

Audit rows: ``payouts.PayoutEvent`` (``withdrawal_payout_events``) for payouts and
withdrawal requests, ``anchor.ApTransactionEvent`` (``ap_transaction_events``) for
expiry.

Services, their permissions, and what they do to money and state:

- ``payout_confirm_paid`` (``payouts.confirm_payout_paid``): no money moves; records a
  UTR an operator saw paid; ``completed``, then AP ``notify_offchain_funds_sent``.
- ``payout_mark_failed`` (``payouts.mark_payout_failed``): no money moves; ``failed``
  once the provider shows no payout that could still pay.
- ``payout_new_attempt`` (``payouts.new_payout_attempt``): pays the INR again under a
  NEW key, only after the provider said failed/cancelled/rejected for the last one.
- ``withdrawal_accept_short`` (``payouts.accept_short_withdrawal``): pays the INR the
  USDC received buys; AP ``notify_amounts_updated``.
- ``withdrawal_refund_on_chain`` (``payouts.refund_withdrawal``): sends the USDC
  received back to its sender; AP ``notify_refund_sent``.
- ``receipt_refund_on_chain`` (``payouts.refund_receipt``): sends the unconsumed part
  of a USDC receipt (second payment, overpayment, unknown or shared memo) back to its
  sender; AP is not told. ``late_receipt_refund`` is Corridor's own (no permission, the
  audit row names Corridor) for USDC that arrived after its SEP-31 receive expired.
- ``ap_transaction_expire`` (``anchor.expire_ap_transaction``): no money moves; AP
  ``notify_transaction_expired`` before any funds arrived.

``ap_transaction_expire`` lives here, not in anchor, because proving that no funds
arrived needs the withdrawal receipts as well as the deposit payments, and imports
point payouts -> anchor.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from anchor import limits, pii, platform, stellar
from anchor import razorpay as rzp
from anchor.models import ApTransactionEvent, DepositOrder, DepositPayment
from common.console import (
    OperationRefused,
    Preview,
    clean_note,
    operator_name,
    require_permission,
)
from payouts import books, guard, receipts, refunds
from payouts.models import (
    PayoutAttempt,
    PayoutEvent,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from payouts.providers.base import Beneficiary, ProviderError, ProviderPayout
from payouts.withdrawals import (
    ACCOUNT_NUMBER,
    IFSC,
    NAME,
    VPA,
    WithdrawalInputError,
    quote,
)

log = logging.getLogger(__name__)
P = WithdrawalPayout.Status
R = WithdrawalRequest.Status
F = WithdrawalRefund.Status
# A UTR as banks print it: IMPS/UPI 12 digits (RRN), NEFT/RTGS up to 22 alphanumerics.
UTR = re.compile(r"^[A-Za-z0-9]{6,35}$")
# AP statuses from which nothing can arrive or leave any more (AP NOTES §1.6).
AP_CLOSED = ("completed", "refunded", "expired", "error")
# AP statuses in which AP itself has not seen funds (expiry allowed, NOTES §1.6).
AP_BEFORE_FUNDS = ("incomplete", "pending_user_transfer_start")


def _usdc_asset() -> str:
    return f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"


def _usdc() -> str:
    return f"{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"


def _amount_text(amount: Decimal) -> str:
    """A Decimal as AP wants it: plain, no trailing zeros (``9.5``, ``10``)."""
    text = format(amount, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _ap_read(transaction_id: str) -> dict:
    try:
        ap_tx = platform.get_transaction(transaction_id)
    except platform.PlatformError as exc:
        raise OperationRefused(f"AP cannot be read: {exc}") from exc
    if ap_tx is None:
        raise OperationRefused(f"AP has no transaction {transaction_id}")
    return ap_tx


def _provider_view(transaction_id: str) -> list[ProviderPayout]:
    """Every provider payout under our reference (the AP id), asked now. Raises
    OperationRefused when the provider cannot be asked."""
    try:
        return guard.provider().find_by_reference(transaction_id)
    except (rzp.RazorpayError, ProviderError) as exc:
        raise OperationRefused(f"the payout provider cannot be asked: {exc}") from exc


def _describe_provider(found: list[ProviderPayout]) -> list[dict]:
    return [{"id": p.payout_id, "status": p.status, "utr": p.utr, "amount_paise": p.amount_paise,
             "reason": p.reason} for p in found]


def _event(*, transaction_id: str, event: str, operator, note: str, detail: dict,
           payout: WithdrawalPayout | None = None,
           request: WithdrawalRequest | None = None) -> PayoutEvent:
    return PayoutEvent.objects.create(transaction_id=transaction_id, payout=payout,
                                      request=request, event=event, detail=detail,
                                      operator=operator_name(operator), note=note)


def _payout(payout_id: int) -> WithdrawalPayout:
    payout = WithdrawalPayout.objects.filter(pk=payout_id).first()
    if payout is None:
        raise OperationRefused(f"payout {payout_id} does not exist")
    return payout


def _payout_evidence(payout: WithdrawalPayout) -> list[tuple[str, object]]:
    attempts = [{"number": a.number, "idempotency_key": str(a.idempotency_key),
                 "provider_payout_id": a.provider_payout_id,
                 "provider_status": a.provider_status}
                for a in payout.attempt_rows.order_by("number")]
    return [("AP transaction", payout.transaction_id), ("status", payout.status),
            ("reason", payout.last_error),
            ("amount", f"{rzp.paise_to_rupees(payout.amount_paise)} {payout.currency}"),
            ("fund account", f"{payout.fund_account_id} ({payout.mode})"),
            ("UTR", payout.reference or "(none)"), ("attempts", attempts)]


# --- payout: confirm paid with a UTR -------------------------------------------------

@dataclass
class _ConfirmCheck:
    payout: WithdrawalPayout
    provider: list[dict] | str


def _confirm_paid_check(payout_id: int, utr: str | None) -> _ConfirmCheck:
    """A payout in ``manual_review`` (outcome unknown, or stuck past the provider's
    settlement window) that an operator saw paid on the bank statement, or a
    ``reversed`` one the operator paid again outside Corridor (DESIGN.md §5: a reversal
    is never retried by itself; it waits in the operators' queue). The provider is
    asked first: a UTR that contradicts what it reports is refused."""
    payout = _payout(payout_id)
    if payout.status not in (P.MANUAL_REVIEW, P.REVERSED):
        raise OperationRefused(f"payout is {payout.status}; only a payout in manual_review "
                               "or reversed is confirmed by hand")
    _refused_if_refunded(payout.transaction_id)
    if utr is not None and not UTR.match(utr):
        raise OperationRefused("a UTR is 6-35 letters or digits")
    try:
        found = guard.provider().find_by_reference(payout.transaction_id)
    except (rzp.RazorpayError, ProviderError) as exc:
        # The operator's evidence (the bank statement) stands on its own; record the gap.
        return _ConfirmCheck(payout, f"provider unreachable: {exc}")
    failed = guard.provider().failed_statuses
    for p in found:
        if payout.status == P.MANUAL_REVIEW:
            if p.status == "reversed":
                raise OperationRefused(f"the provider reports {p.payout_id} reversed: the "
                                       "money came back, it was not paid")
            if utr and p.status == "processed" and p.utr and p.utr != utr:
                raise OperationRefused(f"the provider reports {p.payout_id} processed with "
                                       f"UTR {p.utr}, not {utr}")
        elif utr and p.utr == utr:
            raise OperationRefused(f"{utr} is the UTR of {p.payout_id}, which the bank "
                                   "reversed; give the UTR of the new payment")
    if payout.status == P.MANUAL_REVIEW and found and all(p.status in failed for p in found):
        raise OperationRefused("the provider reports every payout under this reference "
                               "failed: nothing was paid through it")
    return _ConfirmCheck(payout, _describe_provider(found))


def _refused_if_refunded(transaction_id: str) -> None:
    """A withdrawal (or SEP-31 receive, whose ``reversed`` payout may be refunded) whose
    USDC is being or was sent back on chain is never recorded paid as well: that would be
    INR paid and USDC refunded for one transaction."""
    refund = WithdrawalRefund.objects.filter(transaction_id=transaction_id).first()
    if refund is not None:
        raise OperationRefused(f"a refund of its USDC was started ({refund.status}, "
                               f"{refund.amount} USDC in {refund.tx_hash}): it cannot be "
                               "recorded paid as well")


def payout_confirm_paid_preview(*, payout_id: int) -> Preview:
    payout = WithdrawalPayout.objects.get(pk=payout_id)
    preview = Preview(evidence=_payout_evidence(payout))
    try:
        check = _confirm_paid_check(payout_id, None)
        preview.evidence.append(("provider now", check.provider))
    except OperationRefused as exc:
        preview.refusal = str(exc)
    rupees = rzp.paise_to_rupees(payout.amount_paise)
    preview.will = [
        f"Record that the customer was paid ₹{rupees} with the UTR you give: the payout "
        "becomes completed. No money moves and nothing is sent to the provider.",
        "Write one withdrawal_payout_events row with your name, the UTR and your note, in "
        "the same transaction.",
        ("AP already shows this withdrawal completed (a reversed payout cannot be shown "
         "there): nothing is sent to AP." if payout.ap_completed_at else
         "Then tell AP notify_offchain_funds_sent with the UTR (AP -> completed)."),
    ]
    return preview


def payout_confirm_paid(*, payout_id: int, utr: str, operator, note: str) -> WithdrawalPayout:
    """Record a payout an operator saw paid: ``completed`` with ``utr`` (the bank's
    reference, 6-35 alphanumerics), then AP ``notify_offchain_funds_sent`` with it
    unless AP was completed already (a reversed payout, DESIGN.md §5 and invariant 6's
    exemption). Moves no money. Raises OperationRefused."""
    require_permission(operator, "payouts.confirm_payout_paid")
    note = clean_note(note)
    utr = (utr or "").strip()
    if not utr:
        raise OperationRefused("the UTR is required")
    check = _confirm_paid_check(payout_id, utr)
    with transaction.atomic():
        # Lock order of every withdrawal path: the request, then the payout (a refund
        # being stored holds both; guard.lock_request).
        guard.lock_request(check.payout.transaction_id)
        current = WithdrawalPayout.objects.select_for_update().get(pk=payout_id)
        if current.status != check.payout.status:
            raise OperationRefused(f"payout changed since it was checked (now {current.status})")
        # The refund is stored under this row's lock (_refund_store): seen here if it won.
        _refused_if_refunded(current.transaction_id)
        previous, previous_utr = current.status, current.reference
        WithdrawalPayout.transition(current.pk, previous, P.COMPLETED, require=True,
                                    reference=utr,
                                    last_error=f"confirmed paid by {operator_name(operator)}")
        current.refresh_from_db()
        books.confirmed_paid(current, previous)
        _event(transaction_id=current.transaction_id, payout=current,
               request=WithdrawalRequest.objects.filter(
                   transaction_id=current.transaction_id).first(),
               event="payout.confirm_paid", operator=operator, note=note,
               detail={"utr": utr, "previous_status": previous,
                       "previous_utr": previous_utr, "provider": check.provider})
    if current.ap_completed_at is None:
        return guard.payout_complete_ap(payout=current)
    return current


# --- payout: mark failed ---------------------------------------------------------------

def _mark_failed_check(payout_id: int) -> tuple[WithdrawalPayout, list[ProviderPayout]]:
    """Only a payout in ``manual_review``, and only when the provider, asked now, holds
    no payout under our reference that could still pay (DESIGN.md §5: never
    ``failed`` by timeout; an unknown outcome stays unknown until the provider says)."""
    payout = _payout(payout_id)
    if payout.status != P.MANUAL_REVIEW:
        raise OperationRefused(f"payout is {payout.status}; only a payout in manual_review "
                               "is marked failed by hand")
    found = _provider_view(payout.transaction_id)
    live = [p for p in found if p.status not in guard.provider().failed_statuses]
    if live:
        raise OperationRefused("the provider still holds " + ", ".join(
            f"{p.payout_id} ({p.status})" for p in live) + ": it may pay")
    return payout, found


def payout_mark_failed_preview(*, payout_id: int) -> Preview:
    payout = WithdrawalPayout.objects.get(pk=payout_id)
    preview = Preview(evidence=_payout_evidence(payout))
    try:
        _, found = _mark_failed_check(payout_id)
        preview.evidence.append(("provider now", _describe_provider(found) or "no payout"))
    except OperationRefused as exc:
        preview.refusal = str(exc)
    preview.will = [
        "Mark the payout failed: the provider shows nothing under this withdrawal that "
        "could still pay. No money moves.",
        "Copy the provider's statuses onto the attempts and write one "
        "withdrawal_payout_events row with your name and note, in one transaction.",
        "AP is not told: the withdrawal then waits for a new attempt or a refund.",
    ]
    return preview


def payout_mark_failed(*, payout_id: int, operator, note: str) -> WithdrawalPayout:
    """``manual_review`` -> ``failed`` once the provider shows every payout under our
    reference failed (or none at all). Moves no money; AP is left as it is. Raises
    OperationRefused."""
    require_permission(operator, "payouts.mark_payout_failed")
    note = clean_note(note)
    check, found = _mark_failed_check(payout_id)
    with transaction.atomic():
        guard.lock_request(check.transaction_id)  # the request, then the payout
        current = WithdrawalPayout.objects.select_for_update().get(pk=payout_id)
        if current.status != P.MANUAL_REVIEW:
            raise OperationRefused(f"payout changed since it was checked (now {current.status})")
        for p in found:
            PayoutAttempt.objects.filter(payout=current, provider_payout_id=p.payout_id).update(
                provider_status=p.status, updated_at=timezone.now())
        previous_error = current.last_error
        WithdrawalPayout.transition(
            current.pk, P.MANUAL_REVIEW, P.FAILED, require=True,
            last_error=f"marked failed by {operator_name(operator)}: {note}"[:2000])
        current.refresh_from_db()
        _event(transaction_id=current.transaction_id, payout=current,
               request=WithdrawalRequest.objects.filter(
                   transaction_id=current.transaction_id).first(),
               event="payout.mark_failed", operator=operator, note=note,
               detail={"previous_error": previous_error,
                       "provider": _describe_provider(found)})
    return current


# --- payout: a new attempt with a new key ----------------------------------------------

def parse_beneficiary(*, name: str, account_number: str = "", ifsc: str = "",
                      vpa: str = "") -> Beneficiary:
    """Corrected bank details for a new attempt: a bank account (name, account number,
    IFSC) or a UPI VPA (name, vpa); the rules of the withdrawal form
    (payouts/withdrawals.py). Raises WithdrawalInputError."""
    errors: dict[str, str] = {}
    name = " ".join((name or "").split())
    if not NAME.match(name):
        errors["name"] = "Enter the account holder's name (3-50 letters)."
    if vpa:
        if not VPA.match(vpa.strip()):
            errors["vpa"] = "Enter a UPI ID such as name@bank."
        beneficiary = Beneficiary(name=name, kind="vpa", vpa=vpa.strip())
    else:
        account = (account_number or "").replace(" ", "")
        ifsc = (ifsc or "").strip().upper()
        if not ACCOUNT_NUMBER.match(account):
            errors["account_number"] = "Enter the bank account number (5-35 letters or digits)."
        if not IFSC.match(ifsc):
            errors["ifsc"] = "Enter the 11-character IFSC, such as HDFC0001234."
        beneficiary = Beneficiary(name=name, kind="bank_account", account_number=account,
                                  ifsc=ifsc)
    if errors:
        raise WithdrawalInputError(errors)
    return beneficiary


@dataclass
class _AttemptCheck:
    payout: WithdrawalPayout
    latest: PayoutAttempt
    ap_status: str


def _new_attempt_check(payout_id: int) -> _AttemptCheck:
    """DESIGN.md §5: "a new key is minted only after the provider has said failed for
    the old one, and only by an operator's action"; failed means RazorpayX's final
    failed, cancelled or rejected (razorpay/NOTES.md §2.6). Not after a refund began,
    not to a payee whose KYC no longer allows it (``guard.payee_refusal``), and only
    while AP can still complete the withdrawal (NOTES §1.6)."""
    payout = _payout(payout_id)
    latest = payout.attempt_rows.get(number=payout.attempts)
    failed = guard.provider().failed_statuses
    if latest.provider_status not in failed:
        raise OperationRefused(
            f"the provider's status for attempt {latest.number} is "
            f"'{latest.provider_status or 'unknown'}'; a new key is minted only after the "
            f"provider said {'/'.join(sorted(failed))}")
    if payout.status != P.FAILED:
        raise OperationRefused(f"payout is {payout.status}; a new attempt only follows a "
                               "failed payout (mark it failed first)")
    if WithdrawalRefund.objects.filter(transaction_id=payout.transaction_id).exists():
        raise OperationRefused("a refund of this withdrawal was started")
    request = WithdrawalRequest.objects.filter(transaction_id=payout.transaction_id).first()
    refusal = guard.payee_refusal(request) if request is not None else ""
    if refusal:
        raise OperationRefused(f"the payee may not be paid: {refusal}")
    ap_status = _ap_read(payout.transaction_id).get("status")
    payable = ("pending_anchor", "pending_external")
    if request is not None and request.kind == WithdrawalRequest.Kind.RECEIVE:
        payable = ("pending_receiver", "pending_external")  # SEP31-RECEIVE.md §3.2
    if ap_status not in payable:
        raise OperationRefused(f"AP shows the withdrawal {ap_status}: it can no longer be "
                               "completed with a payout")
    return _AttemptCheck(payout, latest, ap_status)


def payout_new_attempt_preview(*, payout_id: int) -> Preview:
    payout = WithdrawalPayout.objects.get(pk=payout_id)
    preview = Preview(evidence=_payout_evidence(payout))
    try:
        check = _new_attempt_check(payout_id)
        preview.evidence.append(("AP status", check.ap_status))
    except OperationRefused as exc:
        preview.refusal = str(exc)
    rupees = rzp.paise_to_rupees(payout.amount_paise)
    preview.will = [
        "If you give corrected bank details, register them with the provider first (a new "
        "fund account); otherwise the same fund account is used.",
        f"Mint attempt {payout.attempts + 1} with a NEW idempotency key (the provider said "
        "the last one failed, so no money moved under it), set the payout back to "
        "processing and write one withdrawal_payout_events row with your name and note, "
        "in one transaction.",
        f"Then ask the provider to pay ₹{rupees} under the new key; the guard completes AP "
        "with the UTR when the provider reports it processed.",
    ]
    return preview


def payout_new_attempt(*, payout_id: int, operator, note: str,
                       beneficiary: Beneficiary | None = None) -> WithdrawalPayout:
    """A new provider attempt for a ``failed`` payout whose latest attempt the provider
    reported failed/cancelled/rejected: a new ``payout_attempts`` row with a fresh UUID
    key, status ``processing``, then the disbursement under that key
    (``guard.payout_disburse_current``). ``beneficiary``: corrected bank details,
    registered with the provider (contact + fund account) before the transaction.
    ``clock_started_at`` restarts, so the guard's review clocks (unknown outcome,
    settlement window: DESIGN.md §5) count from this attempt, not from the first claim;
    ``created_at`` (the first claim) never changes.

    Money: pays ``amount_paise`` INR once more; the previous key is dead at the
    provider, so at most one of the attempts pays (invariant 1). Raises
    OperationRefused."""
    require_permission(operator, "payouts.new_payout_attempt")
    note = clean_note(note)
    check = _new_attempt_check(payout_id)
    transaction_id = check.payout.transaction_id
    registered = None
    if beneficiary is not None:
        try:
            registered = guard.provider().register_beneficiary(beneficiary=beneficiary,
                                                               reference=transaction_id)
        except (ProviderError, rzp.RazorpayError) as exc:
            raise OperationRefused(f"the provider refused the bank details: {exc}") from exc
    with transaction.atomic():
        # Lock order everywhere: the request, then the payout.
        request = WithdrawalRequest.objects.select_for_update().filter(
            transaction_id=transaction_id).first()
        current = WithdrawalPayout.objects.select_for_update().get(pk=payout_id)
        if current.status != P.FAILED or current.attempts != check.payout.attempts:
            raise OperationRefused(f"payout changed since it was checked (now "
                                   f"{current.status}, attempt {current.attempts})")
        if WithdrawalRefund.objects.filter(transaction_id=transaction_id).exists():
            raise OperationRefused("a refund of this withdrawal was started")
        attempt = PayoutAttempt.objects.create(
            payout=current, number=current.attempts + 1, idempotency_key=guard.attempt_key(
                transaction_id=transaction_id, number=current.attempts + 1))
        detail = {"previous_attempt": check.latest.number,
                  "previous_key": str(check.latest.idempotency_key),
                  "previous_provider_payout_id": check.latest.provider_payout_id,
                  "previous_provider_status": check.latest.provider_status,
                  "previous_error": current.last_error,
                  "attempt": attempt.number, "key": str(attempt.idempotency_key)}
        fields = {}
        if registered is not None:
            contact_id, fund_account_id = registered
            detail.update(previous_fund_account=current.fund_account_id,
                          fund_account=fund_account_id, beneficiary=beneficiary.masked())
            fields = {"fund_account_id": fund_account_id,
                      "mode": "UPI" if beneficiary.kind == "vpa" else "IMPS"}
            if request is not None:
                WithdrawalRequest.objects.filter(pk=request.pk).update(
                    contact_id=contact_id, fund_account_id=fund_account_id,
                    beneficiary_type=beneficiary.kind,
                    beneficiary_display=beneficiary.masked(),
                    beneficiary_name=pii.seal(beneficiary.name.encode()),
                    updated_at=timezone.now())
        detail["previous_clock_started_at"] = current.clock_started_at.isoformat()
        # The guard's clocks (PAYOUT_UNKNOWN_REVIEW_S, PAYOUT_SETTLEMENT_WINDOW_S) run from
        # clock_started_at; they restart with the attempt the provider now holds.
        WithdrawalPayout.transition(
            current.pk, P.FAILED, P.PROCESSING, require=True,
            where=Q(attempts=check.payout.attempts), attempts=attempt.number,
            provider_payout_id="",  # the new attempt's payout is recorded on its own
            reference="", last_error="", clock_started_at=timezone.now(), **fields)
        current.refresh_from_db()
        _event(transaction_id=transaction_id, payout=current, request=request,
               event="payout.new_attempt", operator=operator, note=note, detail=detail)
    log.info("payout %s: attempt %s minted by %s", transaction_id, attempt.number,
             operator_name(operator))
    return guard.payout_disburse_current(payout_id=payout_id)


# --- withdrawal: accept a short amount -----------------------------------------------

def _request(request_id: int) -> WithdrawalRequest:
    request = WithdrawalRequest.objects.filter(pk=request_id).first()
    if request is None:
        raise OperationRefused(f"withdrawal request {request_id} does not exist")
    return request


def _request_evidence(request: WithdrawalRequest) -> list[tuple[str, object]]:
    return [("AP transaction", request.transaction_id), ("status", request.status),
            ("reason", request.review_reason),
            ("expected", f"{request.amount_in} USDC (fee {request.fee})"),
            ("received", f"{request.received_amount} USDC" if request.received_amount
             is not None else "(nothing verified)"),
            ("INR", f"₹{request.amount_out} at {request.rate}"),
            ("beneficiary", request.beneficiary_display),
            ("memo", f"{request.memo_type} {request.memo}"), ("sender", request.source_account),
            ("chain evidence", request.chain_evidence)]


@dataclass
class _ShortCheck:
    request: WithdrawalRequest
    verdict: receipts.Verdict
    ap_tx: dict
    amount_out: Decimal


def _accept_short_check(request_id: int) -> _ShortCheck:
    """A request in ``manual_review`` because the USDC received under its memo is short
    of what was asked (receipts.verify: right account, asset, sender and decimals, and
    no other withdrawal sharing the memo; only the amount is short), with nothing paid
    or refunded yet. New receipts are read from Horizon first, so a late top-up is
    counted. AP must hold the withdrawal in ``pending_anchor`` (funds received) or
    ``pending_user_transfer_start`` (its observer missed the payment), the states from
    which ``notify_amounts_updated`` can be reached (AP NOTES §1.5-1.6)."""
    request = _request(request_id)
    if request.status != R.MANUAL_REVIEW:
        raise OperationRefused(f"withdrawal is {request.status}; only one in manual_review "
                               "is accepted short")
    if WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).exists():
        raise OperationRefused("a payout exists for this withdrawal")
    if WithdrawalRefund.objects.filter(transaction_id=request.transaction_id).exists():
        raise OperationRefused("a refund of this withdrawal was started")
    try:
        receipts.scan()
    except stellar.HorizonUnavailable as exc:
        raise OperationRefused(f"Horizon cannot be read, so the receipts may be "
                               f"incomplete: {exc}") from exc
    verdict = receipts.verify(request, ap_source=request.source_account)
    if verdict.outcome == "ok":
        raise OperationRefused("the full amount has arrived since: nothing is short")
    if verdict.outcome == "review":
        raise OperationRefused(f"the payment does not match for another reason: "
                               f"{verdict.reason}")
    if verdict.received <= 0:
        raise OperationRefused("no USDC has arrived under this withdrawal's memo")
    try:
        amount_out = quote(verdict.received).amount_out
    except WithdrawalInputError as exc:
        raise OperationRefused(f"{verdict.received} USDC does not cover the fee: refund it "
                               "instead") from exc
    ap_tx = _ap_read(request.transaction_id)
    if ap_tx.get("status") not in ("pending_anchor", "pending_user_transfer_start"):
        raise OperationRefused(f"AP shows the withdrawal {ap_tx.get('status')}")
    return _ShortCheck(request, verdict, ap_tx, amount_out)


def withdrawal_accept_short_preview(*, request_id: int) -> Preview:
    request = WithdrawalRequest.objects.get(pk=request_id)
    preview = Preview(evidence=_request_evidence(request))
    received, amount_out = "the USDC received", "the INR it buys"
    try:
        check = _accept_short_check(request_id)
        received, amount_out = f"{check.verdict.received} USDC", f"₹{check.amount_out}"
        preview.evidence += [("received now", received), ("AP status", check.ap_tx["status"])]
    except OperationRefused as exc:
        preview.refusal = str(exc)
    preview.will = [
        f"Tell AP notify_amounts_updated: the customer gets {amount_out} for {received} "
        f"(instead of ₹{request.amount_out}), same fee and rate (if AP's observer missed "
        "the payment, notify_onchain_funds_received first).",
        "Set the withdrawal to the amount received, mark it verified and write one "
        "withdrawal_payout_events row with your name and note, in one transaction.",
        f"Then pay {amount_out} through the payout guard (one payout, at most once).",
    ]
    return preview


def withdrawal_accept_short(*, request_id: int, operator, note: str) -> WithdrawalRequest:
    """Accept the short USDC a customer sent and pay the INR it buys at the quoted rate
    and fee (payouts/withdrawals.py ``quote``): AP ``notify_amounts_updated`` (amount_out
    and fee_details; AP NOTES §1.5) first, then one commit (amounts, ``funds_verified``,
    the audit row), then the payout guard (``guard.payout_run``, at most once).

    Money: pays ``quote(received).amount_out`` INR instead of the amount first quoted;
    the USDC stays with us. Raises OperationRefused."""
    require_permission(operator, "payouts.accept_short_withdrawal")
    note = clean_note(note)
    check = _accept_short_check(request_id)
    request, verdict = check.request, check.verdict
    fee = request.fee
    try:
        if check.ap_tx["status"] == "pending_user_transfer_start":
            platform.rpc_once(
                "notify_onchain_funds_received",
                {"transaction_id": request.transaction_id,
                 "stellar_transaction_id": verdict.first_hash,
                 "amount_in": {"amount": _amount_text(verdict.received)}},
                reached=lambda tx: tx["status"] != "pending_user_transfer_start")
        platform.rpc("notify_amounts_updated", {
            "transaction_id": request.transaction_id,
            "amount_out": {"amount": format(check.amount_out, "f")},
            "fee_details": {"total": _amount_text(fee), "asset": _usdc_asset()}})
    except (platform.RpcError, platform.PlatformError) as exc:
        raise OperationRefused(f"AP refused the new amounts: {exc}") from exc
    with transaction.atomic():
        current = WithdrawalRequest.objects.select_for_update().get(pk=request_id)
        if current.status != R.MANUAL_REVIEW or WithdrawalRefund.objects.filter(
                transaction_id=current.transaction_id).exists():
            raise OperationRefused(f"withdrawal changed since it was checked (now "
                                   f"{current.status})")
        detail = {"expected": format(current.amount_in, "f"),
                  "received": format(verdict.received, "f"),
                  "previous_amount_out": format(current.amount_out, "f"),
                  "amount_out": format(check.amount_out, "f"), "fee": format(fee, "f"),
                  "previous_reason": current.review_reason, "receipts": verdict.evidence}
        current.amount_in = verdict.received
        current.amount_out = check.amount_out
        current.amount_out_paise = rzp.rupees_to_paise(check.amount_out)
        current.received_amount = verdict.received
        current.chain_evidence = verdict.evidence
        current.status = R.FUNDS_VERIFIED
        current.review_reason = (f"short amount accepted by {operator_name(operator)} "
                                 f"(expected {detail['expected']})")
        current.save()
        books.received(current, verdict.received)  # rule 3, with the verification
        _event(transaction_id=current.transaction_id, request=current,
               event="withdrawal.accept_short", operator=operator, note=note, detail=detail)
    guard.payout_run(request=current)
    current.refresh_from_db()
    return current


# --- withdrawal: refund the USDC on chain ---------------------------------------------

@dataclass
class _RefundCheck:
    request: WithdrawalRequest
    payout: WithdrawalPayout | None
    receipts: list[StellarReceipt]
    amount: Decimal
    destination: str
    ap_tx: dict
    provider: list[dict] = field(default_factory=list)


def _refund_check(request_id: int) -> _RefundCheck:
    """When the USDC may go back: no INR was paid for it (no payout, or a ``failed``
    payout whose every provider payout failed, asked now; for a SEP-31 receive also a
    ``reversed`` one: the bank sent the rupees back), the request is waiting for a person
    (``manual_review``) or its payout failed, and every USDC receipt under its memo came
    from one sender. AP must be able to record a refund: for a withdrawal
    ``pending_anchor`` with funds received (``notify_refund_sent``), or
    ``pending_external`` (``notify_refund_pending`` moves it to ``pending_anchor`` first;
    AP NOTES §1.5-1.6); for a receive one of ``RECEIVE_REFUNDABLE`` with the funds seen by
    AP (payouts/refunds.py moves it; SEP31-RECEIVE.md §3.2, §4 step 4).
    """
    request = _request(request_id)
    receive = request.kind == WithdrawalRequest.Kind.RECEIVE
    if WithdrawalRefund.objects.filter(transaction_id=request.transaction_id).exists():
        raise OperationRefused("a refund exists already")
    payout = WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).first()
    provider: list[dict] = []
    if payout is None:
        if request.status != R.MANUAL_REVIEW:
            raise OperationRefused(f"withdrawal is {request.status} with no payout; only one "
                                   "in manual_review, or one whose payout failed, is refunded")
    else:
        ended = (P.FAILED, P.REVERSED) if receive else (P.FAILED,)
        if payout.status not in ended:
            raise OperationRefused(f"its payout is {payout.status}: INR may have been paid")
        found = _provider_view(payout.transaction_id)
        back = {*guard.provider().failed_statuses, *(("reversed",) if receive else ())}
        live = [p for p in found if p.status not in back]
        if live:
            raise OperationRefused("the provider still holds " + ", ".join(
                f"{p.payout_id} ({p.status})" for p in live))
        provider = _describe_provider(found)
    try:
        receipts.scan()
    except stellar.HorizonUnavailable as exc:
        raise OperationRefused(f"Horizon cannot be read: {exc}") from exc
    rows = list(StellarReceipt.objects.filter(
        memo_type=request.memo_type or "id", memo=request.memo,
        to_account=receipts.withdraw_account()).order_by("paging_token"))
    usdc = [r for r in rows if r.asset == _usdc()]
    if not usdc:
        raise OperationRefused("no USDC arrived under this withdrawal's memo")
    if request.memo and WithdrawalRequest.objects.filter(
            memo=request.memo, memo_type=request.memo_type).exclude(pk=request.pk).exists():
        raise OperationRefused("another withdrawal shares this memo: whose USDC this is "
                               "cannot be told")
    senders = {r.from_account for r in usdc}
    if len(senders) != 1:
        raise OperationRefused(f"the USDC came from {len(senders)} senders: "
                               + ", ".join(sorted(senders)))
    ap_tx = _ap_read(request.transaction_id)
    if receive:
        _receive_refundable(ap_tx)
    elif ap_tx.get("status") not in ("pending_anchor", "pending_external"):
        raise OperationRefused(f"AP shows the withdrawal {ap_tx.get('status')}; AP records a "
                               "refund only from pending_anchor (funds received) or "
                               "pending_external")
    # What an operator already sent back of one of these receipts on its own (the
    # unconsumed part of an overpayment) is not sent again.
    sent_back = _sent_back(usdc)
    amount = sum((r.amount for r in usdc), Decimal(0)) - sent_back
    if amount <= 0:
        raise OperationRefused("every USDC under this memo was sent back already")
    return _RefundCheck(request, payout, usdc, amount, senders.pop(), ap_tx, provider)


def _sent_back(receipts_: list[StellarReceipt]) -> Decimal:
    """USDC of ``receipts_`` their own refunds sent back on chain. Only a completed one
    is known to have left; one still open or in manual_review may or may not land, so
    none is counted either way: refused until it is decided (the receipt queue shows it,
    unsettled, until then). Raises OperationRefused."""
    own = list(WithdrawalRefund.objects.filter(receipt__in=receipts_))
    undecided = [f for f in own if f.status != F.COMPLETED]
    if undecided:
        raise OperationRefused("a receipt's own refund is not finished: " + ", ".join(
            f"{f.transaction_id} {f.status} ({f.amount} USDC)" for f in undecided)
            + "; its USDC may or may not have left, so it is decided first")
    return sum((f.amount for f in own), Decimal(0))


# AP statuses of a SEP-31 receive whose refund AP can be brought to record
# (SEP31-RECEIVE.md §3.2): ``notify_refund_sent`` from ``pending_receiver``; from the
# others ``notify_transaction_error`` (unless ``error``/``expired`` already), then
# ``notify_transaction_recovery`` (funds received) -> ``pending_receiver`` first
# (payouts/refunds.py). ``pending_sender``: AP's observer missed the USDC our receipts
# hold, so AP is told of it first (``notify_onchain_funds_received``). ``completed`` (a
# reversal after AP was told): the USDC goes back on chain and AP keeps ``completed``
# (no RPC leaves it).
RECEIVE_REFUNDABLE = ("pending_sender", "pending_receiver", "pending_external",
                      "pending_customer_info_update", "error", "expired", "completed")


def _receive_refundable(ap_tx: dict) -> None:
    status = ap_tx.get("status")
    if status not in RECEIVE_REFUNDABLE:
        raise OperationRefused(f"AP shows the remittance {status}; a refund is recorded only "
                               "from " + ", ".join(RECEIVE_REFUNDABLE))
    if status in ("error", "expired") and not ap_tx.get("transfer_received_at"):
        raise OperationRefused(
            f"AP shows the remittance {status} without the USDC received "
            "(transfer_received_at): it cannot record a refund; refund the receipt itself "
            "from the receipts queue")


def withdrawal_refund_preview(*, request_id: int) -> Preview:
    request = WithdrawalRequest.objects.get(pk=request_id)
    preview = Preview(evidence=_request_evidence(request))
    refund = WithdrawalRefund.objects.filter(transaction_id=request.transaction_id).first()
    if refund is not None:
        preview.evidence += [("refund", f"{refund.status}: {refund.amount} USDC to "
                                        f"{refund.destination}, hash {refund.tx_hash}"),
                             ("refund error", refund.last_error)]
        if refund.status == F.COMPLETED:
            preview.refusal = "the USDC was refunded already"
        preview.will = [
            "Drive the refund already stored: look its hash up on Stellar, re-post the "
            "same envelope (a new one only if the stored one is provably dead), then tell "
            "AP notify_refund_sent. No second payment is ever made.",
            "Write one withdrawal_payout_events row with your name and note.",
        ]
        return preview
    amount, destination = "the USDC received", "its sender"
    try:
        check = _refund_check(request_id)
        amount, destination = f"{check.amount} USDC", check.destination
        preview.evidence += [("AP status", check.ap_tx["status"]),
                             ("receipts", [r.tx_hash for r in check.receipts])]
        if check.provider:
            preview.evidence.append(("provider now", check.provider))
    except OperationRefused as exc:
        preview.refusal = str(exc)
    preview.will = [
        f"Send {amount} from the distribution account back to {destination} on Stellar. "
        "The signed envelope and its hash are stored (with one withdrawal_payout_events "
        "row naming you and your note) in one transaction before anything is submitted, "
        "so repeating this action can never pay twice.",
        "Then submit it and tell AP notify_refund_sent with the hash (AP -> refunded). No "
        "INR is paid for this withdrawal afterwards.",
    ]
    return preview


def withdrawal_refund_on_chain(*, request_id: int, operator, note: str) -> WithdrawalRefund:
    """Send the USDC a withdrawal (or a SEP-31 receive) received back to its sender, from
    the distribution account, and record it in AP (``notify_refund_sent``, refund id = the
    Stellar hash, fee 0; AP NOTES §1.5; for a receive payouts/refunds.py brings AP to
    ``pending_receiver`` first, SEP31-RECEIVE.md §4 step 4). An outbox like the deposit
    release (DESIGN.md §4): one commit stores the signed envelope, its hash and the audit
    row (``withdrawal_refunds`` unique per withdrawal), then the refund outbox
    (``payouts.refunds``) submits the envelope and tells AP; its beat sweep finishes
    whatever this call leaves open.

    Idempotent per withdrawal: a repeat finds the stored refund and drives the same
    envelope (a new one only once the stored one is provably dead), never a second
    payment, with its own audit row (``withdrawal.refund_resumed``); a completed refund
    is refused. Money: pays the USDC received under the
    withdrawal's memo (Decimal, 7 dp) back to its single sender (a receive: to AP's
    ``refund_memo``, which AP 4.3.0 sets to the payment memo, §3.3); the request stays
    in ``manual_review`` so the poller never pays INR for it. The envelope's channel and
    sequence are leased in the claim transaction, as the release outbox leases them.
    Raises OperationRefused."""
    require_permission(operator, "payouts.refund_withdrawal")
    note = clean_note(note)
    request = _request(request_id)
    existing = WithdrawalRefund.objects.filter(transaction_id=request.transaction_id).first()
    if existing is not None:
        if existing.status == F.COMPLETED:
            raise OperationRefused("the USDC was refunded already")
        with transaction.atomic():
            _event(transaction_id=request.transaction_id, request=request,
                   event="withdrawal.refund_resumed", operator=operator, note=note,
                   detail={"status": existing.status, "tx_hash": existing.tx_hash,
                           "last_error": existing.last_error})
        return refunds.refund_drive(refund_id=existing.pk, resumed=True)
    return _refund_store(request_id, operator=operator, note=note,
                         event=f"{request.kind}.refund")


def refund_for_good(*, request_id: int, reason: str) -> WithdrawalRefund | None:
    """Corridor's own refund of a withdrawal or SEP-31 receive whose payout failed for
    good (the bank says the account cannot take the credit: payouts/receive.py
    ``failed_for_good``; a SEP-24 withdrawal only under WITHDRAWAL_REFUND_FOR_GOOD): the
    same checks, outbox and audit row as the operator's action, the audit row
    (``<kind>.refund``) naming Corridor. None when it is not refundable now (the refusal
    is logged; the poller asks again) or a refund exists already."""
    request = _request(request_id)
    if WithdrawalRefund.objects.filter(transaction_id=request.transaction_id).exists():
        return None
    try:
        return _refund_store(request_id, operator=None, note=reason[:2000],
                             event=f"{request.kind}.refund")
    except OperationRefused as exc:
        log.info("%s %s: no refund yet: %s", request.kind, request.transaction_id, exc)
        return None


def _refund_store(request_id: int, *, operator, note: str, event: str) -> WithdrawalRefund:
    check = _refund_check(request_id)
    request = check.request
    receive = request.kind == WithdrawalRequest.Kind.RECEIVE
    if not receive and check.ap_tx["status"] == "pending_external":
        try:
            platform.rpc_once("notify_refund_pending",
                              {"transaction_id": request.transaction_id},
                              reached=lambda tx: tx["status"] == "pending_anchor")
        except (platform.RpcError, platform.PlatformError) as exc:
            raise OperationRefused(f"AP refused notify_refund_pending: {exc}") from exc
    holder = refunds.holder(request.transaction_id)
    memo_type = check.ap_tx.get("refund_memo_type") or "none"
    memo = check.ap_tx.get("refund_memo") or ""
    try:  # outside the transaction: Horizon reads hold no lock
        # A refund already on chain whose row a failover lost (issue 25 §2): adopted,
        # never sent twice (as anchor/releases.py ``release_adopt``).
        found = refunds.landed_unrecorded(destination=check.destination, amount=check.amount,
                                          memo=memo, since=request.created_at)
        adopted = refunds.chain_fields(found.tx_hash) if found is not None else None
    except stellar.HorizonUnavailable as exc:
        raise OperationRefused(f"Horizon cannot be read: {exc}") from exc
    try:
        with transaction.atomic():
            current = WithdrawalRequest.objects.select_for_update().get(pk=request_id)
            payout = WithdrawalPayout.objects.select_for_update().filter(
                transaction_id=current.transaction_id).first()
            if (payout is None and current.status != R.MANUAL_REVIEW) or (
                    (payout is None) != (check.payout is None)) or (
                    payout is not None and payout.status != check.payout.status):
                raise OperationRefused("the withdrawal changed since it was checked")
            if WithdrawalRefund.objects.filter(transaction_id=current.transaction_id).exists():
                # Another tab's refund won the request's lock first (the second new-user
                # trial saw "no channel free" here, which invites a retry).
                raise OperationRefused("a refund exists already")
            if receive and current.status != R.MANUAL_REVIEW:
                # A receive whose payout failed: the poller never pays a request in
                # review, and the refund it now has refuses any new attempt.
                WithdrawalRequest.objects.filter(pk=current.pk).update(
                    status=R.MANUAL_REVIEW, review_reason=f"refunded on chain: {note}"[:2000],
                    updated_at=timezone.now())
            # The receipts it sends back: locked, none refunded on its own meanwhile,
            # then settled with this refund (they leave the receipt queue).
            locked = list(StellarReceipt.objects.select_for_update().filter(
                pk__in=[r.pk for r in check.receipts]).order_by("pk"))
            sent_back = _sent_back(locked)
            if sum((r.amount for r in locked), Decimal(0)) - sent_back != check.amount:
                raise OperationRefused("a receipt of this withdrawal was refunded on its own "
                                       "since it was checked")
            StellarReceipt.objects.filter(pk__in=[r.pk for r in locked]).update(
                settled_at=timezone.now(), transaction_id=current.transaction_id)
            if adopted is not None:
                refund = WithdrawalRefund.objects.create(
                    request=current, transaction_id=current.transaction_id,
                    status=F.SUBMITTED, destination=check.destination, amount=check.amount,
                    memo=memo, memo_type=memo_type, **adopted,
                    last_error=f"adopted from the chain: {found.tx_hash} landed with no "
                               "refund recorded (a lost commit)")
                books.refund_landed(refund)  # rule 6, with the row that records it
            else:
                prepared = stellar.prepare_payment(
                    holder=holder, destination=check.destination, amount=check.amount,
                    memo_type=memo_type, memo=memo)
                refund = WithdrawalRefund.objects.create(
                    request=current, transaction_id=current.transaction_id,
                    destination=check.destination, amount=check.amount, memo=memo,
                    memo_type=memo_type, **prepared)
            _event(transaction_id=current.transaction_id, request=current, payout=payout,
                   event=event, operator=operator, note=note,
                   detail={"amount": format(check.amount, "f"),
                           "destination": check.destination, "tx_hash": refund.tx_hash,
                           "receipts": [r.tx_hash for r in check.receipts],
                           "ap_status": check.ap_tx["status"], "provider": check.provider})
    except IntegrityError as exc:  # a concurrent refund of the same withdrawal won
        raise OperationRefused("a refund exists already") from exc
    except (stellar.NoChannelFree, stellar.HorizonUnavailable, ValueError) as exc:
        raise OperationRefused(f"no refund envelope could be built now: {exc}") from exc
    if receive:
        limits.release(current.transaction_id)  # no INR moves for it: off the limits
    log.info("withdrawal %s: refund %s stored by %s", current.transaction_id, refund.tx_hash,
             operator_name(operator))
    return refunds.refund_drive(refund_id=refund.pk, resumed=False)


# --- an unconsumed USDC receipt: refund it on chain -------------------------------------

def receipt_refund_key(receipt: StellarReceipt) -> str:
    """The refund outbox's unique key (``withdrawal_refunds.transaction_id``) and the
    audit rows' ``transaction_id`` for a receipt's own refund."""
    return refunds.receipt_key(receipt.pk)


def _receipt(receipt_id: int) -> StellarReceipt:
    receipt = StellarReceipt.objects.filter(pk=receipt_id).first()
    if receipt is None:
        raise OperationRefused(f"receipt {receipt_id} does not exist")
    return receipt


def _receipt_refund_refusal(receipt: StellarReceipt) -> str:
    """Why the unconsumed part of ``receipt`` may not go back now, or ""."""
    if receipt.asset != _usdc():
        return f"the receipt is {receipt.asset}, not USDC"
    if receipt.settled_at is not None:
        return "the receipt is accounted for already (consumed or refunded)"
    if not receipt.review_reason:
        return "the receipt is not in the review queue (a withdrawal may still consume it)"
    if receipt.unconsumed <= 0:
        return "nothing of this receipt is unconsumed"
    # A withdrawal's refund settles every receipt it sent back (in its claim), so an
    # unsettled receipt was never part of one.
    return ""


def _receipt_evidence(receipt: StellarReceipt) -> list[tuple[str, object]]:
    return [("reason", receipt.review_reason), ("tx hash", receipt.tx_hash),
            ("from", receipt.from_account), ("amount", f"{receipt.amount} USDC"),
            ("consumed", f"{receipt.consumed_amount} USDC"
             + (f" by withdrawal {receipt.transaction_id}" if receipt.transaction_id else "")),
            ("unconsumed", f"{receipt.unconsumed} USDC"),
            ("memo", f"{receipt.memo_type} {receipt.memo}".strip()),
            ("ledger time", receipt.created_at.isoformat())]


def receipt_refund_preview(*, receipt_id: int) -> Preview:
    receipt = _receipt(receipt_id)
    preview = Preview(evidence=_receipt_evidence(receipt))
    refund = WithdrawalRefund.objects.filter(receipt=receipt).first()
    if refund is not None:
        preview.evidence += [("refund", f"{refund.status}: {refund.amount} USDC to "
                                        f"{refund.destination}, hash {refund.tx_hash}"),
                             ("refund error", refund.last_error)]
        if refund.status == F.COMPLETED:
            preview.refusal = "the receipt was refunded already"
        preview.will = [
            "Drive the refund already stored: look its hash up on Stellar, re-post the "
            "same envelope (a new one only if the stored one is provably dead). No second "
            "payment is ever made.",
            "Write one withdrawal_payout_events row with your name and note."]
        return preview
    preview.refusal = _receipt_refund_refusal(receipt)
    preview.will = [
        f"Send {receipt.unconsumed} USDC from the distribution account back to "
        f"{receipt.from_account} on Stellar (the receipt's sender; memo none). The signed "
        "envelope and its hash are stored with one withdrawal_payout_events row naming "
        "you and your note, in one transaction, before anything is submitted: one refund "
        "per receipt, so repeating this action can never pay twice.",
        "Then submit it (the refund outbox and its sweep finish it). AP is not told: no "
        "AP transaction holds this USDC."]
    return preview


def receipt_refund_on_chain(*, receipt_id: int, operator, note: str) -> WithdrawalRefund:
    """Send the unconsumed part of a USDC receipt (``amount - consumed_amount``,
    Decimal, 7 dp: a second payment after completion, an overpayment's excess, an
    unknown or shared memo; payouts/receipts.py) back to its sender, from the
    distribution account, through the withdrawal-refund outbox (payouts/refunds.py,
    decided by the one envelope rule, anchor/envelopes.py). One commit stores the
    signed envelope, its hash and the audit row (``receipt.refund``); the refund is
    unique per receipt (``withdrawal_refunds.receipt`` and ``transaction_id`` =
    ``receipt:<id>``), so a repeat drives the same envelope (audit
    ``receipt.refund_resumed``) and never pays twice. Once on chain the refund is
    ``completed`` and the receipt ``settled_at``. Raises OperationRefused."""
    require_permission(operator, "payouts.refund_receipt")
    note = clean_note(note)
    receipt = _receipt(receipt_id)
    key = receipt_refund_key(receipt)
    existing = WithdrawalRefund.objects.filter(receipt=receipt).first()
    if existing is not None:
        if existing.status == F.COMPLETED:
            raise OperationRefused("the receipt was refunded already")
        with transaction.atomic():
            _event(transaction_id=key, event="receipt.refund_resumed", operator=operator,
                   note=note, detail={"status": existing.status, "tx_hash": existing.tx_hash,
                                      "last_error": existing.last_error})
        return refunds.refund_drive(refund_id=existing.pk, resumed=True)
    refund = _receipt_refund_store(receipt, operator=operator, note=note, memo_type="none",
                                   memo="")
    return refunds.refund_drive(refund_id=refund.pk, resumed=False)


def _receipt_refund_store(receipt: StellarReceipt, *, operator, note: str, memo_type: str,
                          memo: str, check=None) -> WithdrawalRefund:
    """One commit: the receipt locked and checked again (``check``: more refusals, read
    under the lock), the signed envelope of its unconsumed part back to its sender and
    the audit row ``receipt.refund``. A refund of it already on chain with no row (its
    claim lost with a failover's last commits, issue 25 §2; under either memo a
    receipt's refund carries, ``refunds.receipt_refund_memos``) is adopted instead, as
    ``_refund_store`` adopts a withdrawal's: the row stored ``submitted`` with the
    payment's hash and booked (rule 6), nothing sent again. Raises OperationRefused."""
    key = receipt_refund_key(receipt)
    refusal = _receipt_refund_refusal(receipt)
    if refusal:
        raise OperationRefused(refusal)
    try:  # outside the transaction: Horizon reads hold no lock
        found = refunds.landed_unrecorded(
            destination=receipt.from_account, amount=receipt.unconsumed,
            memo=refunds.receipt_refund_memos(receipt), since=receipt.created_at)
        adopted = refunds.chain_fields(found.tx_hash) if found is not None else None
    except stellar.HorizonUnavailable as exc:
        raise OperationRefused(f"Horizon cannot be read: {exc}") from exc
    try:
        with transaction.atomic():
            current = StellarReceipt.objects.select_for_update().get(pk=receipt.pk)
            refusal = _receipt_refund_refusal(current) or (check(current) if check else "")
            if refusal or current.unconsumed != receipt.unconsumed:
                raise OperationRefused(refusal or "the receipt changed since it was checked")
            if adopted is not None:
                refund = WithdrawalRefund.objects.create(
                    receipt=current, transaction_id=key, status=F.SUBMITTED,
                    destination=current.from_account, amount=current.unconsumed,
                    memo=found.memo, memo_type=found.memo_type, **adopted,
                    last_error=f"adopted from the chain: {found.tx_hash} landed with no "
                               "refund recorded (a lost commit)")
                books.refund_landed(refund)  # rule 6, with the row that records it
            else:
                prepared = stellar.prepare_payment(
                    holder=refunds.holder(key), destination=current.from_account,
                    amount=current.unconsumed, memo_type=memo_type, memo=memo)
                refund = WithdrawalRefund.objects.create(
                    receipt=current, transaction_id=key, destination=current.from_account,
                    amount=current.unconsumed, memo=memo, memo_type=memo_type, **prepared)
            _event(transaction_id=key, event="receipt.refund", operator=operator, note=note,
                   detail={"amount": format(current.unconsumed, "f"),
                           "destination": current.from_account, "tx_hash": refund.tx_hash,
                           "adopted": adopted is not None,
                           "receipt": {"tx_hash": current.tx_hash,
                                       "from": current.from_account,
                                       "amount": format(current.amount, "f"),
                                       "consumed": format(current.consumed_amount, "f"),
                                       "memo_type": current.memo_type, "memo": current.memo,
                                       "at": current.created_at.isoformat(),
                                       "reason": current.review_reason}})
    except IntegrityError as exc:  # a concurrent refund of the same receipt won
        raise OperationRefused("a refund of this receipt exists already") from exc
    except (stellar.NoChannelFree, stellar.HorizonUnavailable, ValueError) as exc:
        raise OperationRefused(f"no refund envelope could be built now: {exc}") from exc
    log.info("receipt %s: refund %s of %s USDC stored by %s", receipt.tx_hash, refund.tx_hash,
             refund.amount, operator_name(operator))
    return refund


def _expired_receive_of(receipt: StellarReceipt) -> WithdrawalRequest | None:
    """The SEP-31 receive ``receipt`` paid late: its memo names exactly one request, a
    receive, ``expired`` (payouts/receive.py ``expire_if_due``). None otherwise."""
    requests = list(receipts.memo_requests(receipt)[:2])
    if len(requests) != 1 or requests[0].kind != WithdrawalRequest.Kind.RECEIVE or \
            requests[0].status != R.EXPIRED:
        return None
    return requests[0]


def late_receipt_refund(*, receipt_id: int) -> WithdrawalRefund | None:
    """Corridor's own refund of USDC that arrived under the memo of a SEP-31 receive
    after the receive expired (issue 25 §1: late money is returned to whoever sent it,
    exactly once, through the shared outbox): the receipt's unconsumed part (all of it:
    an expired receive consumes nothing) goes back to the payment's sender, under the
    payment's own memo (the one AP 4.3.0 gives a receive's ``refund_memo``), by the
    operator's ``receipt_refund_on_chain`` path: the same checks, one refund per receipt
    (an operator who refunded it first wins), the audit row ``receipt.refund`` naming
    Corridor (``common.console.AUTOMATIC``). Only a receipt the classifier raised
    (payouts/receipts.py, past RECEIPT_GRACE_S). Returns the refund driven once, or
    None when the receipt is not such a payment or not refundable now (logged; the
    poller asks again), or a refund of it exists already (the refund sweep drives it)."""
    receipt = StellarReceipt.objects.filter(pk=receipt_id).first()
    if receipt is None or WithdrawalRefund.objects.filter(receipt=receipt).exists():
        return None
    request = _expired_receive_of(receipt)
    if request is None:
        return None

    def still_late(current: StellarReceipt) -> str:
        return "" if _expired_receive_of(current) is not None else \
            "the receipt no longer pays an expired receive"

    try:
        refund = _receipt_refund_store(
            receipt, operator=None, memo_type=receipt.memo_type, memo=receipt.memo,
            check=still_late,
            note=(f"arrived after SEP-31 transaction {request.transaction_id} expired "
                  f"({request.review_reason}): returned to its sender")[:2000])
    except OperationRefused as exc:
        log.info("receipt %s: no automatic refund yet: %s", receipt.tx_hash, exc)
        return None
    return refunds.refund_drive(refund_id=refund.pk, resumed=False)


# --- any AP transaction: expire it before funds arrive ---------------------------------

@dataclass
class _ExpireCheck:
    ap_tx: dict
    evidence: dict


def _expire_check(transaction_id: str) -> _ExpireCheck:
    """AP allows ``notify_transaction_expired`` from any open status while funds have
    not been received (NOTES §1.6), but its "funds received" flag is not visible for
    SEP-24 (§1.7) and its observer misses payments (§4.4): Corridor's own records decide.
    Deposits: no captured payment of ours, and Razorpay (asked now) shows none captured
    or authorized for the order. Withdrawals: no USDC receipt under the memo (Horizon
    read now) and no payout. AP status must be ``incomplete`` or
    ``pending_user_transfer_start``."""
    transaction_id = (transaction_id or "").strip()
    if not transaction_id:
        raise OperationRefused("an AP transaction id is required")
    ap_tx = _ap_read(transaction_id)
    status, kind = ap_tx.get("status"), ap_tx.get("kind")
    evidence: dict = {"kind": kind, "ap_status": status}
    if status in AP_CLOSED:
        raise OperationRefused(f"AP shows the transaction {status}: it is closed")
    if status not in AP_BEFORE_FUNDS:
        raise OperationRefused(f"AP shows the transaction {status}: funds may have arrived")
    if kind == "deposit":
        if DepositPayment.objects.live().filter(transaction_id=transaction_id).exists():
            raise OperationRefused("Corridor recorded a captured INR payment for it")
        order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
        if order is not None:
            try:
                payments = rzp.order_payments(order.order_id)
            except rzp.RazorpayError as exc:
                raise OperationRefused(f"Razorpay cannot be asked about order "
                                       f"{order.order_id}: {exc}") from exc
            paid = [p.get("id") for p in payments
                    if p.get("status") in ("captured", "authorized")]
            if paid:
                raise OperationRefused(f"Razorpay shows payment {', '.join(paid)} for order "
                                       f"{order.order_id}")
            evidence["order"] = order.order_id
            evidence["razorpay_payments"] = [(p.get("id"), p.get("status")) for p in payments]
    elif kind == "withdrawal":
        if WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists():
            raise OperationRefused("a payout exists for it")
        request = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
        memo = (request.memo if request else "") or str(ap_tx.get("memo") or "")
        memo_type = (request.memo_type if request else "") or ap_tx.get("memo_type") or "id"
        if memo:
            try:
                receipts.scan()
            except stellar.HorizonUnavailable as exc:
                raise OperationRefused(f"Horizon cannot be read: {exc}") from exc
            arrived = list(StellarReceipt.objects.filter(
                memo_type=memo_type, memo=memo, to_account=receipts.withdraw_account())
                .values_list("tx_hash", "amount", "asset"))
            if arrived:
                raise OperationRefused(f"{len(arrived)} payment(s) arrived under its memo "
                                       f"{memo}: {arrived[0][1]} {arrived[0][2]} in "
                                       f"{arrived[0][0]}")
        evidence["memo"] = memo
    else:
        raise OperationRefused(f"unknown kind {kind!r}")
    return _ExpireCheck(ap_tx, evidence)


def ap_transaction_expire_preview(*, transaction_id: str) -> Preview:
    preview = Preview(evidence=[("AP transaction", transaction_id)])
    try:
        check = _expire_check(transaction_id)
        ap_tx = check.ap_tx
        preview.evidence += [("kind", ap_tx.get("kind")), ("AP status", ap_tx.get("status")),
                             ("amount in", ap_tx.get("amount_in")),
                             ("amount out", ap_tx.get("amount_out")),
                             ("started", ap_tx.get("started_at")),
                             ("our evidence", check.evidence)]
    except OperationRefused as exc:
        preview.refusal = str(exc)
    preview.will = [
        "Tell AP notify_transaction_expired (AP -> expired, final): the customer must "
        "start again. No money moves: none has arrived.",
        "Mark our deposit order or withdrawal request expired if there is one (USDC "
        "arriving later is raised for a refund), and write one ap_transaction_events row "
        "with your name and note, in one transaction.",
    ]
    return preview


def ap_transaction_expire(*, transaction_id: str, operator, note: str) -> ApTransactionEvent:
    """Expire an AP transaction (deposit or withdrawal) while no funds have arrived:
    AP ``notify_transaction_expired`` with a message (required for ``expired``, NOTES
    §1.4), then one commit: our deposit order or withdrawal request ``expired`` (if
    any) and the ``ap_transaction_events`` row. AP's -32600 (funds received, or
    closed) is a refusal: nothing is written. Moves no money. Raises OperationRefused."""
    require_permission(operator, "anchor.expire_ap_transaction")
    note = clean_note(note)
    transaction_id = (transaction_id or "").strip()
    check = _expire_check(transaction_id)
    try:
        platform.rpc_once(
            "notify_transaction_expired",
            {"transaction_id": transaction_id,
             "message": "This transaction expired before any funds arrived; start a new one."},
            reached=lambda tx: tx.get("status") == "expired")
    except (platform.RpcError, platform.PlatformError) as exc:
        raise OperationRefused(f"AP refused to expire it: {exc}") from exc
    with transaction.atomic():
        orders = DepositOrder.objects.filter(
            transaction_id=transaction_id, status=DepositOrder.Status.AWAITING_PAYMENT
        ).update(status=DepositOrder.Status.EXPIRED, updated_at=timezone.now())
        # Our withdrawal request ends with AP: USDC that arrives under its memo after
        # this (or that a lagging Horizon hid from the check) is raised for a refund by
        # the receipt classifier; left ``awaiting_funds`` it owned those receipts for
        # ever, while the poller never lists an expired AP transaction again.
        requests = WithdrawalRequest.objects.filter(
            transaction_id=transaction_id, status=R.AWAITING_FUNDS
        ).update(status=R.EXPIRED, updated_at=timezone.now(),
                 review_reason=f"expired in AP by {operator_name(operator)}"[:2000])
        return ApTransactionEvent.objects.create(
            transaction_id=transaction_id, kind=check.ap_tx.get("kind") or "",
            event="ap.expired", operator=operator_name(operator), note=note,
            detail={**check.evidence, "orders_expired": orders,
                    "requests_expired": requests})
