"""Settlements of the Razorpay (pay-ins) stand-in: captured payments settle to our bank
account after a cycle, and the read APIs a reconciler compares its books with
(TREASURY §3): ``GET /v1/settlements``, ``GET /v1/settlements/{id}`` (docs
``api/settlements/entity``, ``fetch-all``, ``fetch-with-id``) and ``GET
/v1/settlements/recon/combined`` (docs ``api/settlements/fetch-recon``; rows shaped as
``api_settlement_recon_combined.json``).

Amounts are integer paise. A payment row's ``fee`` and ``tax`` are the payment entity's
(``payins.fee_and_tax``: 2 % + 18 % GST on it, ``fee`` includes ``tax``) and its ``credit``
is ``amount - fee``, as in the sample (100000 - 2900 = 97100). A refunded payment settles
like any other (Razorpay settles the capture; the refund is a row of its own). A refund,
once ``processed`` (refunds.py), is deducted from the next settlement: a row of type
``refund``, ``entity_id`` the ``rfnd_...``, ``debit`` = ``amount``, ``credit``, ``fee`` and
``tax`` 0, ``payment_id`` the refunded payment (the sample's refund row), due at the first
day boundary after its processing (:func:`queue_refund`). The settlement's ``amount`` is
the sum of its rows' ``credit - debit``; its ``fees``/``tax`` are 0 (a normal settlement).
Simplification: a boundary whose rows net below zero (a refund larger than what it
settles) still makes its settlement, with a negative ``amount`` (our bank debited), so
every row settles at its boundary; Razorpay would rather settle nothing and carry the
deficit to a later settlement (TREASURY §3.1). Either way the settlement's ``amount``
equals its rows' net, which is all a reconciliation relies on.

Cycle: the sandbox's "day" is ``SANDBOX_SETTLEMENT_CYCLE_S`` seconds (default 10), days
counted from the Unix epoch. A payment captured during day k settles at the start of day
k + 2 (Razorpay's default T+2, docs ``payments/settlements``; no holidays), together with
every other payment captured that day: one settlement per day boundary, ``processed`` at
once with a UTR (16 characters like the docs' ``1568176960vxp0rj``). The background loop
(``advance_due``) makes them. Recon rows are grouped by settlement date, Asia/Kolkata
calendar day of ``settled_at`` (TREASURY §3.2), and only settled rows are listed.

Fault switches, taken once per captured payment and applied to that payment only
(``POST /sandbox/faults``):

- ``razorpay.settlement_omit_payment`` ``{"listed": false}``: the payment is left out of
  its settlement. Unlisted (default): it never settles, so no settlement and no recon row
  carry it although it stays ``captured``. ``listed: true``: the recon lists it under the
  settlement (``settled: true``, its ``settlement_id``), but the settlement's ``amount``
  leaves its credit out: the money sent falls short of the rows;
- ``razorpay.settlement_fee_mismatch`` ``{"fee_extra": 100, "tax_extra": 0}``: the recon row
  charges ``fee + fee_extra`` (``tax + tax_extra``) while the payment entity keeps its own
  fee; ``credit`` and the settlement's ``amount`` follow the row's fee;
- ``razorpay.settlement_delay`` ``{"cycles": 1}``: the payment settles ``cycles`` days
  later than its capture day's settlement.

Not modelled: transfers and adjustments rows, on-hold payments, instant settlements,
partial settlements and carried deficits (above), failed settlements and the
``settlement.processed`` webhook.
"""

from __future__ import annotations

import math
import secrets
import string
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from sandbox.control import faults
from sandbox.razorpay.common import RazorpayError, new_id
from sandbox.razorpay.models import Order, Payment, Refund, Settlement, SettlementItem

DB = "sandbox"
IST = ZoneInfo("Asia/Kolkata")
DEFAULT_CYCLE_S = 10.0
TIMESTAMP_RANGE = (946684800, 4765046400)  # docs api/settlements/fetch-all errors
MAX_LIST_COUNT = 100
MAX_RECON_COUNT = 1000
DEFAULT_COUNT = 10  # docs: settlements default 10; recon default undocumented (inference)
CARD = {"card_network": "Visa", "card_issuer": "HDFC", "card_type": "debit"}  # sandbox card
NO_CARD = {"card_network": None, "card_issuer": None, "card_type": None}


def cycle_s() -> float:
    """Length of the sandbox's settlement "day" in seconds (``SANDBOX_SETTLEMENT_CYCLE_S``)."""
    return float(getattr(settings, "SANDBOX_SETTLEMENT_CYCLE_S", DEFAULT_CYCLE_S))


def _due(captured_ts: datetime, extra_cycles: int) -> datetime:
    """Start of day k + 2 + ``extra_cycles`` for a capture during day k."""
    cycle = cycle_s()
    day = math.floor(captured_ts.timestamp() / cycle)
    return datetime.fromtimestamp((day + 2 + extra_cycles) * cycle, tz=UTC)


