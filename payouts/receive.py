"""SEP-31 receiving behind AP 4.x (anchor-platform SEP31-RECEIVE.md §1, §3, §4): a
foreign sending anchor (SA) registers sender and receiver through SEP-12, takes a firm
SEP-38 quote and creates a SEP-31 transaction; AP creates it in ``pending_receiver``
and checks no KYC (§1 rule 1). Corridor decides here, once per transaction:

1. the sender and receiver named in ``customers`` exist, were registered by the
   account that created the transaction (``creator.account``: one SA cannot name
   another's customer, §10 item 2), and are ``ACCEPTED``. ``NEEDS_INFO`` ->
   ``notify_customer_info_updated`` (AP: ``pending_customer_info_update``; the SA
   updates the customer and the next pass goes on); ``PROCESSING`` -> wait; unknown,
   foreign or ``REJECTED`` -> ``notify_transaction_error`` with a message for the SA;
2. the firm quote is Corridor's, given to the account that created the transaction,
   unexpired, unused, for exactly this ``amount_in`` of USDC into INR
   (``anchor.quotes.use_firm_quote``: single use and owner even on AP 4.3.0, §10
   item 3), and its ``buy_amount`` is what the receiver gets;
3. the receiver's daily and monthly limits (anchor/limits.py) hold;
4. the receiver's bank account (or UPI ID) from the KYC fields is registered with
   RazorpayX, and a ``withdrawal_requests`` row of kind ``receive`` is committed with a
   memo of ours (19 random digits: unique among open transactions, §3.3) before
   ``request_onchain_funds`` (``destination_account`` = the account whose USDC receipts
   Corridor reads, payouts/receipts.py) moves AP to ``pending_sender``.

From there the row is a payout request like a withdrawal's (payouts/poller.py): the USDC
is verified on Horizon by the same receipt checks (AP's observer would take any asset
or amount, and AP accepts ``notify_offchain_funds_sent`` before any USDC arrived, §1
rule 3), the beneficiary is validated (payouts/beneficiaries.py), and the INR is paid
once by the payout guard, which moves AP to ``pending_external`` and ``completed``.

A transaction still ``pending_sender`` when its quote expires is expired at AP
(``expire_if_due``, only once Corridor's receipt scan covers Horizon's history up to
the expiry), and USDC that arrives after the quote expired is never paid at it
(``late_for_quote``: a person decides; after the expiry Corridor returns it to its
sender by itself, ``payouts.operations.late_receipt_refund``). Limits count per person,
not per customer row (anchor/limits.py identities): the same bank account under a new
memo, or a customer deleted and registered again, meets the same limits and the same
rejection.

A remittance whose payout can never succeed (``failed_for_good``: the bank says the
receiver's account is invalid, closed or frozen, at validation or at payout) is refunded
in full to the SA on chain by Corridor itself (``operations.refund_for_good``,
the withdrawal refund outbox; AP is moved error -> recovery -> ``notify_refund_sent``,
payouts/refunds.py). Every other refusal (a name mismatch, a short payment, a late one, a
transient bank failure, a reversal) waits for a person, who pays again (a new attempt)
or refunds the same way.

Every step is idempotent: a repeated call re-reads AP and the row and does only what is
missing.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from anchor import customers, limits, pii, platform, quotes
from anchor import razorpay as rzp
from anchor.models import Customer, FirmQuote
from payouts import receipts
from payouts.guard import provider
from payouts.models import (
    FundAccountValidation,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRequest,
)
from payouts.providers.base import Beneficiary, ProviderError

log = logging.getLogger(__name__)
INR = "iso4217:INR"
AP_STATUSES = ["pending_receiver", "pending_sender", "pending_customer_info_update",
               "pending_external"]
# AP statuses of a receive whose request row :func:`receive_rebuild` stores again.
REBUILT_STATUSES = ("pending_sender", "pending_receiver", "pending_external", "completed",
                    "refunded", "expired")


# RazorpayX ``status_details.reason`` values that say the receiver's account itself cannot
# take the credit (razorpay/NOTES.md §2.6; docs errors/x/payout-status-details): paying it
# again never succeeds. Offline banks, timeouts and our own balance are not among them.
ACCOUNT_REFUSES = frozenset({
    "bank_account_closed", "bank_account_frozen", "bank_account_invalid",
    "beneficiary_account_dormant", "beneficiary_account_invalid", "beneficiary_vpa_invalid",
    "invalid_beneficiary", "invalid_ifsc_code"})


class Refused(Exception):
    """The transaction cannot be served: the message goes to the SA through AP."""


def _ids(ap_tx: dict) -> tuple[str, str]:
    people = ap_tx.get("customers") or {}
    return ((people.get("sender") or {}).get("id") or "",
            (people.get("receiver") or {}).get("id") or "")


def _customer(customer_id: str, creator: str, kind: str) -> Customer:
    who = "sender" if kind == customers.SENDER else "receiver"
    customer = Customer.objects.filter(pk=customer_id, deleted_at__isnull=True).first() \
        if customer_id else None
    if customer is None or customer.account != creator:
        raise Refused(f"the {who} {customer_id or '(none)'} is not a customer you "
                      f"registered")
    if customer.type != kind:
        raise Refused(f"customer {customer_id} is registered as {customer.type}, not {kind}")
    return customer


def _usdc(ap_tx: dict) -> Decimal:
    return Decimal(str((ap_tx.get("amount_in") or {}).get("amount") or "0"))


def _beneficiary(data: dict[str, str]) -> Beneficiary:
    """Where to pay a receiver, from its KYC fields (``personal_data``)."""
    name = " ".join(p for p in (data.get("first_name"), data.get("last_name")) if p)
    account = data.get("bank_account_number", "")
    if "@" in account:
        return Beneficiary(name=name, kind="vpa", vpa=account)
    return Beneficiary(name=name, kind="bank_account", account_number=account,
                       ifsc=data.get("bank_number", ""))


def decide(*, ap_tx: dict) -> str:
    """Decide one SEP-31 transaction AP holds in ``pending_receiver`` or
    ``pending_customer_info_update`` with no funds received (module docstring). One
    decided before (its ``withdrawal_requests`` row exists) that AP has not asked the
    funds for, whatever the row says (a pass on an older read of AP took a refusal for
    done once, issue 25 §3), has its customers checked again and the funds asked for
    again. Returns the outcome: ``funds_requested``, ``needs_info``,
    ``kyc_processing``, ``rejected``, ``not_due``. Raises platform.PlatformError /
    RpcError, rzp.RazorpayError (try again)."""
    transaction_id = ap_tx["id"]
    request = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
    if not unasked(ap_tx):
        return "not_due"
    if request is not None and request.funds_requested_at is not None:
        # Our row says AP asked for the funds, this read says it has not: an older read
        # (look again), or a row that took a refusal for done (issue 25 §3: it then
        # waited for information it already had). Ask again.
        ap_tx = platform.get_transaction(transaction_id) or ap_tx
        if not unasked(ap_tx):
            return "not_due"
        log.warning("SEP-31 %s: AP is %s, not asked for funds: asking again",
                    transaction_id, ap_tx.get("status"))
    creator = (ap_tx.get("creator") or {}).get("account") or ""
    sender_id, receiver_id = _ids(ap_tx)
    try:
        sender = _customer(sender_id, creator, customers.SENDER)
        receiver = _customer(receiver_id, creator, customers.RECEIVER)
        waiting = _kyc(ap_tx, [sender, receiver])
        if waiting:
            return waiting
        if request is not None:  # decided before; AP was not asked (or took it back)
            return _request_funds(request, people=[sender.id, receiver.id])
        amount_in = _usdc(ap_tx)
        quote_id = ap_tx.get("quote_id") or ""
        if not quote_id:
            raise Refused("a firm quote is required (quotes_required)")
        # A pass that died after taking the quote finds it taken by this transaction.
        quote = FirmQuote.objects.filter(quote_id=quote_id, transaction_id=transaction_id,
                                         used_at__isnull=False).first() or \
            quotes.use_firm_quote(quote_id, transaction_id=transaction_id, owner=creator,
                                  sell_asset=quotes.usdc_asset(), sell_amount=amount_in,
                                  buy_asset=INR)
        amount_out = quote.buy_amount.quantize(Decimal("0.01"))
        data = customers.personal_data(receiver)  # read once: limits and the payee
        limits.reserve(customer=receiver, transaction_id=transaction_id, kind="receive",
                       amount_inr=amount_out,
                       identity=customers.payout_identity(data) or receiver.id)
    except (Refused, quotes.QuoteRefused, limits.LimitReached) as exc:
        limits.release(transaction_id)
        return _reject(transaction_id, str(exc), people=[sender_id, receiver_id])
    beneficiary = _beneficiary(data)
    try:
        contact_id, fund_account_id = provider().register_beneficiary(
            beneficiary=beneficiary, reference=transaction_id)
    except ProviderError as exc:
        limits.release(transaction_id)
        return _reject(transaction_id, f"the receiver's bank details were refused: {exc}",
                       people=[sender_id, receiver_id])
    request = _create(
        transaction_id=transaction_id, quote=quote, receiver_id=receiver.id,
        amount_in=amount_in, amount_out=amount_out, beneficiary=beneficiary,
        contact_id=contact_id, fund_account_id=fund_account_id,
        memo=str(10**18 + secrets.randbelow(9 * 10**18))) or \
        WithdrawalRequest.objects.get(transaction_id=transaction_id)  # another worker won
    customers.mark_used(sender.id)
    customers.mark_used(receiver.id)
    return _request_funds(request, people=[sender.id, receiver.id])


def _create(*, transaction_id: str, quote: FirmQuote | None, receiver_id: str,
            amount_in: Decimal, amount_out: Decimal, beneficiary: Beneficiary | None,
            contact_id: str, fund_account_id: str, memo: str, fee: Decimal = Decimal(0),
            **rebuilt) -> WithdrawalRequest | None:
    """The receive's ``withdrawal_requests`` row (kind ``receive``, our account, id memo
    ``memo``), as the decision stores it, or as :func:`receive_rebuild` stores it again
    (``rebuilt``: ``status``, ``review_reason``, ``funds_requested_at``). ``fee`` (USDC)
    is the quote's when there is one. None when the row exists already (another pass)."""
    if quote is not None:
        fee = quote.fee_total if quote.fee_asset == quotes.usdc_asset() else Decimal(0)
    try:
        with transaction.atomic():
            return WithdrawalRequest.objects.create(
                transaction_id=transaction_id, kind=WithdrawalRequest.Kind.RECEIVE,
                quote_id=quote.quote_id if quote is not None else "",
                customer_id=receiver_id, amount_in=amount_in, fee=fee,
                amount_out=amount_out, amount_out_paise=rzp.rupees_to_paise(amount_out),
                rate=(amount_out / amount_in).quantize(Decimal("0.0001")),
                beneficiary_type=beneficiary.kind if beneficiary else "",
                beneficiary_display=beneficiary.masked() if beneficiary else "",
                beneficiary_name=pii.seal(beneficiary.name.encode()) if beneficiary else None,
                contact_id=contact_id, fund_account_id=fund_account_id,
                destination=receipts.withdraw_account(), memo=memo, memo_type="id",
                source_account="", **rebuilt)
    except IntegrityError:
        return None


