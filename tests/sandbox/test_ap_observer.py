"""AP's payment observer in the sandbox (``sandbox.ap.observer``), over real HTTP.

Each test starts a SEP-24 withdrawal through the wallet-facing endpoint, assigns it the
distribution account and an id memo with ``request_onchain_funds``, pays the distribution
account on the sandbox Horizon with stellar-sdk, and reads what AP made of it: the
transaction (``GET /ap/platform/transactions/{id}``) and the observer's record of the
payment (sandbox-only ``GET /ap/sandbox/observer``, written after the observer's RPC
returned, so the tests wait on it instead of sleeping). NOTES §4.4 and §6 faults 4, 5, 6,
11, 12, 13, 18, 20.
"""

from __future__ import annotations

import secrets
import time
from decimal import Decimal

import httpx
import jwt
import pytest
from django.conf import settings
from stellar_sdk import Account, Asset, Keypair, MuxedAccount, Server, TransactionBuilder

from sandbox import keys
from sandbox.ap import observer

pytestmark = pytest.mark.django_db(transaction=True)

USDC = f"stellar:USDC:{keys.USDC_ISSUER.public_key}"
USDC_SEP11 = f"USDC:{keys.USDC_ISSUER.public_key}"
INR = "iso4217:INR"
DISTRIBUTION = keys.DISTRIBUTION.public_key
UINT64_MAX = "18446744073709551615"
REQUESTED = {"amount_in": {"amount": "10", "asset": USDC},
             "amount_out": {"amount": "830", "asset": INR},
             "fee_details": {"total": "0.5", "asset": USDC}}


# --- AP and Horizon over HTTP --------------------------------------------------------------


def platform_headers() -> dict:
    issued = int(time.time())
    token = jwt.encode({"iat": issued, "exp": issued + 60, "aud": "platform_api"},
                       settings.AP_PLATFORM_AUTH_SECRET, algorithm="HS256")
    return {"Authorization": f"Bearer {token}"}


def rpc(sandbox, method: str, **params) -> dict:
    response = httpx.post(f"{sandbox.url}/ap/platform/", headers=platform_headers(),
                          json=[{"jsonrpc": "2.0", "id": 1, "method": method,
                                 "params": params}], timeout=30)
    assert response.status_code == 200, response.text
    return response.json()[0]


