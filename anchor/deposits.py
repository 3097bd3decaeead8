"""Deposit services: the quote, the interactive submission, and recording a captured
INR payment (the only thing that makes a deposit releasable, DESIGN.md §4)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import inbox, platform, submissions
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositPayment
from common.crashpoints import crash_point
from corridor.db import insert_unless_conflict
from ledger import chart

log = logging.getLogger(__name__)
PAISA = Decimal("0.01")
STROOP = Decimal("0.0000001")


class DepositInputError(ValueError):
    """The customer's input cannot make a deposit; the message is shown to them."""


class DepositStateError(Exception):
    """AP's transaction is not in a state that takes this step."""


@dataclass(frozen=True)
class Quote:
    """amount_in and fee in INR (2 dp), amount_out in USDC (7 dp), rate INR per USDC."""

    amount_in: Decimal
    fee: Decimal
    amount_out: Decimal
    rate: Decimal


def parse_inr(raw: str) -> Decimal:
    """A customer's rupee amount: plain decimal, at most 2 places, within limits.
    Raises DepositInputError with a message fit for the form."""
    text = (raw or "").strip().replace(",", "")
    if not text or len(text) > 16 or any(c not in "0123456789." for c in text) \
            or text.count(".") > 1 or text == ".":
        raise DepositInputError("Enter an amount in rupees, for example 1500 or 1500.50.")
    try:
        amount = Decimal(text)
    except InvalidOperation:
        raise DepositInputError("Enter an amount in rupees, for example 1500 or 1500.50.")
    if amount != amount.quantize(PAISA):
        raise DepositInputError("Use at most two decimal places (paise).")
    if amount < settings.DEPOSIT_MIN_INR:
        raise DepositInputError(f"The minimum deposit is ₹{settings.DEPOSIT_MIN_INR}.")
    if amount > settings.DEPOSIT_MAX_INR:
        raise DepositInputError(f"The maximum deposit is ₹{settings.DEPOSIT_MAX_INR}.")
    return amount.quantize(PAISA)


def quote(amount_in: Decimal) -> Quote:
    """Fee = percent of amount_in + fixed, rounded half-up to the paisa; USDC out =
    (amount_in - fee) / rate, rounded down to 7 dp (never over-release)."""
    fee = (amount_in * settings.DEPOSIT_FEE_PERCENT / 100 + settings.DEPOSIT_FEE_FIXED_INR
           ).quantize(PAISA, rounding=ROUND_HALF_UP)
    net = amount_in - fee
    if net <= 0:
        raise DepositInputError("The amount does not cover the fee.")
    rate = settings.DEPOSIT_RATE_INR_PER_USDC
    amount_out = (net / rate).quantize(STROOP, rounding=ROUND_DOWN)
    return Quote(amount_in=amount_in, fee=fee, amount_out=amount_out, rate=rate)


def _usdc_asset_id() -> str:
    return f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"


def deposit_submit(*, transaction_id: str, amount_in: Decimal) -> DepositOrder:
    """The interactive form's one transition: a Razorpay order for ``amount_in``
    (Decimal, INR, 2 dp; receipt = AP id), stored as our DepositOrder, then
    ``request_offchain_funds`` (AP: incomplete -> pending_user_transfer_start, NOTES
    §4.3). Safe under any number of simultaneous calls (anchor/submissions.py): only
    the holder of the submission's claim calls Razorpay or AP, with no database
    transaction or lock held across a call; a repeat after it is done returns the
    stored order and calls nothing.

    Crash recovery (a resumed claim, by the next submission or the sweeper): the
    order is looked up by receipt (``GET /v1/orders?receipt=``, Razorpay docs
    api/orders/fetch-all) before one is created, because Razorpay does not promise a
    unique receipt (NOTES §1.1: ``unique_receipt`` is an open question; its own
    fetch-all example lists two orders with one receipt). A found order is adopted,
    with its amount, so a deposit has one order. Should two ever exist, only the one
    stored here is ever shown to the customer; Checkout needs the order id from our
    page, so the other can never be paid. ``request_offchain_funds`` is sent only
    after a re-read of AP shows it still ``incomplete``.

    Returns the DepositOrder. Raises SubmissionInFlight (another request is making
    this submission: call nothing, show "being submitted"), DepositStateError,
    rzp.RazorpayError, platform errors (the claim is released for a retry)."""
    with bound_contextvars(transaction_id=transaction_id):
        order = DepositOrder.objects.filter(transaction_id=transaction_id,
                                            funds_requested_at__isnull=False).first()
        if order is not None:
            return order
        claim = submissions.claim(transaction_id=transaction_id, kind="deposit",
                                  amount_in=amount_in)
        if claim is None:
            return DepositOrder.objects.get(transaction_id=transaction_id)
        return _deposit_drive(claim, amount_in)