def funds_asked(ap_tx: dict) -> bool:
    """AP took our ``request_onchain_funds``: the transaction is past asking (not
    :func:`unasked`), carries an id memo, and names our receipts account as its
    ``destination_account`` (AP 4.3.0 sets both from the call, SEP31-RECEIVE.md §3.3)."""
    return not unasked(ap_tx) and ap_tx.get("status") in REBUILT_STATUSES and \
        ap_tx.get("memo_type") == "id" and bool(ap_tx.get("memo")) and \
        ap_tx.get("destination_account") == receipts.withdraw_account()


def receive_rebuild(*, ap_tx: dict) -> WithdrawalRequest | None:
    """The ``withdrawal_requests`` row of a receive a failover lost with its last
    commits (issue 25 §2: the decision's commit, the funds request, the USDC's
    verification, the payout claim are all gone) while AP kept the transaction, took
    our ``request_onchain_funds`` (:func:`funds_asked`) and the sending anchor may have
    paid. Rebuilt from what the outside holds: AP's memo, destination, amount expected,
    ``quote_id`` and receiver; the firm quote taken again by this transaction (a
    conditional UPDATE: unused, or already its own); the receiver's bank account
    registered again with RazorpayX (identical details return the same contact and
    fund account, razorpay/NOTES.md §2.2-2.3); the limits reserved again. Stored
    ``awaiting_funds`` with ``funds_requested_at``, so the poller verifies the USDC on
    chain (the receipts come back with the scan cursor the failover rewound) and pays
    through the guard, whose attempt key (derived from the transaction,
    ``guard.attempt_key``) makes RazorpayX answer with the payout it already made.

    Stored ``manual_review`` with the reason instead, its USDC held for a person and
    never paid, when it cannot be honoured as it was: its quote or receiver lost too,
    the quote taken by another transaction since, the bank details refused, more than
    one payout at RazorpayX under its reference (an operator's second attempt: a
    re-claim would replay the first), AP ``completed`` with no payout at RazorpayX (an
    operator's confirmation), or AP ``refunded`` (the refund sweep then rebuilds the
    refund from AP's hash and the chain, ``payouts.refunds.refund_rebuild``). AP
    ``expired`` (Corridor expired it, ``expire_if_due``) is stored ``expired``: USDC
    arriving under its memo later is returned to its sender by itself
    (``receipts.late_for_expired_receives``).

    None when there is nothing to rebuild (RECEIVE_REBUILD off, a row exists, AP never
    took our funds request or holds no amounts). Raises rzp.RazorpayError (RazorpayX
    unreachable: the next pass tries again)."""
    transaction_id = ap_tx["id"]
    # What the sending anchor was asked for (AP's observer may rewrite amount_in with
    # what one payment brought, NOTES §4.4); the receipts are verified against it.
    amount_in = Decimal(str((ap_tx.get("amount_expected") or ap_tx.get("amount_in") or {}
                             ).get("amount") or "0"))
    amount_out = Decimal(str((ap_tx.get("amount_out") or {}).get("amount") or "0"))
    if not settings.RECEIVE_REBUILD or not funds_asked(ap_tx) or amount_in <= 0 or \
            amount_out <= 0 or \
            WithdrawalRequest.objects.filter(transaction_id=transaction_id).exists():
        return None
    creator = (ap_tx.get("creator") or {}).get("account") or ""
    _, receiver_id = _ids(ap_tx)
    if ap_tx.get("status") == "expired":  # nothing owed: USDC arriving now goes back
        return _rebuilt(ap_tx, None, _create(
            transaction_id=transaction_id, quote=None, receiver_id=receiver_id,
            amount_in=amount_in, amount_out=amount_out, beneficiary=None, contact_id="",
            fund_account_id="", memo=str(ap_tx["memo"]), funds_requested_at=timezone.now(),
            status=WithdrawalRequest.Status.EXPIRED,
            review_reason="expired in AP before its USDC arrived (rebuilt after a lost "
                          "commit)"))
    problems = []
    quote_id = ap_tx.get("quote_id") or ""
    FirmQuote.objects.filter(quote_id=quote_id, used_at__isnull=True).update(
        used_at=timezone.now(), transaction_id=transaction_id[:64])
    quote = FirmQuote.objects.filter(quote_id=quote_id).first() if quote_id else None
    if quote is None:
        problems.append(f"its firm quote {quote_id or '(none)'} is not in Corridor")
    elif quote.transaction_id != transaction_id[:64]:
        problems.append(f"its firm quote {quote_id} was taken by {quote.transaction_id} "
                        "since")
    elif quote.client_id != creator or quote.sell_amount != amount_in:
        problems.append(f"its firm quote {quote_id} is not {creator}'s for {amount_in} USDC")
    else:
        amount_out = quote.buy_amount.quantize(Decimal("0.01"))
    receiver = Customer.objects.filter(pk=receiver_id, deleted_at__isnull=True).first() \
        if receiver_id else None
    beneficiary, contact_id, fund_account_id = None, "", ""
    if receiver is None:
        problems.append(f"its receiver {receiver_id or '(none)'} is not in Corridor")
    else:
        data = customers.personal_data(receiver)
        beneficiary = _beneficiary(data)
        try:
            contact_id, fund_account_id = provider().register_beneficiary(
                beneficiary=beneficiary, reference=transaction_id)
        except ProviderError as exc:
            problems.append(f"the receiver's bank details were refused: {exc}")
        try:
            limits.reserve(customer=receiver, transaction_id=transaction_id, kind="receive",
                           amount_inr=amount_out,
                           identity=customers.payout_identity(data) or receiver.id)
        except limits.LimitReached as exc:  # held when it was decided; counted anyway
            log.warning("SEP-31 %s rebuilt over the limits: %s", transaction_id, exc)
    made = provider().find_by_reference(transaction_id)
    if len(made) > 1:
        problems.append(f"{len(made)} payouts at RazorpayX under its reference: "
                        + ", ".join(f"{p.payout_id} ({p.status})" for p in made))
    status = ap_tx.get("status")
    if status == "completed" and not made:
        problems.append("AP shows it completed with no payout at RazorpayX")
    if status == "refunded":
        problems.append("AP shows its USDC refunded")
    then = "" if status == "refunded" else ": a person refunds its USDC or settles it"
    why = ("rebuilt after a lost commit, not payable: " + "; ".join(problems) + then
           )[:2000] if problems else ""
    fee = Decimal(str(((ap_tx.get("fee_details") or {}).get("total")) or "0")) \
        if (ap_tx.get("fee_details") or {}).get("asset") == quotes.usdc_asset() else Decimal(0)
    return _rebuilt(ap_tx, receiver, _create(
        transaction_id=transaction_id, quote=quote if not problems else None,
        receiver_id=receiver_id, amount_in=amount_in, amount_out=amount_out,
        beneficiary=beneficiary, contact_id=contact_id, fund_account_id=fund_account_id,
        memo=str(ap_tx["memo"]), fee=fee, funds_requested_at=timezone.now(),
        status=WithdrawalRequest.Status.MANUAL_REVIEW if problems else
        WithdrawalRequest.Status.AWAITING_FUNDS, review_reason=why))


