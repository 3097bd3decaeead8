"""Channel accounts and asynchronous submission (issue 11 §1), against the sandbox over
real HTTP.

- ``manage.py channels create | retire | list``: accounts funded from the distribution
  account, public keys recorded, seeds only in the printed env lines;
- ``POST /transactions_async`` as Corridor reads it (``stellar.submit_async``): PENDING
  and DUPLICATE are "queued", a 503 is TRY_AGAIN_LATER or stale history by its body,
  an envelope already in a ledger answers ERROR ``tx_bad_seq``;
- releases in async mode: a dropped PENDING is re-posted (the same envelope) and lands
  once; ``tx_bad_seq`` for an envelope that landed behind a lagging Horizon is looked up,
  never rebuilt (with the rule switched off, ``ENVELOPE_RULE = "naive"``, the customer
  is paid twice: the protection shown failing); a channel is free again only once its
  envelope landed or is provably dead; a worker SIGKILLed right after its async post
  pays once; N channels under a real Celery worker pay each deposit once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from stellar_sdk import Account, Asset, Keypair, TransactionBuilder

from anchor import envelopes, releases, stellar
from anchor.models import DepositRelease, SourceAccount
from tests.flows import (
    CeleryWorker,
    Wallet,
    assert_released_once,
    paid_deposit,
    purge_broker,
    run_manage,
    settle,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FOREVER = 100_000  # ledgers of lag: until the test clears the fault
SEED_SECRET = "test-channels-dev-secret"


@pytest.fixture
def pool(clean_sandbox, settings):
    """Two channel accounts (derived from a dev secret, created on the sandbox) and
    asynchronous submission."""
    settings.STELLAR_CHANNEL_SEED_SECRET = SEED_SECRET
    settings.STELLAR_CHANNEL_POOL_SIZE = 2
    settings.STELLAR_SUBMIT_MODE = "async"
    from anchor import channels

    channels.channels_create(count=2)
    purge_broker()
    yield [stellar.derived_channel_keypair(n).public_key for n in (1, 2)]
    purge_broker()


def drive_until(transaction_id: str, status: str, *, timeout: float = 20.0):
    """What ``release_follow`` does, in this process: look again until ``status``."""
    def looked():
        release = DepositRelease.objects.get(transaction_id=transaction_id)
        if release.status == status:
            return release
        releases.release_drive(release_id=release.pk, redrive=True)
        return None
    return wait_for(looked, timeout=timeout, interval=0.3, what=f"release {status}")


def payments_once_faults_cleared(sandbox, wallet, expected: int, timeout: float = 15.0):
    sandbox.clear_faults()
    return wait_for(lambda: len(wallet.usdc_payments()) >= expected and wallet.usdc_payments(),
                    timeout=timeout, what=f"{expected} payment(s) on the sandbox ledger")


# --- manage.py channels ---------------------------------------------------------------

def test_channels_create_list_and_retire(clean_sandbox, settings):
    settings.STELLAR_CHANNEL_SEED_SECRET = "test-channels-create"
    settings.STELLAR_CHANNEL_FUNDING_XLM = Decimal("15")
    out = StringIO()

    call_command("channels", "create", "3", stdout=out)

    lines = out.getvalue().splitlines()
    assert "STELLAR_CHANNEL_SEED_SECRET=test-channels-create" in lines
    assert "STELLAR_CHANNEL_POOL_SIZE=3" in lines
    addresses = [stellar.derived_channel_keypair(n).public_key for n in (1, 2, 3)]
    rows = {r.address: r for r in SourceAccount.objects.filter(address__in=addresses)}
    assert set(rows) == set(addresses)
    assert all(r.xlm_balance == Decimal("15") and r.created_at for r in rows.values())
    for address in addresses:  # funded by the distribution account, on chain
        assert stellar.load_account(address) is not None
    # the database holds public keys only: no seed in any column
    seeds = {stellar.derived_channel_keypair(n).secret for n in (1, 2, 3)}
    values = {str(v) for row in SourceAccount.objects.values() for v in row.values()}
    assert not seeds & values
    # create again: idempotent, nothing new on chain
    call_command("channels", "create", "3", stdout=StringIO())
    assert SourceAccount.objects.filter(address__in=addresses).count() == 3

    settings.STELLAR_CHANNEL_POOL_SIZE = 3
    retired = StringIO()
    call_command("channels", "retire", addresses[2], stdout=retired)

    assert f"{addresses[2]} swept" in retired.getvalue()
    row = SourceAccount.objects.get(address=addresses[2])
    assert row.retired_at and row.xlm_balance < Decimal("1.001")  # its XLM went back
    with pytest.raises(stellar.NoChannelFree), transaction.atomic():
        for _ in range(3):  # two free channels, then none: the retired one is never leased
            stellar.lease_channel(holder=f"h-{_}", until=row.retired_at.replace(year=2999))
    listed = StringIO()
    call_command("channels", "list", stdout=listed)
    assert f"{addresses[2]} retired" in listed.getvalue()
    assert "refusals=" in listed.getvalue()
    with pytest.raises(Exception, match="not a configured channel"):
        call_command("channels", "retire", Keypair.random().public_key, stdout=StringIO())


def test_production_refuses_a_derived_channel_seed_secret():
    from django.test import override_settings

    from corridor.checks import deployment_problems

    with override_settings(STELLAR_CHANNEL_SEED_SECRET="anything"):
        assert any(p.id == "corridor.E015" for p in deployment_problems())
    assert not any(p.id == "corridor.E015" for p in deployment_problems())


# --- POST /transactions_async as Corridor reads it -----------------------------------------

def _native_envelope(sandbox) -> str:
    source = Keypair.random()
    sandbox.http.get("/horizon/friendbot", params={"addr": source.public_key}
                     ).raise_for_status()
    from django.conf import settings

    sequence = stellar.account_sequence(source.public_key)
    builder = TransactionBuilder(Account(source.public_key, sequence),
                                 network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE,
                                 base_fee=100)
    builder.add_time_bounds(0, int(time.time() + 30))
    builder.append_payment_op(stellar.distribution_keypair().public_key, Asset.native(), "1")
    envelope = builder.build()
    envelope.sign(source)
    return envelope


def test_async_answers_pending_duplicate_503_bodies_and_bad_seq_after_landing(clean_sandbox):
    envelope = _native_envelope(clean_sandbox)
    xdr = envelope.to_xdr()

    clean_sandbox.fault("horizon.stale_history", times=1)
    stale = stellar.submit_async(xdr)
    clean_sandbox.fault("horizon.try_again_later", times=1)
    later = stellar.submit_async(xdr)
    clean_sandbox.fault("horizon.close_hold")  # no ledger closes between the next two POSTs
    pending = stellar.submit_async(xdr)
    duplicate = stellar.submit_async(xdr)
    clean_sandbox.fault("horizon.close_hold", times=0)
    wait_for(lambda: stellar.find_transaction(envelope.hash_hex()), timeout=10,
             what="the envelope in a ledger")
    landed = stellar.submit_async(xdr)

    # a 503 problem (stale history) proves nothing; a 503 TRY_AGAIN_LATER body queued nothing
    assert (stale.kind, stale.detail) == ("unknown", "503 Historical DB Is Too Stale")
    assert (later.kind, later.detail) == ("try_again_later", "503 TRY_AGAIN_LATER")
    assert (pending.kind, pending.detail) == ("queued", "201 PENDING")
    assert (duplicate.kind, duplicate.detail) == ("queued", "409 DUPLICATE")
    # the endpoint does not consult history: "look it up", which the rule does
    assert (landed.kind, landed.tx_code) == ("refused", "tx_bad_seq")


# --- releases in async mode ---------------------------------------------------------------

def test_a_dropped_pending_is_reposted_and_lands_once(pool, clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_drop", times=1)

    first = releases.release_start(transaction_id=transaction_id)

    assert first.status == "submitting"
    assert "posted async: queued" in first.last_error  # PENDING... then core forgot it
    assert first.source_account in pool
    time.sleep(1.0)  # ledgers close: the dropped envelope is not in any of them
    assert stellar.find_transaction(first.tx_hash) is None
    release = drive_until(transaction_id, "completed")
    assert release.tx_hash == first.tx_hash and release.attempts == 1  # the same envelope
    assert_released_once(wallet, transaction_id)


def test_bad_seq_for_a_landed_envelope_is_looked_up_and_paid_once(pool, clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)
    release = releases.release_start(transaction_id=transaction_id)
    wait_for(lambda: stellar.account_sequence(release.source_account) >= release.sequence,
             timeout=10, what="the envelope applied (the account shows its sequence)")

    # re-post of the landed envelope: ERROR tx_bad_seq; history lags, so it cannot be
    # proven landed or dead yet -> wait, never rebuild
    reposted = releases.release_drive(release_id=release.pk)

    assert reposted.status == "submitting"
    assert reposted.tx_hash == release.tx_hash and reposted.attempts == 1
    assert "tx_bad_seq" in reposted.last_error and "unknown" in reposted.last_error
    payments_once_faults_cleared(clean_sandbox, wallet, 1)
    drive_until(transaction_id, "completed")
    assert_released_once(wallet, transaction_id)
    time.sleep(1.0)
    assert len(wallet.usdc_payments()) == 1


def test_without_the_rule_bad_seq_after_landing_pays_twice(pool, clean_sandbox, settings):
    """The protection switched off once: reading "sequence used, hash not found" as
    dead (the old rule) rebuilds an envelope that already paid."""
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.lookup_lag", ledgers=FOREVER)
    release = releases.release_start(transaction_id=transaction_id)
    wait_for(lambda: stellar.account_sequence(release.source_account) >= release.sequence,
             timeout=10, what="the envelope applied")
    settings.ENVELOPE_RULE = "naive"
    settings.RELEASE_LOST_SUCCESSOR_CHECK = False  # the rebuild's own look would wait

    releases.release_drive(release_id=release.pk)

    payments = payments_once_faults_cleared(clean_sandbox, wallet, 2)
    assert len(payments) == 2


def test_a_channel_is_free_again_only_once_its_envelope_landed_or_is_dead(
        pool, clean_sandbox, settings):
    settings.STELLAR_CHANNEL_POOL_SIZE = 1
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_drop")  # every post answers PENDING, none queued
    refusals = stellar.channel_refusals()

    release = releases.release_start(transaction_id=transaction_id)
    channel = SourceAccount.objects.get(address=release.source_account)

    assert channel.leased_by == transaction_id
    with pytest.raises(stellar.NoChannelFree):  # in flight: nobody else gets it
        with transaction.atomic():
            stellar.lease_channel(holder="someone-else", until=release.max_time)
    assert stellar.channel_refusals() == refusals + 1
    releases.release_drive(release_id=release.pk, redrive=True)  # alive: re-posted
    assert SourceAccount.objects.get(pk=channel.pk).leased_by == transaction_id
    # past max_time, a ledger closed after it: provably dead -> rebuilt on the channel
    wait_for(lambda: envelopes.envelope_fate(
        tx_hash=release.tx_hash, source_account=release.source_account,
        sequence=release.sequence, max_time=release.max_time).state == envelopes.DEAD,
        timeout=10, what="the dropped envelope provably dead")
    clean_sandbox.clear_faults()
    rebuilt = releases.release_drive(release_id=release.pk, redrive=True)
    assert rebuilt.attempts == 2 and rebuilt.tx_hash != release.tx_hash
    assert rebuilt.sequence == release.sequence  # the dead one never used it
    drive_until(transaction_id, "completed")
    assert SourceAccount.objects.get(pk=channel.pk).leased_by is None  # landed: free
    assert_released_once(wallet, transaction_id)


def test_a_worker_killed_after_its_async_post_pays_once(pool, clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)

    killed = run_manage("release_deposit", transaction_id, crash_at="after_submit",
                        env={"STELLAR_SUBMIT_MODE": "async",
                             "STELLAR_CHANNEL_SEED_SECRET": SEED_SECRET,
                             "STELLAR_CHANNEL_POOL_SIZE": "2"})

    assert killed.returncode == -9, killed.stderr[-2000:]
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_n_channels_release_concurrently_paying_each_deposit_once(pool, clean_sandbox):
    """Two channels, a backlog of twice as many deposits, a real Celery worker: each
    deposit paid once, every channel used, each freed at the end."""
    from anchor import tasks

    wallets, ids = [], []
    for _ in range(4):
        wallet = Wallet(clean_sandbox)
        wallets.append(wallet)
        ids.append(paid_deposit(clean_sandbox, wallet, amount="500"))
    # Time bounds and the "unknown" grace sized for a loaded CI machine: this test is
    # about channels shared by concurrent releases, not about envelopes expiring (a
    # 3 s envelope behind a busy sandbox was rebuilt, or went to review, in CI).
    worker = CeleryWorker(name="channels", concurrency=4, STELLAR_SUBMIT_MODE="async",
                          STELLAR_CHANNEL_SEED_SECRET=SEED_SECRET,
                          STELLAR_CHANNEL_POOL_SIZE="2", RELEASE_FOLLOW_DELAY_S="0.3",
                          STELLAR_TX_TIMEOUT_S="20", ENVELOPE_UNKNOWN_REVIEW_S="60")
    ended = ("completed", "manual_review", "failed")
    try:
        for transaction_id in ids:
            tasks.deposit_release.delay(transaction_id)
        wait_for(lambda: DepositRelease.objects.filter(status__in=ended).count() == 4,
                 timeout=90, what="4 releases ended",
                 explain=lambda: (list(DepositRelease.objects.values_list(
                     "transaction_id", "status", "attempts", "source_account", "last_error")),
                     worker.log_path.read_text()[-4000:]))
    finally:
        worker.stop()
    statuses = dict(DepositRelease.objects.values_list("transaction_id", "status"))
    assert statuses == dict.fromkeys(ids, "completed"), DepositRelease.objects.values_list(
        "status", "last_error")
    for wallet, transaction_id in zip(wallets, ids, strict=True):
        assert_released_once(wallet, transaction_id)
    used = set(DepositRelease.objects.values_list("source_account", flat=True))
    assert used == set(pool)
    assert set(DepositRelease.objects.values_list("attempts", flat=True)) == {1}
    assert SourceAccount.objects.filter(leased_by__isnull=False).count() == 0


def test_metrics_show_channels_in_flight_their_xlm_and_refusals(pool, client, settings):
    SourceAccount.objects.filter(address=pool[0]).update(
        leased_by="tx-1", leased_until=datetime(2999, 1, 1, tzinfo=UTC))

    text = client.get("/metrics").content.decode()

    assert 'corridor_channels{state="in_flight"} 1.0' in text
    assert f'corridor_channel_xlm{{address="{pool[1]}"}}' in text
    assert "corridor_channel_refusals " in text
