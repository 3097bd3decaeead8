"""Hooks of the Razorpay stand-in for ``sandbox.registry``.

- ``background(stop)``: the webhook delivery loop (and the late captures of fault
  ``razorpay.payment_failed_then_captured``), until ``stop`` is set;
- ``reset()``: empty the stand-in's tables.

Fault switches of this stand-in (``sandbox.control.faults``), documented in
``sandbox.razorpay.payins``: ``razorpay.webhook_replay``, ``razorpay.webhook_lose``,
``razorpay.webhook_reorder``, ``razorpay.payment_failed_then_captured``.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connections

from sandbox.razorpay import payins, webhooks

log = logging.getLogger(__name__)

TICK_S = 0.05  # how often due work is looked for when nothing wakes the loop
SENDERS = 8  # concurrent deliveries (fault razorpay.webhook_replay with concurrent: true)


def background(stop: threading.Event) -> None:
    """Deliver due webhooks and run due late captures until ``stop`` is set."""
    with ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="razorpay-webhook") as pool:
        try:
            while not stop.is_set():
                try:
                    payins.capture_due_late_payments()
                    webhooks.dispatch_due(pool)
                except DatabaseError:
                    # The database went away or the tables were being reset: reconnect on
                    # the next tick rather than end the loop.
                    log.exception("razorpay webhook loop: database error")
                    connections[payins.DB].close()
                webhooks.wait_for_work(TICK_S)
        finally:
            webhooks.close()
            connections[payins.DB].close()


def reset() -> None:
    """Empty orders, payments, webhook events and deliveries."""
    payins.reset()