def _rebuilt(ap_tx: dict, receiver: Customer | None,
             request: WithdrawalRequest | None) -> WithdrawalRequest | None:
    """A request :func:`receive_rebuild` stored (None: another pass did): its
    ``created_at`` set to AP's ``started_at``, where its lookbacks on chain start
    (``refunds.landed_unrecorded`` finds a refund sent before the rebuild), the receiver
    marked used, its receipts raised as an unknown memo meanwhile taken back from the
    queue (``receipts.classify_receipts`` allocates them to it), the rebuild logged."""
    if request is None:
        return None
    started = ap_tx.get("started_at")
    if started:
        WithdrawalRequest.objects.filter(pk=request.pk).update(
            created_at=datetime.fromisoformat(started.replace("Z", "+00:00")))
        request.refresh_from_db()
    if receiver is not None:
        customers.mark_used(receiver.id)
    # USDC the classifier raised while no row named its memo (the poller down past
    # RECEIPT_GRACE_S after the failover) is this request's: classified again with it,
    # never left in the queue for a receipt refund beside the payout.
    StellarReceipt.objects.filter(
        memo_type="id", memo=request.memo, settled_at__isnull=True, refund__isnull=True,
        review_reason__startswith="unknown memo").update(review_reason="", reviewed_at=None)
    log.warning("SEP-31 %s: request rebuilt from AP (%s, memo %s) after a lost commit: %s",
                request.transaction_id, ap_tx.get("status"), request.memo,
                request.review_reason or request.status)
    return request


