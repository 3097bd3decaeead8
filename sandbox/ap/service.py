"""Hooks of the AP stand-in for ``sandbox.registry``: the event delivery loop and reset.

Fault switches of this stand-in (set with ``POST /sandbox/faults``):
``ap.event_lose``, ``ap.event_duplicate``, ``ap.event_reorder`` (``sandbox.ap.events``),
``ap.rpc_32603_unindexed_hash``, ``ap.rpc_slow`` (``sandbox.ap.rpc``),
``ap.require_aud``, ``ap.stale_status`` (``sandbox.ap.views``).
"""

from __future__ import annotations

import threading

from django.db import transaction

from sandbox.ap import events
from sandbox.ap.models import ApEvent, ApTransaction

DB = "sandbox"


def background(stop: threading.Event) -> None:
    """Deliver events to Corridor until ``stop`` is set (NOTES §3.3)."""
    events.run(stop)


def reset() -> None:
    """Empty the AP stand-in: every transaction and every event, delivered or not."""
    with transaction.atomic(using=DB):
        ApEvent.objects.using(DB).all().delete()
        ApTransaction.objects.using(DB).all().delete()
