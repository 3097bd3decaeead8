"""The ``remittance`` plan (DESIGN.md §6 "Reference plan"): a partner funds a payment in
USDC on Stellar to Corridor's hub; Corridor converts at the quote locked when the
remittance was created, funds a SEP-31 receiving anchor from the hub, and waits for the
anchor to pay the beneficiary in INR.

Legs, their bookings (USDC and INR; a positive amount debits an asset account) and
their compensations::

    0 bridge.fill    wait (Pending, funding deadline ``fund_by`` plus
                     REMITTANCE_FUNDING_GRACE_S for Horizon's lag, and a history that
                     reaches ``fund_by``) for the partner's payment hub <- partner
                     under the remittance reference (text memo)
                     bridge.fill     USDC  hub +X              partner:P -X
                     undo: refund the partner on chain (hub -> partner, same memo)
                     bridge.unfill   USDC  partner:P +R        partner:P:refunds -R
                     bridge.refund   USDC  partner:P:refunds +R   hub -R
                     (R = what this saga still holds for P: X, less any anchor refund fee)
    1 fx.convert     ledger only, at the locked quote (Y = X * rate, INR, 2 dp)
                     fx.convert      USDC  partner:P +X        fx:USDC-INR -X
                                     INR   fx:USDC-INR +Y      payable:beneficiaries -Y
                     undo: fx.convert.undo, the exact reverse
    2 anchor.fund    POST /transactions at the anchor, commit its id and memo as the
                     intent, look for the payment by that memo, then pay from the hub
                     anchor.fund     USDC  hub -X              anchor:anchor31 +X
                     undo: wait (Pending, REMITTANCE_REFUND_DEADLINE_S, then
                     ManualReviewError) for the anchor's refund anchor -> hub, same memo
                     anchor.refund   USDC  hub +r              anchor:anchor31 -r  (each)
                     (refunds above X: each booked, then ManualReviewError; the
                     anchor's account shows the excess owed back to it)
                     anchor.refund_fee USDC anchor:anchor31 -f partner:P +f  (if the anchor
                     kept a fee: the partner bears it)
    3 anchor.payout  poll the anchor (Pending between polls): ``completed`` -> done;
                     ``refunded`` (or ``error`` with a refund) -> NonRetryableError;
                     ``error`` with no refund (REMITTANCE_ERROR_REFUND_GRACE_S after
                     funding): a refund on chain under the memo -> NonRetryableError;
                     none, on a Horizon history that reaches the grace's end ->
                     ManualReviewError with the evidence (funded: a person decides,
                     unless the refund arrives later: sagas/latemoney.py compensates);
                     history not there yet -> wait;
                     unreachable -> retry, then ManualReviewError
                     anchor.payout   USDC  anchor:anchor31 -X  fx:USDC-INR +X
                                     INR   payable:beneficiaries +Y   fx:USDC-INR -Y

Every account but ``hub`` nets to zero once a saga settles (completed or compensated);
``hub`` moves only with a Stellar payment of the hub, booked under that payment's hash,
so the ledger's hub USDC equals the hub account's USDC on chain (DESIGN.md §8 inv. 3).

Money-moving legs (``anchor.fund`` and the refund to the partner) pay through
``sagas.hub.pay``: intent committed before the call, look-up by reference first.
Crash points (``CORRIDOR_CRASH_AT``): ``remittance.anchor_fund.paid`` and
``remittance.partner_refund.paid``, right after Horizon said the payment applied.

Choices written down here: the oldest partner payment under the reference that
matches (sender, amount, USDC) is the fill; any other payment under the reference (a
partner's retry, another sender or amount) is excess, booked and returned to its sender
by the late-money sweep (sagas/latemoney.py ``excess_check``) once the saga settles;
payments under the reference none of which matches stop the saga for a person rather
than guessing; a payment arriving after the funding deadline (the saga ended
compensated, expired) is matched by the late-money sweep (sagas/latemoney.py): one that
matches is booked as ``bridge.fill`` in the transaction that reopens the saga, whose
compensation returns it to the partner through the hub's outbox, once; one that does
not puts the saga in manual_review with its evidence; the anchor's ``sender_id`` /
``receiver_id`` are Corridor's own ids (``corridor:<partner>``, ``corridor:<reference>``)
as the sandbox takes any non-empty id (no SEP-12 ``PUT /customer`` yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from anchor import stellar
from ledger.models import Entry, Posting
from ledger.services import Line
from sagas import anchor31, hub
from sagas.legs import (
    Booking,
    Leg,
    LegContext,
    LegOutcome,
    ManualReviewError,
    NonRetryableError,
    Pending,
    Plan,
)
from sagas.models import SagaEvent
from sagas.plans import register

USDC = "USDC"
INR = "INR"
HUB = "hub"
FX = "fx:USDC-INR"
PAYABLE = "payable:beneficiaries"
ANCHOR = "anchor:anchor31"
HUB_BUSY_RETRY_S = 0.5


def partner_account(name: str) -> str:
    return f"partner:{name}"


def partner_refunds_account(name: str) -> str:
    return f"partner:{name}:refunds"


def _amount(ctx: LegContext) -> Decimal:
    return Decimal(ctx.saga.input["amount"])


def _partner(ctx: LegContext) -> str:
    return partner_account(ctx.saga.input["partner"])


def _held_for_partner(ctx: LegContext) -> Decimal:
    """What this saga still holds for its partner: minus the sum of its own postings to
    the partner's account (a liability, negative while held)."""
    total = Posting.objects.filter(
        entry__saga_id=ctx.saga.id, account__code=_partner(ctx), account__currency=USDC,
    ).aggregate(total=Sum("amount"))["total"]
    return -(total or Decimal(0))


