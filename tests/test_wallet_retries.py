"""The sandbox's customers retry a transient answer as a wallet would (issue 25 §3:
``make demo`` ended in a traceback on one ``504 No ledger closed in time`` from
``fund_usdc`` on a loaded machine): bounded, logged, and never twice what landed."""

from __future__ import annotations

import logging
import threading
from decimal import Decimal

import pytest

from sandbox.drivers import Wallet


@pytest.fixture
def quick(settings):
    settings.SANDBOX_DRIVER_RETRIES = 4
    settings.SANDBOX_DRIVER_RETRY_WAIT_S = 1.0
    return settings


def _no_ledger_closes_for(sandbox, seconds: float) -> threading.Timer:
    sandbox.fault("horizon.close_hold")
    timer = threading.Timer(seconds, lambda: sandbox.fault("horizon.close_hold", times=0))
    timer.start()
    return timer


def test_funding_answered_504_is_retried_and_lands_once(clean_sandbox, quick, caplog):
    wallet = Wallet(clean_sandbox)
    timer = _no_ledger_closes_for(clean_sandbox, 2.5)  # the answer: 504 after 2 s
    try:
        with caplog.at_level(logging.WARNING, logger="sandbox.drivers"):
            wallet.fund_usdc("100")
    finally:
        timer.cancel()
        clean_sandbox.fault("horizon.close_hold", times=0)

    assert wallet.usdc_balance() == Decimal("100")
    assert any("fund USDC" in r.getMessage() and "504" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_payment_answered_504_is_submitted_again_not_paid_twice(clean_sandbox, quick):
    payer, payee = Wallet(clean_sandbox), Wallet(clean_sandbox)
    payer.fund_usdc("100")
    timer = _no_ledger_closes_for(clean_sandbox, 2.5)
    try:
        payer.pay(destination=payee.address, amount="10", memo="7")
    finally:
        timer.cancel()
        clean_sandbox.fault("horizon.close_hold", times=0)

    assert [p["amount"] for p in payee.usdc_payments()] == ["10.0000000"]