def lost_closed_transactions() -> list[dict[str, Any]]:
    """AP's SEP-31 receives ``completed``, ``refunded`` or ``expired`` that AP started in
    the last RECEIVE_REBUILD_WINDOW_S and closed in the seconds a failover lost (the
    poller's own listing, :func:`transactions`, covers the open ones): with no request
    row in Corridor, or ``completed`` with a request but no payout row (the request kept
    as it was when the funds were asked for; its verification and payout lost: chaos,
    20 loaded seeds, seed 2). Their rows are rebuilt (:func:`receive_rebuild`, then
    ``guard.payout_rebuild``) so the USDC is booked and the payout or refund recorded
    once. Empty with RECEIVE_REBUILD off."""
    if not settings.RECEIVE_REBUILD:
        return []
    closed = platform.list_transactions(
        statuses=["completed", "refunded", "expired"], kind="receive", sep="31",
        started_after=timezone.now() - timedelta(seconds=settings.RECEIVE_REBUILD_WINDOW_S))
    ids = [tx["id"] for tx in closed]
    known = set(requests_of(ids))
    paid = set(WithdrawalPayout.objects.filter(transaction_id__in=ids)
               .values_list("transaction_id", flat=True))
    return [tx for tx in closed if tx["id"] not in known or (
        tx.get("status") == "completed" and tx["id"] not in paid)]


