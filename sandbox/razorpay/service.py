"""Hooks of the Razorpay stand-in for ``sandbox.registry``.

- ``background(stop)``: the webhook delivery loop, the late captures of fault
  ``razorpay.payment_failed_then_captured``, the pay-in settlements, the RazorpayX payout
  life cycle (settle, reverse) and the endings of pending fund account validations, until
  ``stop`` is set;
- ``reset()``: empty the stand-in's tables.

Fault switches of this stand-in (``sandbox.control.faults``), documented in
``sandbox.razorpay.payins``: ``razorpay.webhook_replay``, ``razorpay.webhook_lose``,
``razorpay.webhook_reorder``, ``razorpay.payment_failed_then_captured``; in
``sandbox.razorpay.settlements``: ``razorpay.settlement_omit_payment``,
``razorpay.settlement_fee_mismatch``, ``razorpay.settlement_delay``; and in
``sandbox.razorpay.payouts``: ``razorpayx.settle_delay``,
``razorpayx.payout_stuck_processing``, ``razorpayx.processed_then_reversed``,
``razorpayx.fail_payout``, ``razorpayx.create_5xx_after_create``,
``razorpayx.webhook_before_create_returns``, ``razorpayx.webhook_duplicate``,
``razorpayx.webhook_reorder``, ``razorpayx.webhook_lose``,
``razorpayx.reversal_statement_only``, ``razorpayx.statement_fee_mismatch`` (the statement
rows themselves: ``sandbox.razorpay.statement``); and in
``sandbox.razorpay.refunds``: the ``razorpay.refund_*`` switches (refund life cycle:
pending -> processed | failed after the settle delay).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, connections

from sandbox.razorpay import payins, payouts, refunds, settlements, validations, webhooks

log = logging.getLogger(__name__)

TICK_S = 0.05  # how often due work is looked for when nothing wakes the loop
SENDERS = 8  # concurrent deliveries (fault razorpay.webhook_replay with concurrent: true)


def background(stop: threading.Event) -> None:
    """Deliver due webhooks, run due late captures, payout steps and validation endings
    until ``stop`` is set."""
    with ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="razorpay-webhook") as pool:
        try:
            while not stop.is_set():
                try:
                    payins.capture_due_late_payments()
                    settlements.advance_due()
                    payouts.advance_due()
                    refunds.advance_due()
                    validations.advance_due()
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
    """Empty contacts, fund accounts, fund account validations, payouts, idempotency keys,
    the RazorpayX statement, settlements, orders, payments, webhook events and
    deliveries."""
    payouts.reset()
    refunds.reset()
    payins.reset()
