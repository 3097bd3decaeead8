"""Per-customer KYC above a threshold and daily / monthly limits for the SEP-24 pages
(and, through ``reserve``, any flow that moves a customer's money).

A SEP-24 user is the SEP-10 subject of the interactive token (``sub``: ``G...`` or
``G...:memo``, anchor-platform NOTES.md §4.2), kept as a ``sep24-customer``
(anchor/customers.py). Above KYC_SEP24_THRESHOLD_INR (the INR value of the deposit or
withdrawal) the pages ask for ``SEP24_KYC_FIELDS``, stored through the same SEP-12 rules
(PAN format, dates...); a customer an operator rejected, or still being checked, cannot
go above the threshold.

Limits: LIMIT_DAILY_INR and LIMIT_MONTHLY_INR per customer, over the calendar day and
month in LIMITS_TIME_ZONE (India: Asia/Kolkata); what counts is every transaction's INR
value reserved here (``customer_volumes``), not released, summed per identity (a keyed
hash of the wallet account and memo, or of a receiver's bank account: every customer row
and memo of one person counts together, anchor/customers.py ``identities``). ``reserve``
takes an advisory lock on the identity, sums the window and inserts (or updates) the
transaction's row in one transaction, so concurrent submissions are counted one after
the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from anchor import customers
from anchor.models import Customer, CustomerVolume
from common import locks

SEP24_KYC_FIELDS = ("first_name", "last_name", "tax_id", "birth_date")


class LimitReached(Exception):
    """The customer's daily or monthly limit would be passed; the message is for them."""


class KycRequired(Exception):
    """The amount needs KYC the customer cannot give here now (rejected, or waiting
    for a person); the message is for them."""


@dataclass(frozen=True)
class Gate:
    """What the page must do before it can take ``amount_inr``: ``kyc_fields`` to ask
    for (empty: none)."""

    kyc_fields: tuple[str, ...] = ()


def split_sub(sub: str) -> tuple[str, str]:
    """(account, memo) of a SEP-10 subject; an id memo in its one spelling ("012" is
    12)."""
    account, _, memo = (sub or "").partition(":")
    if memo.isascii() and memo.isdigit():
        memo = str(int(memo))
    return account, memo


def sep24_customer(sub: str) -> Customer:
    """The ``sep24-customer`` of a SEP-10 subject, made on first use (rejected from the
    start if this wallet account was rejected before, even under a deleted row)."""
    account, memo = split_sub(sub)
    customer, created = Customer.objects.get_or_create(
        account=account, memo=memo, memo_type="id" if memo else "", type=customers.SEP24,
        deleted_at__isnull=True, defaults={"review": Customer.Review.AUTO})
    if created or not customer.identities:
        customer.identities = customers.identities(customer)
        customer.save(update_fields=["identities"])
        customers.apply_denials(customer)
    return customer


def wallet_identity(sub: str) -> str:
    return customers.wallet_identity(*split_sub(sub))


def _kyc_done(customer: Customer) -> bool:
    return set(SEP24_KYC_FIELDS) <= set(customer.provided)


def gate(sub: str, amount_inr: Decimal) -> Gate:
    """Whether ``amount_inr`` needs KYC fields first. Raises KycRequired."""
    if amount_inr <= settings.KYC_SEP24_THRESHOLD_INR:
        return Gate()
    customer = sep24_customer(sub)
    status = customers.answer(customer).status
    if status == customers.REJECTED:
        raise KycRequired(f"This account cannot move more than "
                          f"₹{settings.KYC_SEP24_THRESHOLD_INR} at a time.")
    if not _kyc_done(customer):
        return Gate(kyc_fields=SEP24_KYC_FIELDS)
    if status == customers.PROCESSING:
        raise KycRequired("We are checking your details; amounts above "
                          f"₹{settings.KYC_SEP24_THRESHOLD_INR} are possible once that "
                          "is done.")
    return Gate()


def give_kyc(sub: str, fields: dict[str, str]) -> Customer:
    """Store the KYC fields the page collected (SEP-12 rules). Raises
    customers.CustomerInputError with the field named."""
    customer = sep24_customer(sub)
    return customers.put({"id": customer.id, "tax_id_name": "PAN",
                          **{k: fields.get(k, "") for k in SEP24_KYC_FIELDS}})


