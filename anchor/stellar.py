"""Horizon gateway and the pool of channel (source) accounts.

All Horizon traffic goes through stellar-sdk's ``Server`` with a ``RequestsClient``
whose automatic retries are off: stellar-sdk 16.x re-POSTs on 504 and timeouts by
itself and can block for minutes (horizon/NOTES.md §1.1); Corridor's own rule in
``anchor.envelopes`` decides every resubmission and every rebuild.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from stellar_sdk import Account, Asset, Keypair, Server, StrKey, TransactionBuilder
from stellar_sdk import exceptions as sdk_errors
from stellar_sdk.client.requests_client import RequestsClient
from stellar_sdk.transaction_envelope import TransactionEnvelope

from anchor.models import SourceAccount
from common import devkeys
from common.sweeps import broker_redis

log = logging.getLogger(__name__)
STROOP = Decimal("0.0000001")


class HorizonUnavailable(Exception):
    """Horizon could not answer (timeout, 5xx, connection): nothing is known."""


def server() -> Server:
    client = RequestsClient(
        num_retries=0,
        request_timeout=settings.HTTP_TIMEOUT_S,
        post_timeout=settings.STELLAR_SUBMIT_TIMEOUT_S,
    )
    return Server(settings.HORIZON_URL, client=client)


def usdc() -> Asset:
    return Asset(settings.STELLAR_USDC_CODE, settings.STELLAR_USDC_ISSUER)


def distribution_keypair() -> Keypair:
    return Keypair.from_secret(settings.STELLAR_DISTRIBUTION_SECRET)


def derived_channel_keypair(n: int, secret: str | None = None) -> Keypair:
    """Channel ``n`` (1-based) of the development seed secret
    (STELLAR_CHANNEL_SEED_SECRET): Keypair.from_raw_ed25519_seed(sha256(
    "corridor-channel:" + secret + ":" + n)). Sandbox / development only: production
    refuses the setting (corridor/checks.py E013)."""
    secret = settings.STELLAR_CHANNEL_SEED_SECRET if secret is None else secret
    return devkeys.channel_keypair(secret, n)


def configured_channel_keypairs() -> list[Keypair]:
    """The channel keypairs the environment configures, in pool order (no database
    read): STELLAR_CHANNEL_SECRETS, else channels 1..STELLAR_CHANNEL_POOL_SIZE of
    STELLAR_CHANNEL_SEED_SECRET; STELLAR_CHANNEL_POOL_SIZE > 0 caps either list. Empty
    when none is configured. Seeds live only in the environment (or a secret store),
    never in the database, which holds the public keys and their state."""
    size = settings.STELLAR_CHANNEL_POOL_SIZE
    if settings.STELLAR_CHANNEL_SECRETS:
        secrets = list(settings.STELLAR_CHANNEL_SECRETS)
        pairs = [Keypair.from_secret(s) for s in (secrets[:size] if size else secrets)]
    elif settings.STELLAR_CHANNEL_SEED_SECRET and size:
        pairs = [derived_channel_keypair(n) for n in range(1, size + 1)]
    else:
        pairs = []
    return pairs


def channel_keypairs() -> dict[str, Keypair]:
    """Address -> keypair of every configured channel; without any, the distribution
    account is its own single channel (the default)."""
    pairs = configured_channel_keypairs() or [distribution_keypair()]
    return {kp.public_key: kp for kp in pairs}


def stellar_amount(amount: Decimal) -> str:
    """Decimal -> the 7-decimal string Stellar wants ("10.5" -> "10.5000000").
    Raises ValueError for more than 7 decimals (never rounds money silently)."""
    quantized = amount.quantize(STROOP)
    if quantized != amount:
        raise ValueError(f"{amount} has more than 7 decimal places")
    if quantized <= 0:
        raise ValueError(f"{amount} is not a positive amount")
    return format(quantized, "f")


# --- reads -----------------------------------------------------------------------

def find_transaction(tx_hash: str) -> dict[str, Any] | None:
    """``GET /transactions/{hash}``: the resource, or None on 404 (not (yet) ingested)."""
    try:
        return server().transactions().transaction(tx_hash).call()
    except sdk_errors.NotFoundError:
        return None
    except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
        raise HorizonUnavailable(str(exc)) from exc


def transaction_payments(tx_hash: str) -> list[dict[str, Any]]:
    try:
        page = server().payments().for_transaction(tx_hash).limit(200).call()
    except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
        raise HorizonUnavailable(str(exc)) from exc
    return page["_embedded"]["records"]


def load_account(address: str) -> dict[str, Any] | None:
    try:
        return server().accounts().account_id(address).call()
    except sdk_errors.NotFoundError:
        return None
    except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
        raise HorizonUnavailable(str(exc)) from exc


def account_sequence(address: str) -> int:
    account = load_account(address)
    if account is None:
        raise HorizonUnavailable(f"source account {address} does not exist on Horizon")
    return int(account["sequence"])


def has_trustline(address: str, asset: Asset) -> bool | None:
    """True/False for an existing account; None when the account does not exist."""
    if address.startswith("M"):
        address = StrKey.decode_muxed_account(address).ed25519
        address = StrKey.encode_ed25519_public_key(address)
    account = load_account(address)
    if account is None:
        return None
    for balance in account.get("balances", []):
        if (balance.get("asset_code") == asset.code
                and balance.get("asset_issuer") == asset.issuer):
            return True
    return False


def latest_ledger_close_time() -> datetime:
    """``history_latest_ledger_closed_at`` from Horizon's root (NOTES §3.2)."""
    try:
        root = server().root().call()
    except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
        raise HorizonUnavailable(str(exc)) from exc
    closed_at = root["history_latest_ledger_closed_at"].replace("Z", "+00:00")
    return datetime.fromisoformat(closed_at).astimezone(UTC)


