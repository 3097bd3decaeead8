"""Stellar's TypeScript wallet SDK (``@stellar/typescript-wallet-sdk`` 1.10.0, installed
by ``npm ci`` from package-lock.json; README) against the sandbox AP (issue 14): SEP-1,
SEP-10 with a fresh account, SEP-24 info, an interactive deposit started, read back and
listed, then carried to ``completed`` (the test plays the webview with the HTTP
customer driver and runs Corridor's release as its worker would) while the SDK's
watcher follows it. The node script is
tests/wallet/sdk_flow.mjs; it prints one JSON object per step.

Skips with the reason when node or the SDK is absent; fails instead under CI=true."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from django.conf import settings

from anchor import deposits, releases
from anchor.models import DepositPayment, DepositRelease
from tests.conftest import ROOT
from tests.flows import Customer, Wallet, purge_broker, settle, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
SDK = ROOT / "node_modules" / "@stellar" / "typescript-wallet-sdk"


def _node() -> str:
    node = shutil.which("node")
    missing = ("node is not installed (apt-get install nodejs npm)" if node is None else
               "the wallet SDK is not installed (npm ci)" if not SDK.exists() else "")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} (CI=true: this test never skips)")
        pytest.skip(missing)
    return node


def _play_the_webview(sandbox, started: dict) -> None:
    """The customer in the wallet's webview (the HTTP driver), then what Corridor's
    worker does: AP told, the release made and settled."""
    transaction_id = started["id"]
    customer = Customer(sandbox)
    customer.pay(customer.submit_amount(started["url"], "1000"))
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment recorded")
    purge_broker()
    deposits.notify_funds_received(transaction_id=transaction_id)
    releases.release_start(transaction_id=transaction_id)
    settle(transaction_id)


def test_the_typescript_wallet_sdk_deposits_to_completed(clean_sandbox):
    node = _node()
    sandbox = clean_sandbox
    wallet = Wallet(sandbox)
    process = subprocess.Popen(
        [node, str(ROOT / "tests" / "wallet" / "sdk_flow.mjs")], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "SANDBOX_URL": sandbox.url, "WALLET_SECRET": wallet.keypair.secret,
             "NETWORK_PASSPHRASE": settings.STELLAR_NETWORK_PASSPHRASE})
    steps, output = {}, []
    try:
        for line in process.stdout:
            output.append(line)
            if not line.startswith("{"):
                continue
            step = json.loads(line)
            steps[step["event"]] = step
            if step["event"] == "deposit_listed":  # the webview, then Corridor's release
                purge_broker()
                _play_the_webview(sandbox, steps["deposit_started"])
            if step["event"] in ("done", "error"):
                break
        process.wait(timeout=15)
    finally:
        process.kill()
    assert "done" in steps, "".join(output)[-4000:]

    from sandbox.ap import sep10

    assert steps["sep1"]["signingKey"] == sep10.SIGNING_KEY.public_key
    assert steps["sep1"]["webAuthEndpoint"] == f"{sandbox.url}/ap/sep/auth"
    assert steps["sep1"]["currencies"] == ["USDC"]
    assert steps["sep10"]["account"].startswith("G")
    assert steps["sep24_info"] == {"event": "sep24_info", "deposit": ["USDC"],
                                   "withdraw": ["USDC"]}
    started = steps["deposit_started"]
    assert started["type"] == "interactive_customer_info_needed"
    assert (steps["deposit_read"]["id"], steps["deposit_read"]["kind"]) == (
        started["id"], "deposit")
    assert steps["deposit_listed"]["ids"] == [started["id"]]
    final = steps["deposit_final"]
    assert final["status"] == "completed", final
    release = DepositRelease.objects.get(transaction_id=started["id"])
    assert final["stellar_transaction_id"] == release.tx_hash
    assert [p["transaction_hash"] for p in wallet.usdc_payments()] == [release.tx_hash]
