"""The receiving anchor's status machine and its refunds (SEP-31 "Detailed Receiving
Anchor Flow", the ``status`` list of "GET Transaction", "Refunds Object Schema").

A worker loop (``run``) takes every transaction whose ``due_at`` has passed and moves
it one step, each step in its own database transaction under a row lock:

- ``pending_sender`` + its payment (linked by ``sandbox.anchor31.observer``): the payment
  must be the transaction's asset (USDC of the sandbox issuer) and exactly ``amount_in``,
  else ``error`` with a message saying what arrived (the money stays with the anchor, as
  a real one would hold it for an operator). Good -> ``pending_stellar`` ("payment
  seen"), and the transaction draws its fate from the fault switches;
- ``pending_stellar`` -> ``pending_receiver`` (paying out) after the settle delay;
- ``pending_receiver`` -> ``completed`` after the settle delay, with a bank reference as
  ``external_transaction_id`` and ``completed_at``;
- ``pending_sender`` with no payment after ``SANDBOX_ANCHOR31_EXPIRY_S`` (one day) ->
  ``expired`` (SEP-31 ``expired``: "funds were never received"); a payment arriving
  later is a ``duplicate`` that the anchor keeps.

Settle delay: ``SANDBOX_ANCHOR31_STEP_S`` (0.5 s) or fault ``anchor31.step_delay``
``{"seconds"}``. The first step after creation or after the payment is immediate.

Fault switches (``POST /sandbox/faults``; ``times`` counts transactions, as each is drawn
once per transaction):

- ``anchor31.reject_before_funding``: drawn at creation; the transaction goes to
  ``error`` right away, before any payment. A payment that still arrives for it is
  refunded -> ``refunded`` (SEP-31: a refund sets ``refunded`` and fills ``refunds``).
- ``anchor31.refund_after_funding``: drawn when a good payment arrives; from
  ``pending_stellar`` the anchor rejects the transaction and pays the full amount back
  -> ``refunded``.
- ``anchor31.fail_payout``: drawn when a good payment arrives; ``pending_receiver`` ->
  ``error`` "payout failed at the receiving bank", and no refund, ever: money the anchor
  was funded for stays with it (DESIGN §6, ``ManualReviewError``).
- ``anchor31.fail_payout_then_refund``: drawn when a good payment arrives; as
  ``fail_payout``, then the anchor changes its mind and refunds the full amount
  ``SANDBOX_ANCHOR31_LATE_REFUND_S`` (10 s) after the ``error`` -> ``refunded``: a refund
  that arrives after the sender stopped waiting for one (issue 25 §1).
- ``anchor31.slow`` ``{"seconds": s}``: drawn at creation; every status step of that
  transaction waits ``max(s, settle delay)`` seconds, the first ones included.
- ``anchor31.step_delay`` ``{"seconds": s}``: while on, the settle delay of every
  transaction (not drawn, not counted).
- ``anchor31.refund_short`` ``{"short": x, "fee": f}``: drawn when a refund is built;
  the anchor pays back ``x`` less than it received and records a refund fee of ``f``
  (default 0: a record whose fee does not explain what it kept).

Refunds (SEP-31 v2.2.0 ``refund_memo``: "If not specified, the Receiving Anchor should
use the same memo the Sending Anchor used"): one payment from the anchor's account
(``sandbox.keys.ANCHOR31``) to the funding payment's source account (Horizon's
``from``), the same asset and full amount, the payment's memo (or the transaction's
``refund_memo``), refund fee 0. The signed envelope and its hash are committed before the
first POST; an unknown outcome (timeout, 5xx) re-posts the same envelope; a new envelope
is built only once the old one is provably dead (``stellar.envelope_dead``: one read of
the anchor's account shows its sequence below the refund's on a ledger that closed after
the refund's time bounds; a ``tx_bad_seq`` refusal or a 404 for the hash is no proof, as
a lagging history node shows both for a refund that landed). The
transaction is ``refunded`` only once the refund is in a ledger.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from datetime import UTC, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import close_old_connections, connections, transaction
from django.utils import timezone
from stellar_sdk import Asset

from sandbox.anchor31 import stellar
from sandbox.anchor31.models import Sep31Payment, Sep31Refund, Sep31Transaction
from sandbox.control import faults
from sandbox.keys import ANCHOR31

log = logging.getLogger(__name__)

DB = "sandbox"

FAULT_REJECT = "anchor31.reject_before_funding"
FAULT_REFUND = "anchor31.refund_after_funding"
FAULT_FAIL_PAYOUT = "anchor31.fail_payout"
FAULT_FAIL_THEN_REFUND = "anchor31.fail_payout_then_refund"
FAULT_SLOW = "anchor31.slow"
FAULT_STEP_DELAY = "anchor31.step_delay"
FAULT_HTTP_5XX = "anchor31.http_5xx"
FAULT_REFUND_SHORT = "anchor31.refund_short"

REJECTED = "rejected by the receiving anchor before funding"
REJECTED_AFTER_FUNDING = "rejected by the receiving anchor after funding; refunding"
REFUNDED = "refunded to the sending anchor"
PAYOUT_FAILED = "payout failed at the receiving bank"
PAYMENT_RECEIVED = "payment received"
PAYING_OUT = "paying out to the receiver's bank account"
PAID_OUT = "paid out to the receiver's bank account"
EXPIRED = "no payment arrived in time"
RETRY_S = 1.0
BATCH = 50

TX = Sep31Transaction


def seconds(value: float) -> timedelta:
    return timedelta(seconds=float(value))


def poll_interval() -> float:
    return float(getattr(settings, "SANDBOX_ANCHOR31_WORKER_POLL_S", 0.1))


def settle_delay(tx: Sep31Transaction) -> float:
    """Seconds between two status steps of ``tx``: the settle delay, or the fault
    ``anchor31.step_delay``'s, at least the ``anchor31.slow`` seconds ``tx`` drew."""
    params = faults.peek(FAULT_STEP_DELAY)
    if params is not None and "seconds" in params:
        delay = float(params["seconds"])
    else:
        delay = float(getattr(settings, "SANDBOX_ANCHOR31_STEP_S", 0.5))
    return max(delay, tx.slow_s or 0.0)


