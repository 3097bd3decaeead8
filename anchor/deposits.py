"""Deposit services: the quote, the interactive submission, and recording a captured
INR payment (the only thing that makes a deposit releasable, DESIGN.md §4)."""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import platform
from anchor import razorpay as rzp
from anchor.models import DepositOrder, DepositPayment

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
    """The interactive form's one transition: create the Razorpay order (receipt = AP
    id), store it, then ``request_offchain_funds`` (AP: incomplete ->
    pending_user_transfer_start, NOTES §4.3). A repeat (reload, replayed token, double
    click) returns the stored order and makes no second request.
    Raises DepositStateError, rzp.RazorpayError, platform errors."""
    with bound_contextvars(transaction_id=transaction_id):
        with transaction.atomic():
            _xact_lock(f"deposit_submit:{transaction_id}")
            order = DepositOrder.objects.filter(transaction_id=transaction_id).first()
            if order is None:
                ap_tx = platform.get_transaction(transaction_id)
                if ap_tx is None or ap_tx.get("kind") != "deposit":
                    raise DepositStateError("This deposit does not exist.")
                if ap_tx["status"] != "incomplete":
                    raise DepositStateError(f"This deposit is already {ap_tx['status']}.")
                q = quote(amount_in)
                paise = rzp.rupees_to_paise(q.amount_in)
                created = rzp.create_order(amount_paise=paise, currency="INR",
                                           receipt=transaction_id,
                                           notes={"transaction_id": transaction_id})
                order = DepositOrder.objects.create(
                    transaction_id=transaction_id, order_id=created["id"], amount_in=q.amount_in,
                    amount_in_paise=paise, fee=q.fee, amount_out=q.amount_out, rate=q.rate)
        if order.funds_requested_at is None:
            _request_offchain_funds(order)
            DepositOrder.objects.filter(pk=order.pk).update(funds_requested_at=timezone.now())
            order.refresh_from_db()
        return order


def _request_offchain_funds(order: DepositOrder) -> None:
    fiat = settings.AP_FIAT_ASSET
    platform.rpc_once(
        "request_offchain_funds",
        {
            "transaction_id": order.transaction_id,
            "message": "Pay with Razorpay to continue",
            "amount_in": {"amount": format(order.amount_in, "f"), "asset": fiat},
            "amount_out": {"amount": format(order.amount_out, "f"), "asset": _usdc_asset_id()},
            "fee_details": {"total": format(order.fee, "f"), "asset": fiat},
        },
        reached=lambda tx: tx["status"] != "incomplete",
    )


def _xact_lock(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [zlib.crc32(name.encode())])


def payment_record(*, payment: dict) -> str:
    """Record a Razorpay payment entity (from a verified webhook or the order
    reconciler). Only a ``captured`` payment on one of our orders, with the order's
    exact paise and currency, is recorded; one per payment id and one per deposit.
    Returns the outcome: recorded | duplicate | unknown_order | not_captured |
    amount_mismatch | currency_mismatch | second_payment. Enqueues the AP notify and
    the release after commit."""
    order_id = payment.get("order_id") or ""
    order = DepositOrder.objects.filter(order_id=order_id).first()
    if order is None:
        return "unknown_order"
    with bound_contextvars(transaction_id=order.transaction_id):
        if payment.get("status") != "captured":
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

        try:
            with transaction.atomic():
                DepositPayment.objects.create(
                    payment_id=payment["id"], order_id=order_id,
                    transaction_id=order.transaction_id, amount_paise=amount,
                    currency=payment["currency"], method=payment.get("method") or "",
                    captured_at=captured_at)
                DepositOrder.objects.filter(pk=order.pk).update(status=DepositOrder.Status.PAID)
                transaction.on_commit(
                    lambda: tasks.deposit_funds_received.delay(order.transaction_id))
        except IntegrityError:
            existing = DepositPayment.objects.filter(transaction_id=order.transaction_id).first()
            if existing is not None and existing.payment_id != payment["id"]:
                log.error("second captured payment %s for deposit %s (first %s): refund by hand",
                          payment["id"], order.transaction_id, existing.payment_id)
                return "second_payment"
            return "duplicate"
        return "recorded"


def funds_received(*, transaction_id: str) -> None:
    """``notify_offchain_funds_received`` for our recorded payment, then the release."""
    with bound_contextvars(transaction_id=transaction_id):
        notify_funds_received(transaction_id=transaction_id)
        from anchor import releases

        releases.release_start(transaction_id=transaction_id)


def notify_funds_received(*, transaction_id: str) -> None:
    """``notify_offchain_funds_received`` (external id = the Razorpay payment id), once:
    AP pending_user_transfer_start -> pending_anchor (NOTES §1.6)."""
    with bound_contextvars(transaction_id=transaction_id):
        payment = DepositPayment.objects.get(transaction_id=transaction_id)
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
