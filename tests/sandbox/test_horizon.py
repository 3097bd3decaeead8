"""The Horizon stand-in of the sandbox, driven over real HTTP with stellar-sdk 16's sync
``Server`` exactly as Corridor drives it, plus fidelity checks against the real Horizon
samples in ../shared/reference/horizon/ (read in place, never copied).

Ledgers close every 0.25 s and a submission times out after 2 s here
(``tests.conftest.SANDBOX_TIMINGS``). Every test makes its own accounts through
friendbot, so tests do not depend on each other's order.
"""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest
from django.conf import settings
from stellar_sdk import (
    Account,
    Asset,
    HashMemo,
    IdMemo,
    Keypair,
    MuxedAccount,
    Server,
    TextMemo,
    TransactionBuilder,
    TransactionEnvelope,
    xdr,
)
from stellar_sdk.client.requests_client import RequestsClient
from stellar_sdk.exceptions import BadRequestError, BadResponseError, NotFoundError

from sandbox.keys import DISTRIBUTION, USDC_ISSUER, sandbox_keypair
from tests.conftest import reference_path
from tests.flows import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TESTNET = "Test SDF Network ; September 2015"
CHANNEL = sandbox_keypair("channel-1")
USDC = Asset("USDC", USDC_ISSUER.public_key)
TX_CODE = xdr.TransactionResultCode


# --- helpers ---------------------------------------------------------------------

@pytest.fixture
def horizon(clean_sandbox) -> Server:
    """stellar-sdk's Server on the stand-in, with the SDK's default client."""
    return Server(f"{clean_sandbox.url}/horizon")


@pytest.fixture
def strict(clean_sandbox) -> Server:
    """A Server whose client never re-POSTs (as Corridor's anchor.stellar.server())."""
    client = RequestsClient(num_retries=0, request_timeout=10, post_timeout=10)
    return Server(f"{clean_sandbox.url}/horizon", client=client)


@pytest.fixture
def http(clean_sandbox) -> httpx.Client:
    with httpx.Client(base_url=f"{clean_sandbox.url}/horizon", timeout=10) as client:
        yield client


def friendbot(http: httpx.Client) -> Keypair:
    keypair = Keypair.random()
    response = http.get("/friendbot", params={"addr": keypair.public_key})
    assert response.status_code == 200, response.text
    return keypair


def build(server: Server, source: Keypair, add_ops, *, signers=(), memo=None,
          timeout: int | None = 30, time_bounds=None, base_fee: int = 100,
          sequence_offset: int = 0, source_muxed_id: int | None = None) -> TransactionEnvelope:
    """Load ``source`` from the stand-in, build, sign with ``source`` and ``signers``."""
    account = server.load_account(source.public_key)
    account.sequence += sequence_offset
    if source_muxed_id is not None:
        account = Account(MuxedAccount(source.public_key, source_muxed_id), account.sequence)
    builder = TransactionBuilder(account, network_passphrase=TESTNET, base_fee=base_fee)
    if time_bounds is not None:
        builder.add_time_bounds(*time_bounds)
    elif timeout is not None:
        builder.set_timeout(timeout)
    if memo is not None:
        builder.add_memo(memo)
    add_ops(builder)
    envelope = builder.build()
    for keypair in (source, *signers):
        envelope.sign(keypair)
    return envelope


def trust_usdc(server: Server, keypair: Keypair) -> dict:
    envelope = build(server, keypair, lambda b: b.append_change_trust_op(USDC))
    return server.submit_transaction(envelope)


def pay_from_distribution(server: Server, destination: str, amount: str, *, asset=USDC,
                          memo=None, **kwargs) -> TransactionEnvelope:
    """A payment whose source is the distribution account and whose transaction source
    is a channel account (Corridor's layout), signed by both."""
    return build(server, CHANNEL,
                 lambda b: b.append_payment_op(destination, asset, amount,
                                               source=DISTRIBUTION.public_key),
                 signers=(DISTRIBUTION,), memo=memo, **kwargs)


def balance(server: Server, address: str, asset: Asset = USDC) -> Decimal:
    for line in server.accounts().account_id(address).call()["balances"]:
        if asset.is_native() and line["asset_type"] == "native":
            return Decimal(line["balance"])
        if line.get("asset_code") == asset.code and line.get("asset_issuer") == asset.issuer:
            return Decimal(line["balance"])
    raise AssertionError(f"{address} holds no {asset}")


def codes(error: BadRequestError) -> dict:
    return error.extras["result_codes"]


def sample(name: str) -> dict:
    return json.loads(reference_path("horizon", name).read_text())


# --- world, root, friendbot ------------------------------------------------------

def test_root_serves_the_network_and_the_latest_ledger_header(horizon, http):
    root = horizon.root().call()
    response = http.get("/accounts/" + DISTRIBUTION.public_key)

    assert root["network_passphrase"] == settings.STELLAR_NETWORK_PASSPHRASE == TESTNET
    assert root["history_latest_ledger"] == root["core_latest_ledger"] >= 1
    assert root["history_latest_ledger_closed_at"].endswith("Z")
    assert int(response.headers["Latest-Ledger"]) >= root["history_latest_ledger"]
    assert root["_links"]["self"]["href"] == f"{horizon.horizon_url}/"