def history_height() -> tuple[int, datetime]:
    """(``history_latest_ledger``, its ``closed_at``) from Horizon's root: the newest
    ledger a history read (payments, transactions) of the same node can show. Read it
    BEFORE the history read it vouches for: a node's history only grows, so a read that
    follows shows at least that ledger. History endpoints carry no ``Latest-Ledger``
    (stellar-horizon ``StateMiddleware``), hence the separate read. Raises
    HorizonUnavailable."""
    try:
        root = server().root().call()
    except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
        raise HorizonUnavailable(str(exc)) from exc
    closed_at = root["history_latest_ledger_closed_at"].replace("Z", "+00:00")
    return int(root["history_latest_ledger"]), datetime.fromisoformat(closed_at).astimezone(UTC)


# --- submission ------------------------------------------------------------------

@dataclass
class SubmitResult:
    """What one POST /transactions told us.

    kind: ``applied`` (200, successful), ``failed`` (400 transaction_failed: either
    included with a failed op or refused by core; look the hash up to tell),
    ``unknown`` (504 / 5xx / timeout / connection error: the envelope may still land).
    """

    kind: str
    tx_code: str = ""
    op_codes: list[str] = field(default_factory=list)
    detail: str = ""


def submit(envelope_xdr: str) -> SubmitResult:
    """POST the stored envelope once (no SDK retries). Never builds anything new."""
    envelope = TransactionBuilder.from_xdr(envelope_xdr, settings.STELLAR_NETWORK_PASSPHRASE)
    try:
        server().submit_transaction(envelope, skip_memo_required_check=True)
        return SubmitResult("applied")
    except sdk_errors.BadRequestError as exc:
        codes = (exc.extras or {}).get("result_codes", {})
        return SubmitResult("failed", tx_code=codes.get("transaction", ""),
                            op_codes=list(codes.get("operations", []) or []),
                            detail=f"{exc.status} {exc.title}")
    except (sdk_errors.BadResponseError, sdk_errors.UnknownRequestError) as exc:
        return SubmitResult("unknown", detail=f"{exc.status} {exc.title}")
    except (sdk_errors.ConnectionError, TimeoutError) as exc:
        return SubmitResult("unknown", detail=f"{type(exc).__name__}: {exc}")


