"""Celery tasks of the ledger: thin and safe to run twice (STYLE.md)."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings

from common.sweeps import Sweep
from ledger import services

log = logging.getLogger(__name__)


@shared_task(base=Sweep)
def rollup_balances() -> int:
    """Beat, every LEDGER_ROLLUP_PERIOD_S: sync the hot flags, then fold the hot
    accounts' deltas into their balances, LEDGER_ROLLUP_BATCH per transaction, until
    none is left or one period has passed (the next run goes on). Returns how many
    deltas were folded."""
    services.sync_hot_flags()
    deadline = time.monotonic() + settings.LEDGER_ROLLUP_PERIOD_S
    total = 0
    while True:
        folded = services.rollup()
        total += folded
        if folded < settings.LEDGER_ROLLUP_BATCH or time.monotonic() >= deadline:
            break
    if total:
        log.info("rolled up %d ledger deltas", total)
    return total