def requests_of(transaction_ids: list[str]):
    """The AP ids among ``transaction_ids`` that have a request row (unique-key
    lookups; corridor/periodic.py)."""
    return WithdrawalRequest.objects.filter(transaction_id__in=transaction_ids
                                            ).values_list("transaction_id", flat=True)


def unasked(ap_tx: dict) -> bool:
    """AP has not asked the sending anchor for the funds: ``pending_receiver`` or
    ``pending_customer_info_update`` with nothing received (AP 4.3.0: only
    ``request_onchain_funds`` leaves them for ``pending_sender``, and only
    ``notify_onchain_funds_received`` sets ``transfer_received_at``)."""
    return not ap_tx.get("transfer_received_at") and ap_tx.get("status") in (
        "pending_receiver", "pending_customer_info_update")


def _wanted(people: list[str], *, now) -> None:
    """``info_wanted_at`` of ``people`` (customer ids): ``now`` (a transaction waits on
    them, as of this look) or None (none does any more)."""
    Customer.objects.filter(pk__in=[p for p in people if p]).update(info_wanted_at=now)


def _kyc(ap_tx: dict, people: list[Customer]) -> str:
    """"" when every customer is ACCEPTED (and AP was told if it was waiting for
    them); else what to wait for, stamping the customers waited for
    (``info_wanted_at``). Raises Refused."""
    info = None
    for person in people:
        view = customers.answer(person)
        if view.status == customers.REJECTED:
            raise Refused(f"the {person.type} was rejected: {view.message}")
        if view.status == customers.NEEDS_INFO and info is None:
            info = (person, view)
        elif view.status == customers.PROCESSING:
            _wanted([person.id], now=timezone.now())
            return "kyc_processing"
    status = ap_tx.get("status")
    if info is not None:
        person, view = info
        _wanted([person.id], now=timezone.now())
        if status == "pending_receiver":
            platform.rpc_once("notify_customer_info_updated", {
                "transaction_id": ap_tx["id"], "customer_id": person.id,
                "customer_type": person.type,
                "message": f"{person.type} needs: {', '.join(view.fields)}"},
                reached=lambda tx: tx.get("status") == "pending_customer_info_update")
        return "needs_info"
    if status == "pending_customer_info_update":  # the SA gave what was missing
        platform.rpc_once("notify_customer_info_updated", {
            "transaction_id": ap_tx["id"], "message": "customer information accepted"},
            reached=lambda tx: tx.get("status") == "pending_receiver")
    return ""