# Async submission outcomes (stellar-horizon ``actions/submit_transaction_async.go``;
# horizon/NOTES.md §2.2 item 8 and §3.3).
QUEUED, TRY_AGAIN_LATER, REFUSED, UNKNOWN = "queued", "try_again_later", "refused", "unknown"


def _tx_code_name(code) -> str:
    """An XDR TransactionResultCode as Horizon spells it (txBAD_SEQ -> tx_bad_seq;
    txNO_ACCOUNT -> tx_no_source_account, stellar/go ``codes/main.go``)."""
    name = code.name
    if name == "txNO_ACCOUNT":
        return "tx_no_source_account"
    return "tx_" + name.removeprefix("tx").lower()


def submit_async(envelope_xdr: str) -> SubmitResult:
    """POST the stored envelope once to ``/transactions_async`` (no SDK retries; never
    waits for a ledger; never builds anything new). ``kind``:

    - ``queued``: 201 PENDING or 409 DUPLICATE -- core holds it *for now*; it can still
      be dropped, so it is followed by its hash and re-posted while alive;
    - ``try_again_later``: 503 with ``tx_status`` TRY_AGAIN_LATER -- not queued (core
      holds another transaction of this source, or is full); re-post the same envelope;
    - ``refused``: 400 ERROR, ``tx_code`` decoded from ``error_result_xdr``. The endpoint
      does not consult Horizon's history: ``tx_bad_seq`` also answers an envelope that
      already landed, so it means "look it up" (anchor.envelopes), never "dead";
    - ``unknown``: any other answer (a 503 problem such as ``stale_history``, 5xx, a
      timeout, no connection, an unreadable body): nothing is known.
    The body, not the status alone, decides (a 503 is either of two things)."""
    client = RequestsClient(num_retries=0, request_timeout=settings.HTTP_TIMEOUT_S,
                            post_timeout=settings.STELLAR_SUBMIT_TIMEOUT_S)
    url = f"{settings.HORIZON_URL.rstrip('/')}/transactions_async"
    try:
        response = client.post(url, data={"tx": envelope_xdr})
    except (sdk_errors.ConnectionError, TimeoutError, OSError) as exc:
        return SubmitResult(UNKNOWN, detail=f"{type(exc).__name__}: {exc}")
    finally:
        client.close()
    try:
        body = response.json()
    except ValueError:
        body = {}
    status = body.get("tx_status") if isinstance(body, dict) else None
    title = body.get("title", "") if isinstance(body, dict) else ""
    detail = f"{response.status_code} {status or title}"
    if status in ("PENDING", "DUPLICATE") and response.status_code in (201, 409):
        return SubmitResult(QUEUED, detail=detail.strip())
    if status == "TRY_AGAIN_LATER" and response.status_code == 503:
        return SubmitResult(TRY_AGAIN_LATER, detail=detail.strip())
    if status == "ERROR" and response.status_code == 400:
        from stellar_sdk import xdr

        try:
            result = xdr.TransactionResult.from_xdr(body.get("error_result_xdr", ""))
            tx_code = _tx_code_name(result.result.code)
        except Exception:  # an undecodable result is a refusal we cannot read
            tx_code = "tx_unknown"
        return SubmitResult(REFUSED, tx_code=tx_code, detail=detail.strip())
    return SubmitResult(UNKNOWN, detail=detail.strip())