def _deposit_drive(claim: submissions.Claim, amount_in: Decimal) -> DepositOrder:
    """The holder's steps, each outcome committed under the claim's fence."""
    transaction_id = claim.transaction_id
    try:
        ap_tx = platform.get_transaction(transaction_id)
        if ap_tx is None or ap_tx.get("kind") != "deposit":
            raise DepositStateError("This deposit does not exist.")
        order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
        if order is not None and ap_tx["status"] not in _NOT_REQUESTED and \
                not _funds_requested(ap_tx):
            # Past incomplete without the amounts our call sets: a stale read, not a
            # state to give up on (the claim is kept; a retry or the sweeper reads again).
            raise platform.PlatformError(
                f"AP shows {ap_tx['status']} without amount_in: a stale read")
        if ap_tx["status"] != "incomplete" and (order is None or not _funds_requested(ap_tx)):
            # An order stored by a crashed holder whose RPC AP applied is finished below.
            raise DepositStateError(f"This deposit is already {ap_tx['status']}.")
        if order is None:
            order = _deposit_order(claim, amount_in)
        if ap_tx["status"] == "incomplete":
            crash_point("deposit_submit.order_stored")
            _request_offchain_funds(order)
    except DepositStateError as exc:
        submissions.release(claim, error=str(exc), forget=True)
        raise
    except (rzp.RazorpayError, platform.PlatformError, platform.RpcError) as exc:
        submissions.release(claim, error=f"{type(exc).__name__}: {exc}", forget=False)
        raise

    def mark_requested():
        DepositOrder.objects.filter(pk=order.pk).update(funds_requested_at=timezone.now())

    submissions.finish(claim, also=mark_requested)
    order.refresh_from_db()
    return order


def _deposit_order(claim: submissions.Claim, amount_in: Decimal) -> DepositOrder:
    """Create (or, on a resumed claim, find by receipt) the Razorpay order and store it.
    The intent ``order_requested`` is committed before the create is sent."""
    transaction_id = claim.transaction_id
    found = None
    if claim.resumed and claim.step == "order_requested":
        found = _order_by_receipt(transaction_id)
    if found is None:
        q = quote(amount_in)
        paise = rzp.rupees_to_paise(q.amount_in)
        submissions.advance(claim, "order_requested", amount_in=q.amount_in)
        crash_point("deposit_submit.order_requested")
        created = rzp.create_order(amount_paise=paise, currency="INR", receipt=transaction_id,
                                   notes={"transaction_id": transaction_id})
    else:
        created, paise = found, found["amount"]
        q = quote(rzp.paise_to_rupees(paise))
        log.info("adopted Razorpay order %s found by receipt", found["id"])
    crash_point("deposit_submit.order_created")
    return submissions.advance(claim, "order_stored", also=lambda: DepositOrder.objects.create(
        transaction_id=transaction_id, order_id=created["id"], amount_in=q.amount_in,
        amount_in_paise=paise, fee=q.fee, amount_out=q.amount_out, rate=q.rate))


def _order_by_receipt(transaction_id: str) -> dict | None:
    """The order an earlier attempt created for this deposit, if Razorpay has one: one
    already attempted or paid first, else the oldest."""
    orders = [o for o in rzp.orders_by_receipt(transaction_id[:40])
              if o.get("receipt") == transaction_id[:40] and o.get("currency") == "INR"]
    orders.sort(key=lambda o: (o.get("status") == "created", o.get("created_at") or 0))
    return orders[0] if orders else None