def _reject(transaction_id: str, message: str, *, people: list[str]) -> str:
    log.info("SEP-31 %s refused: %s", transaction_id, message)
    platform.rpc_once("notify_transaction_error",
                      {"transaction_id": transaction_id, "message": message[:250]},
                      reached=lambda tx: tx.get("status") == "error")
    _wanted(people, now=None)
    return "rejected"


def _request_funds(request: WithdrawalRequest, *, people: list[str]) -> str:
    """``request_onchain_funds`` with our account and memo (repeat-safe), then the row
    says funds were requested and nothing waits on ``people`` (customer ids). A
    refusal counts as done only when AP did ask (``pending_sender``, or funds received):
    AP back in ``pending_customer_info_update`` is not asked (issue 25 §3, the receivers
    of make demo whose IFSC came late). Raises platform.RpcError otherwise."""
    platform.rpc_once("request_onchain_funds", {
        "transaction_id": request.transaction_id, "destination_account": request.destination,
        "memo": request.memo, "memo_type": "id"},
        reached=lambda tx: tx.get("status") == "pending_sender" or
        bool(tx.get("transfer_received_at")))
    WithdrawalRequest.objects.filter(pk=request.pk, funds_requested_at__isnull=True).update(
        funds_requested_at=timezone.now(), updated_at=timezone.now())
    _wanted(people, now=None)
    return "funds_requested"