def build_payment(*, channel: Keypair, sequence: int, destination: str, amount: Decimal,
                  memo_type: str, memo: str, max_time: int,
                  funds: Keypair | None = None) -> TransactionEnvelope:
    """Build and sign one USDC payment, sequence ``sequence`` on ``channel``.

    The payment's source is ``funds`` (default: the distribution account, which holds
    the USDC); the transaction's source is the channel (it owns the sequence); when both
    are one account it signs once. memo_type is SEP-24's ``text`` | ``id`` (decimal
    string, up to 2^64-1) | ``hash`` (base64 of 32 bytes) | ``none``. Raises ValueError
    for a memo or amount Stellar cannot carry."""
    funds = funds or distribution_keypair()
    builder = TransactionBuilder(
        Account(channel.public_key, sequence - 1),
        network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE,
        base_fee=settings.STELLAR_BASE_FEE,
    )
    builder.add_time_bounds(0, max_time)
    if memo_type == "text":
        builder.add_text_memo(memo)
    elif memo_type == "id":
        builder.add_id_memo(int(memo))
    elif memo_type == "hash":
        builder.add_hash_memo(base64.b64decode(memo))
    elif memo_type not in ("none", "", None):
        raise ValueError(f"unsupported memo_type {memo_type!r}")
    op_source = None if funds.public_key == channel.public_key else funds.public_key
    builder.append_payment_op(destination, usdc(), stellar_amount(amount), source=op_source)
    envelope = builder.build()
    envelope.sign(channel)
    if op_source:
        envelope.sign(funds)
    return envelope


# --- channel pool ------------------------------------------------------------------

class NoChannelFree(Exception):
    """Every channel account has an envelope in flight; try again shortly."""


def ensure_pool() -> None:
    """Record every configured channel's public key (never its seed): one INSERT ... ON
    CONFLICT DO NOTHING."""
    SourceAccount.objects.bulk_create([SourceAccount(address=a) for a in channel_keypairs()],
                                      ignore_conflicts=True)


REFUSALS_KEY = "corridor:channel_refusals"


def _redis():
    return broker_redis(timeout_s=0.5)


def count_refusal() -> None:
    """One more claim refused because every channel had an envelope in flight (a
    counter in Redis, shared by every process; a metric, so an unreachable Redis only
    loses the count)."""
    try:
        _redis().incr(REFUSALS_KEY)
    except Exception:  # noqa: BLE001 - a metric never breaks a release
        log.debug("channel refusal not counted (Redis unreachable)")


def channel_refusals() -> int | None:
    """Claims refused so far for want of a free channel (None: Redis unreachable)."""
    try:
        return int(_redis().get(REFUSALS_KEY) or 0)
    except Exception:  # noqa: BLE001
        return None


def lease_channel(*, holder: str, until: datetime, prefer: str | None = None,
                  resync: bool = False) -> tuple[Keypair, int]:
    """Lease a free channel to ``holder`` until ``until`` and hand out its next
    sequence number. Must run inside the caller's transaction (row lock held until
    its commit, so two claims can never get the same sequence).

    A channel is free when nobody holds it (its last envelope landed or was proven
    dead), or its holder's lease passed (that envelope's time bounds are over: it
    landed or can never land). A retired channel is never leased. After such an
    expiry, or with ``resync``, the sequence is read from Horizon.
    Raises NoChannelFree (counted, see ``channel_refusals``), HorizonUnavailable."""
    from django.db.models import Q

    ensure_pool()
    now = timezone.now()
    keypairs = channel_keypairs()
    candidates = SourceAccount.objects.select_for_update(skip_locked=True).filter(
        address__in=list(keypairs), retired_at__isnull=True
    )
    chosen = None
    if prefer:
        chosen = candidates.filter(address=prefer, leased_by=holder).first()
    if chosen is None:
        chosen = candidates.filter(Q(leased_by__isnull=True) | Q(leased_until__lt=now)).order_by(
            "leased_until", "id").first()
    if chosen is None:
        count_refusal()
        raise NoChannelFree("all channel accounts have a transaction in flight")
    if resync or chosen.sequence is None or chosen.leased_by not in (None, holder):
        chosen.sequence = account_sequence(chosen.address)
    sequence = chosen.sequence + 1
    SourceAccount.objects.filter(pk=chosen.pk).update(
        sequence=sequence, leased_by=holder, leased_until=until
    )
    return keypairs[chosen.address], sequence


