"""Payments from the hub (Corridor's USDC account on Stellar) for saga legs: at most
one payment per leg key, even across crashes between "paid" and "recorded"
(DESIGN.md §6 "Legs that move money"; the rules of §4 steps 1-3 applied to the hub).

``pay`` does, in order:

1. **Look for the payment on chain** by its reference (the memo) from the saga's
   ``stellar_cursor``: same from (the hub), to, amount and asset -> it happened; return
   its hash. This is what finds a payment whose worker died after submitting it.
2. **The stored envelope** (``saga_hub_payments``, one row per leg key), judged by the
   one rule every Stellar outbox uses (``anchor.envelopes.envelope_fate``): landed and
   successful -> done; alive -> re-posted as is, never rebuilt; unknown (Horizon cannot
   prove it yet, e.g. a lagging node) -> ``HubPaymentUnknown``: the leg waits (Pending,
   no attempt used), and past ENVELOPE_UNKNOWN_REVIEW_S after its ``max_time`` it stops
   with ``ManualReviewError`` and the evidence; dead (or included but failed: no money
   moved) -> step 3.
3. **Build, store, submit**: only when there is no envelope or it is provably dead, a new
   one is built on the hub's next sequence, stored in a fenced commit (the saga's lease
   is renewed in the same transaction, so a worker that lost the saga writes nothing),
   and then posted.

A leg key's first envelope is built only on evidence that covers the moment (issue 25
§1-2): the hub's sequence is read from Horizon's state, and the history must already
show the hub's transaction of that sequence (``envelopes.history_shows_sequence``;
until it does the leg waits, ``HubPaymentUnknown``). Then step 1 runs again on that
history, and the leg's ``before_first`` check (the anchor leg's look for its own
payment under a memo a failover lost) sees every payment the hub made; the envelope
is built on exactly that sequence + 1, so an envelope of a lost run still in flight
and the new one share a sequence and at most one of them applies. Found by the
20-seed loaded campaign at a927fb9, seed 5: a failover lost saga 135's anchor.fund
run after the hub paid the anchor 115.25 USDC; the next run's look read a history
lagging behind it and paid the anchor's new transaction too. A rebuild of a dead
envelope waits, looks and checks the same way (stop 34's review: a lost run's rebuild
had paid the anchor after the stored envelope died, and a history showing the dead
one's consumer but not that rebuild let a third envelope pay again).

Hub submissions take turns under a PostgreSQL advisory lock: Stellar core queues one
transaction per source account (horizon/NOTES.md; the sandbox's Horizon enforces it), so
two workers building on the same sequence would only refuse each other.

``REMITTANCE_CHAIN_LOOKUP`` (test-only) False skips steps 1 and 2: every attempt builds
and pays anew, which is how the tests show the double payment the look-up prevents.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F

from anchor import envelopes, stellar
from common import locks
from common.crashpoints import crash_point
from sagas.legs import LegContext, ManualReviewError
from sagas.models import HubPayment

log = logging.getLogger(__name__)

HUB_LOCK_KEY = 0x436F7252_48554221  # "CorR" "HUB!": one hub submission at a time


class HubBusy(Exception):
    """Another worker's hub payment held the hub for longer than REMITTANCE_HUB_LOCK_WAIT_S."""


class HubPaymentUnknown(Exception):
    """Whether the payment landed is not known yet: the envelope was posted and Horizon
    did not say (504, timeout), or Horizon cannot prove where the stored envelope stands.
    Legs wait (``Pending``, no attempt used); the next attempt reads the envelope's fate
    before anything else."""


class HubPaymentFailed(Exception):
    """Horizon refused the envelope or included it unsuccessfully (result codes in the
    message). Retryable: the next attempt finds the envelope dead and builds anew."""


def hub_address() -> str:
    return stellar.hub_keypair().public_key


@dataclass(frozen=True)
class Payment:
    """What to pay: ``amount`` USDC (Decimal, 7 dp) to ``destination`` under memo."""

    destination: str
    amount: Decimal
    memo_type: str
    memo: str


def find(payment: Payment, *, cursor: str) -> stellar.Transfer | None:
    """The first successful USDC payment hub -> ``payment.destination`` of exactly
    ``payment.amount`` under ``payment.memo``, after ``cursor``; None if none.
    Raises stellar.HorizonUnavailable."""
    hub = hub_address()
    for transfer in stellar.find_transfers_by_reference(hub, payment.memo, cursor):
        if (transfer.source == hub and transfer.destination == payment.destination
                and transfer.amount == payment.amount
                and transfer.asset == stellar.usdc_asset_id()):
            return transfer
    return None