def get_tx(sandbox, transaction_id: str) -> dict:
    response = httpx.get(f"{sandbox.url}/ap/platform/transactions/{transaction_id}",
                         headers=platform_headers(), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def wallet_token(sandbox, account: str, memo: str | None = None) -> str:
    body = {"account": account, **({"memo": memo} if memo else {})}
    response = httpx.post(f"{sandbox.url}/ap/sep/sandbox-token", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["token"]


def start_withdrawal(sandbox, account: str, *, memo: str | None = None, **fields) -> dict:
    """A SEP-24 withdrawal started by ``account`` (``memo``: a memo-identified custodial
    user), moved to ``pending_user_transfer_start``; the ``request_onchain_funds`` result."""
    token = wallet_token(sandbox, account, memo)
    answer = httpx.post(f"{sandbox.url}/ap/sep/transactions/withdraw/interactive",
                        json={"asset_code": "USDC", "amount": "10", **fields},
                        headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    reply = rpc(sandbox, "request_onchain_funds", transaction_id=answer.json()["id"],
                **REQUESTED)
    assert "result" in reply, reply
    return reply["result"]


def observed(sandbox, stellar_transaction_id: str, timeout: float = 8.0) -> list[dict]:
    """The observer's records of the payments in ``stellar_transaction_id``, once there."""
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(f"{sandbox.url}/ap/sandbox/observer",
                             params={"stellar_transaction_id": stellar_transaction_id},
                             timeout=10)
        response.raise_for_status()
        payments = response.json()["payments"]
        if payments:
            return payments
        if time.monotonic() > deadline:
            raise AssertionError(f"the observer did not handle {stellar_transaction_id}")
        time.sleep(0.05)


def not_observed(sandbox, stellar_transaction_id: str) -> bool:
    response = httpx.get(f"{sandbox.url}/ap/sandbox/observer",
                         params={"stellar_transaction_id": stellar_transaction_id}, timeout=10)
    return response.json()["payments"] == []


class Wallet:
    """A funded account on the sandbox Horizon (friendbot XLM, a USDC trustline, USDC from
    ``POST /horizon/sandbox/fund``) that pays the distribution account."""

    def __init__(self, sandbox, usdc: str = "1000"):
        self.keypair = Keypair.random()
        self.horizon = f"{sandbox.url}/horizon"
        self.server = Server(self.horizon)
        self.usdc = Asset("USDC", keys.USDC_ISSUER.public_key)
        httpx.get(f"{self.horizon}/friendbot", params={"addr": self.public_key},
                  timeout=30).raise_for_status()
        self._submit(lambda b: b.append_change_trust_op(self.usdc))
        httpx.post(f"{self.horizon}/sandbox/fund", json={"account": self.public_key,
                                                         "amount": usdc},
                   timeout=30).raise_for_status()

    @property
    def public_key(self) -> str:
        return self.keypair.public_key

    def muxed(self, muxed_id: int) -> str:
        return MuxedAccount(self.public_key, muxed_id).account_muxed

    def _submit(self, build, *, muxed_id: int | None = None, memo_id: str | None = None,
                memo_text: str | None = None) -> str:
        loaded = self.server.load_account(self.public_key)
        source = (Account(MuxedAccount(self.public_key, muxed_id), loaded.sequence)
                  if muxed_id is not None else loaded)
        builder = TransactionBuilder(source, settings.STELLAR_NETWORK_PASSPHRASE,
                                     base_fee=100).set_timeout(30)
        build(builder)
        if memo_id is not None:
            builder.add_id_memo(int(memo_id))
        if memo_text is not None:
            builder.add_text_memo(memo_text)
        envelope = builder.build()
        envelope.sign(self.keypair)
        return self.server.submit_transaction(envelope)["hash"]

    def pay(self, amount: str, *, memo_id: str | None = None, memo_text: str | None = None,
            native: bool = False, destination: str = DISTRIBUTION,
            muxed_id: int | None = None) -> str:
        """Pay ``amount`` USDC (XLM with ``native``) to ``destination``; the tx hash."""
        asset = Asset.native() if native else self.usdc
        return self._submit(lambda b: b.append_payment_op(destination, asset, amount),
                            muxed_id=muxed_id, memo_id=memo_id, memo_text=memo_text)


@pytest.fixture(scope="module")
def wallet(sandbox) -> Wallet:
    return Wallet(sandbox)


# --- the happy path --------------------------------------------------------------------------


def test_observer_notifies_the_withdrawal_with_only_hash_amount_and_message(clean_sandbox,
                                                                            wallet):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)
    assert withdrawal["destination_account"] == DISTRIBUTION
    assert withdrawal["memo_type"] == "id"
    assert 1 <= int(withdrawal["memo"]) < 2**63 - 1  # SecureRandom.nextLong(1, MAX)

    stellar_id = wallet.pay("10", memo_id=withdrawal["memo"])

    [seen] = observed(sandbox, stellar_id)
    assert (seen["outcome"], seen["transaction_id"]) == ("notified", withdrawal["id"])
    assert seen["rpc_request"]["method"] == "notify_onchain_funds_received"
    assert seen["rpc_request"]["params"] == {
        "transaction_id": withdrawal["id"], "message": "Received an incoming payment",
        "stellar_transaction_id": stellar_id, "amount_in": {"amount": "10.0000000"}}
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert tx["amount_in"] == {"amount": "10.0000000", "asset": USDC}
    assert tx["amount_out"] == {"amount": "830", "asset": INR}
    assert tx["amount_expected"] == {"amount": "10", "asset": USDC}
    assert tx["message"] == "Received an incoming payment"
    [recorded] = tx["stellar_transactions"]
    assert recorded["id"] == stellar_id and recorded["memo"] == withdrawal["memo"]
    assert recorded["payments"] == [{
        "id": seen["operation_id"], "amount": {"amount": "10.0000000", "asset": USDC_SEP11},
        "payment_type": "payment", "source_account": wallet.public_key,
        "destination_account": DISTRIBUTION}]
    events = httpx.get(f"{sandbox.url}/ap/sandbox/events",
                       params={"transaction_id": withdrawal["id"]}, timeout=10).json()["events"]
    assert [e["status"] for e in events] == ["incomplete", "pending_user_transfer_start",
                                             "pending_anchor"]


# --- NOTES §4.4: what AP does with bad withdrawals ---------------------------------------------


def test_right_memo_wrong_asset_is_accepted_as_if_it_were_usdc(clean_sandbox, wallet):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)

    stellar_id = wallet.pay("10", memo_id=withdrawal["memo"], native=True)

    [seen] = observed(sandbox, stellar_id)
    assert seen["outcome"] == "notified" and seen["asset"] == "native"
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert tx["amount_in"] == {"amount": "10.0000000", "asset": USDC}  # the asset lies
    [payment] = tx["stellar_transactions"][0]["payments"]
    assert payment["amount"] == {"amount": "10.0000000", "asset": "native"}  # the truth


@pytest.mark.parametrize("paid", ["9.5", "10.5", "10.1234567"])
def test_short_over_and_7_decimal_payments_overwrite_amount_in_only(clean_sandbox, wallet,
                                                                     paid):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)

    stellar_id = wallet.pay(paid, memo_id=withdrawal["memo"])

    assert observed(sandbox, stellar_id)[0]["outcome"] == "notified"
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert tx["amount_in"] == {"amount": f"{Decimal(paid):.7f}", "asset": USDC}
    assert tx["amount_out"] == {"amount": "830", "asset": INR}
    assert tx["fee_details"] == {"total": "0.5", "asset": USDC}
    assert tx["amount_expected"] == {"amount": "10", "asset": USDC}