@dataclass(frozen=True)
class ChainRefunds:
    """The anchor's refunds of one funding as Horizon's history shows them: every
    successful USDC payment anchor -> hub under the funding's memo (``refunds``), and
    the history height the read covers (``ledger``, ``closed_at``: read before it)."""

    refunds: list[stellar.Transfer]
    ledger: int
    closed_at: datetime

    @property
    def total(self) -> Decimal:
        return sum((t.amount for t in self.refunds), Decimal(0))

    def describe(self) -> str:
        seen = ", ".join(f"{t.tx_hash} {t.amount} USDC at {t.created_at}"
                         for t in self.refunds) or "none"
        return (f"refunds on chain from the anchor under its memo: {seen} (Horizon's "
                f"history as of ledger {self.ledger}, closed {self.closed_at.isoformat()})")


def chain_refunds(fund: dict[str, Any], *, cursor: str) -> ChainRefunds:
    """The anchor's refunds on chain for the ``anchor.fund`` output (or intent) ``fund``
    (its ``account`` and ``memo``), from Horizon's root (the height) and then the hub's
    payments after ``cursor``. Raises stellar.HorizonUnavailable."""
    address = hub.hub_address()
    ledger, closed_at = stellar.history_height()
    refunds = [t for t in stellar.find_transfers_by_reference(address, fund["memo"], cursor)
               if t.source == fund["account"] and t.destination == address
               and t.asset == stellar.usdc_asset_id()]
    return ChainRefunds(refunds, ledger, closed_at)


def refund_fee(record: dict[str, Any], *, funded: Decimal, received: Decimal
               ) -> Decimal | None:
    """The fee the anchor kept out of a refund of ``received`` USDC (on chain) of the
    ``funded`` it was paid, from its SEP-31 transaction ``record``: ``funded -
    received`` when the record says the refund is over (``refunded``), refunded exactly
    ``received`` (> 0) and its refund payments' fees sum to that; None while that is not
    so (the compensation waits; the late-money sweep does not reopen the saga for it).
    A refund of the whole funding has fee 0 and needs no record."""
    if received == funded:
        return Decimal(0)
    refunded, payments = anchor31.refunds_of(record)
    fees = sum((Decimal(str(p.get("fee") or "0")) for p in payments), Decimal(0))
    if record.get("status") != anchor31.REFUNDED or refunded != received or received == 0:
        return None
    fee = funded - received
    return fee if fees == fee else None