def free_channel(*, address: str, holder: str) -> None:
    """End ``holder``'s lease (its envelope landed). In the caller's transaction; after
    its commit the ``CHANNEL_FREED`` hooks run (a waiting release is woken)."""
    if SourceAccount.objects.filter(address=address, leased_by=holder).update(
            leased_by=None, leased_until=None):
        transaction.on_commit(_channel_freed)


def forget_sequence(*, address: str, holder: str) -> None:
    """The holder's envelope is dead: its sequence was not used; reread on next use.
    Frees the channel like ``free_channel``."""
    if SourceAccount.objects.filter(address=address, leased_by=holder).update(
            sequence=None, leased_by=None, leased_until=None):
        transaction.on_commit(_channel_freed)


# Called (no arguments) after the commit that freed a channel; anchor.releases registers
# the wake-up of a release waiting for one.
CHANNEL_FREED: list = []


def _channel_freed() -> None:
    for hook in CHANNEL_FREED:
        try:
            hook()
        except Exception:  # noqa: BLE001 - a wake-up is an optimisation: the retry remains
            log.warning("channel-freed hook failed", exc_info=True)


AWAITING_KEY = "corridor:awaiting_channel"


def await_channel(holder: str) -> None:
    """Remember that ``holder`` (a release's transaction id) was refused a channel, so
    the next freed channel wakes it (a Redis sorted set, oldest first). Best effort:
    the refused task keeps its own retry."""
    import time

    try:
        _redis().zadd(AWAITING_KEY, {holder: time.time()}, nx=True)
    except Exception:  # noqa: BLE001
        log.debug("awaiting channel not recorded (Redis unreachable)")


def next_waiting(count: int = 1) -> list[str]:
    """Take the ``count`` oldest holders waiting for a channel (removed from the set)."""
    try:
        return [m.decode() for m, _ in _redis().zpopmin(AWAITING_KEY, count)]
    except Exception:  # noqa: BLE001
        return []


def channel_free_now() -> bool:
    """Whether some configured channel looks free right now (one read, no lock, no
    write): a cheap early refusal before a claim's outbound reads. A channel not
    recorded yet counts as free (``lease_channel`` records it)."""
    from django.db.models import Q

    addresses = list(channel_keypairs())
    rows = SourceAccount.objects.filter(address__in=addresses)
    if rows.count() < len(addresses):
        return True
    return rows.filter(retired_at__isnull=True).filter(
        Q(leased_by__isnull=True) | Q(leased_until__lt=timezone.now())).exists()


def prepare_payment(*, holder: str, destination: str, amount: Decimal, memo_type: str,
                    memo: str, resync: bool = False) -> dict:
    """Step 1 of every outbox (releases, refunds): lease a channel for ``holder``, take
    its next sequence, build and sign the USDC payment with time bounds of
    STELLAR_TX_TIMEOUT_S, and return the fields to store before anything is sent:
    ``source_account``, ``sequence``, ``envelope_xdr``, ``tx_hash``, ``max_time``
    (datetime, UTC). Runs inside the caller's transaction (the channel row lock is
    held until it commits). Raises NoChannelFree, HorizonUnavailable, ValueError."""
    max_time = int(timezone.now().timestamp() + settings.STELLAR_TX_TIMEOUT_S)
    channel, sequence = lease_channel(holder=holder, until=lease_end(max_time), resync=resync)
    envelope = build_payment(channel=channel, sequence=sequence, destination=destination,
                             amount=amount, memo_type=memo_type, memo=memo, max_time=max_time)
    return {"source_account": channel.public_key, "sequence": sequence,
            "envelope_xdr": envelope.to_xdr(), "tx_hash": envelope.hash_hex(),
            "max_time": datetime.fromtimestamp(max_time, UTC)}