def test_latest_ledger_header_only_on_state_endpoints(horizon, http):
    """Horizon's StateMiddleware sets Latest-Ledger on /accounts/{id} (also on its 404);
    root, history endpoints and submissions carry none (stellar-horizon
    internal/httpx/router.go, middleware.go @ 2abda012)."""
    tx_hash = horizon.transactions().order(desc=True).limit(1).call()[
        "_embedded"]["records"][0]["hash"]
    ledger = horizon.root().call()["history_latest_ledger"]
    with_header = [http.get(f"/accounts/{DISTRIBUTION.public_key}"),
                   http.get(f"/accounts/{Keypair.random().public_key}")]
    without = [http.get("/"), http.get(f"/transactions/{tx_hash}"),
               http.get(f"/transactions/{'0' * 64}"), http.get("/transactions"),
               http.get(f"/accounts/{DISTRIBUTION.public_key}/transactions"),
               http.get(f"/accounts/{DISTRIBUTION.public_key}/payments"),
               http.get("/payments"), http.get("/ledgers"), http.get(f"/ledgers/{ledger}"),
               http.post("/transactions", data={"tx": "AAAA"})]

    assert [r.status_code for r in with_header] == [200, 404]
    assert all(int(r.headers["Latest-Ledger"]) >= ledger for r in with_header)
    assert [r.status_code for r in without] == [200, 200, 404, 200, 200, 200, 200, 200,
                                                200, 400]
    assert [r.headers.get("Latest-Ledger") for r in without] == [None] * len(without)


def _latest(horizon) -> int:
    return horizon.root().call()["history_latest_ledger"]


def test_ledgers_close_on_their_own(horizon):
    first = _latest(horizon)

    wait_for(lambda: _latest(horizon) >= first + 1, timeout=10, what="a ledger close")


def test_close_hold_stops_the_close_loop_until_switched_off(horizon, clean_sandbox):
    clean_sandbox.fault("horizon.close_hold")
    time.sleep(1.0)  # a close that had begun before the switch went on ends
    held = _latest(horizon)
    time.sleep(1.0)  # four close periods
    assert _latest(horizon) == held

    clean_sandbox.fault("horizon.close_hold", times=0)
    wait_for(lambda: _latest(horizon) >= held + 1, timeout=10, what="closes again")


def test_fixed_world_holds_usdc_and_funded_channels(horizon):
    distribution = horizon.accounts().account_id(DISTRIBUTION.public_key).call()

    usdc = [b for b in distribution["balances"] if b.get("asset_code") == "USDC"]
    assert usdc and usdc[0]["asset_issuer"] == USDC_ISSUER.public_key
    assert Decimal(usdc[0]["limit"]) == Decimal("922337203685.4775807")
    assert horizon.load_account(USDC_ISSUER.public_key).sequence >= 1 << 32
    for n in range(1, 5):
        assert balance(horizon, sandbox_keypair(f"channel-{n}").public_key,
                       Asset.native()) > Decimal("9000")


def test_fetch_base_fee_and_fee_stats(horizon, http):
    stats = http.get("/fee_stats").json()

    assert horizon.fetch_base_fee() == 100
    assert stats["last_ledger_base_fee"] == "100"
    assert stats["fee_charged"]["p50"] == "100"


def test_friendbot_creates_an_account_once(horizon, http):
    keypair = friendbot(http)
    again = http.get("/friendbot", params={"addr": keypair.public_key})

    account = horizon.load_account(keypair.public_key)
    assert account.sequence == int(account.raw_data["sequence"])
    assert account.sequence % (1 << 32) == 0  # ledgerSeq << 32, as core starts accounts
    assert balance(horizon, keypair.public_key, Asset.native()) == Decimal("10000")
    assert again.status_code == 400
    assert again.json()["detail"] == "account already funded to starting balance"


def test_concurrent_friendbot_requests_all_land(horizon, http):
    keypairs = [Keypair.random() for _ in range(6)]

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(
            lambda k: http.get("/friendbot", params={"addr": k.public_key}), keypairs))

    assert [a.status_code for a in answers] == [200] * 6
    for keypair in keypairs:
        assert balance(horizon, keypair.public_key, Asset.native()) == Decimal("10000")


def test_unknown_account_is_a_404_problem(horizon, http):
    response = http.get("/accounts/" + Keypair.random().public_key)

    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/problem+json; charset=utf-8"
    assert response.json()["type"] == "https://stellar.org/horizon-errors/not_found"
    with pytest.raises(NotFoundError):
        horizon.load_account(Keypair.random().public_key)


# --- payments and memos ----------------------------------------------------------

@pytest.mark.parametrize("memo, memo_type, rendered", [
    (TextMemo("deposit 42"), "text", "deposit 42"),
    (IdMemo(2**64 - 1), "id", "18446744073709551615"),
    (HashMemo(bytes(range(32))), "hash", base64.b64encode(bytes(range(32))).decode()),
], ids=["text", "id-max", "hash"])
def test_usdc_payment_with_memo_lands_and_renders_like_horizon(horizon, http, memo, memo_type,
                                                               rendered):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    before = balance(horizon, DISTRIBUTION.public_key)

    envelope = pay_from_distribution(horizon, customer.public_key, "12.3456789", memo=memo)
    resource = horizon.submit_transaction(envelope)

    assert resource["successful"] is True
    assert resource["hash"] == envelope.hash_hex()
    assert resource["memo_type"] == memo_type and resource["memo"] == rendered
    assert ("memo_bytes" in resource) == (memo_type == "text")
    assert horizon.transactions().transaction(envelope.hash_hex()).call() == resource
    result = xdr.TransactionResult.from_xdr(resource["result_xdr"])
    assert result.result.code == TX_CODE.txSUCCESS and result.fee_charged.int64 == 100
    assert balance(horizon, customer.public_key) == Decimal("12.3456789")
    assert balance(horizon, DISTRIBUTION.public_key) == before - Decimal("12.3456789")
    payment = horizon.payments().for_transaction(envelope.hash_hex()).call()
    record = payment["_embedded"]["records"][0]
    assert (record["type"], record["from"], record["to"], record["amount"]) == (
        "payment", DISTRIBUTION.public_key, customer.public_key, "12.3456789")
    assert (record["asset_code"], record["asset_issuer"]) == ("USDC", USDC_ISSUER.public_key)


