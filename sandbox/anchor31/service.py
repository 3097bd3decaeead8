"""Hooks of the SEP-31 receiving-anchor stand-in for ``sandbox.registry``.

- ``reset()``: empties this stand-in's tables and extends the fixed world with the
  corridor's accounts (``sandbox.anchor31.world``: hub, partner, anchor), then points
  the payment watcher just past their creation. Runs after Horizon's reset (``STANDINS``
  order).
- ``background(stop)``: creates those accounts on a first start without ``--reset``,
  then runs the payment watcher (``observer``) in its own thread and the status worker
  (``machine``) in this one.

Fault switches of this stand-in (set with ``POST /sandbox/faults``):
``anchor31.reject_before_funding``, ``anchor31.refund_after_funding``,
``anchor31.fail_payout``, ``anchor31.slow`` ``{"seconds"}``, ``anchor31.step_delay``
``{"seconds"}``, ``anchor31.refund_short`` ``{"short", "fee"}``
(``sandbox.anchor31.machine``) and ``anchor31.http_5xx`` (the next
``times`` SEP-31 API calls answer 503 before doing anything; ``sandbox.anchor31.views``).
"""

from __future__ import annotations

import logging
import threading

from django.db import connections, transaction

from sandbox.anchor31 import machine, observer, world
from sandbox.anchor31.models import Sep31Payment, Sep31Refund, Sep31Transaction
from sandbox.keys import ANCHOR31

log = logging.getLogger(__name__)

DB = "sandbox"


def reset() -> None:
    """Empty every transaction, payment and refund; make sure the hub, partner and
    anchor accounts exist on the (freshly reset) ledger; restart the watcher after the
    anchor account's newest operation."""
    with transaction.atomic(using=DB):
        Sep31Refund.objects.using(DB).all().delete()
        Sep31Payment.objects.using(DB).all().delete()
        Sep31Transaction.objects.using(DB).all().delete()
    world.ensure_accounts()
    with transaction.atomic(using=DB):
        observer.reset_state(world.latest_payment_token(ANCHOR31.public_key))


def _ensure_world(stop: threading.Event) -> None:
    """First start without a reset: wait for Horizon's world, then add ours."""
    while not stop.is_set():
        try:
            if world.ensure_accounts():
                with transaction.atomic(using=DB):
                    observer.reset_state(world.latest_payment_token(ANCHOR31.public_key))
            return
        except Exception:
            log.exception("anchor31: could not create the corridor accounts; retrying")
            connections[DB].close()
            stop.wait(1.0)


def background(stop: threading.Event) -> None:
    """Create the accounts if needed, then watch payments and run the status worker
    until ``stop`` is set."""
    _ensure_world(stop)
    watcher = threading.Thread(target=observer.run, args=(stop,), name="sandbox.anchor31-observer",
                               daemon=True)
    watcher.start()
    try:
        machine.run(stop)
    finally:
        watcher.join(timeout=5)
