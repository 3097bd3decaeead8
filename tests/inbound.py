"""A stored provider webhook's outcome (anchor/inbox.py ``store``): the webhook answers
``received``; the drain applies it and writes the outcome on its row."""

from __future__ import annotations

from anchor import inbox
from anchor.models import InboundEvent


def applied_outcome(source: str, event_id: str) -> str:
    """Drain (as the woken worker would; a no-op when it already ran) and return the
    outcome on the row of ``(source, event_id)``."""
    inbox.drain()
    return InboundEvent.objects.get(source=source, event_id=event_id).outcome