def order_rebuild(*, ap_tx: dict) -> DepositOrder | None:
    """A deposit AP shows past ``incomplete`` (waiting, funded, expired, completed) with the
    ``amount_in`` of our request_offchain_funds (so our order was stored before) with no
    order in Corridor: the order a failover lost with its last commits (issue 25 §2),
    while Razorpay kept it and the customer may have paid it. Rebuilt from Razorpay's
    order (found by its receipt, the transaction id) and the quote of its paise, which
    must equal the amounts AP holds from our call; stored ``awaiting_payment`` with funds
    requested, so the order reconciler records its payment (a payment to an expired
    deposit is then refunded: anchor/refunds.py ``refund_if_ap_expired``). None when
    there is nothing to rebuild (an order exists, Razorpay has none, the amounts
    disagree: a person's, logged). Raises rzp.RazorpayError."""
    transaction_id = ap_tx["id"]
    requested = _funds_requested(ap_tx) or (
        ap_tx.get("status") in ("expired", "completed")
        and bool((ap_tx.get("amount_in") or {}).get("amount")))
    if not requested or DepositOrder.objects.filter(transaction_id=transaction_id).exists():
        return None
    found = _order_by_receipt(transaction_id)
    if found is None:
        return None
    q = quote(rzp.paise_to_rupees(found["amount"]))
    told = (Decimal((ap_tx.get("amount_in") or {}).get("amount") or "0"),
            Decimal((ap_tx.get("amount_out") or {}).get("amount") or "0"))
    if told != (q.amount_in, q.amount_out):
        log.error("order %s of %s not rebuilt: AP holds %s, Razorpay's paise quote %s",
                  found["id"], transaction_id, told, (q.amount_in, q.amount_out))
        return None
    order, created = DepositOrder.objects.get_or_create(
        transaction_id=transaction_id, defaults={
            "order_id": found["id"], "amount_in": q.amount_in, "amount_in_paise":
            found["amount"], "fee": q.fee, "amount_out": q.amount_out, "rate": q.rate,
            "funds_requested_at": timezone.now()})
    if created:
        if found.get("created_at"):  # Razorpay's (whole seconds): the release found on
            # chain must be "made after the order" (releases.landed_unrecorded)
            DepositOrder.objects.filter(pk=order.pk).update(
                created_at=datetime.fromtimestamp(int(found["created_at"]), tz=UTC))
            order.refresh_from_db()
        log.warning("deposit order %s of %s rebuilt from Razorpay and AP (a lost commit)",
                    found["id"], transaction_id)
    return order if created else None


# AP statuses that say it never took (or no longer honours) request_offchain_funds.
_NOT_REQUESTED = {"incomplete", "expired", "error", "no_market", "too_small", "too_large"}


def _funds_requested(tx: dict) -> bool:
    """AP took request_offchain_funds and the deposit is live: it left ``incomplete``
    for pending_user_transfer_start or later (NOTES §1.6) and carries the ``amount_in``
    the call sets. A status past ``incomplete`` with no amount is a stale or lagging read
    after a call that was never applied (chaos seed 7's withdrawal twin), not proof."""
    return tx.get("status") not in _NOT_REQUESTED and bool(
        (tx.get("amount_in") or {}).get("amount"))


def _request_offchain_funds(order: DepositOrder) -> None:
    """``request_offchain_funds``, once: ``rpc_once`` re-reads AP on -32600 (already
    applied); a -32603 "modified by another request" (AP's optimistic lock, 4.2.0+) is
    re-read too, and counts as done only if AP left ``incomplete``."""
    fiat = settings.AP_FIAT_ASSET
    try:
        platform.rpc_once(
            "request_offchain_funds",
            {
                "transaction_id": order.transaction_id,
                "message": "Pay with Razorpay to continue",
                "amount_in": {"amount": format(order.amount_in, "f"), "asset": fiat},
                "amount_out": {"amount": format(order.amount_out, "f"),
                               "asset": _usdc_asset_id()},
                "fee_details": {"total": format(order.fee, "f"), "asset": fiat},
            },
            reached=_funds_requested,
        )
    except platform.RpcError as exc:
        if exc.code != platform.INTERNAL_ERROR:
            raise
        current = platform.get_transaction(order.transaction_id)
        if current is None or not _funds_requested(current):
            raise


def deposit_resume(transaction_id: str) -> str:
    """The sweeper's resume of a deposit submission whose claim lapsed: the stored
    amount, the same steps (anchor/submissions.py ``sweep_submissions``). Returns
    completed | released | skipped; raises the transient errors (claim released)."""
    with bound_contextvars(transaction_id=transaction_id):
        try:
            claim = submissions.claim(transaction_id=transaction_id, kind="deposit",
                                      amount_in=None)
        except submissions.SubmissionInFlight:
            return "skipped"
        if claim is None:
            return "skipped"
        if not claim.resumed:  # the intent vanished meanwhile: nothing to complete
            submissions.release(claim, error="nothing to resume", forget=True)
            return "skipped"
        try:
            _deposit_drive(claim, claim.submission.amount_in.quantize(PAISA))
        except DepositStateError:
            return "released"
        return "completed"


