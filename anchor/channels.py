"""Channel accounts (issue 11 §1): the transaction sources of deposit releases, one
envelope in flight each, so N channels release up to N deposits per ledger.

A release transaction has the channel as its source (it owns the sequence and pays the
fee) and one payment whose source is the distribution account (it holds the USDC); both
sign (``anchor.stellar.build_payment``). The pool is ``anchor.stellar.channel_keypairs``:
seeds come from the environment only (``STELLAR_CHANNEL_SECRETS``, or in the sandbox /
development channels 1..``STELLAR_CHANNEL_POOL_SIZE`` derived from
``STELLAR_CHANNEL_SEED_SECRET``, which production refuses); the database
(``stellar_source_accounts``) holds public keys, leases, sequences and the XLM last seen.

Services here (``manage.py channels`` calls them):

- ``channels_create(count=N)``: channels 1..N exist on chain, funded from the
  distribution account with STELLAR_CHANNEL_FUNDING_XLM each (create_account, up to 100
  per transaction), and recorded; returns the env lines to set;
- ``channels_retire(addresses=...)``: no new leases; a retired channel with nothing in
  flight pays its XLM above the minimum balance back to the distribution account;
- ``channels_status()``: every recorded channel with its state, lease and XLM (read from
  Horizon now), and the refusals counted so far.

Run ``create`` and ``retire`` while no release uses the distribution account as its own
channel (the default pool): they spend one of its sequence numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.utils import timezone
from stellar_sdk import Account, Asset, Keypair, TransactionBuilder

from anchor import stellar
from anchor.models import SourceAccount

log = logging.getLogger(__name__)
OPS_PER_TX = 100


class ChannelError(Exception):
    """Horizon refused a channel transaction, or the request makes no sense."""


@dataclass(frozen=True)
class ChannelRow:
    """One channel as ``channels list`` shows it. ``state``: ``free`` | ``in_flight`` |
    ``retired``; ``xlm``: Decimal XLM (7 dp) as Horizon showed it now, None when the
    account is missing on chain."""

    address: str
    state: str
    leased_by: str | None
    leased_until: datetime | None
    xlm: Decimal | None


def _planned_keypairs(count: int) -> tuple[list[Keypair], list[str]]:
    """The ``count`` channels to have, and the env lines that configure them."""
    if count < 1:
        raise ChannelError("count must be at least 1")
    if settings.STELLAR_CHANNEL_SEED_SECRET:
        pairs = [stellar.derived_channel_keypair(n) for n in range(1, count + 1)]
        lines = [f"STELLAR_CHANNEL_SEED_SECRET={settings.STELLAR_CHANNEL_SEED_SECRET}",
                 f"STELLAR_CHANNEL_POOL_SIZE={count}"]
        return pairs, lines
    pairs = [Keypair.from_secret(s) for s in settings.STELLAR_CHANNEL_SECRETS][:count]
    pairs += [Keypair.random() for _ in range(count - len(pairs))]
    lines = ["STELLAR_CHANNEL_SECRETS=" + ",".join(kp.secret for kp in pairs),
             f"STELLAR_CHANNEL_POOL_SIZE={count}"]
    return pairs, lines


def _submit_from_distribution(build) -> None:
    """Build (``build(builder)``) and submit one transaction of the distribution account
    on its current sequence (synchronous: a command may wait a ledger). Raises
    ChannelError, stellar.HorizonUnavailable."""
    funds = stellar.distribution_keypair()
    sequence = stellar.account_sequence(funds.public_key)
    builder = TransactionBuilder(Account(funds.public_key, sequence),
                                 network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE,
                                 base_fee=settings.STELLAR_BASE_FEE)
    builder.set_timeout(int(max(settings.STELLAR_TX_TIMEOUT_S, 30)))
    build(builder)
    envelope = builder.build()
    envelope.sign(funds)
    result = stellar.submit(envelope.to_xdr())
    if result.kind == "applied":
        return
    if result.kind == "unknown" and stellar.find_transaction(envelope.hash_hex()):
        return
    raise ChannelError(f"channel transaction {envelope.hash_hex()} not applied: "
                       f"{result.kind} {result.tx_code} {result.op_codes} {result.detail}")


def _xlm(account: dict | None) -> Decimal | None:
    if account is None:
        return None
    for line in account.get("balances", []):
        if line.get("asset_type") == "native":
            return Decimal(line["balance"])
    return Decimal(0)


def channels_create(*, count: int) -> list[str]:
    """Make channels 1..``count`` exist on chain (each missing one created and funded
    with STELLAR_CHANNEL_FUNDING_XLM XLM by the distribution account, in transactions of
    up to 100 create_account operations) and record their public keys. Idempotent: an
    existing account is only recorded. Returns the env lines that configure this pool
    (seeds or the dev seed secret: the caller shows them or writes them to a private
    file; they are never stored in the database). Raises ChannelError,
    stellar.HorizonUnavailable."""
    pairs, lines = _planned_keypairs(count)
    missing = [kp for kp in pairs if stellar.load_account(kp.public_key) is None]
    amount = stellar.stellar_amount(Decimal(settings.STELLAR_CHANNEL_FUNDING_XLM))
    for start in range(0, len(missing), OPS_PER_TX):
        batch = missing[start:start + OPS_PER_TX]

        def create(builder, batch=batch):
            for kp in batch:
                builder.append_create_account_op(kp.public_key, amount)

        _submit_from_distribution(create)
        log.info("channels: created %s accounts", len(batch))
    now = timezone.now()
    for kp in pairs:
        row, _ = SourceAccount.objects.get_or_create(address=kp.public_key)
        SourceAccount.objects.filter(pk=row.pk).update(
            created_at=row.created_at or now, retired_at=None,
            xlm_balance=_xlm(stellar.load_account(kp.public_key)), balance_checked_at=now)
    return lines


def channels_retire(*, addresses: list[str]) -> dict[str, str]:
    """Retire each channel in ``addresses`` (G...): no release leases it again; one
    with no envelope in flight (no holder, or its lease is over) is merged into the
    distribution account, which gets its XLM above the minimum balance back (a payment
    signed by the channel: configured seeds only). Re-run to sweep one that was in
    flight. Returns address -> ``swept`` | ``retired, in flight`` | ``gone`` (no such
    account on chain). Raises
    ChannelError (an address that is not a configured channel)."""
    keypairs = {kp.public_key: kp for kp in stellar.configured_channel_keypairs()}
    outcome: dict[str, str] = {}
    now = timezone.now()
    for address in addresses:
        if address not in keypairs:
            raise ChannelError(f"{address} is not a configured channel")
        SourceAccount.objects.get_or_create(address=address)
        SourceAccount.objects.filter(address=address, retired_at__isnull=True).update(
            retired_at=now)
        row = SourceAccount.objects.get(address=address)
        if row.leased_by and row.leased_until and row.leased_until > now:
            outcome[address] = "retired, in flight"
            continue
        account = stellar.load_account(address)
        if account is None:
            outcome[address] = "gone"
            continue
        _sweep(keypairs[address], account)
        SourceAccount.objects.filter(pk=row.pk).update(
            xlm_balance=_xlm(stellar.load_account(address)),
            balance_checked_at=timezone.now(), sequence=None)
        outcome[address] = "swept"
    return outcome


MIN_BALANCE_XLM = Decimal("1")  # 2 base reserves of 0.5 XLM: what an account must keep
FEE_MARGIN_XLM = Decimal("0.001")


def _sweep(channel: Keypair, account: dict) -> Decimal:
    """Pay the channel's XLM above its minimum balance back to the distribution account
    (a native payment signed by the channel: the sandbox's core has no account_merge).
    Returns the XLM returned. Raises ChannelError."""
    amount = (_xlm(account) or Decimal(0)) - MIN_BALANCE_XLM - FEE_MARGIN_XLM
    if amount <= 0:
        return Decimal(0)
    builder = TransactionBuilder(Account(channel.public_key, int(account["sequence"])),
                                 network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE,
                                 base_fee=settings.STELLAR_BASE_FEE)
    builder.set_timeout(int(max(settings.STELLAR_TX_TIMEOUT_S, 30)))
    builder.append_payment_op(stellar.distribution_keypair().public_key, Asset.native(),
                              stellar.stellar_amount(amount.quantize(stellar.STROOP)))
    envelope = builder.build()
    envelope.sign(channel)
    result = stellar.submit(envelope.to_xdr())
    if result.kind != "applied" and not stellar.find_transaction(envelope.hash_hex()):
        raise ChannelError(f"sweep of {channel.public_key} not applied: {result.kind} "
                           f"{result.tx_code} {result.op_codes} {result.detail}")
    return amount


def channels_status(*, refresh: bool = True) -> list[ChannelRow]:
    """Every recorded channel (configured now or retired), with its state and XLM
    (read from Horizon when ``refresh``, and stored for /metrics and the admin)."""
    stellar.ensure_pool()
    now = timezone.now()
    rows = []
    for row in SourceAccount.objects.order_by("id"):
        xlm = row.xlm_balance
        if refresh:
            xlm = _xlm(stellar.load_account(row.address))
            SourceAccount.objects.filter(pk=row.pk).update(xlm_balance=xlm,
                                                           balance_checked_at=now)
        rows.append(ChannelRow(address=row.address, state=channel_state(row, now),
                               leased_by=row.leased_by, leased_until=row.leased_until,
                               xlm=xlm))
    return rows


def channel_state(row: SourceAccount, now: datetime | None = None) -> str:
    """``retired``, ``in_flight`` (a holder whose lease is live: its envelope may still
    land) or ``free``."""
    now = now or timezone.now()
    if row.retired_at is not None:
        return "retired"
    if row.leased_by and row.leased_until and row.leased_until > now:
        return "in_flight"
    return "free"