def mark_funds_requested(request: WithdrawalRequest, *, ap_tx: dict) -> bool:
    """Set ``funds_requested_at`` of a decided receive whose mark was lost (its commit,
    or its worker between AP's answer and the update) when AP's record proves the funds
    request (:func:`funds_asked`) under the row's own memo. True when it did."""
    if request.funds_requested_at is not None or not funds_asked(ap_tx) or \
            str(ap_tx.get("memo")) != request.memo:
        return False
    moved = WithdrawalRequest.objects.filter(
        pk=request.pk, funds_requested_at__isnull=True).update(
        funds_requested_at=timezone.now(), updated_at=timezone.now())
    if moved:
        log.warning("SEP-31 %s: AP holds our funds request (%s), the row's mark of it was "
                    "lost: set from AP's record", request.transaction_id, ap_tx.get("status"))
    return bool(moved)


def _quote_of(request: WithdrawalRequest) -> FirmQuote | None:
    if request.kind != WithdrawalRequest.Kind.RECEIVE or not request.quote_id:
        return None
    return FirmQuote.objects.filter(quote_id=request.quote_id).first()


def late_for_quote(request: WithdrawalRequest, first_receipt_at) -> str:
    """Why a receive may not be paid at its firm quote ("" if it may): its USDC first
    arrived after the quote expired (SEP31-RECEIVE.md §10 item 18: paying then would give
    the sending anchor a free option on the rate)."""
    quote = _quote_of(request)
    if quote is None or first_receipt_at is None or first_receipt_at <= quote.expires_at:
        return ""
    return (f"the USDC arrived at {first_receipt_at.isoformat()}, after the firm quote "
            f"{quote.quote_id} expired at {quote.expires_at.isoformat()}: refund it or "
            "agree a new rate")