submissions.register_resumer("deposit", deposit_resume)


def payment_record(*, payment: dict, order: DepositOrder | None = None,
                   from_reconciler: bool = False) -> str:
    """Store a Razorpay payment entity as it was told (by a verified webhook or the
    order reconciler). Only a claim of a ``captured`` payment on one of our orders,
    with the order's exact paise and currency, is stored; one live row per payment id
    and one per deposit. The row is ``unconfirmed``: nothing is released on it until
    ``payment_confirm`` fetched the payment from Razorpay itself (a signed webhook
    proves only that its sender knows the webhook secret).

    Returns the outcome: recorded | duplicate | unknown_order | not_captured |
    amount_mismatch | currency_mismatch | second_payment | awaiting_other_confirmation
    | payment_of_another_order. Enqueues the confirmation, the AP notify and the
    release after commit (``tasks.deposit_funds_received``). May run inside the
    caller's transaction (the webhook's dedupe row); makes no outbound call.
    ``order``: the ``DepositOrder`` of ``payment["order_id"]`` if the caller read it
    already (its amount and currency never change), else it is read here.
    ``from_reconciler``: the order reconciler, which also records a payment Razorpay
    shows ``refunded`` (read from Razorpay itself, never from a webhook): our refund
    of it whose rows a failover lost is rebuilt once ``payment_confirm`` finds it."""
    order_id = payment.get("order_id") or ""
    if order is None or order.order_id != order_id:
        order = next(iter(DepositOrder.objects.filter(order_id=order_id)[:1]), None)
    if order is None:
        return "unknown_order"
    with bound_contextvars(transaction_id=order.transaction_id):
        if payment.get("status") not in ("captured", "refunded") or (
                payment["status"] == "refunded" and not from_reconciler):
            return "not_captured"
        amount = payment.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or \
                amount != order.amount_in_paise:
            log.warning("payment %s amount %r != order %s paise %s", payment.get("id"), amount,
                        order_id, order.amount_in_paise)
            return "amount_mismatch"
        if payment.get("currency") != order.currency:
            return "currency_mismatch"
        created = payment.get("created_at")
        captured_at = datetime.fromtimestamp(created, UTC) if isinstance(created, int) \
            else timezone.now()
        from anchor import tasks

        # One statement, no savepoint: a live row for this payment or this deposit
        # (either partial unique constraint) makes it a conflict, explained below.
        if not insert_unless_conflict(DepositPayment(
                payment_id=payment["id"], order_id=order_id,
                transaction_id=order.transaction_id, amount_paise=amount,
                currency=payment["currency"], method=payment.get("method") or "",
                captured_at=captured_at)):
            return _record_conflict(payment["id"], order)
        inbox.follow_up(tasks.deposit_funds_received, order.transaction_id)
        return "recorded"


def _record_conflict(payment_id: str, order: DepositOrder) -> str:
    """Why a live row already holds this payment id or this deposit."""
    existing = DepositPayment.objects.live().filter(transaction_id=order.transaction_id).first()
    if existing is not None and existing.payment_id == payment_id:
        return "duplicate"
    if existing is not None and existing.confirmation == DepositPayment.Confirmation.CONFIRMED:
        log.error("second captured payment %s for deposit %s (first %s): refund by hand",
                  payment_id, order.transaction_id, existing.payment_id)
        return "second_payment"
    if existing is not None:
        # The first claim may be forged: once Razorpay contradicts it, the row is
        # rejected and the order reconciler records this payment (the order stays
        # awaiting_payment until a payment is confirmed).
        log.warning("payment %s for deposit %s waits: %s is not confirmed yet", payment_id,
                    order.transaction_id, existing.payment_id)
        return "awaiting_other_confirmation"
    log.error("payment %s is already claimed for another deposit; not for %s", payment_id,
              order.transaction_id)
    return "payment_of_another_order"


class PaymentRejected(Exception):
    """Razorpay's own record contradicts the payment Corridor was told about (no such
    payment, not captured, another order, amount or currency), or there is no payment:
    nothing is released on it. The row is ``rejected`` with the reason."""


class PaymentRefunded(PaymentRejected):
    """Razorpay shows the payment captured, then refunded by Corridor's own refund (one
    under our ``receipt``, :func:`refund_receipt`) whose row a failover lost: the payment
    is confirmed (its capture booked) but never releasable; the caller rebuilds the
    refund row from Razorpay (anchor/refunds.py ``refund_rebuild``). Issue 25, 20-seed
    loaded chaos at 5b283ee seeds 3 and 15: such a payment was ``rejected`` and its
    refund never booked."""


