"""The ``hub_return`` plan: USDC that arrived at the hub under a memo no saga owns is
booked in suspense and returned to its sender once, through the hub's outbox (issue 25
§2). Started by the late-money sweep (``sagas/latemoney.py`` ``unmatched_check``), one
saga per payment (reference ``unmatched:<hash>``, so two sweeps, or a sweep whose
commits a failover lost, start it once). The case it was made for (the loaded chaos
campaign, seeds 2 and 3): a failover lost the commits that created two remittances after
``POST /api/remittances`` had answered 202 with the hub account and the memo; the
partner paid 10.25 and 12.25 USDC under those memos, and nothing owned them.

Input: ``{"hash", "from", "amount" (USDC, 7 dp), "asset", "memo_type", "memo", "at"}``
of the payment; the saga's ``stellar_cursor`` is the payment's paging token (its return
can only come after it). Legs::

    0 hub.unmatched  ledger only
                     hub.unmatched  USDC  hub +X   owed:hub-unmatched -X   (key: its hash)
    1 hub.return     a memo that is no remittance reference (``remittances.is_reference``:
                     an anchor's refund whose funding's record was lost, a stranger) ->
                     ManualReviewError, the USDC left in suspense. Else look for an
                     unrecorded hub payment of X since the payment (a lost saga may have
                     moved it already): its refund to the sender under the memo ->
                     booked as the return, nothing paid; another one (an anchor funded?)
                     -> ManualReviewError with the evidence, that payment booked as
                     ``anchor.fund`` (hub -X, anchor:anchor31 +X, key
                     ``anchor.fund:<hash>``, as the remittance books it), the USDC left in
                     suspense; none -> commit the intent, pay X back to the sender under
                     ``hub.return_memo(hash)`` (``hub.pay``: the look-up by that memo
                     first, so a run that died between paying and booking never pays
                     again)
                     hub.return     USDC  owed:hub-unmatched +X   hub -X   (key: the
                     return's hash)

Nothing to compensate: the payment was never the saga's to keep.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from anchor import stellar
from ledger.models import Entry
from ledger.services import Line
from sagas import hub, remittances
from sagas.legs import Booking, Leg, LegContext, LegOutcome, ManualReviewError, Pending, Plan
from sagas.plans import register, remittance

KIND = "hub_return"
USDC = "USDC"
HUB = "hub"
SUSPENSE = "owed:hub-unmatched"
HUB_BUSY_RETRY_S = 0.5


def reference_for(payment_hash: str) -> str:
    """The saga reference of the return of payment ``payment_hash`` (hex)."""
    return f"unmatched:{payment_hash}"


def _amount(ctx: LegContext) -> Decimal:
    return Decimal(ctx.saga.input["amount"])


class HubUnmatched(Leg):
    """Book the payment on the hub, owed back to its sender."""

    kind = "hub.unmatched"

    def forward(self, ctx: LegContext) -> LegOutcome:
        amount, payment_hash = _amount(ctx), ctx.saga.input["hash"]
        return LegOutcome(
            output={"hash": payment_hash, "amount": str(amount)},
            bookings=[Booking("hub.unmatched", [Line(HUB, USDC, amount),
                                                Line(SUSPENSE, USDC, -amount)],
                              reference=payment_hash)])


class HubReturn(Leg):
    """Pay the sender back once, unless a lost saga's own payment already moved it."""

    kind = "hub.return"
    max_attempts = 8

    def forward(self, ctx: LegContext) -> LegOutcome | Pending:
        inp, amount = ctx.saga.input, _amount(ctx)
        payment = hub.Payment(destination=inp["from"], amount=amount, memo_type="hash",
                              memo=hub.return_memo(inp["hash"]))
        if ctx.intent is None:
            if not remittances.is_reference(inp["memo_type"], inp["memo"]):
                # Only a remittance reference is a memo Corridor told someone to pay
                # under; anything else (an anchor's refund of a funding whose record a
                # failover lost, a stranger's payment) is not returned blindly.
                raise ManualReviewError(
                    f"{amount} USDC from {inp['from']} under {inp['memo_type']} memo "
                    f"{inp['memo']!r} ({inp['hash']}) arrived at the hub for no saga, under "
                    f"no reference Corridor issued: booked in {SUSPENSE}, not returned; a "
                    "person returns it or matches it (an anchor's refund?)")
            refunded = self._lost_movements(ctx, payment)
            if refunded is not None:
                return refunded
            ctx.commit_intent({"to": payment.destination, "amount": str(amount),
                               "memo_type": payment.memo_type, "memo": payment.memo})
        try:
            tx_hash = hub.pay(ctx, payment, crash_name="hub.return.paid")
        except (hub.HubBusy, hub.HubPaymentUnknown) as exc:
            return Pending(HUB_BUSY_RETRY_S, str(exc))
        return _returned(tx_hash, amount, to=payment.destination)

    @staticmethod
    def _lost_movements(ctx: LegContext, payment: hub.Payment) -> LegOutcome | None:
        """Before the first intent: the hub's payments of exactly this amount after the
        unmatched one that nothing in Corridor records (no ``saga_hub_payments`` row,
        no ledger entry under their hash). Every hub payment's row commits before its
        envelope is sent, so one with none is a payment whose commits a failover lost
        with the saga that owned this money: its refund to the sender under the
        payment's memo -> that was the return (booked, nothing paid again); any other
        -> ManualReviewError with the evidence (the lost saga may have funded an
        anchor with it: returning it too would pay twice). Raises
        stellar.HorizonUnavailable (retried)."""
        inp, address = ctx.saga.input, hub.hub_address()
        amount = Decimal(inp["amount"])
        out = [t for t in stellar.transfers_after(address, ctx.stellar_cursor)
               if t.source == address and t.amount == amount
               and t.asset == stellar.usdc_asset_id() and t.memo != payment.memo]
        unrowed = hub.without_rows(out)
        booked = set(Entry.objects.filter(reference__in=[t.tx_hash for t in unrowed])
                     .values_list("reference", flat=True))
        lost = [t for t in unrowed if t.tx_hash not in booked]
        if not lost:
            return None
        for t in lost:
            if t.destination == inp["from"] and t.memo == inp["memo"]:
                return _returned(t.tx_hash, amount, to=t.destination, lost=True)
        raise ManualReviewError(
            f"{amount} USDC from {inp['from']} under memo {inp['memo']} ({inp['hash']}) "
            f"arrived at the hub for no saga, and the hub has since paid that amount with "
            f"no record of it (commits lost): " + ", ".join(
                f"{t.tx_hash} to {t.destination} memo {t.memo}" for t in lost)
            + "; the saga that owned this money may have funded an anchor with it: not "
              f"returned, booked in {SUSPENSE}, each such payment booked as an anchor's "
              "funding; a person returns it or matches it",
            # As ``AnchorFund._check_no_lost_payment`` books it (same kind, lines and
            # key): the hub's books equal its chain while a person decides, and a saga
            # that finds the same payment later replays the entry.
            bookings=[Booking("anchor.fund", [Line(HUB, USDC, -t.amount),
                                              Line(remittance.ANCHOR, USDC, t.amount)],
                              reference=t.tx_hash) for t in lost])


def _returned(tx_hash: str, amount: Decimal, *, to: str, lost: bool = False) -> LegOutcome:
    output: dict[str, Any] = {"tx_hash": tx_hash, "to": to, "amount": str(amount)}
    if lost:
        output["found_unrecorded"] = True
    return LegOutcome(output=output, bookings=[
        Booking("hub.return", [Line(SUSPENSE, USDC, amount), Line(HUB, USDC, -amount)],
                reference=tx_hash)])


HUB_RETURN = register(Plan(KIND, (HubUnmatched(), HubReturn())))