def expire_if_due(request: WithdrawalRequest, ap_tx: dict) -> bool:
    """A receive still waiting for its USDC (AP ``pending_sender``, nothing received by
    AP or by us) whose firm quote expired: AP's ``notify_transaction_expired`` (AP expires
    nothing itself, §3.3), then the row is ``expired`` (a later payment is returned to
    its sender: payouts/receipts.py ``late_for_expired_receives``). "Nothing received"
    rests only on a receipt scan whose Horizon history reaches the quote's expiry
    (``receipts.scanned_through``); until then it waits (issue 25 §1: an on-time payment
    hidden by a lagging Horizon was expired). True when it is expired now. Raises
    stellar.HorizonUnavailable."""
    if request.status == WithdrawalRequest.Status.EXPIRED:
        return True
    quote = _quote_of(request)
    if (quote is None or timezone.now() <= quote.expires_at
            or ap_tx.get("status") != "pending_sender" or ap_tx.get("transfer_received_at")
            or request.status != WithdrawalRequest.Status.AWAITING_FUNDS):
        return False
    covered = receipts.scanned_through()
    if covered is None or covered < quote.expires_at:
        log.info("SEP-31 %s: quote expired at %s, receipts scanned only through %s: "
                 "waiting", request.transaction_id, quote.expires_at.isoformat(),
                 covered.isoformat() if covered else "(scan incomplete)")
        return False
    if receipts.verify(request, ap_source="").first_at is not None:
        return False
    platform.rpc_once("notify_transaction_expired", {
        "transaction_id": request.transaction_id,
        "message": f"the quote {quote.quote_id} expired before the USDC arrived"},
        reached=lambda tx: tx.get("status") == "expired")
    WithdrawalRequest.objects.filter(pk=request.pk,
                                     status=WithdrawalRequest.Status.AWAITING_FUNDS).update(
        status=WithdrawalRequest.Status.EXPIRED, updated_at=timezone.now(),
        review_reason=f"quote {quote.quote_id} expired before the USDC arrived")
    limits.release(request.transaction_id)
    return True


def failed_for_good(request: WithdrawalRequest) -> str:
    """Why ``request``'s INR can never be paid, in words for the audit row ("" when it
    may yet be: a person decides). A SEP-31 receive, or a SEP-24 withdrawal when
    WITHDRAWAL_REFUND_FOR_GOOD is on (issue 13 §3: "refunded on chain by policy"): its
    payout ``failed`` with one of ``ACCOUNT_REFUSES``, or, before any payout, its fund
    account validation completed with the account not active
    (payouts/beneficiaries.py)."""
    if request.kind != WithdrawalRequest.Kind.RECEIVE and \
            not settings.WITHDRAWAL_REFUND_FOR_GOOD:
        return ""
    payout = WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).first()
    if payout is None:
        validation = FundAccountValidation.objects.filter(
            fund_account_id=request.fund_account_id,
            decision=FundAccountValidation.Decision.REFUSED, status="completed").first()
        if request.status != WithdrawalRequest.Status.MANUAL_REVIEW or validation is None \
                or validation.account_status in ("", "active"):
            return ""
        return (f"the payee's bank says the account is {validation.account_status} "
                f"(fund account validation {validation.validation_id}): refunded in full")
    # The provider's own reason, kept on the attempt it failed (guard.payout_apply_status),
    # never the text of last_error (an operator's mark-failed note may end in any word);
    # the refund itself asks RazorpayX again (operations._refund_check).
    latest = payout.attempt_rows.filter(number=payout.attempts).first()
    reason = latest.provider_reason if latest is not None else ""
    if payout.status != WithdrawalPayout.Status.FAILED or latest is None or \
            latest.provider_status not in provider().failed_statuses or \
            reason not in ACCOUNT_REFUSES:
        return ""
    return (f"the payout {payout.provider_payout_id or payout.transaction_id} failed at the "
            f"payee's bank ({reason}): refunded in full")


def ap_status_for(request: WithdrawalRequest, sep24_status: str) -> str:
    """The AP status of ``request``'s kind that plays ``sep24_status``'s part
    (``pending_user_transfer_start`` -> ``pending_sender``, ``pending_anchor`` ->
    ``pending_receiver`` for a SEP-31 receive)."""
    if request.kind != WithdrawalRequest.Kind.RECEIVE:
        return sep24_status
    return {"pending_user_transfer_start": "pending_sender",
            "pending_anchor": "pending_receiver"}.get(sep24_status, sep24_status)


def transactions() -> list[dict[str, Any]]:
    """AP's SEP-31 transactions the poller looks at (kind ``receive``)."""
    return platform.list_transactions(statuses=AP_STATUSES, kind="receive", sep="31")