def test_second_payment_with_the_same_memo_matches_nothing_and_is_dropped(clean_sandbox,
                                                                           wallet):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)

    first = wallet.pay("5", memo_id=withdrawal["memo"])
    assert observed(sandbox, first)[0]["outcome"] == "notified"
    second = wallet.pay("5", memo_id=withdrawal["memo"])

    [seen] = observed(sandbox, second)
    assert (seen["outcome"], seen["transaction_id"], seen["rpc_request"]) == (
        "no_match", None, None)
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert tx["amount_in"]["amount"] == "5.0000000"
    assert [s["id"] for s in tx["stellar_transactions"]] == [first]


def test_more_decimals_than_the_asset_allows_is_refused_and_never_retried(clean_sandbox,
                                                                          wallet):
    sandbox = clean_sandbox
    sandbox.fault("ap.asset_decimals", asset=USDC, decimals=2)
    withdrawal = start_withdrawal(sandbox, wallet.public_key)

    refused = wallet.pay("10.1234567", memo_id=withdrawal["memo"])

    [seen] = observed(sandbox, refused)
    assert seen["outcome"] == "refused"
    assert seen["rpc_reply"]["error"] == {
        "id": withdrawal["id"], "code": -32602,
        "message": "'10.1234567' has invalid significant decimals. Expected: '2'"}
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_user_transfer_start"
    assert "stellar_transactions" not in tx and tx["amount_in"]["amount"] == "10"
    # the cursor moved on: a later payment is handled, the refused one is not retried
    accepted = wallet.pay("10", memo_id=withdrawal["memo"])
    assert observed(sandbox, accepted)[0]["outcome"] == "notified"
    assert len(observed(sandbox, refused)) == 1
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert [s["id"] for s in tx["stellar_transactions"]] == [accepted]


# --- faults ----------------------------------------------------------------------------------


def test_observer_off_piles_payments_up_and_a_restart_skips_all_but_the_newest(clean_sandbox,
                                                                               wallet):
    sandbox = clean_sandbox
    older, newer = (start_withdrawal(sandbox, wallet.public_key) for _ in range(2))
    sandbox.fault("ap.observer_off")

    older_payment = wallet.pay("10", memo_id=older["memo"])
    newer_payment = wallet.pay("10", memo_id=newer["memo"])
    time.sleep(0.8)  # four observer periods

    assert not_observed(sandbox, older_payment) and not_observed(sandbox, newer_payment)
    assert get_tx(sandbox, older["id"])["status"] == "pending_user_transfer_start"
    # ap.stale_status still works for withdrawals: REST says pending_anchor, RPC the truth
    sandbox.fault("ap.stale_status", transaction_ids=[older["id"]])
    assert get_tx(sandbox, older["id"])["status"] == "pending_anchor"
    assert rpc(sandbox, "get_transaction", transaction_id=older["id"])["result"][
        "status"] == "pending_user_transfer_start"

    sandbox.clear_faults()  # AP restarted: fetchStreamingCursor, max(stored, latest - 200)

    assert observed(sandbox, newer_payment)[0]["outcome"] == "notified"
    assert get_tx(sandbox, newer["id"])["status"] == "pending_anchor"
    assert not_observed(sandbox, older_payment)  # the cursor is past it for good
    assert get_tx(sandbox, older["id"])["status"] == "pending_user_transfer_start"