def test_text_memo_with_invalid_utf8_is_cleaned_with_memo_bytes(horizon, http):
    customer = friendbot(http)
    raw = b"ab\xff\x00cd"
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                     memo=TextMemo(raw))

    resource = horizon.submit_transaction(envelope, skip_memo_required_check=True)

    assert resource["memo"] == "ab\ufffdcd"
    assert base64.b64decode(resource["memo_bytes"]) == raw


def test_payment_to_a_muxed_address_credits_the_account_and_records_the_id(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    muxed = MuxedAccount(customer.public_key, 2**64 - 2).account_muxed

    envelope = pay_from_distribution(horizon, muxed, "5")
    horizon.submit_transaction(envelope)

    record = horizon.payments().for_account(customer.public_key).order(desc=True).limit(1) \
        .call()["_embedded"]["records"][0]
    assert record["to"] == customer.public_key
    assert record["to_muxed"] == muxed
    assert record["to_muxed_id"] == str(2**64 - 2)
    assert balance(horizon, customer.public_key) == Decimal("5")


def test_muxed_transaction_source_is_rendered(horizon, http):
    customer = friendbot(http)
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                     source_muxed_id=7, memo=TextMemo("m"))

    resource = horizon.submit_transaction(envelope)

    assert resource["source_account"] == customer.public_key
    assert resource["account_muxed"].startswith("M")
    assert resource["account_muxed_id"] == "7"


def test_change_trust_adds_and_removes_a_trustline(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    with_line = horizon.accounts().account_id(customer.public_key).call()

    remove = build(horizon, customer, lambda b: b.append_change_trust_op(USDC, limit="0"))
    horizon.submit_transaction(remove)
    without = horizon.accounts().account_id(customer.public_key).call()

    assert with_line["subentry_count"] == 1
    assert [b["asset_type"] for b in with_line["balances"]] == ["credit_alphanum4", "native"]
    assert without["subentry_count"] == 0
    assert [b["asset_type"] for b in without["balances"]] == ["native"]


def test_sandbox_fund_pays_usdc_from_the_issuer(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)

    response = http.post("/sandbox/fund", json={"account": customer.public_key,
                                                "amount": "100.0000000"})
    no_line = http.post("/sandbox/fund", json={"account": friendbot(http).public_key,
                                               "amount": "1"})

    assert response.status_code == 200, response.text
    assert response.json()["source_account"] == USDC_ISSUER.public_key
    assert horizon.transactions().transaction(response.json()["hash"]).call()["successful"]
    assert balance(horizon, customer.public_key) == Decimal("100")
    assert no_line.status_code == 400


# --- refusals in core's order ----------------------------------------------------

def test_bad_sequence_is_refused_with_horizons_canned_result(horizon, http):
    customer = friendbot(http)
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                     sequence_offset=1)  # one ahead: a gap

    with pytest.raises(BadRequestError) as refused:
        horizon.submit_transaction(envelope, skip_memo_required_check=True)

    assert refused.value.status == 400
    assert codes(refused.value) == {"transaction": "tx_bad_seq"}
    assert refused.value.result_xdr == "AAAAAAAAAAD////7AAAAAA=="
    assert xdr.TransactionResult.from_xdr(refused.value.result_xdr).result.code == \
        TX_CODE.txBAD_SEQ
    assert balance(horizon, customer.public_key, Asset.native()) == Decimal("10000")


def test_expired_time_bounds_are_too_late_and_future_ones_too_early(horizon, http):
    customer = friendbot(http)
    now = int(time.time())

    def pay(b):
        b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1")

    late = build(horizon, customer, pay, time_bounds=(0, now - 10))
    early = build(horizon, customer, pay, time_bounds=(now + 600, 0))

    with pytest.raises(BadRequestError) as too_late:
        horizon.submit_transaction(late, skip_memo_required_check=True)
    with pytest.raises(BadRequestError) as too_early:
        horizon.submit_transaction(early, skip_memo_required_check=True)

    assert codes(too_late.value) == {"transaction": "tx_too_late"}
    assert codes(too_early.value) == {"transaction": "tx_too_early"}