def expiry_delay() -> float:
    """Seconds a ``pending_sender`` transaction waits for its payment before it is
    ``expired``: ``SANDBOX_ANCHOR31_EXPIRY_S`` (one day)."""
    return float(getattr(settings, "SANDBOX_ANCHOR31_EXPIRY_S", 86400.0))


def first_delay(tx: Sep31Transaction) -> float:
    """Seconds before the step that follows creation or a payment: none unless slow."""
    return tx.slow_s or 0.0


def iso(moment) -> str | None:
    """UTC ISO 8601 with milliseconds and ``Z`` (SEP-31 "UTC ISO 8601 string")."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def move(tx: Sep31Transaction, status: str, message: str, now) -> None:
    """Set ``tx``'s status (in memory), its message and ``updated_at``, and append to
    its history."""
    tx.status = status
    tx.status_message = message
    tx.updated_at = now
    tx.history = [*tx.history, {"status": status, "at": iso(now)}]


def funding_payment(tx: Sep31Transaction) -> Sep31Payment | None:
    return tx.payments.using(DB).filter(outcome=Sep31Payment.MATCHED).first()


def _asset_of(payment: Sep31Payment) -> str:
    return "native" if payment.asset_type == "native" else (
        f"{payment.asset_code}:{payment.asset_issuer}")


def payment_problem(tx: Sep31Transaction, payment: Sep31Payment) -> str | None:
    """Why ``payment`` cannot fund ``tx`` (SEP-31 "Detailed Receiving Anchor Flow": the
    anchor transfers the equivalent of what it expected), or None."""
    wanted = f"{tx.asset_code}:{tx.asset_issuer}"
    if _asset_of(payment) != wanted:
        return (f"payment {payment.stellar_transaction_id} was {_asset_of(payment)}, "
                f"expected {wanted}")
    if payment.amount != tx.amount_in:
        return (f"payment {payment.stellar_transaction_id} was "
                f"{stellar.amount_text(payment.amount)}, expected "
                f"{stellar.amount_text(tx.amount_in)}")
    return None


def _draw_fate() -> str:
    if faults.take(FAULT_REFUND) is not None:
        return TX.FATE_REFUND
    if faults.take(FAULT_FAIL_PAYOUT) is not None:
        return TX.FATE_FAIL_PAYOUT
    if faults.take(FAULT_FAIL_THEN_REFUND) is not None:
        return TX.FATE_FAIL_THEN_REFUND
    return ""


def late_refund_delay() -> float:
    """Seconds between ``error`` and the refund of a ``fail_payout_then_refund``
    transaction: ``SANDBOX_ANCHOR31_LATE_REFUND_S`` (10 s)."""
    return float(getattr(settings, "SANDBOX_ANCHOR31_LATE_REFUND_S", 10.0))


def _bank_reference() -> str:
    return f"{secrets.randbelow(10**12):012d}"


def _lock(transaction_id: str) -> Sep31Transaction | None:
    return TX.objects.using(DB).select_for_update().filter(pk=transaction_id).first()


def step(transaction_id: str) -> None:
    """Move one due transaction one step (module docstring). Refunds are driven by
    ``drive_refund`` outside the row lock of this step."""
    refund = False
    with transaction.atomic(using=DB):
        tx = _lock(transaction_id)
        now = timezone.now()
        if tx is None or tx.due_at is None or tx.due_at > now:
            return
        tx.due_at = None
        payment = funding_payment(tx)
        if tx.status == TX.PENDING_SENDER and tx.reject:
            move(tx, TX.ERROR, REJECTED, now)
            if payment is not None:
                tx.stellar_transaction_id = payment.stellar_transaction_id
                tx.due_at = now + seconds(settle_delay(tx))
        elif tx.status == TX.PENDING_SENDER and payment is not None:
            tx.stellar_transaction_id = payment.stellar_transaction_id
            problem = payment_problem(tx, payment)
            if problem:
                move(tx, TX.ERROR, problem, now)
            else:
                tx.fate = _draw_fate()
                move(tx, TX.PENDING_STELLAR, PAYMENT_RECEIVED, now)
                tx.due_at = now + seconds(settle_delay(tx))
        elif tx.status == TX.PENDING_SENDER:
            move(tx, TX.EXPIRED, EXPIRED, now)
        elif tx.status == TX.PENDING_STELLAR and tx.fate == TX.FATE_REFUND:
            if tx.status_message != REJECTED_AFTER_FUNDING:
                tx.status_message, tx.updated_at = REJECTED_AFTER_FUNDING, now
            tx.due_at = now + seconds(RETRY_S)  # if the refund crashes, try again
            refund = True
        elif tx.status == TX.PENDING_STELLAR:
            move(tx, TX.PENDING_RECEIVER, PAYING_OUT, now)
            tx.due_at = now + seconds(settle_delay(tx))
        elif tx.status == TX.PENDING_RECEIVER and tx.fate == TX.FATE_FAIL_PAYOUT:
            move(tx, TX.ERROR, PAYOUT_FAILED, now)
        elif tx.status == TX.PENDING_RECEIVER and tx.fate == TX.FATE_FAIL_THEN_REFUND:
            move(tx, TX.ERROR, PAYOUT_FAILED, now)
            tx.due_at = now + seconds(late_refund_delay())
        elif tx.status == TX.ERROR and tx.fate == TX.FATE_FAIL_THEN_REFUND and \
                payment is not None:
            tx.due_at = now + seconds(RETRY_S)  # if the refund crashes, try again
            refund = True
        elif tx.status == TX.PENDING_RECEIVER:
            move(tx, TX.COMPLETED, PAID_OUT, now)
            tx.completed_at = now
            tx.external_transaction_id = _bank_reference()
        elif tx.status == TX.ERROR and tx.reject and payment is not None:
            tx.stellar_transaction_id = payment.stellar_transaction_id
            tx.due_at = now + seconds(RETRY_S)  # if the refund crashes, try again
            refund = True
        tx.save(using=DB)
    if refund:
        drive_refund(transaction_id)


# --------------------------------------------------------------------------- refunds


def _refund_asset(payment: Sep31Payment) -> Asset:
    if payment.asset_type == "native":
        return Asset.native()
    return Asset(payment.asset_code, payment.asset_issuer)


def _prepare_refund(tx: Sep31Transaction, payment: Sep31Payment) -> Sep31Refund:
    """The live refund of ``payment``, or a new signed one committed with the caller's
    transaction (intent before the POST). Reads the anchor's sequence from Horizon."""
    refund = (payment.refunds.using(DB).exclude(status=Sep31Refund.DEAD)
              .order_by("-id").first())
    if refund is not None:
        return refund
    if tx.refund_memo_type:
        memo_type, memo = tx.refund_memo_type, tx.refund_memo
    else:
        memo_type, memo = payment.memo_type, payment.memo
    amount, fee = payment.amount, Decimal(0)
    if (short := faults.take(FAULT_REFUND_SHORT)) is not None:
        amount -= Decimal(str(short.get("short", "1")))
        fee = Decimal(str(short.get("fee", "0")))
    envelope_xdr, tx_hash, max_time = stellar.build_payment(
        ANCHOR31, destination=payment.from_account, asset=_refund_asset(payment),
        amount=amount, memo_type=memo_type, memo=memo)
    return Sep31Refund.objects.using(DB).create(
        transaction=tx, payment=payment, destination=payment.from_account,
        asset_type=payment.asset_type, asset_code=payment.asset_code,
        asset_issuer=payment.asset_issuer, amount=amount, fee=fee,
        memo_type=memo_type, memo=memo, envelope_xdr=envelope_xdr, hash=tx_hash,
        max_time=max_time, status=Sep31Refund.SUBMITTING, created_at=timezone.now())