def _since_compensating(ctx: LegContext) -> datetime:
    """When this compensation started: the saga's ``saga.compensating``, an operator's
    ``operator.compensate`` of a saga stopped going forward, or the later
    ``auto.compensate`` that reopened it once its late refund was confirmed (without the
    operator's, the deadline was counted from each read and never came)."""
    event = SagaEvent.objects.filter(
        saga_id=ctx.saga.id,
        event__in=["saga.compensating", "operator.compensate", "auto.compensate"]) \
        .order_by("-id").first()
    return event.at if event else timezone.now()


def first_match(incoming: list[stellar.Transfer], inp: dict[str, Any]) -> stellar.Transfer | None:
    """The oldest of ``incoming`` (payments to the hub under the reference, oldest
    first) that funds the remittance ``inp``: from its partner's account, its amount, in
    USDC; None if none does. Every other one is excess, returned to its sender by the
    late-money sweep (sagas/latemoney.py ``excess_check``), never a reason to stop."""
    expected = (inp["partner_account"], Decimal(str(inp["amount"])), stellar.usdc_asset_id())
    for transfer in incoming:
        if (transfer.source, transfer.amount, transfer.asset) == expected:
            return transfer
    return None


# --- 0 ------------------------------------------------------------------------------

class BridgeFill(Leg):
    """The partner's USDC arrives on the hub under the remittance reference."""

    kind = "bridge.fill"
    max_attempts = 8

    def forward(self, ctx: LegContext) -> LegOutcome | Pending:
        inp = ctx.saga.input
        address, amount = hub.hub_address(), _amount(ctx)
        fund_by = datetime.fromisoformat(inp["fund_by"])
        expiring = timezone.now() >= fund_by + timedelta(
            seconds=settings.REMITTANCE_FUNDING_GRACE_S)
        try:
            # Past the grace, "no payment" must rest on a history that reaches fund_by
            # (issue 25 §1): its height is read first (a node's history only grows).
            height = stellar.history_height() if expiring else None
            moved = stellar.find_transfers_by_reference(
                address, ctx.saga.reference, ctx.stellar_cursor)
        except stellar.HorizonUnavailable as exc:
            return Pending(settings.REMITTANCE_FUNDING_POLL_S, f"Horizon: {exc}")
        incoming = [t for t in moved if t.destination == address]
        if not incoming:
            # One read that shows nothing is proof only past the grace, and only from a
            # history that reaches fund_by: Horizon's history lags behind the ledger
            # (found by the stale-read attacker: a payment made on time, hidden by a
            # lagging read, was expired and left unbooked on the hub). A payment that
            # arrives after the expiry anyway is returned by sagas/latemoney.py.
            if height is not None and height[1] >= fund_by:
                raise NonRetryableError(
                    f"not funded by {inp['fund_by']}: expired (no payment under the "
                    f"reference as of ledger {height[0]}, closed {height[1].isoformat()})")
            if height is not None:
                return Pending(settings.REMITTANCE_FUNDING_POLL_S,
                               f"Horizon's history (ledger {height[0]}, closed "
                               f"{height[1].isoformat()}) does not reach fund_by yet")
            return Pending(settings.REMITTANCE_FUNDING_POLL_S,
                           "waiting for the partner's payment")
        first = first_match(incoming, inp)
        if first is None:
            seen = [f"{t.tx_hash} {t.source} {t.amount} {t.asset}" for t in incoming]
            raise ManualReviewError(
                f"payments under {ctx.saga.reference} do not match the remittance "
                f"({inp['partner_account']} {amount} USDC): {seen}")
        fill = Booking("bridge.fill", [Line(HUB, USDC, amount),
                                       Line(_partner(ctx), USDC, -amount)],
                       reference=first.tx_hash)
        self._check_no_lost_refund(ctx, moved, first, fill)
        return LegOutcome(
            output={"tx_hash": first.tx_hash, "from": first.source, "amount": str(amount)},
            bookings=[fill])

    @staticmethod
    def _check_no_lost_refund(ctx: LegContext, moved: list[stellar.Transfer],
                              first: stellar.Transfer, fill: Booking) -> None:
        """Before the saga goes on: the hub already sent USDC back to the partner under
        the reference, and no ``saga_hub_payments`` row holds that payment. Every hub
        payment's row is committed before its envelope is sent, so a failover lost the
        commits of this saga's compensation (issue 25 §2; chaos seed 3 with two burners:
        the anchor refused, the partner was refunded, the failover lost it, the saga ran
        again and funded the anchor's new transaction: 11.25 USDC moved twice). Raises
        ManualReviewError with the evidence, booking the fill and each such refund as
        the compensation books it (``bridge.unfill``, ``bridge.refund`` under its hash)
        in the same commit as the stop, so the hub's books equal its chain and nothing
        is paid to the anchor."""
        address = hub.hub_address()
        lost = hub.without_rows([t for t in moved if t.source == address
                                 and t.destination == first.source
                                 and t.asset == stellar.usdc_asset_id()])
        if not lost:
            return
        partner = _partner(ctx)
        refunds = partner_refunds_account(ctx.saga.input["partner"])
        raise ManualReviewError(
            "the hub already refunded the partner under this remittance's reference with "
            "no record of it (commits lost): " + ", ".join(
                f"{t.tx_hash} {format(t.amount, 'f')} USDC" for t in lost)
            + "; booked as its refund, the anchor not funded",
            bookings=[fill] + [b for t in lost for b in (
                Booking("bridge.unfill", [Line(partner, USDC, t.amount),
                                          Line(refunds, USDC, -t.amount)],
                        reference=t.tx_hash),
                Booking("bridge.refund", [Line(refunds, USDC, t.amount),
                                          Line(HUB, USDC, -t.amount)],
                        reference=t.tx_hash))])

    def compensate(self, ctx: LegContext, output: dict[str, Any]) -> LegOutcome | Pending:
        """Send back on Stellar what the saga still holds for the partner, to the account
        that paid, under the same reference."""
        owed = _held_for_partner(ctx)
        if owed <= 0:
            return LegOutcome(output={"refunded": "0"})
        payment = hub.Payment(destination=output["from"], amount=owed,
                              memo_type=ctx.saga.input.get("memo_type", "text"),
                              memo=ctx.saga.reference)
        try:
            tx_hash = hub.pay(ctx, payment, crash_name="remittance.partner_refund.paid")
        except (hub.HubBusy, hub.HubPaymentUnknown) as exc:
            return Pending(HUB_BUSY_RETRY_S, str(exc))
        partner, refunds = _partner(ctx), partner_refunds_account(ctx.saga.input["partner"])
        return LegOutcome(
            output={"refunded": str(owed), "tx_hash": tx_hash, "to": output["from"]},
            bookings=[
                Booking("bridge.unfill", [Line(partner, USDC, owed),
                                          Line(refunds, USDC, -owed)]),
                Booking("bridge.refund", [Line(refunds, USDC, owed), Line(HUB, USDC, -owed)],
                        reference=tx_hash),
            ])