def _windows(now: datetime) -> tuple[datetime, datetime]:
    local = now.astimezone(ZoneInfo(settings.LIMITS_TIME_ZONE))
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)


def used(identity: str, *, since: datetime, but: str = "") -> Decimal:
    """INR reserved for ``identity`` since ``since`` (all its customer rows and memos)."""
    rows = CustomerVolume.objects.filter(identity=identity, created_at__gte=since,
                                         released_at__isnull=True).exclude(transaction_id=but)
    return rows.aggregate(total=Sum("amount_inr"))["total"] or Decimal(0)


def headroom(sub: str) -> tuple[Decimal, Decimal]:
    """INR left today and this month for ``sub``."""
    identity = wallet_identity(sub)
    day, month = _windows(timezone.now())
    return (settings.LIMIT_DAILY_INR - used(identity, since=day),
            settings.LIMIT_MONTHLY_INR - used(identity, since=month))


def reserve(*, transaction_id: str, kind: str, amount_inr: Decimal, sub: str = "",
            customer: Customer | None = None, identity: str = "") -> None:
    """Count ``amount_inr`` for ``transaction_id`` against the limits of ``identity``
    (default: ``sub``'s wallet identity); ``customer`` (default ``sub``'s SEP-24
    customer) is the row it is recorded on. Again for one transaction: its row is
    updated, not added. Raises LimitReached (nothing written)."""
    customer = customer or sep24_customer(sub)
    identity = identity or wallet_identity(sub)
    with transaction.atomic():
        # One person's reservations one at a time (two tabs, two sending anchors).
        locks.xact_lock(f"limits:{identity}")
        day, month = _windows(timezone.now())
        for label, since, limit in (("today", day, settings.LIMIT_DAILY_INR),
                                    ("this month", month, settings.LIMIT_MONTHLY_INR)):
            left = limit - used(identity, since=since, but=transaction_id)
            if amount_inr > left:
                raise LimitReached(f"This is over your limit: ₹{max(left, Decimal(0)):.2f} "
                                   f"is left {label} (₹{limit} in all).")
        CustomerVolume.objects.update_or_create(
            transaction_id=transaction_id,
            defaults={"customer": customer, "identity": identity, "kind": kind,
                      "amount_inr": amount_inr, "released_at": None})



def release(transaction_id: str) -> None:
    """The transaction ended without moving money: it no longer counts."""
    CustomerVolume.objects.filter(transaction_id=transaction_id,
                                  released_at__isnull=True).update(released_at=timezone.now())


def payee_refusal(*, transaction_id: str, receiver_id: str = "") -> str:
    """Why the customer ``transaction_id`` pays may not be paid now ("" when it may):
    the KYC status that allowed the transaction, read again at the moment of paying
    (issue 25 §4; an operator's rejection page promises "no payout to it will be
    made", customers.review_preview), never only when it was accepted:

    - a SEP-31 receive (``receiver_id``, the receiver's customer id): the receiver
      still exists and is ``ACCEPTED`` (payouts/receive.py step 1);
    - a SEP-24 transaction above KYC_SEP24_THRESHOLD_INR: the customer its limits were
      reserved on (``customer_volumes``) is not ``REJECTED`` (:func:`gate`).

    Reads only; the message names the customer and its status, for the review queue."""
    if receiver_id:
        receiver = Customer.objects.filter(pk=receiver_id).first()
        if receiver is None or receiver.deleted_at is not None:
            return f"the receiver {receiver_id} was deleted after the transaction was accepted"
        view = customers.answer(receiver)
        if view.status != customers.ACCEPTED:
            return (f"the receiver {receiver_id} is {view.status} since the transaction "
                    f"was accepted ({view.message or 'no message'})")
        return ""
    volume = CustomerVolume.objects.select_related("customer").filter(
        transaction_id=transaction_id).first()
    if volume is None or volume.amount_inr <= settings.KYC_SEP24_THRESHOLD_INR:
        return ""
    view = customers.answer(volume.customer)
    if view.status == customers.REJECTED:
        return (f"the customer {volume.customer_id} was rejected after the transaction "
                f"was accepted ({view.message}), and ₹{volume.amount_inr} is above "
                f"the KYC threshold")
    return ""
