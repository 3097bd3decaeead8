"""One dedupe-and-apply service for at-least-once deliveries (issue 10 §5): the
Razorpay payment webhooks (anchor/callbacks.py), the RazorpayX payout webhooks
(payouts/webhooks.py) and AP's events all go through :func:`record_and_apply`.

The dedupe row (``inbound_events``, unique on source + event id, DESIGN.md §3) and the
event's effect commit in ONE transaction: a crash or an exception between the two
rolls both back, so the sender's redelivery is applied (never taken for a
duplicate), and a replay finds the row and applies nothing. A concurrent duplicate
blocks on the unique index until the first delivery commits (then it is a
duplicate) or rolls back (then it applies). ``apply`` therefore runs with that row
locked: it may make bounded outbound calls (every client has a timeout), and defers
anything that must follow the commit to ``transaction.on_commit``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, transaction

from anchor.models import InboundEvent

DUPLICATE = "duplicate"


def record_and_apply(*, source: str, event_id: str, event_type: str,
                     apply: Callable[[], str]) -> str:
    """Record delivery ``(source, event_id)`` and run ``apply()`` in one transaction.

    ``source``: an ``InboundEvent.Source`` value (ap, razorpay, razorpayx);
    ``event_id``, ``event_type``: already checked to fit their columns
    (``callbacks.event_id_checked``). ``apply`` returns the outcome (text, kept in
    ``inbound_events.outcome``, cut to 200 characters). Returns ``"duplicate"``
    without calling ``apply`` when the delivery was recorded before, else the outcome.
    Whatever ``apply`` raises propagates and leaves no row. Call it outside any open
    transaction: inside one, a rollback of the caller would also drop the row."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = InboundEvent.objects.create(source=source, event_id=event_id,
                                                  event_type=event_type, outcome="received")
        except IntegrityError:
            return DUPLICATE
        outcome = apply()
        InboundEvent.objects.filter(pk=row.pk).update(outcome=str(outcome)[:200])
    return outcome