def queue_payment(payment: Payment, *, captured_ts: datetime) -> None:
    """Record the just captured ``payment`` (saved, status ``captured``) as settleable,
    with this payment's settlement faults. Inside the capture's transaction."""
    omit = faults.take("razorpay.settlement_omit_payment")
    mismatch = faults.take("razorpay.settlement_fee_mismatch") or {}
    delay = faults.take("razorpay.settlement_delay")
    fee = payment.fee + int(mismatch.get("fee_extra", 0))
    tax = payment.tax + int(mismatch.get("tax_extra", 0))
    unlisted = omit is not None and not omit.get("listed", False)
    SettlementItem.objects.using(DB).create(
        entity_id=payment.id, type="payment", payment=payment, amount=payment.amount,
        credit=payment.amount - fee, fee=fee, tax=tax, currency=payment.currency,
        unpaid=omit is not None and not unlisted, captured_ts=captured_ts,
        settle_due_ts=None if unlisted else _due(
            captured_ts, int(delay.get("cycles", 1)) if delay is not None else 0),
        created_at=payment.created_at,
    )


def queue_refund(refund: Refund, *, processed_ts: datetime) -> None:
    """Record the just processed ``refund`` as a deduction from the next settlement: due at
    the first day boundary after ``processed_ts``. Inside the refund's transaction."""
    cycle = cycle_s()
    due = datetime.fromtimestamp((math.floor(processed_ts.timestamp() / cycle) + 1) * cycle,
                                 tz=UTC)
    SettlementItem.objects.using(DB).get_or_create(entity_id=refund.id, defaults=dict(
        type="refund", payment_id=refund.payment_id, amount=refund.amount, credit=0,
        debit=refund.amount, fee=0, tax=0, currency=refund.currency,
        captured_ts=processed_ts, settle_due_ts=due, created_at=refund.created_at))


def _utr(created_at: int) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{created_at}" + "".join(secrets.choice(alphabet) for _ in range(6))


def advance_due() -> int:
    """Settle every item whose day boundary has come (background loop): one settlement per
    boundary, its items locked (``SKIP LOCKED``) and stamped in the same transaction.
    Returns how many settlements were made."""
    made = 0
    while True:
        now = timezone.now()
        with transaction.atomic(using=DB):
            first = (SettlementItem.objects.using(DB).select_for_update(skip_locked=True)
                     .filter(settlement__isnull=True, settle_due_ts__lte=now)
                     .order_by("settle_due_ts").first())
            if first is None:
                return made
            items = list(SettlementItem.objects.using(DB).select_for_update(skip_locked=True)
                         .filter(settlement__isnull=True, settle_due_ts=first.settle_due_ts))
            amount = sum(i.credit - i.debit for i in items if not i.unpaid)
            created_at = int(now.timestamp())
            settlement = Settlement.objects.using(DB).create(
                id=new_id("setl_"), amount=amount,
                utr=_utr(created_at), created_at=created_at, created_ts=now,
            )
            SettlementItem.objects.using(DB).filter(
                pk__in=[i.pk for i in items]).update(settlement=settlement, settled_at=created_at)
            made += 1


# --- reading --------------------------------------------------------------------------


def settlement_entity(settlement: Settlement) -> dict:
    """The settlement entity (docs ``api/settlements/entity``, keys in its order)."""
    return {
        "id": settlement.id,
        "entity": "settlement",
        "amount": settlement.amount,
        "status": settlement.status,
        "fees": settlement.fees,
        "tax": settlement.tax,
        "utr": settlement.utr,
        "created_at": settlement.created_at,
    }


def _count(params, default: int, maximum: int) -> int:
    raw = params.get("count")
    if raw is None:
        return default
    if not raw.isdigit():
        raise RazorpayError("The count must be an integer.", field="count")
    if int(raw) < 1:
        raise RazorpayError("The count must be at least 1.", field="count")
    if int(raw) > maximum:
        raise RazorpayError(f"The count may not be greater than {maximum}.", field="count")
    return int(raw)


def _skip(params) -> int:
    raw = params.get("skip")
    if raw is None:
        return 0
    if not raw.isdigit():
        raise RazorpayError("The skip must be an integer.", field="skip")
    return int(raw)