def unrecorded(*, destination: str, amount: Decimal, memo: str,
               cursor: str) -> list[stellar.Transfer]:
    """Successful USDC payments hub -> ``destination`` of exactly ``amount`` after
    ``cursor`` under another memo than ``memo`` whose hash no ``saga_hub_payments`` row
    holds. Every hub payment's row is committed before its envelope is sent, so such a
    payment is one whose commits a failover lost (issue 25 §2). Raises
    stellar.HorizonUnavailable."""
    hub = hub_address()
    return without_rows([t for t in stellar.transfers_after(hub, cursor)
                         if t.source == hub and t.destination == destination
                         and t.amount == amount and t.asset == stellar.usdc_asset_id()
                         and t.memo != memo])


def without_rows(transfers: list[stellar.Transfer]) -> list[stellar.Transfer]:
    """The ones of ``transfers`` (hub payments read from Horizon) whose hash no
    ``saga_hub_payments`` row holds: every hub payment's row is committed before its
    envelope is sent, so each is a payment whose commits a failover lost. One query."""
    recorded = set(HubPayment.objects.filter(tx_hash__in=[t.tx_hash for t in transfers])
                   .values_list("tx_hash", flat=True))
    return [t for t in transfers if t.tx_hash not in recorded]


def return_memo(payment_hash: str) -> str:
    """The memo of the hub's return of the payment ``payment_hash`` (hex): a ``hash``
    memo carrying that hash, base64 as Horizon shows it. Not the saga's reference: the
    engine's own refund to the partner goes under the reference to the same account,
    often for the same amount, and each side's look-up (``hub.find``: memo, to,
    amount) must never take the other's payment for its own."""
    return base64.b64encode(bytes.fromhex(payment_hash)).decode()


def pay(ctx: LegContext, payment: Payment, *, crash_name: str,
        before_first: Callable[[], None] | None = None) -> str:
    """Pay ``payment`` from the hub at most once for ``ctx.idempotency_key`` and return
    the Stellar transaction hash once it is in a ledger. ``crash_name``: the crash point
    reached right after Horizon said the payment applied, before anything records it.
    ``before_first``: called once the history covers the hub's sequence, before each
    envelope of the key is built, the first or a rebuild (it raises to stop the
    payment).

    Raises HubBusy (try later, nothing done), HubPaymentUnknown (wait: the look-up
    decides), HubPaymentFailed (retry), ManualReviewError (the envelope's fate stayed
    unknown past ENVELOPE_UNKNOWN_REVIEW_S after its max_time: a person decides),
    stellar.HorizonUnavailable, StaleLeaseError (from the fenced commit of a new
    envelope: nothing was paid)."""
    lookup = settings.REMITTANCE_CHAIN_LOOKUP
    if lookup:
        found = find(payment, cursor=ctx.stellar_cursor)
        if found is not None:
            return found.tx_hash
    with _hub_turn(ctx):
        row = HubPayment.objects.filter(key=ctx.idempotency_key).first()
        if row is not None and lookup:
            fate = _fate(row)
            if fate.state == envelopes.LANDED and fate.successful:
                return row.tx_hash
            if fate.state == envelopes.ALIVE:
                return _submit(row, crash_name)
            if fate.state == envelopes.UNKNOWN:
                if envelopes.unknown_overdue(_max_time(row)):
                    raise ManualReviewError(
                        f"hub payment {row.key}: the fate of {row.tx_hash} stayed unknown "
                        f"past max_time + {settings.ENVELOPE_UNKNOWN_REVIEW_S:g}s: "
                        f"{fate.reason}; evidence {fate.evidence}")
                raise HubPaymentUnknown(f"{row.tx_hash}: {fate.reason}")
        sequence = None
        if lookup and settings.HUB_HISTORY_COVERAGE_CHECK:
            sequence = _covered_sequence(payment, ctx, first=row is None)
            if isinstance(sequence, str):
                return sequence  # found on chain: a lost run's envelope paid it
            if before_first is not None:
                before_first()
        row = _build(ctx, payment, row, sequence=sequence)
        return _submit(row, crash_name)