def lease_end(max_time: int) -> datetime:
    return datetime.fromtimestamp(max_time, UTC) + timedelta(
        seconds=settings.STELLAR_CHANNEL_GRACE_S
    )


# --- the hub (remittances, DESIGN.md §6) ---------------------------------------------

PAYMENT_TYPES = ("payment", "path_payment_strict_receive", "path_payment_strict_send")


def hub_keypair() -> Keypair:
    """Corridor's USDC hub: partners fund remittances to it, it pays the anchors."""
    return Keypair.from_secret(settings.STELLAR_HUB_SECRET)


@dataclass(frozen=True)
class Transfer:
    """One successful payment operation as Horizon shows it (``join=transactions``).
    ``source``/``destination``: G... base accounts; ``asset``: ``CODE:ISSUER`` or
    ``native``; ``amount``: Decimal, 7 dp; ``memo``: the transaction's memo as a string
    ("" for none); ``destination_muxed``: the M... address paid when the payment named
    one (Horizon's ``to_muxed``), else ""."""

    tx_hash: str
    paging_token: str
    source: str
    destination: str
    asset: str
    amount: Decimal
    memo_type: str
    memo: str
    created_at: str
    destination_muxed: str = ""


def usdc_asset_id() -> str:
    return f"{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"


def _transfer(record: dict[str, Any]) -> Transfer:
    tx = record.get("transaction") or {}
    asset = "native" if record.get("asset_type") == "native" else (
        f"{record.get('asset_code')}:{record.get('asset_issuer')}")
    return Transfer(
        tx_hash=record["transaction_hash"], paging_token=record["paging_token"],
        source=record.get("from", ""), destination=record.get("to", ""), asset=asset,
        amount=Decimal(record["amount"]), memo_type=tx.get("memo_type", "none"),
        memo=tx.get("memo", ""), created_at=record.get("created_at", ""),
        destination_muxed=record.get("to_muxed") or "")


def transfers_after(account: str, cursor: str = "", *, max_pages: int = 50
                    ) -> list[Transfer]:
    """Every successful payment sent or received by ``account`` after paging token
    ``cursor``, oldest first (``find_transfers_by_reference`` without the memo filter).
    Raises HorizonUnavailable."""
    return find_transfers_by_reference(account, None, cursor, max_pages=max_pages)


def _payment_records(account: str, cursor: str, *, desc: bool,
                     max_pages: int) -> Iterator[dict]:
    """Every payment record of ``account`` (joined with its transaction) after paging
    token ``cursor``, in pages of 200 from Horizon's ``/accounts/{account}/payments
    ?join=transactions``; none for an account Horizon never saw. Raises
    HorizonUnavailable, also past ``max_pages`` pages (the caller stops reading
    earlier when it has what it wants)."""
    for _ in range(max_pages):
        try:
            page = (server().payments().for_account(account).join("transactions")
                    .cursor(cursor).order(desc=desc).limit(200).call())
        except sdk_errors.NotFoundError:
            return
        except Exception as exc:  # the SDK raises several types for one outage
            raise HorizonUnavailable(str(exc)) from exc
        records = page["_embedded"]["records"]
        for record in records:
            cursor = record["paging_token"]
            yield record
        if len(records) < 200:
            return
    raise HorizonUnavailable(f"more than {max_pages} pages of payments after {cursor}")


def _successful_payment(record: dict) -> bool:
    return record.get("type") in PAYMENT_TYPES and record.get("transaction_successful", True)