def test_wrong_signer_is_bad_auth_and_missing_op_signer_fails_the_op(horizon, http):
    customer = friendbot(http)
    stranger = Keypair.random()
    wrong = build(horizon, customer,
                  lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"))
    wrong.signatures = []
    wrong.sign(stranger)
    no_op_signer = build(horizon, CHANNEL,
                         lambda b: b.append_payment_op(customer.public_key, USDC, "1",
                                                       source=DISTRIBUTION.public_key))
    extra = build(horizon, customer,
                  lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                  signers=(stranger,))

    with pytest.raises(BadRequestError) as bad_auth:
        horizon.submit_transaction(wrong, skip_memo_required_check=True)
    with pytest.raises(BadRequestError) as op_bad_auth:
        horizon.submit_transaction(no_op_signer, skip_memo_required_check=True)
    with pytest.raises(BadRequestError) as bad_auth_extra:
        horizon.submit_transaction(extra, skip_memo_required_check=True)

    assert codes(bad_auth.value) == {"transaction": "tx_bad_auth"}
    # stellar-core checks an operation's source signature per operation: tx_failed.
    assert codes(op_bad_auth.value) == {"transaction": "tx_failed", "operations": ["op_bad_auth"]}
    assert codes(bad_auth_extra.value) == {"transaction": "tx_bad_auth_extra"}
    with pytest.raises(NotFoundError):  # refused at submission: never in a ledger
        horizon.transactions().transaction(no_op_signer.hash_hex()).call()


def test_insufficient_fee_malformed_envelope_and_wrong_media_type(horizon, http):
    customer = friendbot(http)
    cheap = build(horizon, customer,
                  lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                  base_fee=10)

    with pytest.raises(BadRequestError) as insufficient:
        horizon.submit_transaction(cheap, skip_memo_required_check=True)
    malformed = http.post("/transactions", data={"tx": "AAAA not xdr"})
    json_body = http.post("/transactions", json={"tx": cheap.to_xdr()})

    assert codes(insufficient.value) == {"transaction": "tx_insufficient_fee"}
    assert xdr.TransactionResult.from_xdr(insufficient.value.result_xdr).fee_charged.int64 == 10
    assert malformed.status_code == 400
    assert malformed.json()["type"].endswith("/transaction_malformed")
    assert malformed.json()["extras"]["envelope_xdr"] == "AAAA not xdr"
    assert json_body.status_code == 415


def test_payment_without_destination_trustline_fails_in_the_ledger(horizon, http):
    customer = friendbot(http)
    channel_before = horizon.load_account(CHANNEL.public_key).sequence
    envelope = pay_from_distribution(horizon, customer.public_key, "1")

    with pytest.raises(BadRequestError) as failed:
        horizon.submit_transaction(envelope)

    assert codes(failed.value) == {"transaction": "tx_failed", "operations": ["op_no_trust"]}
    included = horizon.transactions().transaction(envelope.hash_hex()).call()
    assert included["successful"] is False and included["fee_charged"] == "100"
    assert horizon.load_account(CHANNEL.public_key).sequence == channel_before + 1
    assert xdr.TransactionResult.from_xdr(included["result_xdr"]).result.code == \
        TX_CODE.txFAILED
    default_page = horizon.payments().for_account(customer.public_key).call()
    with_failed = horizon.payments().for_account(customer.public_key).include_failed(True).call()
    assert [r["type"] for r in default_page["_embedded"]["records"]] == ["create_account"]
    assert [r["transaction_successful"] for r in with_failed["_embedded"]["records"]] == \
        [True, False]


def test_underfunded_credit_payment_and_missing_destination(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    overdraw = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, USDC, "1"))
    with pytest.raises(BadRequestError) as underfunded:
        horizon.submit_transaction(overdraw)
    ghost = build(horizon, customer,
                  lambda b: b.append_payment_op(Keypair.random().public_key, Asset.native(), "1"))
    with pytest.raises(BadRequestError) as no_destination:
        horizon.submit_transaction(ghost, skip_memo_required_check=True)

    assert codes(underfunded.value)["operations"] == ["op_underfunded"]
    assert codes(no_destination.value)["operations"] == ["op_no_destination"]


def test_resubmitting_an_applied_envelope_returns_the_same_outcome(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    good = pay_from_distribution(horizon, customer.public_key, "1")
    first = horizon.submit_transaction(good)
    bad = pay_from_distribution(horizon, friendbot(http).public_key, "1")  # no trustline
    with pytest.raises(BadRequestError) as failed_once:
        horizon.submit_transaction(bad)

    again = horizon.submit_transaction(good)
    with pytest.raises(BadRequestError) as failed_again:
        horizon.submit_transaction(bad)

    assert again == first
    assert failed_again.value.extras["result_xdr"] == failed_once.value.extras["result_xdr"]
    assert balance(horizon, customer.public_key) == Decimal("1")


def test_one_transaction_per_source_account_in_the_queue(horizon, http):
    customer = friendbot(http)
    statuses = []
    for _ in range(5):  # the two posts must fall between the same two ledger closes
        account = horizon.load_account(customer.public_key)
        envelopes = []
        for _n in range(2):
            builder = TransactionBuilder(account, network_passphrase=TESTNET, base_fee=100)
            builder.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1")
            envelope = builder.set_timeout(30).build()
            envelope.sign(customer)
            envelopes.append(envelope)
        answers = [http.post("/transactions_async", data={"tx": e.to_xdr()}) for e in envelopes]
        statuses = [a.json()["tx_status"] for a in answers]
        if statuses == ["PENDING", "TRY_AGAIN_LATER"]:
            break
        time.sleep(0.6)

    assert statuses == ["PENDING", "TRY_AGAIN_LATER"]
    assert answers[1].status_code == 503
    # Once the first one landed, the same second envelope goes through.
    deadline = time.monotonic() + 5
    while http.get(f"/transactions/{envelopes[0].hash_hex()}").status_code == 404:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    landed = horizon.submit_transaction(envelopes[1], skip_memo_required_check=True)
    assert landed["successful"] is True


# --- faults ----------------------------------------------------------------------

def test_504_after_apply_then_lookup_by_hash_finds_it(clean_sandbox, strict, horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    envelope = pay_from_distribution(horizon, customer.public_key, "2")

    with pytest.raises(BadResponseError) as timeout:
        strict.submit_transaction(envelope)

    assert timeout.value.status == 504
    assert timeout.value.type == \
        "https://stellar.org/horizon-errors/transaction_submission_timeout"
    assert timeout.value.extras == {"hash": envelope.hash_hex(),
                                    "envelope_xdr": envelope.to_xdr()}
    assert strict.transactions().transaction(envelope.hash_hex()).call()["successful"]
    assert strict.submit_transaction(envelope)["hash"] == envelope.hash_hex()
    assert balance(horizon, customer.public_key) == Decimal("2")  # paid once


def test_sdk_retry_after_a_504_gets_the_landed_outcome(clean_sandbox, horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    envelope = pay_from_distribution(horizon, customer.public_key, "3")

    resource = horizon.submit_transaction(envelope)  # RequestsClient re-POSTs on 504

    assert resource["hash"] == envelope.hash_hex()
    assert balance(horizon, customer.public_key) == Decimal("3")


def test_dropped_submission_never_lands_and_dies_with_its_time_bounds(clean_sandbox, strict,
                                                                       horizon, http):
    customer = friendbot(http)
    clean_sandbox.fault("horizon.submit_drop", times=1, wait_s=0.5)
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                     timeout=2)
    max_time = envelope.transaction.preconditions.time_bounds.max_time

    with pytest.raises(BadResponseError) as dropped:
        strict.submit_transaction(envelope, skip_memo_required_check=True)
    while int(time.time()) < max_time:  # until the time bounds have passed
        time.sleep(0.1)
    with pytest.raises(BadRequestError) as expired:
        strict.submit_transaction(envelope, skip_memo_required_check=True)

    assert dropped.value.status == 504
    assert codes(expired.value) == {"transaction": "tx_too_late"}
    with pytest.raises(NotFoundError):
        strict.transactions().transaction(envelope.hash_hex()).call()
    assert strict.load_account(customer.public_key).sequence == envelope.transaction.sequence - 1


def test_submission_timeout_waits_for_the_configured_period(clean_sandbox, strict, horizon,
                                                            http):
    customer = friendbot(http)
    clean_sandbox.fault("horizon.submit_drop", times=1)  # default: the 2 s timeout
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"))

    started = time.monotonic()
    with pytest.raises(BadResponseError):
        strict.submit_transaction(envelope, skip_memo_required_check=True)
    waited = time.monotonic() - started
    landed = strict.submit_transaction(envelope, skip_memo_required_check=True)

    assert 1.8 <= waited < 4
    assert landed["successful"] is True  # the same envelope, posted again, lands


def test_lookup_404_once_hides_each_landed_transaction_once(clean_sandbox, horizon, http):
    customer = friendbot(http)
    envelopes = []
    for amount in ("1", "2"):
        envelope = build(horizon, customer,
                         lambda b, a=amount: b.append_payment_op(DISTRIBUTION.public_key,
                                                                 Asset.native(), a))
        horizon.submit_transaction(envelope, skip_memo_required_check=True)
        envelopes.append(envelope)
    clean_sandbox.fault("horizon.lookup_404_once")

    for envelope in envelopes:
        with pytest.raises(NotFoundError):
            horizon.transactions().transaction(envelope.hash_hex()).call()
        assert horizon.transactions().transaction(envelope.hash_hex()).call()["successful"]


def _paid_once(horizon, http, amount="1"):
    customer = friendbot(http)
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(),
                                                   amount))
    landed = horizon.submit_transaction(envelope, skip_memo_required_check=True)
    return customer, envelope, landed


