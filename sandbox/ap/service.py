"""Hooks of the AP stand-in for ``sandbox.registry``: the event delivery loop, the
payment observer and reset.

Fault switches of this stand-in (set with ``POST /sandbox/faults``):
``ap.event_lose``, ``ap.event_duplicate``, ``ap.event_reorder`` (``sandbox.ap.events``),
``ap.rpc_32603_unindexed_hash``, ``ap.rpc_slow``, ``ap.next_withdraw_memo``
(``sandbox.ap.rpc``), ``ap.require_aud``, ``ap.stale_status`` (``sandbox.ap.views``),
``ap.asset_decimals`` (``sandbox.ap.assets``), ``ap.observer_off``, ``ap.observer_miss``,
``ap.observer_match_first`` (``sandbox.ap.observer``).
"""

from __future__ import annotations

import threading

from django.db import transaction

from sandbox.ap import events, observer
from sandbox.ap.models import ApEvent, ApQuote, ApTransaction

DB = "sandbox"


def background(stop: threading.Event) -> None:
    """Run the payment observer (NOTES §4.3 step 5) in its own thread and deliver events
    to Corridor (NOTES §3.3) in this one, until ``stop`` is set."""
    watcher = threading.Thread(target=observer.run, args=(stop,), name="sandbox.ap-observer",
                               daemon=True)
    watcher.start()
    try:
        events.run(stop)
    finally:
        watcher.join(timeout=5)


def reset() -> None:
    """Empty the AP stand-in: every transaction, quote and event, delivered or not, and
    the observer's cursor and observations (it restarts from the latest payment)."""
    with transaction.atomic(using=DB):
        ApEvent.objects.using(DB).all().delete()
        ApTransaction.objects.using(DB).all().delete()
        ApQuote.objects.using(DB).all().delete()
        observer.reset_state()