def find_transfers_by_reference(account: str, reference: str | None, cursor: str = "", *,
                                max_pages: int = 50) -> list[Transfer]:
    """Successful payments sent or received by ``account`` whose transaction memo is
    ``reference`` (None: any), oldest first, read from Horizon's
    ``/accounts/{account}/payments?join=transactions`` after paging token ``cursor``
    ("" = from the beginning).

    The caller decides what matches (DESIGN.md §6: the same from, to, amount and
    asset). An account Horizon never saw has no payments. Raises HorizonUnavailable."""
    return [_transfer(record) for record in _payment_records(
        account, cursor, desc=False, max_pages=max_pages)
        if _successful_payment(record) and (
            reference is None
            or (record.get("transaction") or {}).get("memo", "") == reference)]


def transfers_page(account: str, cursor: str, *, limit: int) -> tuple[list[Transfer], str]:
    """One page of ``account``'s payments after paging token ``cursor``, oldest first:
    (the successful ones, each with its ``paging_token``; the paging token of the last
    record read, successful or not, ``cursor`` when there was none). ``limit``: at most
    200 records (Horizon's page). An account Horizon never saw has none. Raises
    HorizonUnavailable."""
    transfers: list[Transfer] = []
    try:
        page = (server().payments().for_account(account).join("transactions")
                .cursor(cursor).order(desc=False).limit(min(limit, 200)).call())
    except sdk_errors.NotFoundError:
        return transfers, cursor
    except Exception as exc:  # the SDK raises several types for one outage
        raise HorizonUnavailable(str(exc)) from exc
    for record in page["_embedded"]["records"]:
        cursor = record["paging_token"]
        if _successful_payment(record):
            transfers.append(_transfer(record))
    return transfers, cursor


def transfers_since(account: str, since: datetime, *, max_pages: int = 10) -> list[Transfer]:
    """Successful payments sent or received by ``account`` whose ledger closed at or
    after ``since`` (aware datetime), newest first, read from Horizon's
    ``/accounts/{account}/payments?join=transactions&order=desc`` until an older one.
    An account Horizon never saw has none. Raises HorizonUnavailable (also past
    ``max_pages`` pages of 200)."""
    found: list[Transfer] = []
    for record in _payment_records(account, "", desc=True, max_pages=max_pages):
        if datetime.fromisoformat(record["created_at"]) < since:
            break
        if _successful_payment(record):
            found.append(_transfer(record))
    return found


def latest_payment_cursor(account: str) -> str:
    """The paging token of ``account``'s latest payment ("" if none): a saga's
    ``stellar_cursor``, so its look-ups read only what happened after it started."""
    try:
        page = server().payments().for_account(account).order(desc=True).limit(1).call()
    except sdk_errors.NotFoundError:
        return ""
    except Exception as exc:
        raise HorizonUnavailable(str(exc)) from exc
    records = page["_embedded"]["records"]
    return records[0]["paging_token"] if records else ""


def asset_balance(address: str, asset: Asset) -> Decimal | None:
    """``address``'s balance of ``asset`` (0 without a trustline); None when the
    account does not exist. Raises HorizonUnavailable."""
    account = load_account(address)
    if account is None:
        return None
    for line in account.get("balances", []):
        if asset.is_native():  # Horizon's native line has no asset_code / asset_issuer
            if line.get("asset_type") == "native":
                return Decimal(line["balance"])
        elif line.get("asset_code") == asset.code and line.get("asset_issuer") == asset.issuer:
            return Decimal(line["balance"])
    return Decimal(0)


def build_payment_from(*, source: Keypair, sequence: int, destination: str, amount: Decimal,
                       memo_type: str, memo: str, max_time: int) -> TransactionEnvelope:
    """One USDC payment from ``source`` on its own sequence and its own USDC (the hub):
    ``build_payment`` with ``source`` as both channel and funds."""
    return build_payment(channel=source, sequence=sequence, destination=destination,
                         amount=amount, memo_type=memo_type, memo=memo, max_time=max_time,
                         funds=source)