def _wait_ledgers(horizon, count: int) -> None:
    start = horizon.ledgers().order(desc=True).limit(1).call()["_embedded"]["records"][0][
        "sequence"]
    deadline = time.monotonic() + 10
    while True:
        records = horizon.ledgers().order(desc=True).limit(1).call()["_embedded"]["records"]
        if records[0]["sequence"] >= start + count:
            return
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_lookup_lag_hides_history_while_the_account_shows_the_new_sequence(
        clean_sandbox, strict, horizon, http):
    clean_sandbox.fault("horizon.lookup_lag", ledgers=1000)
    customer = friendbot(http)  # friendbot answers from core: it waits for nobody
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"))

    with pytest.raises(BadResponseError) as posted:  # Horizon waits for its own history
        strict.submit_transaction(envelope, skip_memo_required_check=True)
    account = http.get(f"/accounts/{customer.public_key}")
    with pytest.raises(NotFoundError):
        strict.transactions().transaction(envelope.hash_hex()).call()
    listed = strict.transactions().for_account(customer.public_key).call()
    with pytest.raises(BadRequestError) as reposted:
        strict.submit_transaction(envelope, skip_memo_required_check=True)
    clean_sandbox.clear_faults()
    found = strict.transactions().transaction(envelope.hash_hex()).call()

    assert posted.value.status == 504
    assert int(account.json()["sequence"]) == envelope.transaction.sequence
    assert listed["_embedded"]["records"] == []
    assert codes(reposted.value) == {"transaction": "tx_bad_seq"}  # stellar/go #2628
    assert found["successful"] is True
    assert int(found["ledger"]) <= int(account.headers["Latest-Ledger"])


def test_lookup_lag_ends_after_n_ledgers(clean_sandbox, horizon, http):
    customer, envelope, landed = _paid_once(horizon, http)
    clean_sandbox.fault("horizon.lookup_lag", ledgers=8)
    root = horizon.root().call()

    hidden = http.get(f"/transactions/{envelope.hash_hex()}")
    _wait_ledgers(horizon, 9)
    seen = http.get(f"/transactions/{envelope.hash_hex()}")

    assert root["core_latest_ledger"] - root["history_latest_ledger"] == 8
    assert root["ingest_latest_ledger"] == root["core_latest_ledger"]
    assert (hidden.status_code, seen.status_code) == (404, 200)