def _covered_sequence(payment: Payment, ctx: LegContext, *, first: bool) -> int | str:
    """Before any envelope is built for a leg key, the first or a rebuild of a dead one:
    the hub's sequence as its state reads it, once Horizon's history shows the
    transaction that used it; then the look for ``payment`` on that history. Returns
    that sequence (build on it + 1), or the hash of the payment found. A rebuild needs
    it as much as a first envelope: a lost run may have rebuilt and paid after the
    stored envelope died (stop 34's review). Raises HubPaymentUnknown while the history
    lags behind the state, stellar.HorizonUnavailable."""
    sequence = stellar.account_sequence(hub_address())
    if not envelopes.history_shows_sequence(hub_address(), sequence):
        raise HubPaymentUnknown(
            f"Horizon's history does not show the hub's transaction {sequence} yet: no "
            f"{'first' if first else 'new'} envelope before it does")
    found = find(payment, cursor=ctx.stellar_cursor)
    return found.tx_hash if found is not None else sequence


def envelope_outstanding(ctx: LegContext) -> bool:
    """Whether this leg key has a stored envelope that landed or may still land: the
    leg has (perhaps) paid already, whatever the counterparty says now."""
    row = HubPayment.objects.filter(key=ctx.idempotency_key).first()
    if row is None:
        return False
    fate = _fate(row)
    return fate.state != envelopes.DEAD and not (
        fate.state == envelopes.LANDED and not fate.successful)


@contextmanager
def _hub_turn(ctx: LegContext) -> Iterator[None]:
    try:
        with locks.wait_session_lock(HUB_LOCK_KEY, timeout=settings.REMITTANCE_HUB_LOCK_WAIT_S,
                                     while_waiting=ctx.renew_lease):
            ctx.renew_lease()
            yield
    except locks.LockTimeout as exc:
        raise HubBusy("the hub is busy with another payment") from exc


def _max_time(row: HubPayment) -> datetime:
    return datetime.fromtimestamp(row.max_time, UTC)


def _fate(row: HubPayment) -> envelopes.Fate:
    """The stored envelope's fate under the one rule (``anchor.envelopes``)."""
    return envelopes.envelope_fate(tx_hash=row.tx_hash, source_account=hub_address(),
                                   sequence=row.sequence, max_time=_max_time(row))


def _build(ctx: LegContext, payment: Payment, row: HubPayment | None, *,
           sequence: int | None = None) -> HubPayment:
    """Build, store (fenced) and return the envelope of ``payment``: on ``sequence`` + 1
    (the hub's sequence the caller verified), or on the sequence Horizon shows now."""
    hub = stellar.hub_keypair()
    sequence = (stellar.account_sequence(hub.public_key) if sequence is None
                else sequence) + 1
    max_time = int(time.time() + settings.STELLAR_TX_TIMEOUT_S)
    envelope = stellar.build_payment_from(
        source=hub, sequence=sequence, destination=payment.destination,
        amount=payment.amount, memo_type=payment.memo_type, memo=payment.memo,
        max_time=max_time)
    fields = {"destination": payment.destination, "amount": payment.amount,
              "memo_type": payment.memo_type, "memo": payment.memo, "sequence": sequence,
              "max_time": max_time, "envelope_xdr": envelope.to_xdr(),
              "tx_hash": envelope.hash_hex()}
    with transaction.atomic():
        ctx.renew_lease()  # the fence: a worker that lost the saga stores nothing
        if row is None:
            row = HubPayment.objects.create(key=ctx.idempotency_key, saga_id=ctx.saga.id,
                                            **fields)
        else:
            log.warning("hub payment %s: envelope %s is dead; building a new one",
                        row.key, row.tx_hash)
            HubPayment.objects.filter(pk=row.pk).update(rebuilds=F("rebuilds") + 1, **fields)
            row.refresh_from_db()
    return row


def _submit(row: HubPayment, crash_name: str) -> str:
    result = stellar.submit(row.envelope_xdr)
    if result.kind == "applied":
        crash_point(crash_name)
        return row.tx_hash
    if result.kind == "unknown":
        raise HubPaymentUnknown(f"{row.tx_hash}: {result.detail}")
    raise HubPaymentFailed(f"{row.tx_hash}: {result.detail} {result.tx_code} "
                           f"{' '.join(result.op_codes)}".strip())
