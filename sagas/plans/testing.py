"""Test plans: the shape of the remittance (DESIGN.md §6) with the ledger only.

``testing`` — four ledger-only legs, one entry each, keyed on the step
(``{saga_id}:{idx}``); each compensation books the exact reverse under
``{saga_id}:{idx}:undo``. One commit per leg.

    0 test.fill     USDC  test:partner -a        test:hub +a
    1 test.convert  USDC  test:hub -a            test:fx +a
                    INR   test:fx -a*rate        test:payable +a*rate
    2 test.fund     INR   test:payable -x        test:anchor +x       (x = output of 1)
    3 test.payout   INR   test:anchor -x         test:beneficiary +x  (x = output of 2)

``testing.external`` — the same legs, each committing its intent before its (simulated)
external side effect: two commits per leg (ledger-and-sagas.md §1.1, §7 rule 3).

Input: ``{"amount": "10.00" (USDC), "rate": "85" (INR per USDC), "faults": {...}}``.
Faults are the engine's (``sagas/engine.py``), not the plan's.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ledger.services import Line
from sagas.legs import Booking, Leg, LegContext, LegOutcome, Plan
from sagas.plans import register

USDC = "USDC"
INR = "INR"


def _amount(ctx: LegContext) -> Decimal:
    return Decimal(str(ctx.saga.input.get("amount", "10.00")))


def _inr(ctx: LegContext) -> Decimal:
    return Decimal(ctx.outputs[1]["inr"]) if ctx.outputs[1] else Decimal(0)


def _fill(ctx: LegContext) -> tuple[list[Line], dict]:
    a = _amount(ctx)
    return [Line("test:partner", USDC, -a), Line("test:hub", USDC, a)], {"usdc": str(a)}


def _convert(ctx: LegContext) -> tuple[list[Line], dict]:
    a = Decimal(ctx.outputs[0]["usdc"])
    inr = (a * Decimal(str(ctx.saga.input.get("rate", "85")))).quantize(Decimal("0.01"))
    return ([Line("test:hub", USDC, -a), Line("test:fx", USDC, a),
             Line("test:fx", INR, -inr), Line("test:payable", INR, inr)], {"inr": str(inr)})


def _fund(ctx: LegContext) -> tuple[list[Line], dict]:
    x = _inr(ctx)
    return [Line("test:payable", INR, -x), Line("test:anchor", INR, x)], {"inr": str(x)}


def _payout(ctx: LegContext) -> tuple[list[Line], dict]:
    x = _inr(ctx)
    return [Line("test:anchor", INR, -x), Line("test:beneficiary", INR, x)], {"inr": str(x)}


class LedgerLeg(Leg):
    """A leg whose whole effect is one ledger entry; its compensation is the reverse
    entry. ``external``: commit an intent first, as a leg that pays out would."""

    def __init__(self, kind: str, lines: Callable[[LegContext], tuple[list[Line], dict]],
                 *, external: bool = False):
        self.kind = kind
        self._lines = lines
        self.external = external

    def forward(self, ctx: LegContext) -> LegOutcome:
        lines, output = self._lines(ctx)
        if self.external and ctx.intent is None:
            ctx.commit_intent({"reference": ctx.idempotency_key,
                               "lines": [[x.account, x.currency, str(x.amount)] for x in lines]})
        output = {**output, "lines": [[x.account, x.currency, str(x.amount)] for x in lines]}
        return LegOutcome(output=output, bookings=[Booking(self.kind, lines)])

    def compensate(self, ctx: LegContext, output: dict[str, Any]) -> LegOutcome:
        lines = [Line(code, ccy, -Decimal(amount)) for code, ccy, amount in output["lines"]]
        return LegOutcome(output={"reversed": len(lines)},
                          bookings=[Booking(f"{self.kind}.undo", lines)])


LEGS = (("test.fill", _fill), ("test.convert", _convert), ("test.fund", _fund),
        ("test.payout", _payout))

TESTING = register(Plan("testing", tuple(LedgerLeg(kind, fn) for kind, fn in LEGS)))
TESTING_EXTERNAL = register(Plan(
    "testing.external", tuple(LedgerLeg(kind, fn, external=True) for kind, fn in LEGS)))