def test_ingest_behind_is_consistently_stale(clean_sandbox, strict, horizon, http):
    customer, envelope, landed = _paid_once(horizon, http)
    before = int(http.get(f"/accounts/{customer.public_key}").json()["sequence"])
    assert before == envelope.transaction.sequence
    created = strict.transactions().for_account(customer.public_key).order(desc=False).call()[
        "_embedded"]["records"][0]["ledger"]  # friendbot's create_account
    latest = horizon.root().call()["core_latest_ledger"]
    clean_sandbox.fault("horizon.ingest_behind", ledgers=latest - 1)

    root = horizon.root().call()
    account = http.get(f"/accounts/{customer.public_key}")
    lookup = http.get(f"/transactions/{envelope.hash_hex()}")
    ledger = http.get(f"/ledgers/{landed['ledger']}")
    payments = strict.payments().for_account(customer.public_key).limit(200).call()
    with pytest.raises(BadResponseError) as reposted:  # waits for ingestion: 504
        strict.submit_transaction(envelope, skip_memo_required_check=True)

    assert root["history_latest_ledger"] == root["ingest_latest_ledger"] < created
    assert root["core_latest_ledger"] >= latest
    assert int(account.headers["Latest-Ledger"]) < created
    assert account.status_code == 404  # the account did not exist yet at that height
    assert (lookup.status_code, ledger.status_code) == (404, 404)
    assert payments["_embedded"]["records"] == []
    assert reposted.value.status == 504


def test_ingest_behind_serves_the_old_sequence_and_balances(clean_sandbox, horizon, http):
    customer, first, landed = _paid_once(horizon, http, "1")
    after_first = http.get(f"/accounts/{customer.public_key}").json()
    _wait_ledgers(horizon, 12)
    second = build(horizon, customer,
                   lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "2"))
    second_landed = horizon.submit_transaction(second, skip_memo_required_check=True)
    now = horizon.root().call()["core_latest_ledger"]
    clean_sandbox.fault("horizon.ingest_behind", ledgers=now - landed["ledger"])

    stale = http.get(f"/accounts/{customer.public_key}")

    assert landed["ledger"] <= int(stale.headers["Latest-Ledger"]) < second_landed["ledger"]
    assert stale.json()["sequence"] == after_first["sequence"] == str(first.transaction.sequence)
    assert stale.json()["balances"] == after_first["balances"]
    assert http.get(f"/accounts/{customer.public_key}").json()["sequence"] != str(
        second.transaction.sequence)


def test_split_nodes_alternate_between_two_heights(clean_sandbox, strict, horizon, http):
    customer, envelope, _ = _paid_once(horizon, http)
    clean_sandbox.fault("horizon.split_nodes", ledgers=1000, first="behind")

    answers = []
    for _ in range(4):
        try:
            strict.transactions().transaction(envelope.hash_hex()).call()
            answers.append("found")
        except NotFoundError:
            answers.append("404")
    plain = [http.get(f"/transactions/{envelope.hash_hex()}").status_code for _ in range(2)]

    assert answers == ["404", "found", "404", "found"]
    assert plain == [200, 200]  # other clients are served by the current node


def test_unknown_fault_names_are_refused_with_the_known_list(clean_sandbox):
    response = clean_sandbox.http.post("/sandbox/faults",
                                       json={"name": "horizon.lookup_404_twice"})
    listing = clean_sandbox.http.get("/sandbox/faults").json()

    assert response.status_code == 400
    assert response.json()["error"] == "unknown fault 'horizon.lookup_404_twice'"
    assert {"horizon.lookup_404_once", "horizon.lookup_lag", "horizon.ingest_behind",
            "horizon.split_nodes", "ap.event_lose"} <= set(response.json()["known"])
    assert listing == {"faults": []}  # nothing was switched on


@pytest.mark.parametrize("body", [
    {"name": "horizon.lookup_lag", "times": "abc"},
    {"name": "horizon.lookup_lag", "times": -1},
    {"name": "horizon.lookup_lag", "params": [1]},
    {"name": ["horizon.lookup_lag"]},
    [1],
])
def test_a_malformed_fault_switch_is_a_400_and_switches_nothing(clean_sandbox, body):
    """Found by the money-path attacker: these gave a 500 (or, for a list of params,
    were stored and then broke every Horizon read)."""
    response = clean_sandbox.http.post("/sandbox/faults", json=body)

    assert response.status_code == 400, response.text
    assert clean_sandbox.http.get("/sandbox/faults").json() == {"faults": []}
    assert clean_sandbox.http.get("/horizon/").status_code == 200


def test_channel_accounts_land_in_the_same_ledger(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    envelopes = [
        build(horizon, sandbox_keypair(f"channel-{n}"),
              lambda b: b.append_payment_op(customer.public_key, USDC, "1",
                                            source=DISTRIBUTION.public_key),
              signers=(DISTRIBUTION,))
        for n in range(1, 5)
    ]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(horizon.submit_transaction, envelopes))

    assert all(r["successful"] for r in results)
    assert len({r["paging_token"] for r in results}) == 4
    assert balance(horizon, customer.public_key) == Decimal("4")


# --- paging ----------------------------------------------------------------------