def list_settlements(*, params) -> dict:
    """``GET /v1/settlements?from=&to=&count=&skip=`` (docs ``api/settlements/fetch-all``):
    newest first; ``from``/``to`` bound ``created_at`` (Unix seconds, inclusive), each
    between 946684800 and 4765046400; ``count`` 1-100 (default 10)."""
    count = _count(params, DEFAULT_COUNT, MAX_LIST_COUNT)
    skip = _skip(params)
    rows = Settlement.objects.using(DB).order_by("-created_at", "-created_ts", "-id")
    for name, lookup in (("from", "created_at__gte"), ("to", "created_at__lte")):
        raw = params.get(name)
        if raw is None:
            continue
        low, high = TIMESTAMP_RANGE
        if not raw.isdigit() or not low <= int(raw) <= high:
            raise RazorpayError(f"{name} must be between {low} and {high}", field=name)
        rows = rows.filter(**{lookup: int(raw)})
    items = [settlement_entity(s) for s in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def get_settlement(settlement_id: str) -> dict:
    settlement = Settlement.objects.using(DB).filter(pk=settlement_id).first()
    if settlement is None:
        raise RazorpayError("The id provided does not exist")
    return settlement_entity(settlement)


def _recon_window(params) -> tuple[int, int]:
    """``[start, end)`` in Unix seconds of the Asia/Kolkata day (or month without ``day``)
    named by ``year``/``month``/``day``; error texts from docs ``api/settlements/fetch-recon``
    where it has them."""
    year, month, day = params.get("year"), params.get("month"), params.get("day")
    if year is None:
        raise RazorpayError("The year field is required.", field="year")
    if not (year.isdigit() and len(year) == 4):
        raise RazorpayError("The year must be 4 digits.", field="year")
    if month is None:
        raise RazorpayError("The month field is required.", field="month")
    if not (month.isdigit() and len(month) <= 2 and 1 <= int(month) <= 12):
        raise RazorpayError("The month is not a valid month.", field="month")
    if day is not None and not (day.isdigit() and 1 <= len(day) <= 2 and 1 <= int(day) <= 31):
        raise RazorpayError("The day must be between 1 and 2 digits.", field="day")
    try:
        start = date(int(year), int(month), int(day) if day is not None else 1)
    except ValueError:
        raise RazorpayError("The day is not a valid day.", field="day")
    if day is not None:
        end = start + timedelta(days=1)
    else:
        end = date(start.year + start.month // 12, start.month % 12 + 1, 1)

    def epoch(d: date) -> int:
        return int(datetime(d.year, d.month, d.day, tzinfo=IST).timestamp())

    return epoch(start), epoch(end)


def recon_item(item: SettlementItem, payment: Payment, order: Order,
               settlement: Settlement) -> dict:
    """One recon row (keys and order of ``api_settlement_recon_combined.json``'s payment
    and refund rows). ``notes`` carries the payment's (a refund's: the refund's) notes as
    the docs type them (an object; the sample shows a string); ``order_receipt`` is the
    receipt set on the order, the join key to our deposit (NOTES §1.7). A refund row names
    its refunded payment in ``payment_id`` and that payment's order."""
    refund = item.type == "refund"
    notes = (Refund.objects.using(DB).filter(pk=item.entity_id).values_list(
        "notes", flat=True).first() if refund else payment.notes)
    return {
        "entity_id": item.entity_id,
        "type": item.type,
        "debit": item.debit,
        "credit": item.credit,
        "amount": item.amount,
        "currency": item.currency,
        "fee": item.fee,
        "tax": item.tax,
        "on_hold": False,
        "settled": True,
        "created_at": item.created_at,
        "settled_at": item.settled_at,
        "settlement_id": settlement.id,
        "posted_at": None,
        "credit_type": "default",
        "description": None if refund else payment.description,
        "notes": notes,
        "payment_id": payment.id if refund else None,
        "settlement_utr": settlement.utr,
        "order_id": order.id,
        "order_receipt": order.receipt,
        "method": payment.method,
        **(CARD if payment.method == "card" else NO_CARD),
        "dispute_id": None,
    }


def recon(*, params) -> dict:
    """``GET /v1/settlements/recon/combined?year=&month=[&day=][&count=1..1000][&skip=]``:
    the rows settled in that Asia/Kolkata day or month, oldest settlement first (then by
    creation and id, a stable order for paging with ``skip``). Raises ``RazorpayError``."""
    start, end = _recon_window(params)
    count = _count(params, DEFAULT_COUNT, MAX_RECON_COUNT)
    skip = _skip(params)
    rows = (SettlementItem.objects.using(DB)
            .select_related("settlement", "payment", "payment__order")
            .filter(settlement__isnull=False, settled_at__gte=start, settled_at__lt=end)
            .order_by("settled_at", "settlement_id", "created_at", "entity_id"))
    items = [recon_item(i, i.payment, i.payment.order, i.settlement)
             for i in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def reset() -> None:
    """Empty the settlement items and settlements (before the payments they point at)."""
    with transaction.atomic(using=DB):
        SettlementItem.objects.using(DB).all().delete()
        Settlement.objects.using(DB).all().delete()