def test_observer_miss_drops_the_next_matching_payment_and_moves_on(clean_sandbox, wallet):
    sandbox = clean_sandbox
    missed, caught = (start_withdrawal(sandbox, wallet.public_key) for _ in range(2))
    sandbox.fault("ap.observer_miss", times=1)

    missed_payment = wallet.pay("10", memo_id=missed["memo"])
    caught_payment = wallet.pay("10", memo_id=caught["memo"])

    [dropped] = observed(sandbox, missed_payment)
    assert (dropped["outcome"], dropped["transaction_id"], dropped["rpc_request"]) == (
        "missed", missed["id"], None)
    assert observed(sandbox, caught_payment)[0]["outcome"] == "notified"
    assert get_tx(sandbox, missed["id"])["status"] == "pending_user_transfer_start"
    assert get_tx(sandbox, caught["id"])["status"] == "pending_anchor"


def test_unindexed_hash_fault_makes_the_observer_call_fail_for_good(clean_sandbox, wallet):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)
    sandbox.fault("ap.rpc_32603_unindexed_hash", times=1)

    stellar_id = wallet.pay("10", memo_id=withdrawal["memo"])

    [seen] = observed(sandbox, stellar_id)
    assert seen["outcome"] == "refused"
    assert seen["rpc_reply"]["error"]["code"] == -32603
    assert seen["rpc_reply"]["error"]["message"].startswith(
        f"Failed to retrieve Stellar transaction by ID[{stellar_id}]")
    assert get_tx(sandbox, withdrawal["id"])["status"] == "pending_user_transfer_start"


# --- accounts and memos ------------------------------------------------------------------------


def test_muxed_wallet_withdraws_and_pays_from_its_muxed_address(clean_sandbox, wallet):
    sandbox = clean_sandbox
    user = wallet.muxed(4242)
    withdrawal = start_withdrawal(sandbox, user)
    assert withdrawal["source_account"] == user  # AP 4.3.0 keeps the M-address (PR #1930)
    assert withdrawal["customers"]["sender"] == {"account": user}

    stellar_id = wallet.pay("10", memo_id=withdrawal["memo"], muxed_id=4242)

    [seen] = observed(sandbox, stellar_id)
    assert seen["outcome"] == "notified" and seen["from"] == wallet.public_key
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert tx["stellar_transactions"][0]["payments"][0]["source_account"] == wallet.public_key


def test_payment_to_a_muxed_distribution_address_matches_on_the_transaction_memo(
        clean_sandbox, wallet):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)

    stellar_id = wallet.pay("10", memo_id=withdrawal["memo"],
                            destination=MuxedAccount(DISTRIBUTION, 99).account_muxed)

    [seen] = observed(sandbox, stellar_id)
    assert (seen["to"], seen["to_muxed"]) == (DISTRIBUTION,
                                              MuxedAccount(DISTRIBUTION, 99).account_muxed)
    assert seen["outcome"] == "notified"
    assert get_tx(sandbox, withdrawal["id"])["status"] == "pending_anchor"


def test_memo_identified_user_and_a_memo_above_2_63_round_trip(clean_sandbox, wallet):
    sandbox = clean_sandbox
    sandbox.fault("ap.next_withdraw_memo", times=1, memo=UINT64_MAX)
    withdrawal = start_withdrawal(sandbox, wallet.public_key, memo="11872666534918305457")
    assert (withdrawal["memo"], withdrawal["memo_type"]) == (UINT64_MAX, "id")
    assert withdrawal["source_account"] == wallet.public_key
    assert withdrawal["customers"]["sender"] == {"account": wallet.public_key,
                                                 "memo": "11872666534918305457"}
    unforced = start_withdrawal(sandbox, wallet.public_key)
    assert unforced["memo"] != UINT64_MAX  # times=1: the next memo is random again

    stellar_id = wallet.pay("10", memo_id=UINT64_MAX)

    [seen] = observed(sandbox, stellar_id)
    assert (seen["memo_type"], seen["memo"], seen["outcome"]) == ("id", UINT64_MAX, "notified")
    tx = get_tx(sandbox, withdrawal["id"])
    assert tx["status"] == "pending_anchor"
    assert tx["stellar_transactions"][0]["memo"] == UINT64_MAX