# --- 1 ------------------------------------------------------------------------------

class FxConvert(Leg):
    """USDC held for the partner becomes INR owed to the beneficiary, at the quote."""

    kind = "fx.convert"

    def forward(self, ctx: LegContext) -> LegOutcome:
        usdc = Decimal(ctx.output_of("bridge.fill")["amount"])
        inr = Decimal(ctx.saga.input["receive_amount"])
        lines = [Line(_partner(ctx), USDC, usdc), Line(FX, USDC, -usdc),
                 Line(FX, INR, inr), Line(PAYABLE, INR, -inr)]
        return LegOutcome(
            output={"usdc": str(usdc), "inr": str(inr), "rate": ctx.saga.input["rate"]},
            bookings=[Booking("fx.convert", lines)])

    def compensate(self, ctx: LegContext, output: dict[str, Any]) -> LegOutcome:
        """Undo the conversion in the books, once: a saga whose look found its lost
        refund to the partner (``AnchorFund._check_no_lost_partner_refund``) booked the
        undo already, and an operator's "compensate" after that stop books nothing
        more (stop 34's review: the conversion undone twice, the books short)."""
        if self._undone_already(ctx):
            return LegOutcome(output={"reversed": True, "booked_before": True})
        usdc, inr = Decimal(output["usdc"]), Decimal(output["inr"])
        lines = [Line(_partner(ctx), USDC, -usdc), Line(FX, USDC, usdc),
                 Line(FX, INR, -inr), Line(PAYABLE, INR, inr)]
        return LegOutcome(output={"reversed": True},
                          bookings=[Booking("fx.convert.undo", lines)])

    @staticmethod
    def _undone_already(ctx: LegContext) -> bool:
        return Entry.objects.filter(saga_id=ctx.saga.id, kind="fx.convert.undo").exists()