def drive_refund(transaction_id: str) -> None:
    """Pay the funding payment of ``transaction_id`` back (module docstring, "Refunds")
    and record the outcome: ``refunded`` once it is in a ledger; a retry scheduled
    (``due_at``) while it is unknown; the worker stops (message set) if it failed."""
    with transaction.atomic(using=DB):
        tx = _lock(transaction_id)
        if tx is None or tx.status == TX.REFUNDED:
            return
        payment = funding_payment(tx)
        if payment is None:
            return
        refund = _prepare_refund(tx, payment)
    outcome = None
    if refund.status == Sep31Refund.SUBMITTING:
        outcome = stellar.submit(refund.envelope_xdr, refund.hash)
    with transaction.atomic(using=DB):
        tx = _lock(transaction_id)
        current = Sep31Refund.objects.using(DB).select_for_update().filter(
            pk=refund.pk).first()
        if tx is None or current is None:
            return  # a reset emptied the tables meanwhile
        now = timezone.now()
        landed = current.status == Sep31Refund.COMPLETED or (
            outcome is not None and outcome.state == "applied" and outcome.successful)
        if landed:
            current.status, current.completed_at = Sep31Refund.COMPLETED, now
            move(tx, TX.REFUNDED, REFUNDED, now)
            tx.due_at = None
        elif current.status == Sep31Refund.FAILED or outcome is None:
            tx.due_at = None  # failed earlier: an operator's matter
        elif outcome.state == "applied":
            current.status = Sep31Refund.FAILED
            current.last_error = f"refund {current.hash} failed in the ledger: {outcome.codes}"
            tx.status_message, tx.updated_at, tx.due_at = (
                f"refund failed: {current.last_error}", now, None)
        elif outcome.state == "refused":
            codes = outcome.codes.get("transaction")
            current.last_error = f"refused: {outcome.codes}"
            if codes in ("tx_bad_seq", "tx_too_late"):
                # the sequence may be consumed by this very envelope behind a lagging
                # history: only the proof of stellar.envelope_dead allows a new one
                if _provably_dead(current):
                    current.status, tx.due_at = Sep31Refund.DEAD, now
                else:
                    tx.due_at = now + seconds(RETRY_S)
            else:
                current.status = Sep31Refund.FAILED
                tx.status_message, tx.updated_at, tx.due_at = (
                    f"refund failed: {current.last_error}", now, None)
        else:
            current.last_error = outcome.error
            if _provably_dead(current):
                current.status = Sep31Refund.DEAD
            tx.due_at = now + seconds(RETRY_S)
        current.save(using=DB)
        tx.save(using=DB)