class PaymentUnconfirmed(Exception):
    """Razorpay could not be asked (5xx, timeout, auth, rate limit): the payment stays
    ``unconfirmed`` and nothing is released until a later attempt confirms it."""


def payment_mismatch(*, fetched: dict, order: DepositOrder, payment_id: str) -> str | None:
    """Compare the payment entity Razorpay returned (``GET /v1/payments/{id}``) with
    our order: the same id, ``status`` ``captured``, nothing refunded, ``order_id`` =
    our order's, ``amount`` = the order's integer paise, ``currency`` = the order's
    (razorpay/NOTES.md §1.7 step 4). Returns None when it matches, else every reason,
    joined with "; "."""
    reasons = []
    if fetched.get("id") != payment_id:
        reasons.append(f"Razorpay answered for payment {fetched.get('id')!r}")
    if fetched.get("status") != "captured":
        reasons.append(f"status is {fetched.get('status')!r}, not 'captured'")
    refunded = fetched.get("amount_refunded") or 0
    if refunded != 0:
        reasons.append(f"{refunded!r} paise refunded")
    if fetched.get("order_id") != order.order_id:
        reasons.append(f"order_id is {fetched.get('order_id')!r}, not {order.order_id!r}")
    amount = fetched.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount != order.amount_in_paise:
        reasons.append(f"amount is {amount!r} paise, not {order.amount_in_paise}")
    if fetched.get("currency") != order.currency:
        reasons.append(f"currency is {fetched.get('currency')!r}, not {order.currency!r}")
    return "; ".join(reasons) or None


def payment_confirm(*, transaction_id: str) -> DepositPayment:
    """Make deposit ``transaction_id``'s recorded payment releasable, or refuse it:
    fetch the payment from Razorpay (``GET /v1/payments/{id}``, no database
    transaction or lock held across the call) and compare it with our order
    (``payment_mismatch``). A match sets ``confirmed`` + ``confirmed_at`` and the
    order ``paid`` (one commit); a contradiction sets ``rejected`` with the reason
    (logged; the order stays ``awaiting_payment`` so a real payment can still be
    recorded). Every path to a release claim passes here (``notify_funds_received``,
    ``releases.release_start``); a confirmed payment returns at once without a call.

    Returns the confirmed DepositPayment. Raises PaymentRejected (never releasable on
    this payment) or PaymentUnconfirmed (Razorpay unreachable: delay, never skip)."""
    with bound_contextvars(transaction_id=transaction_id):
        payment = DepositPayment.objects.live().filter(transaction_id=transaction_id).first()
        if payment is None:
            raise PaymentRejected(f"{transaction_id}: no captured payment recorded by Corridor")
        if payment.confirmation == DepositPayment.Confirmation.CONFIRMED:
            return payment
        order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
        if order is None or order.order_id != payment.order_id:
            _reject(payment, "the payment is not on this deposit's order")
        try:
            fetched = rzp.fetch_payment(payment.payment_id)
        except rzp.PaymentNotFound as exc:
            _reject(payment, f"Razorpay has no payment {payment.payment_id}: {exc}")
        except rzp.RazorpayError as exc:
            DepositPayment.objects.filter(
                pk=payment.pk, confirmation=DepositPayment.Confirmation.UNCONFIRMED
            ).update(confirmation_error=f"not confirmed yet: {exc}"[:2000])
            log.warning("payment %s not confirmed yet: %s", payment.payment_id, exc)
            raise PaymentUnconfirmed(f"{payment.payment_id}: {exc}") from exc
        reason = payment_mismatch(fetched=fetched, order=order, payment_id=payment.payment_id)
        refunded_by_us = bool(reason) and _refunded_by_us(fetched, order, payment)
        if reason and not refunded_by_us:
            _reject(payment, f"Razorpay disagrees: {reason}")
        created = fetched.get("created_at")
        with transaction.atomic():
            moved = DepositPayment.objects.filter(
                pk=payment.pk, confirmation=DepositPayment.Confirmation.UNCONFIRMED
            ).update(confirmation=DepositPayment.Confirmation.CONFIRMED,
                     confirmed_at=timezone.now(), confirmation_error="",
                     method=str(fetched.get("method") or payment.method)[:20],
                     **({"captured_at": datetime.fromtimestamp(created, UTC)}
                        if isinstance(created, int) and not isinstance(created, bool) else {}))
            DepositOrder.objects.filter(pk=order.pk).update(status=DepositOrder.Status.PAID)
            if moved:  # the books: rule 1 (ledger/chart.py), with the confirmation
                chart.deposit_captured(payment_id=payment.payment_id,
                                       transaction_id=transaction_id,
                                       amount_in=order.amount_in)
        payment.refresh_from_db()
        if payment.confirmation != DepositPayment.Confirmation.CONFIRMED:
            raise PaymentRejected(f"{payment.payment_id}: {payment.confirmation_error}")
        if refunded_by_us:
            log.warning("payment %s confirmed with Razorpay, and refunded by Corridor: %s",
                        payment.payment_id, reason)
            raise PaymentRefunded(f"{payment.payment_id}: refunded by Corridor ({reason})")
        log.info("payment %s confirmed with Razorpay", payment.payment_id)
        return payment