# --- 2 ------------------------------------------------------------------------------

class AnchorFund(Leg):
    """Create the SEP-31 transaction and pay the anchor from the hub under its memo."""

    kind = "anchor.fund"
    max_attempts = 8

    def forward(self, ctx: LegContext) -> LegOutcome | Pending:
        inp, amount = ctx.saga.input, _amount(ctx)
        intent = ctx.intent
        if intent is None:
            beneficiary = inp["beneficiary"]
            fields = {"receiver_account_number": beneficiary["account_number"],
                      "receiver_ifsc": beneficiary["ifsc"]}
            try:
                created = anchor31.create_transaction(
                    amount=amount, asset_code=inp["asset_code"],
                    asset_issuer=inp["asset_issuer"], sender_id=f"corridor:{inp['partner']}",
                    receiver_id=f"corridor:{ctx.saga.reference}",
                    fields={"transaction": fields})
            except anchor31.AnchorRejected as exc:
                raise NonRetryableError(f"the anchor refused the transaction: {exc}")
            if settings.REMITTANCE_CHAIN_LOOKUP:
                self._check_no_lost_payment(ctx, created, amount)
            intent = ctx.commit_intent({
                "anchor_tx_id": created["id"], "account": created["stellar_account_id"],
                "memo_type": created["stellar_memo_type"], "memo": created["stellar_memo"],
                "amount": str(amount)})
        payment = hub.Payment(destination=intent["account"], amount=amount,
                              memo_type=intent["memo_type"], memo=intent["memo"])
        found = hub.find(payment, cursor=ctx.stellar_cursor) \
            if settings.REMITTANCE_CHAIN_LOOKUP else None
        if found is not None:
            tx_hash = found.tx_hash
        else:
            if not (settings.REMITTANCE_CHAIN_LOOKUP and hub.envelope_outstanding(ctx)):
                self._check_not_rejected(intent)
            try:
                tx_hash = hub.pay(ctx, payment, crash_name="remittance.anchor_fund.paid",
                                  before_first=lambda: self._before_first_payment(
                                      ctx, intent, amount))
            except (hub.HubBusy, hub.HubPaymentUnknown) as exc:
                return Pending(HUB_BUSY_RETRY_S, str(exc))
        return LegOutcome(
            output={**intent, "tx_hash": tx_hash, "funded_at": timezone.now().isoformat()},
            bookings=[Booking("anchor.fund", [Line(HUB, USDC, -amount),
                                              Line(ANCHOR, USDC, amount)],
                              reference=tx_hash)])

    def _before_first_payment(self, ctx: LegContext, intent: dict[str, Any],
                              amount: Decimal) -> None:
        """``hub.pay``'s look before each envelope (the first, or a rebuild of a dead
        one), on a history that shows the hub's sequence: no lost payment to this anchor,
        and no lost refund to the partner."""
        self._check_no_lost_partner_refund(ctx)
        self._check_no_lost_payment(ctx, {"stellar_account_id": intent["account"],
                                          "stellar_memo": intent["memo"]}, amount)

    @staticmethod
    def _check_no_lost_partner_refund(ctx: LegContext) -> None:
        """The hub already sent USDC back to the partner under the reference with no
        ``saga_hub_payments`` row: the failover lost the commits of this saga's
        compensation after its refund to the partner left, while the fill and the
        conversion before it survived, so the saga resumed at this leg (20-seed loaded
        campaign at 3c81d47, seed 6: saga 166's anchor refused, the partner was refunded
        12.25 USDC, the failover lost it, the saga funded the anchor's new transaction:
        12.25 paid twice). ``BridgeFill._check_no_lost_refund`` covers a saga that
        resumed at its first leg. Raises ManualReviewError with the evidence, booking the
        compensation as it happened (``fx.convert.undo``, ``bridge.unfill``,
        ``bridge.refund`` under the refund's hash) in the same commit as the stop: the
        hub's books equal its chain, and nothing is paid to the anchor."""
        fill = ctx.output_of("bridge.fill")
        if not fill:
            return
        address = hub.hub_address()
        lost = hub.without_rows([
            t for t in stellar.find_transfers_by_reference(address, ctx.saga.reference,
                                                            ctx.stellar_cursor)
            if t.source == address and t.destination == fill["from"]
            and t.asset == stellar.usdc_asset_id()])
        if not lost:
            return
        partner = _partner(ctx)
        refunds = partner_refunds_account(ctx.saga.input["partner"])
        bookings = []
        converted = ctx.output_of("fx.convert")
        if converted:
            usdc, inr = Decimal(converted["usdc"]), Decimal(converted["inr"])
            bookings.append(Booking("fx.convert.undo", [
                Line(partner, USDC, -usdc), Line(FX, USDC, usdc), Line(FX, INR, -inr),
                Line(PAYABLE, INR, inr)], reference=lost[0].tx_hash))
        for t in lost:
            bookings += [Booking("bridge.unfill", [Line(partner, USDC, t.amount),
                                                   Line(refunds, USDC, -t.amount)],
                                 reference=t.tx_hash),
                         Booking("bridge.refund", [Line(refunds, USDC, t.amount),
                                                   Line(HUB, USDC, -t.amount)],
                                 reference=t.tx_hash)]
        raise ManualReviewError(
            "the hub already refunded the partner under this remittance's reference with "
            "no record of it (commits lost): " + ", ".join(
                f"{t.tx_hash} {format(t.amount, 'f')} USDC" for t in lost)
            + "; booked as its compensation, the anchor not funded", bookings=bookings)

    @staticmethod
    def _check_no_lost_payment(ctx: LegContext, created: dict[str, str],
                               amount: Decimal) -> None:
        """Before the first intent: the hub already paid this anchor ``amount`` since the
        saga started under a memo no leg recorded (``hub.unrecorded``). A failover lost
        the commits of an earlier run of this leg (its intent, the anchor's first
        transaction and memo, the hub payment row; issue 25 §2), while the anchor and the
        chain kept them: paying the new transaction's memo would pay twice, and SEP-31
        gives no way to find the first transaction by anything Corridor still holds.
        Raises ManualReviewError with the evidence (a person matches the payment to the
        anchor's transaction), booking each such payment as the funding it was
        (``anchor.fund:<hash>``: hub -X, anchor +X) in the same commit as the stop, so
        the hub's books equal its chain while the saga waits (the payment is rebuilt from
        the chain; only its anchor transaction is left for the person)."""
        lost = hub.unrecorded(destination=created["stellar_account_id"], amount=amount,
                              memo=created["stellar_memo"], cursor=ctx.stellar_cursor)
        if lost:
            raise ManualReviewError(
                "the hub already paid this anchor " + format(amount, "f") + " USDC since "
                "the saga started with no record of it (commits lost): " + ", ".join(
                    f"{t.tx_hash} memo {t.memo}" for t in lost) + "; booked as this "
                "saga's funding of the anchor, not paid again",
                bookings=[Booking("anchor.fund", [Line(HUB, USDC, -t.amount),
                                                  Line(ANCHOR, USDC, t.amount)],
                                  reference=t.tx_hash) for t in lost])

    @staticmethod
    def _check_not_rejected(intent: dict[str, Any]) -> None:
        """Before paying (and when no earlier envelope of ours may still land: that one is
        re-posted whatever the anchor says, and refunded by it if need be): an anchor
        that already failed the transaction is not funded. A status past
        ``pending_sender`` means it saw a payment the look-up did not: retry, the
        look-up decides."""
        status = anchor31.get_transaction(intent["anchor_tx_id"])
        state = status.get("status")
        if state in (anchor31.ERROR, anchor31.REFUNDED, anchor31.EXPIRED):
            raise NonRetryableError(f"the anchor rejected the transaction before funding: "
                                    f"{state} {status.get('status_message', '')}".strip())
        if state != anchor31.PENDING_SENDER and settings.REMITTANCE_CHAIN_LOOKUP:
            raise RuntimeError(f"the anchor reports {state} but no payment was found "
                               f"under memo {intent['memo']}")

    def compensate(self, ctx: LegContext, output: dict[str, Any]) -> LegOutcome | Pending:
        """Book the anchor's refund (anchor -> hub, same memo) once it is on chain."""
        funded = Decimal(output["amount"])
        try:
            seen = chain_refunds(output, cursor=ctx.stellar_cursor)
        except stellar.HorizonUnavailable as exc:
            return self._wait(ctx, f"Horizon: {exc}")
        refunds, received = seen.refunds, seen.total
        bookings = [Booking("anchor.refund", [Line(HUB, USDC, t.amount),
                                              Line(ANCHOR, USDC, -t.amount)],
                            reference=t.tx_hash) for t in refunds]
        if received > funded:  # the hub holds it: book it, the excess is owed back
            raise ManualReviewError(
                f"the anchor refunded {received}, more than the {funded} it was paid "
                f"(refunds {', '.join(t.tx_hash for t in refunds)}); all booked, "
                f"{received - funded} is owed back to the anchor", bookings=bookings)
        fee = Decimal(0)
        if received < funded:
            fee = self._refund_fee(output, received)
            if fee is None:
                return self._wait(ctx, f"refund {received} of {funded} seen on chain; "
                                       f"{seen.describe()}", history=seen.closed_at)
        if fee:
            bookings.append(Booking("anchor.refund_fee", [Line(ANCHOR, USDC, -fee),
                                                          Line(_partner(ctx), USDC, fee)]))
        return LegOutcome(output={"refunded": str(received), "fee": str(fee),
                                  "refunds": [t.tx_hash for t in refunds]},
                          bookings=bookings)

    @staticmethod
    def _refund_fee(output: dict[str, Any], received: Decimal) -> Decimal | None:
        """The fee the anchor kept (:func:`refund_fee`, on its record read now); None
        while it is not known."""
        try:
            tx = anchor31.get_transaction(output["anchor_tx_id"])
        except anchor31.AnchorError:
            return None
        return refund_fee(tx, funded=Decimal(output["amount"]), received=received)

    @staticmethod
    def _wait(ctx: LegContext, reason: str, *, history: datetime | None = None) -> Pending:
        """Wait for the anchor's refund; past REMITTANCE_REFUND_DEADLINE_S stop for a
        person, unless the chain read (``history``: when the ledger its Horizon history
        reached closed) does not cover the deadline yet (issue 25 §1: decide on
        evidence that covers the moment, or wait). A refund after the stop is the
        late-money sweep's."""
        deadline = _since_compensating(ctx) + timedelta(
            seconds=settings.REMITTANCE_REFUND_DEADLINE_S)
        if timezone.now() > deadline and history is not None and history < deadline:
            return Pending(settings.REMITTANCE_ANCHOR_POLL_S,
                           f"Horizon's history (closed {history.isoformat()}) does not "
                           f"reach the refund deadline {deadline.isoformat()} yet: {reason}")
        if timezone.now() > deadline:
            raise ManualReviewError(f"no refund from the anchor by {deadline.isoformat()}: "
                                    f"{reason}")
        return Pending(settings.REMITTANCE_ANCHOR_POLL_S, f"waiting for the anchor's refund: "
                                                          f"{reason}")