def _provably_dead(refund: Sep31Refund) -> bool:
    """``stellar.envelope_dead``: the anchor's sequence is still below the refund's in
    one account read, on a ledger that closed after its time bounds."""
    return stellar.envelope_dead(refund.envelope_xdr, refund.max_time)


# --------------------------------------------------------------------------- loop


def due_transactions(limit: int = BATCH) -> list[str]:
    return list(TX.objects.using(DB).filter(due_at__lte=timezone.now())
                .order_by("due_at").values_list("pk", flat=True)[:limit])


def _postpone(transaction_id: str) -> None:
    TX.objects.using(DB).filter(pk=transaction_id, due_at__isnull=False).update(
        due_at=timezone.now() + seconds(RETRY_S))


def run(stop: threading.Event) -> None:
    """The worker loop: every ``SANDBOX_ANCHOR31_WORKER_POLL_S`` (0.1 s) step each
    due transaction, until ``stop``. A failing step is logged and retried a second
    later; the loop outlives resets and database restarts."""
    try:
        while not stop.is_set():
            try:
                for transaction_id in due_transactions():
                    try:
                        step(transaction_id)
                    except Exception:
                        log.exception("anchor31: step of %s failed; retrying", transaction_id)
                        close_old_connections()
                        _postpone(transaction_id)
            except Exception:
                log.exception("anchor31: worker pass failed; retrying")
                connections[DB].close()
                time.sleep(0.5)
            stop.wait(poll_interval())
    finally:
        connections[DB].close()