def test_paging_with_cursors_next_and_prev(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)

    def five_payments(b):
        for n in range(1, 6):
            b.append_payment_op(customer.public_key, USDC, f"{n}", source=DISTRIBUTION.public_key)

    envelope = build(horizon, CHANNEL, five_payments, signers=(DISTRIBUTION,),
                     memo=TextMemo("batch"))
    horizon.submit_transaction(envelope)

    builder = horizon.payments().for_account(customer.public_key).limit(2).order(desc=False)
    pages = [builder.call()]
    while pages[-1]["_embedded"]["records"]:
        pages.append(builder.next())
    records = [r for p in pages for r in p["_embedded"]["records"]]
    tokens = [int(r["paging_token"]) for r in records]

    assert [r["type"] for r in records] == ["create_account"] + ["payment"] * 5
    assert [r["amount"] for r in records[1:]] == [f"{n}.0000000" for n in range(1, 6)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 6
    assert tokens[1] >> 32 == horizon.transactions().transaction(envelope.hash_hex()) \
        .call()["ledger"]
    assert tokens[2] - tokens[1] == 1  # operation index in the TOID
    assert [len(p["_embedded"]["records"]) for p in pages] == [2, 2, 2, 0]
    assert pages[0]["_links"]["next"]["href"].startswith(horizon.horizon_url)
    back = builder.prev()  # the empty last page kept the last cursor: before it, descending
    assert [r["paging_token"] for r in back["_embedded"]["records"]] == \
        [str(t) for t in reversed(tokens[-3:-1])]
    after = horizon.payments().for_account(customer.public_key).cursor(tokens[3]).limit(10) \
        .call()["_embedded"]["records"]
    assert [int(r["paging_token"]) for r in after] == tokens[4:]  # cursor is exclusive
    desc = horizon.payments().for_account(customer.public_key).order(desc=True).limit(200) \
        .call()["_embedded"]["records"]
    assert [int(r["paging_token"]) for r in desc] == list(reversed(tokens))
    joined = horizon.payments().for_account(customer.public_key).join("transactions") \
        .cursor(tokens[0]).limit(1).call()["_embedded"]["records"][0]
    assert joined["transaction"]["memo"] == "batch"
    assert joined["transaction"]["hash"] == envelope.hash_hex()


def test_account_and_transaction_listings(horizon, http):
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    envelope = pay_from_distribution(horizon, customer.public_key, "4")
    horizon.submit_transaction(envelope)

    mine = horizon.transactions().for_account(customer.public_key).call()["_embedded"]["records"]
    latest = horizon.transactions().order(desc=True).limit(1).call()["_embedded"]["records"]
    ops = http.get(f"/transactions/{envelope.hash_hex()}/operations").json()
    ledger_txs = http.get(f"/ledgers/{mine[-1]['ledger']}/transactions").json()

    assert [t["hash"] for t in mine][-1] == envelope.hash_hex()
    assert len(mine) == 3  # created by friendbot, change_trust, the payment
    assert int(latest[0]["paging_token"]) >= int(mine[-1]["paging_token"])
    assert [r["type"] for r in ops["_embedded"]["records"]] == ["payment"]
    assert envelope.hash_hex() in [t["hash"] for t in ledger_txs["_embedded"]["records"]]
    with pytest.raises(BadRequestError):
        horizon.payments().limit(201).call()
    with pytest.raises(NotFoundError):
        horizon.payments().for_account(Keypair.random().public_key).call()


# --- fidelity against the real Horizon samples -----------------------------------

def _text_memo_payment(horizon, http) -> dict:
    customer = friendbot(http)
    trust_usdc(horizon, customer)
    envelope = pay_from_distribution(horizon, customer.public_key, "1.5",
                                     memo=TextMemo("fidelity"))
    return horizon.submit_transaction(envelope)


def _assert_transaction_parses(resource: dict, passphrase: str) -> None:
    TransactionEnvelope.from_xdr(resource["envelope_xdr"], passphrase)
    xdr.TransactionResult.from_xdr(resource["result_xdr"])
    xdr.TransactionMeta.from_xdr(resource["result_meta_xdr"])
    xdr.LedgerEntryChanges.from_xdr(resource["fee_meta_xdr"])
    int(resource["source_account_sequence"]), int(resource["fee_charged"])
    int(resource["max_fee"]), int(resource["paging_token"])


MAINNET = "Public Global Stellar Network ; September 2015"


def test_fidelity_account(horizon):
    real = sample("account.json")
    ours = horizon.accounts().account_id(DISTRIBUTION.public_key).call()

    omitted_when_empty = {"inflation_destination", "home_domain"}
    assert set(ours) == set(real) - omitted_when_empty
    assert set(ours["_links"]) == set(real["_links"])
    real_credit = next(b for b in real["balances"] if b.get("asset_code") == "USDC")
    real_native = next(b for b in real["balances"] if b["asset_type"] == "native")
    assert set(ours["balances"][0]) == set(real_credit)
    assert set(ours["balances"][-1]) == set(real_native)
    assert set(ours["thresholds"]) == set(real["thresholds"])
    assert set(ours["flags"]) == set(real["flags"])
    assert set(ours["signers"][0]) == set(real["signers"][0])
    assert isinstance(ours["sequence"], str) and isinstance(ours["sequence_time"], str)
    assert horizon.load_account(DISTRIBUTION.public_key).sequence == int(ours["sequence"])


def test_fidelity_transaction_with_text_memo(horizon, http):
    real = sample("transaction_text_memo.json")
    ours = _text_memo_payment(horizon, http)

    assert set(ours) == set(real)
    assert set(ours["_links"]) == set(real["_links"])
    assert set(ours["preconditions"]["timebounds"]) == set(real["preconditions"]["timebounds"])
    assert list(ours)[:3] == list(real)[:3]  # memo, memo_bytes, _links first
    _assert_transaction_parses(ours, TESTNET)
    _assert_transaction_parses(real, MAINNET)
    for key in ("ledger", "operation_count"):
        assert type(ours[key]) is type(real[key])


def test_fidelity_failed_transaction(horizon, http):
    real = sample("transaction_failed_in_ledger.json")
    envelope = pay_from_distribution(horizon, friendbot(http).public_key, "1")
    with pytest.raises(BadRequestError):
        horizon.submit_transaction(envelope)

    ours = horizon.transactions().transaction(envelope.hash_hex()).call()

    assert set(ours) == set(real)
    assert ours["successful"] is real["successful"] is False
    assert xdr.TransactionResult.from_xdr(ours["result_xdr"]).result.code == \
        xdr.TransactionResult.from_xdr(real["result_xdr"]).result.code == TX_CODE.txFAILED


def test_fidelity_muxed_source_against_the_fee_bump_sample(horizon, http):
    real = sample("transaction_fee_bump_muxed.json")
    customer = friendbot(http)
    envelope = build(horizon, customer,
                     lambda b: b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1"),
                     source_muxed_id=int(real["account_muxed_id"]), time_bounds=(0, 0))
    ours = horizon.submit_transaction(envelope, skip_memo_required_check=True)

    fee_bump_only = {"fee_bump_transaction", "inner_transaction"}
    # Horizon >= 2.x also renders a muxed fee account for a muxed (non fee-bump) source.
    assert set(ours) - {"fee_account_muxed", "fee_account_muxed_id"} == set(real) - fee_bump_only
    assert ours["preconditions"] == {"timebounds": {"min_time": "0"}}
    assert isinstance(ours["account_muxed_id"], str)


def test_fidelity_pages(horizon, http):
    usdc_tx = _text_memo_payment(horizon, http)  # the latest 3: friendbot, trust, payment
    real_txs = sample("transactions_page.json")
    real_payments = sample("payments_page.json")
    real_usdc = sample("payments_page_usdc_testnet.json")

    txs = horizon.transactions().order(desc=True).limit(3).call()
    payments = horizon.payments().order(desc=False).limit(3).call()
    usdc = horizon.payments().for_transaction(usdc_tx["hash"]).call()

    for ours, real in ((txs, real_txs), (payments, real_payments), (usdc, real_usdc)):
        assert set(ours) == set(real) == {"_links", "_embedded"}
        assert set(ours["_links"]) == set(real["_links"])
        assert ours["_links"]["self"]["href"].split("?")[1] == \
            real["_links"]["self"]["href"].split("?")[1]
    real_tx_keys = [set(r) for r in real_txs["_embedded"]["records"]]
    for record in txs["_embedded"]["records"]:
        assert set(record) - {"valid_before"} in [k - {"valid_before"} for k in real_tx_keys]
        _assert_transaction_parses(record, TESTNET)
    by_type = {r["type"]: set(r) for r in real_payments["_embedded"]["records"]}
    for record in payments["_embedded"]["records"]:
        assert set(record) == by_type[record["type"]]
    assert set(usdc["_embedded"]["records"][0]) == set(real_usdc["_embedded"]["records"][0])
    assert usdc["_embedded"]["records"][0]["amount"] == "1.5000000"


def test_fidelity_problems(clean_sandbox, horizon, http):
    real_bad_seq = sample("problem_tx_bad_seq.json")
    real_fee = sample("problem_tx_insufficient_fee.json")
    real_timeout = sample("problem_timeout_legacy.json")
    customer = friendbot(http)

    def pay(b):
        b.append_payment_op(DISTRIBUTION.public_key, Asset.native(), "1")

    bad_seq = http.post("/transactions", data={
        "tx": build(horizon, customer, pay, sequence_offset=5).to_xdr()}).json()
    low_fee = http.post("/transactions", data={
        "tx": build(horizon, customer, pay, base_fee=10).to_xdr()}).json()

    for ours, real in ((bad_seq, real_bad_seq), (low_fee, real_fee)):
        assert set(ours) == set(real)
        assert set(ours["extras"]) == set(real["extras"])
        assert ours["type"] == real["type"] and ours["title"] == real["title"]
        assert ours["extras"]["result_codes"] == real["extras"]["result_codes"]
        ours_result = xdr.TransactionResult.from_xdr(ours["extras"]["result_xdr"])
        real_result = xdr.TransactionResult.from_xdr(real["extras"]["result_xdr"])
        assert ours_result.result.code == real_result.result.code
    assert bad_seq["extras"]["result_xdr"] == real_bad_seq["extras"]["result_xdr"]

    clean_sandbox.fault("horizon.submit_drop", times=1, wait_s=0.3)
    envelope = build(horizon, customer, pay)
    timeout = http.post("/transactions", data={"tx": envelope.to_xdr()})
    # Current Horizon: the legacy keys plus extras.hash / extras.envelope_xdr (NOTES §3.3).
    assert timeout.status_code == 504
    assert timeout.headers["Content-Type"] == "application/problem+json; charset=utf-8"
    assert set(timeout.json()) == set(real_timeout) | {"extras"}
    assert timeout.json()["type"] == \
        "https://stellar.org/horizon-errors/transaction_submission_timeout"
    assert timeout.json()["extras"] == {"hash": envelope.hash_hex(),
                                        "envelope_xdr": envelope.to_xdr()}


def test_fidelity_fee_stats_and_root(horizon, http):
    real_stats = sample("fee_stats.json")
    real_root = sample("root.json")

    stats = http.get("/fee_stats").json()
    root = horizon.root().call()

    assert set(stats) == set(real_stats)
    assert set(stats["fee_charged"]) == set(real_stats["fee_charged"])
    assert set(stats["max_fee"]) == set(real_stats["max_fee"])
    assert all(isinstance(v, str) for v in stats["fee_charged"].values())
    assert set(root) == set(real_root)
    assert set(root["_links"]) == set(real_root["_links"]) | {"friendbot"}
    for key in real_root:
        assert type(root[key]) is type(real_root[key]), key


def test_every_fault_name_a_stand_in_reads_is_known():
    """A fault read by a stand-in but missing from ``KNOWN`` could never be switched on
    (POST /sandbox/faults refuses it): every literal name passed to ``faults.take`` /
    ``faults.peek`` under sandbox/ must be listed."""
    import re

    from sandbox.control.faults import KNOWN
    from tests.conftest import ROOT

    pattern = re.compile(r'faults\.(?:take|peek|take_numbered|get)\(\s*"([a-z0-9]+\.[a-z0-9_]+)"')
    read = {name for path in (ROOT / "sandbox").rglob("*.py")
            for name in pattern.findall(path.read_text())}
    assert read, "the pattern found no fault reads at all"
    assert read - KNOWN == set()