# --- 3 ------------------------------------------------------------------------------

class AnchorPayout(Leg):
    """The funded anchor pays the beneficiary."""

    kind = "anchor.payout"
    max_attempts = 8

    def forward(self, ctx: LegContext) -> LegOutcome | Pending:
        fund = ctx.output_of("anchor.fund")
        read_at = timezone.now()
        try:
            tx = anchor31.get_transaction(fund["anchor_tx_id"])
        except anchor31.AnchorError as exc:
            if ctx.attempt >= self.max_attempts:
                raise ManualReviewError(f"the funded anchor did not answer after "
                                        f"{ctx.attempt} attempts: {exc}")
            raise
        status = tx.get("status")
        message = tx.get("status_message") or ""
        refunded, _ = anchor31.refunds_of(tx)
        if status == anchor31.COMPLETED:
            usdc, inr = _amount(ctx), Decimal(ctx.saga.input["receive_amount"])
            lines = [Line(ANCHOR, USDC, -usdc), Line(FX, USDC, usdc),
                     Line(PAYABLE, INR, inr), Line(FX, INR, -inr)]
            return LegOutcome(
                output={"anchor_tx_id": fund["anchor_tx_id"], "status": status,
                        "external_transaction_id": tx.get("external_transaction_id", "")},
                bookings=[Booking("anchor.payout", lines, reference=fund["anchor_tx_id"])])
        if status == anchor31.REFUNDED or (status == anchor31.ERROR and refunded > 0):
            raise NonRetryableError(f"the anchor refunded the payment ({status}, "
                                    f"{refunded} USDC): {message}".strip())
        funded_at = datetime.fromisoformat(fund["funded_at"])
        if status == anchor31.ERROR:
            # An anchor that failed the transaction refunds asynchronously (one that
            # rejected it just before our payment landed refunds that payment): give the
            # refund a grace period before calling it "no refund".
            grace = funded_at + timedelta(seconds=settings.REMITTANCE_ERROR_REFUND_GRACE_S)
            if read_at <= grace:
                return Pending(settings.REMITTANCE_ANCHOR_POLL_S,
                               f"anchor: error, waiting for a refund until {grace.isoformat()}")
            return self._no_refund(ctx, fund, message=message, read_at=read_at, grace=grace)
        deadline = funded_at + timedelta(seconds=settings.REMITTANCE_PAYOUT_DEADLINE_S)
        if timezone.now() > deadline:
            raise ManualReviewError(f"the anchor is still {status} past {deadline.isoformat()}")
        return Pending(settings.REMITTANCE_ANCHOR_POLL_S, f"anchor: {status}")


    @staticmethod
    def _no_refund(ctx: LegContext, fund: dict[str, Any], *, message: str,
                   read_at: datetime, grace: datetime) -> Pending:
        """The anchor's record said ``error`` with no refund at ``read_at``, past the
        grace ``grace``. "No refund by ``grace``" is decided only on evidence that covers
        that moment (issue 25 §1): the chain is read too, from a Horizon whose history
        (root's ``history_latest_ledger_closed_at``, read first) reaches ``grace``. A
        refund on chain the anchor's record does not show yet -> NonRetryableError (the
        compensation books it and waits for the record where it must); history not
        there yet -> wait, up to REMITTANCE_PAYOUT_DEADLINE_S after the funding, then
        stop saying what is not proven. A refund that lands after the decision is the
        late-money sweep's (sagas/latemoney.py). Raises ManualReviewError with the
        evidence."""
        poll = settings.REMITTANCE_ANCHOR_POLL_S
        try:
            seen = chain_refunds(fund, cursor=ctx.stellar_cursor)
        except stellar.HorizonUnavailable as exc:
            return Pending(poll, f"anchor: error; Horizon unreadable to look for its "
                                 f"refund: {exc}")
        record = (f"the anchor's record read at {read_at.isoformat()}: error, refunds "
                  f"none ({message or 'no message'})")
        if seen.refunds:
            raise NonRetryableError(f"the anchor refunded {seen.total} USDC on chain while "
                                    f"its record still said error; {seen.describe()}")
        if seen.closed_at >= grace:
            raise ManualReviewError(
                f"the anchor failed a payout it was funded for, with no refund: {message}; "
                f"evidence: {record}; {seen.describe()}; grace ended {grace.isoformat()}"
                .replace(": ;", ":"))
        give_up = datetime.fromisoformat(fund["funded_at"]) + timedelta(
            seconds=settings.REMITTANCE_PAYOUT_DEADLINE_S)
        if timezone.now() > give_up:
            raise ManualReviewError(
                f"the anchor failed a payout it was funded for; whether it refunded is not "
                f"proven: Horizon's history stayed before {grace.isoformat()}: {record}; "
                f"{seen.describe()}")
        return Pending(poll, f"anchor: error; Horizon's history (ledger {seen.ledger}, "
                             f"closed {seen.closed_at.isoformat()}) does not reach "
                             f"{grace.isoformat()} yet")


REMITTANCE = register(Plan("remittance", (BridgeFill(), FxConvert(), AnchorFund(),
                                          AnchorPayout())))