def refund_receipt(transaction_id: str) -> str:
    """The ``receipt`` of a deposit's INR refund (anchor/refunds.py): its AP id, cut to
    Razorpay's 40 characters."""
    return transaction_id[:40]


def _refunded_by_us(fetched: dict, order: DepositOrder, payment: DepositPayment) -> bool:
    """Razorpay's payment matches our order but for its refund, and a refund of it under
    our receipt exists (``GET /v1/payments/{id}/refunds``): captured, then refunded by
    Corridor. Raises PaymentUnconfirmed when the refunds cannot be read."""
    as_captured = dict(fetched, status="captured", amount_refunded=0)
    if fetched.get("status") not in ("captured", "refunded") or payment_mismatch(
            fetched=as_captured, order=order, payment_id=payment.payment_id):
        return False
    try:
        made = rzp.payment_refunds(payment.payment_id)
    except rzp.RazorpayError as exc:
        raise PaymentUnconfirmed(f"{payment.payment_id}: refunds: {exc}") from exc
    return any(i.get("receipt") == refund_receipt(payment.transaction_id) for i in made)


def _reject(payment: DepositPayment, reason: str):
    """Mark an unconfirmed payment ``rejected`` and raise PaymentRejected."""
    DepositPayment.objects.filter(
        pk=payment.pk, confirmation=DepositPayment.Confirmation.UNCONFIRMED
    ).update(confirmation=DepositPayment.Confirmation.REJECTED,
             confirmation_error=reason[:2000])
    log.error("payment %s for deposit %s rejected, nothing released: %s", payment.payment_id,
              payment.transaction_id, reason)
    raise PaymentRejected(f"{payment.payment_id}: {reason}")


def funds_received(*, transaction_id: str) -> None:
    """Confirm our recorded payment with Razorpay, ``notify_offchain_funds_received``,
    then the release. Raises PaymentRejected, PaymentUnconfirmed, the release's and
    AP's errors (``tasks.deposit_funds_received`` retries the transient ones)."""
    with bound_contextvars(transaction_id=transaction_id):
        notify_funds_received(transaction_id=transaction_id)
        from anchor import releases

        releases.release_start(transaction_id=transaction_id)


def notify_funds_received(*, transaction_id: str) -> None:
    """``notify_offchain_funds_received`` (external id = the Razorpay payment id), once,
    and only for a payment ``payment_confirm`` confirmed: AP
    pending_user_transfer_start -> pending_anchor (NOTES §1.6). Raises PaymentRejected,
    PaymentUnconfirmed, platform errors."""
    with bound_contextvars(transaction_id=transaction_id):
        payment = payment_confirm(transaction_id=transaction_id)
        if payment.ap_notified_at is None:
            order = DepositOrder.objects.get(transaction_id=transaction_id)
            platform.rpc_once(
                "notify_offchain_funds_received",
                {
                    "transaction_id": transaction_id,
                    "external_transaction_id": payment.payment_id,
                    "funds_received_at": payment.captured_at.isoformat().replace("+00:00", "Z"),
                    "amount_in": {"amount": format(order.amount_in, "f")},
                    "amount_out": {"amount": format(order.amount_out, "f")},
                    "fee_details": {"total": format(order.fee, "f"),
                                    "asset": settings.AP_FIAT_ASSET},
                },
                reached=lambda tx: tx.get("external_transaction_id") == payment.payment_id
                and tx["status"] not in ("pending_user_transfer_start", "incomplete"),
            )
            DepositPayment.objects.filter(pk=payment.pk).update(ap_notified_at=timezone.now())