def test_text_memo_with_the_same_digits_matches_an_id_memo(clean_sandbox, wallet):
    sandbox = clean_sandbox
    withdrawal = start_withdrawal(sandbox, wallet.public_key)

    stellar_id = wallet.pay("10", memo_text=withdrawal["memo"])

    [seen] = observed(sandbox, stellar_id)
    assert (seen["memo_type"], seen["outcome"]) == ("text", "notified")
    assert get_tx(sandbox, withdrawal["id"])["status"] == "pending_anchor"


def test_two_withdrawals_with_one_memo_credit_neither_then_the_wrong_customer(clean_sandbox,
                                                                              wallet):
    sandbox = clean_sandbox
    memo = str(2**63 + secrets.randbelow(2**63 - 1))
    sandbox.fault("ap.next_withdraw_memo", times=2, memo=memo)
    mine = start_withdrawal(sandbox, wallet.public_key)
    theirs = start_withdrawal(sandbox, Keypair.random().public_key)
    assert mine["memo"] == theirs["memo"] == memo  # PR #1929's collision

    # both pending: the single-result lookup finds two rows and throws; nobody is credited
    ambiguous = wallet.pay("10", memo_id=memo)
    [seen] = observed(sandbox, ambiguous)
    assert seen["outcome"] == "lookup_error"
    assert "did not return a unique result: 2" in seen["detail"]
    assert {get_tx(sandbox, t["id"])["status"] for t in (mine, theirs)} == {
        "pending_user_transfer_start"}

    # read as findFirst (no ORDER BY): one of the two, whichever the database returns
    sandbox.fault("ap.observer_match_first")
    picked_payment = wallet.pay("10", memo_id=memo)
    [picked] = observed(sandbox, picked_payment)
    assert picked["outcome"] == "notified" and picked["transaction_id"] in {mine["id"],
                                                                            theirs["id"]}
    sandbox.clear_faults()

    # the other one is now the only match: my next payment is credited to it
    last_payment = wallet.pay("10", memo_id=memo)
    [last] = observed(sandbox, last_payment)
    assert last["outcome"] == "notified"
    assert {picked["transaction_id"], last["transaction_id"]} == {mine["id"], theirs["id"]}
    credited = get_tx(sandbox, theirs["id"])
    assert credited["status"] == "pending_anchor"
    paid_by = credited["stellar_transactions"][0]["payments"][0]["source_account"]
    assert paid_by == wallet.public_key != credited["source_account"]  # wrong customer


# --- rules without the network ------------------------------------------------------------------


@pytest.mark.parametrize(("stored", "latest", "resume"), [
    (None, "4294971393", "4294971393"),  # first start: from the newest payment
    ("8589938689", "4294971393", "4294971393"),  # stored >= latest: a network reset
    ("4294971393", "8589938689", "8589938489"),  # long outage: latest - 200 wins
    ("8589938600", "8589938689", "8589938600"),  # short outage: the stored cursor wins
    ("4294971393", None, "4294971393"),
])
def test_restart_cursor_follows_fetch_streaming_cursor(stored, latest, resume):
    assert observer.streaming_cursor(stored, latest) == resume


@pytest.mark.parametrize(("tx", "expected"), [
    ({"memo_type": "id", "memo": UINT64_MAX}, ("id", UINT64_MAX)),
    ({"memo_type": "text", "memo": "123", "memo_bytes": "MTIz"}, ("text", "123")),
    ({"memo_type": "text", "memo": "", "memo_bytes": ""}, ("text", None)),  # ignored
    ({"memo_type": "hash", "memo": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="},
     ("hash", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")),
    ({"memo_type": "none"}, ("none", "")),
])
def test_memo_as_string_renders_memos_as_ap_matches_them(tx, expected):
    assert observer.memo_as_string(tx) == expected
