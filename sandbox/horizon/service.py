"""Horizon stand-in: ledger closes, transaction submission, the fixed world, friendbot.

Hooks for ``sandbox.registry``: ``background(stop)`` closes a ledger every
``SANDBOX_LEDGER_CLOSE_S`` seconds; ``reset()`` empties the tables and recreates the
fixed world.

Fixed world (ledger 1, built from real signed transactions so that history pages show
how every account came to be):

- the network root account (seed = sha256(network passphrase), as on every Stellar
  network) holds the rest of the 100 billion XLM;
- friendbot's minion accounts ``friendbot-minion-1`` .. ``-8``
  (``sandbox_keypair``), 100,000,000 XLM each: like the real friendbot, concurrent
  requests are spread over several source accounts, since core queues one transaction
  per source account;
- the USDC issuer (``sandbox.keys.USDC_ISSUER``), the distribution account
  (``sandbox.keys.DISTRIBUTION``) and ``channel-1`` .. ``channel-4``
  (``sandbox_keypair("channel-N")``), 10,000 XLM each;
- the distribution account trusts USDC (``STELLAR_USDC_CODE``) and holds 10,000,000 USDC.

Submission (stellar-horizon ``internal/txsub``, stellar-core ``TransactionQueue``;
horizon/NOTES.md §2.1-2.2):

1. a hash already in a ledger returns its stored outcome (200, or 400
   ``transaction_failed`` for an included transaction whose operation failed);
2. a negative sequence, or a min-sequence precondition not below the sequence, is
   Horizon's own ``tx_bad_seq``;
3. the same envelope already queued joins that submission (core DUPLICATE): it shares
   the first POST's clock, so a later duplicate can time out sooner;
4. **one transaction per source account in the queue** (stellar-core 19.13 / 20.0 and
   later, ``TransactionQueue::canAdd``; SDF blog "Proposed changes to transaction
   submission", 2023): a second transaction from a source that already has one queued
   is refused with TRY_AGAIN_LATER when its sequence is not lower, ``tx_bad_seq`` when it
   is. Horizon counts TRY_AGAIN_LATER as submitted, so that POST waits and answers 504
   ``transaction_submission_timeout`` with nothing queued (resubmit the same envelope
   after the first one lands). Transactions of one source therefore land one ledger at
   a time; use channel accounts for throughput;
5. otherwise core's ``checkValid`` (see ``core.check_valid``) against the last closed
   ledger: refused -> 400 ``transaction_failed`` with ``result_xdr`` and ``result_codes``;
6. accepted -> queued; the POST blocks until the transaction is in a closed ledger (200,
   or 400 ``tx_failed`` with operation codes: fee charged, sequence consumed), or until
   ``SANDBOX_SUBMISSION_TIMEOUT_S`` after the first POST of that envelope (504; the
   transaction may still land later).

At each close the queue is re-validated against the new ledger (close time = wall clock,
whole seconds): a transaction whose time bounds passed, or whose sequence is no longer
next, is dropped and never applies; one that is not valid *yet* (min time) waits up to
``core.QUEUE_DEPTH`` ledgers.

Fault switches (``sandbox.control.faults``; each fires only for a POST /transactions of
a new envelope that passed validation, i.e. one that would be queued; optional param
``account`` restricts it to transactions whose source is that G... address):

- ``horizon.submit_504_after_apply``: the transaction is queued and applied normally,
  but the POST answers the 504 ``transaction_submission_timeout`` problem as soon as the
  ledger holding it closes: the real "504 although the payment landed" (SDP PR #1208,
  django-polaris #361). ``GET /transactions/{hash}`` then finds it; re-POSTing the same
  envelope returns its outcome.
- ``horizon.submit_drop``: the envelope is never queued; the POST waits for the
  submission timeout (param ``wait_s`` to shorten it) and answers 504. The transaction
  stays unknown and dies when its time bounds pass (core TRY_AGAIN_LATER / a lost
  submission). Posting the same envelope again while it is still valid can land it.
- ``horizon.lookup_404_once``: while on, the first ``GET /transactions/{hash}`` of each
  transaction that *is* in a ledger answers 404 once; the next lookup of that hash finds
  it (django-polaris #640, stellar-horizon PR #222). ``times`` caps how many lookups it
  hides in all; optional param ``hash`` restricts it to that hash.

- ``horizon.try_again_later``: core answers TRY_AGAIN_LATER (its queue is full) and
  nothing is queued: ``/transactions`` waits and answers 504; ``/transactions_async``
  answers 503 ``{"tx_status": "TRY_AGAIN_LATER"}``.
- ``horizon.stale_history`` (no ``account`` param): every POST, sync or async, answers
  503 ``stale_history`` before reading the envelope; nothing is queued.
- ``horizon.close_hold`` (a test handle, not a network behaviour): while on, the close
  loop closes no ledger, so what is queued stays queued; switching it off (``times`` 0)
  lets the next close apply the queue. Lets a test observe "still queued" answers
  without racing the ``SANDBOX_LEDGER_CLOSE_S`` clock.

Both endpoints share every fault above. On ``/transactions_async`` (which never waits):
``submit_drop`` answers 201 PENDING for an envelope core then forgets (the real "PENDING
only means queued"); ``submit_504_after_apply`` queues it and answers 504 at once; the
lag faults do not matter, since the endpoint does not consult history: an envelope
already in a ledger answers 400 ERROR ``tx_bad_seq`` (core sees its sequence used).

Lag faults (read by every GET, see ``node_view``; a Horizon node answers each request
from its own ingested height: ``state`` endpoints, i.e. ``/accounts/{id}``, from its state
height, history endpoints -- ``/transactions...``, ``/accounts/{id}/transactions|
payments|operations``, ``/payments``, ``/operations``, ``/ledgers...`` -- from its history
height; stellar-core is never behind, so submissions are validated against the real
latest ledger):

- ``horizon.lookup_lag`` (param ``ledgers`` N, default 3): history is N ledgers behind
  state, as behind a load balancer whose nodes ingest at different speeds: a transaction
  applied in ledger A answers 404 on ``GET /transactions/{hash}`` (and is missing from
  history pages) until ledger A + N closes, while ``GET /accounts/{source}`` already
  shows its new sequence. A re-POST of such an envelope misses it in Horizon's own
  database; core answers txBAD_SEQ; Horizon sees the account's sequence at or past the
  envelope's and answers 400 ``tx_bad_seq`` (stellar/go #2628).
- ``horizon.ingest_behind`` (param ``ledgers`` K, default 3): one node K ledgers behind,
  consistently: root, ledgers, accounts (from ``AccountSnapshot``), transactions and
  payments all stop at ledger latest - K, and ``Latest-Ledger`` says so. A re-POST of an
  envelope applied above that height waits for ingestion and times out (504).
- ``horizon.split_nodes`` (params ``ledgers`` K, default 3, and ``first``:
  ``behind`` | ``current``, default ``behind``): two nodes behind one address, one
  current and one K ledgers behind; stellar-sdk's requests (``X-Client-Name:
  py-stellar-base``) alternate between them, starting with ``first`` when the switch is
  set. Other clients (the sandbox's own observers) are served by the current node.

``Latest-Ledger`` is sent only on the state endpoints (``/accounts/{id}``), as Horizon's
``StateMiddleware`` does (stellar-horizon ``internal/httpx/middleware.go``,
``router.go`` @ 2abda012): history endpoints, root and submissions carry none.

Waiting uses a condition variable notified after every ledger close, with a short poll
as a fallback (the sandbox process serves requests and closes ledgers in one process).
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, close_old_connections, connections, transaction
from stellar_sdk import Account as SdkAccount
from stellar_sdk import Asset, Keypair, TransactionBuilder

from common import devkeys
from common.locks import xact_lock
from sandbox.control import faults
from sandbox.horizon import core, models
from sandbox.keys import DISTRIBUTION, USDC_ISSUER, sandbox_keypair

log = logging.getLogger(__name__)

DB = "sandbox"
_LOCK_KEY = 0x484F52495A4E  # pg advisory lock: exclusive for closes/reset, shared for submits

CHANNELS = list(devkeys.SANDBOX_CHANNEL_NAMES)
WORLD_XLM = "10000"
DISTRIBUTION_USDC = "10000000"
FRIENDBOT_XLM = "10000"
MINIONS = list(devkeys.SANDBOX_MINION_NAMES)
MINION_XLM = "100000000"

FAULT_504_AFTER_APPLY = "horizon.submit_504_after_apply"
FAULT_DROP = "horizon.submit_drop"
FAULT_LOOKUP_404 = "horizon.lookup_404_once"
FAULT_LOOKUP_LAG = "horizon.lookup_lag"
FAULT_INGEST_BEHIND = "horizon.ingest_behind"
FAULT_SPLIT_NODES = "horizon.split_nodes"
FAULT_STALE_HISTORY = "horizon.stale_history"
FAULT_TRY_AGAIN_LATER = "horizon.try_again_later"
FAULT_CLOSE_HOLD = "horizon.close_hold"
DEFAULT_LAG_LEDGERS = 3
SDK_CLIENT_NAME = "py-stellar-base"

_closed = threading.Condition()
_close_count = 0
_hidden_once: set[str] = set()  # hashes horizon.lookup_404_once already hid
_hidden_lock = threading.Lock()


def passphrase() -> str:
    """The network passphrase (``STELLAR_NETWORK_PASSPHRASE``, read at call time)."""
    return settings.STELLAR_NETWORK_PASSPHRASE


def usdc() -> Asset:
    """The sandbox's USDC: ``STELLAR_USDC_CODE`` issued by ``sandbox.keys.USDC_ISSUER``."""
    return Asset(settings.STELLAR_USDC_CODE, USDC_ISSUER.public_key)


def _lock(*, exclusive: bool) -> None:
    xact_lock(_LOCK_KEY, shared=not exclusive, using=DB)


def _now() -> datetime:
    return datetime.now(UTC)


def _datetime(unix: int) -> datetime:
    return datetime.fromtimestamp(unix, UTC)


def latest_ledger() -> models.Ledger | None:
    """The last closed ledger, or None before the world exists."""
    return models.Ledger.objects.using(DB).order_by("-sequence").first()


# --- ledger close ----------------------------------------------------------------

def _ingest(applied: list[core.Applied], *, sequence: int, close_time: int) -> None:
    """Write the history rows (transactions, operations, participants) of one ledger."""
    created_at = _datetime(close_time)
    for order, item in enumerate(applied, start=1):
        env, result = item.env, item.result
        memo = _memo_fields(env)
        tx = models.Transaction.objects.using(DB).create(
            id=core.toid(sequence, order),
            hash=env.hash,
            ledger=sequence,
            application_order=order,
            created_at=created_at,
            source_account=env.source,
            account_muxed=env.source_muxed,
            account_muxed_id=str(env.source_muxed_id) if env.source_muxed else None,
            source_account_sequence=env.sequence,
            fee_account=env.source,
            fee_charged=result.fee_charged,
            max_fee=env.fee,
            operation_count=len(env.ops),
            successful=result.successful,
            envelope_xdr=env.raw,
            result_xdr=result.to_xdr(),
            result_meta_xdr=item.meta_xdr,
            fee_meta_xdr=item.fee_meta_xdr,
            signatures=[_b64(s.signature.signature) for s in env.signatures],
            has_time_bounds=env.time_bounds is not None,
            min_time=env.time_bounds[0] if env.time_bounds else None,
            max_time=env.time_bounds[1] if env.time_bounds else None,
            min_ledger=env.ledger_bounds[0] if env.ledger_bounds else None,
            max_ledger=env.ledger_bounds[1] if env.ledger_bounds else None,
            min_account_sequence=env.min_seq_num,
            min_account_sequence_age=env.min_seq_age or None,
            min_account_sequence_ledger_gap=env.min_seq_ledger_gap or None,
            **memo,
        )
        tx_participants = {env.source}
        for op in env.ops:
            source, source_muxed, source_muxed_id = env.op_source(op)
            details, others = _op_details(op, source, source_muxed, source_muxed_id)
            row = models.Operation.objects.using(DB).create(
                id=core.toid(sequence, order, op.index),
                transaction=tx,
                index=op.index,
                type=op.type_name,
                type_i=int(op.type),
                source_account=source,
                source_account_muxed=source_muxed,
                source_account_muxed_id=str(source_muxed_id) if source_muxed else None,
                details=details,
                is_payment=op.type in core.PAYMENT_OP_TYPES,
                successful=result.successful,
                created_at=created_at,
            )
            op_participants = {source, *others}
            models.OperationParticipant.objects.using(DB).bulk_create(
                [models.OperationParticipant(account_id=a, operation=row)
                 for a in sorted(op_participants)])
            tx_participants |= op_participants
        models.TransactionParticipant.objects.using(DB).bulk_create(
            [models.TransactionParticipant(account_id=a, transaction=tx)
             for a in sorted(tx_participants)])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _memo_fields(env: core.Envelope) -> dict:
    """Horizon's memo rendering (NOTES §3.2): none -> no memo; text -> cleaned UTF-8 +
    memo_bytes (base64 of the raw bytes); id -> decimal string; hash/return -> base64."""
    memo = env.memo
    kind = memo.type
    if kind == core.xdr.MemoType.MEMO_TEXT:
        return {"memo_type": "text", "memo": core.memo_text_for_horizon(memo.text),
                "memo_bytes": _b64(memo.text)}
    if kind == core.xdr.MemoType.MEMO_ID:
        return {"memo_type": "id", "memo": str(memo.id.uint64)}
    if kind == core.xdr.MemoType.MEMO_HASH:
        return {"memo_type": "hash", "memo": _b64(memo.hash.hash)}
    if kind == core.xdr.MemoType.MEMO_RETURN:
        return {"memo_type": "return", "memo": _b64(memo.ret_hash.hash)}
    return {"memo_type": "none"}


def _muxed_fields(prefix: str, muxed: str | None, muxed_id: int | None) -> dict:
    if not muxed:
        return {}
    return {f"{prefix}_muxed": muxed, f"{prefix}_muxed_id": str(muxed_id)}


def _op_details(op: core.ParsedOp, source: str, source_muxed: str | None,
                source_muxed_id: int | None) -> tuple[dict, set[str]]:
    """The type-specific fields of Horizon's operation record (stellar/go
    protocols/horizon/operations) and the other accounts taking part."""
    body = op.body
    if op.type == core.OPS.CREATE_ACCOUNT:
        destination = core.address_of(body.create_account_op.destination)
        return {
            "starting_balance": core.format_amount(
                core.amount_from_stroops(body.create_account_op.starting_balance.int64)),
            "funder": source, **_muxed_fields("funder", source_muxed, source_muxed_id),
            "account": destination,
        }, {destination}
    if op.type == core.OPS.PAYMENT:
        destination, dest_muxed, dest_muxed_id = core.muxed_parts(body.payment_op.destination)
        return {
            **core.asset_from_xdr(body.payment_op.asset).horizon_fields(),
            "from": source, **_muxed_fields("from", source_muxed, source_muxed_id),
            "to": destination, **_muxed_fields("to", dest_muxed, dest_muxed_id),
            "amount": core.format_amount(core.amount_from_stroops(body.payment_op.amount.int64)),
        }, {destination}
    if op.type == core.OPS.CHANGE_TRUST:
        asset = core.asset_from_xdr(body.change_trust_op.line)
        return {
            **asset.horizon_fields(),
            "limit": core.format_amount(core.amount_from_stroops(body.change_trust_op.limit.int64)),
            "trustee": asset.issuer,
            "trustor": source, **_muxed_fields("trustor", source_muxed, source_muxed_id),
        }, set()
    return {}, set()


def _close(*, sequence: int, prev_hash: str, close_time: int, fee_pool,
           candidates: list[tuple[models.Submission | None, core.Envelope]]) -> models.Ledger:
    """Validate and apply ``candidates`` in order against the current state, write the
    state, the history and the ledger row. In the caller's transaction (lock held)."""
    state = core.LedgerState()
    applied: list[core.Applied] = []
    for submission, env in candidates:
        # Building the tx set re-runs checkValid (not "for apply": a signed operation
        # source that does not exist fails later, in the ledger, with op_no_source_account).
        problem = core.check_valid(env, state, ledger_seq=sequence, close_time_lower=close_time,
                                   close_time_upper=close_time)
        if problem is not None:
            if submission is None:
                raise RuntimeError(f"world transaction invalid: {core.TX_CODE_NAMES[problem.code]}")
            too_early = problem.code == core.TX.txTOO_EARLY
            if too_early and sequence - submission.queued_ledger <= core.QUEUE_DEPTH:
                continue  # not valid yet: stays queued
            models.Submission.objects.using(DB).filter(pk=submission.pk).update(
                status=models.Submission.DROPPED,
                reason=core.TX_CODE_NAMES.get(problem.code, "invalid"))
            continue
        applied.append(core.apply_transaction(state, env, ledger_seq=sequence,
                                              close_time=close_time))
        if submission is not None:
            models.Submission.objects.using(DB).filter(pk=submission.pk).update(
                status=models.Submission.APPLIED)
    state.flush()
    _snapshot_accounts(sequence)
    _ingest(applied, sequence=sequence, close_time=close_time)
    fees = core.amount_from_stroops(sum(a.result.fee_charged for a in applied))
    fee_pool = fee_pool + fees
    header_xdr, ledger_hash = core.ledger_header(
        sequence=sequence, prev_hash=prev_hash, close_time=close_time,
        tx_hashes=[a.env.hash for a in applied], result_xdrs=[a.result.to_xdr() for a in applied],
        total_coins=core.TOTAL_COINS, fee_pool=fee_pool)
    ops = sum(len(a.env.ops) for a in applied)
    return models.Ledger.objects.using(DB).create(
        sequence=sequence,
        paging_token=core.toid(sequence),
        hash=ledger_hash,
        prev_hash=prev_hash,
        close_time=close_time,
        closed_at=_datetime(close_time),
        successful_transaction_count=sum(1 for a in applied if a.result.successful),
        failed_transaction_count=sum(1 for a in applied if not a.result.successful),
        operation_count=sum(len(a.env.ops) for a in applied if a.result.successful),
        tx_set_operation_count=ops,
        total_coins=core.TOTAL_COINS,
        fee_pool=fee_pool,
        base_fee=core.BASE_FEE,
        base_reserve=core.BASE_RESERVE_STROOPS,
        max_tx_set_size=core.MAX_TX_SET_SIZE,
        protocol_version=core.PROTOCOL_VERSION,
        header_xdr=header_xdr,
    )


def _snapshot_fields(row, names: list[str]) -> dict:
    values = {}
    for name in names:
        value = getattr(row, name)
        values[name] = core.format_amount(value) if isinstance(value, Decimal) else value
    return values


_SNAPSHOT_ACCOUNT = [f.name for f in models.Account._meta.fields]
_SNAPSHOT_TRUSTLINE = [f.name for f in models.Trustline._meta.fields if f.name != "id"]


def _snapshot_accounts(sequence: int) -> None:
    """Keep the state of every account ledger ``sequence`` changed (its entry or one of
    its trustlines), for the nodes that answer from an older height."""
    touched = set(models.Account.objects.using(DB).filter(last_modified_ledger=sequence)
                  .values_list("account_id", flat=True))
    touched |= set(models.Trustline.objects.using(DB).filter(last_modified_ledger=sequence)
                   .values_list("account_id", flat=True))
    rows = []
    for account in models.Account.objects.using(DB).filter(pk__in=touched):
        lines = models.Trustline.objects.using(DB).filter(
            account_id=account.account_id).order_by("asset_code", "asset_issuer")
        rows.append(models.AccountSnapshot(ledger=sequence, account_id=account.account_id, data={
            "account": _snapshot_fields(account, _SNAPSHOT_ACCOUNT),
            "trustlines": [_snapshot_fields(line, _SNAPSHOT_TRUSTLINE) for line in lines]}))
    models.AccountSnapshot.objects.using(DB).bulk_create(rows)


def account_at(account_id: str, height: int) -> tuple[models.Account,
                                                      list[models.Trustline]] | None:
    """The account and its trustlines as they stood after ledger ``height`` (unsaved
    model instances), or None when the account did not exist then."""
    snap = (models.AccountSnapshot.objects.using(DB)
            .filter(account_id=account_id, ledger__lte=height).order_by("-ledger").first())
    if snap is None:
        return None
    decimals = {"balance", "limit"}

    def build(model, values: dict):
        return model(**{k: Decimal(v) if k in decimals else v for k, v in values.items()})

    return (build(models.Account, snap.data["account"]),
            [build(models.Trustline, line) for line in snap.data["trustlines"]])


def _notify_closed() -> None:
    global _close_count
    with _closed:
        _close_count += 1
        _closed.notify_all()


def close_ledger() -> int | None:
    """Close the next ledger: apply the queued transactions that are still valid at the
    new close time (wall clock, whole unix seconds, never before the previous close).
    Returns the new ledger sequence, or None when there is no world yet. While
    ``horizon.close_hold`` is on nothing closes and the latest sequence is returned
    (read under the exclusive lock, so no close that began before the switch went on
    can apply anything after a submission saw it on)."""
    with transaction.atomic(using=DB):
        _lock(exclusive=True)
        last = latest_ledger()
        if last is None:
            return None
        if faults.peek(FAULT_CLOSE_HOLD) is not None:
            return last.sequence
        queued = list(models.Submission.objects.using(DB)
                      .filter(status=models.Submission.QUEUED).order_by("id"))
        candidates = []
        for submission in queued:
            try:
                candidates.append((submission, core.parse_envelope(submission.envelope_xdr,
                                                                   passphrase())))
            except core.MalformedEnvelope:
                models.Submission.objects.using(DB).filter(pk=submission.pk).update(
                    status=models.Submission.DROPPED, reason="malformed")
        ledger = _close(sequence=last.sequence + 1, prev_hash=last.hash,
                        close_time=max(int(time.time()), last.close_time),
                        fee_pool=last.fee_pool, candidates=candidates)
    _notify_closed()
    return ledger.sequence


def wait_for_close(after: int, timeout: float) -> bool:
    """Block until more than ``after`` ledgers closed in this process (see
    ``close_count``) or ``timeout`` seconds passed. Returns whether one closed."""
    deadline = time.monotonic() + timeout
    with _closed:
        while _close_count <= after:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            _closed.wait(remaining)
    return True


def close_count() -> int:
    """How many ledgers this process closed so far (for ``wait_for_close``)."""
    return _close_count


def background(stop: threading.Event) -> None:
    """The ledger-close loop: one ledger every ``SANDBOX_LEDGER_CLOSE_S`` seconds (read
    each time), empty or not, unless ``horizon.close_hold`` is on, until ``stop`` is set.
    A failed close is logged and the loop goes on (the next close retries with the same
    queue). Creates the fixed world when there is none (first start)."""
    try:
        while True:
            try:
                if close_ledger() is None:
                    ensure_world()
            except Exception:
                log.exception("sandbox horizon: ledger close failed")
                close_old_connections()
            if stop.wait(float(settings.SANDBOX_LEDGER_CLOSE_S)):
                return
    finally:
        connections[DB].close()


# --- world -----------------------------------------------------------------------

def _signed(source: Keypair, sequence: int, build: Callable[[TransactionBuilder], None],
            *signers: Keypair, timeout: int | None = None) -> str:
    builder = TransactionBuilder(SdkAccount(source.public_key, sequence - 1),
                                 network_passphrase=passphrase(), base_fee=core.BASE_FEE)
    if timeout is None:
        builder.add_time_bounds(0, 0)
    else:
        builder.set_timeout(timeout)
    build(builder)
    envelope = builder.build()
    for keypair in (source, *signers):
        envelope.sign(keypair)
    return envelope.to_xdr()


def _world_envelopes() -> list[str]:
    root = core.root_keypair(passphrase())
    new_account_seq = 1 << 32  # accounts created in ledger 1

    def create_accounts(builder: TransactionBuilder) -> None:
        for keypair in (USDC_ISSUER, DISTRIBUTION, *map(sandbox_keypair, CHANNELS)):
            builder.append_create_account_op(keypair.public_key, WORLD_XLM)

    def create_minions(builder: TransactionBuilder) -> None:
        for name in MINIONS:
            builder.append_create_account_op(sandbox_keypair(name).public_key, MINION_XLM)

    return [
        _signed(root, 1, create_accounts),
        _signed(root, 2, create_minions),
        _signed(DISTRIBUTION, new_account_seq + 1,
                lambda b: b.append_change_trust_op(usdc())),
        _signed(USDC_ISSUER, new_account_seq + 1,
                lambda b: b.append_payment_op(DISTRIBUTION.public_key, usdc(),
                                              DISTRIBUTION_USDC)),
    ]


def reset(*, only_if_empty: bool = False) -> None:
    """Empty every Horizon table and recreate the fixed world in ledger 1 (see the
    module docstring). Pending POSTs time out (504). ``only_if_empty``: do nothing when
    a world exists (first start)."""
    with transaction.atomic(using=DB):
        _lock(exclusive=True)
        if only_if_empty and models.Ledger.objects.using(DB).exists():
            return
        for model in (models.AccountSnapshot, models.OperationParticipant,
                      models.TransactionParticipant,
                      models.Operation, models.Transaction, models.Submission,
                      models.Trustline, models.Account, models.Ledger):
            model.objects.using(DB).all().delete()
        close_time = int(time.time())
        root = core.root_keypair(passphrase())
        models.Account.objects.using(DB).create(
            account_id=root.public_key, balance=core.TOTAL_COINS, sequence=0,
            last_modified_ledger=1, last_modified_time=close_time)
        candidates = [(None, core.parse_envelope(raw, passphrase()))
                      for raw in _world_envelopes()]
        _close(sequence=1, prev_hash="0" * 64, close_time=close_time,
               fee_pool=core.amount_from_stroops(0), candidates=candidates)
    with _hidden_lock:
        _hidden_once.clear()
    _notify_closed()


def lookup_hidden(tx_hash: str) -> bool:
    """Fault ``horizon.lookup_404_once``: should this lookup of a landed transaction
    answer 404? True at most once per hash while the switch is on."""
    params = faults.peek(FAULT_LOOKUP_404)
    if params is None or params.get("hash", tx_hash) != tx_hash:
        return False
    with _hidden_lock:
        if tx_hash in _hidden_once or faults.take(FAULT_LOOKUP_404) is None:
            return False
        _hidden_once.add(tx_hash)
        return True


def ensure_world() -> None:
    """Create the fixed world if the database has no ledger yet (first start)."""
    if not models.Ledger.objects.using(DB).exists():
        reset(only_if_empty=True)


# --- node views (lag faults) -------------------------------------------------------

@dataclass(frozen=True)
class NodeView:
    """The Horizon node serving one request: how many ledgers its state and its
    history are behind stellar-core (0 = current). Heights are read against the latest
    ledger at the moment of use, so a long request (a POST waiting for a ledger) keeps
    its node while ledgers close."""

    state_lag: int = 0
    history_lag: int = 0

    @property
    def current(self) -> bool:
        return self.state_lag == 0 and self.history_lag == 0

    def state_height(self, latest: int | None = None) -> int:
        latest = latest_ledger().sequence if latest is None else latest
        return max(1, latest - self.state_lag)

    def history_height(self, latest: int | None = None) -> int:
        latest = latest_ledger().sequence if latest is None else latest
        return max(1, latest - self.history_lag)

    def sees(self, tx: models.Transaction) -> bool:
        """Whether this node has ingested ``tx``'s ledger."""
        return self.history_lag == 0 or tx.ledger <= self.history_height()


def _lag(params: dict) -> int:
    try:
        return max(0, int(params.get("ledgers", DEFAULT_LAG_LEDGERS)))
    except (TypeError, ValueError):
        return DEFAULT_LAG_LEDGERS


def node_view(*, client_name: str = "") -> NodeView:
    """The node that serves a request now, from the lag faults (module docstring).
    ``client_name``: the request's ``X-Client-Name`` header (only stellar-sdk requests
    alternate under ``horizon.split_nodes``). Each call under ``split_nodes`` is one
    request to the load balancer."""
    state_lag = history_lag = 0
    lag = faults.peek(FAULT_LOOKUP_LAG)
    if lag is not None:
        history_lag = max(history_lag, _lag(lag))
    behind = faults.peek(FAULT_INGEST_BEHIND)
    if behind is not None:
        state_lag = max(state_lag, _lag(behind))
        history_lag = max(history_lag, _lag(behind))
    if client_name.startswith(SDK_CLIENT_NAME) and faults.peek(FAULT_SPLIT_NODES) is not None:
        taken = faults.take_numbered(FAULT_SPLIT_NODES)
        if taken is not None:
            params, number = taken
            starts_behind = params.get("first", "behind") != "current"
            if (number % 2 == 0) == starts_behind:
                state_lag = max(state_lag, _lag(params))
                history_lag = max(history_lag, _lag(params))
    return NodeView(state_lag, history_lag)


# --- submission ------------------------------------------------------------------

@dataclass
class Known:
    """The transaction is in a ledger (successful or failed)."""

    tx: models.Transaction


@dataclass
class Refused:
    """Refused before any ledger (nothing charged): 400 transaction_failed."""

    result: core.TxResult


@dataclass
class Pending:
    """Handed to core, or waiting like Horizon does: wait for ``hash`` until
    ``deadline``. ``status``: ``queued``, ``duplicate``, ``try_again_later``,
    ``dropped`` (fault). ``respond_504``: answer 504 even once it lands (fault)."""

    hash: str
    deadline: datetime
    status: str
    respond_504: bool = False


def _submission_timeout() -> timedelta:
    return timedelta(seconds=float(settings.SANDBOX_SUBMISSION_TIMEOUT_S))


def _fault_for(name: str, env: core.Envelope) -> dict | None:
    params = faults.peek(name)
    if params is None:
        return None
    if params.get("account") and params["account"] != env.source:
        return None
    return faults.take(name)


def submit(env: core.Envelope, *, with_faults: bool = True) -> Known | Refused | Pending:
    """Horizon's ``txsub.System.Submit`` plus core's queue admission for one decoded
    envelope (the numbered rules of the module docstring). Never blocks for a ledger."""
    now = _now()
    tx = models.Transaction.objects.using(DB).filter(hash=env.hash).first()
    if tx is not None:
        return Known(tx)
    if env.sequence < 0 or (env.min_seq_num is not None
                            and not 0 <= env.min_seq_num < env.sequence):
        return Refused(core.bad_seq_result())
    with transaction.atomic(using=DB):
        _lock(exclusive=False)
        tx = models.Transaction.objects.using(DB).filter(hash=env.hash).first()
        if tx is not None:  # landed while we waited for the lock
            return Known(tx)
        last = latest_ledger()
        existing = (models.Submission.objects.using(DB).select_for_update()
                    .filter(hash=env.hash).first())
        if existing is not None and existing.status == models.Submission.QUEUED:
            return Pending(env.hash, existing.submitted_at + _submission_timeout(), "duplicate")
        other = (models.Submission.objects.using(DB)
                 .filter(source_account=env.source, status=models.Submission.QUEUED).first())
        if other is not None:
            if env.sequence < other.sequence:
                return Refused(core.bad_seq_result())
            return Pending(env.hash, now + _submission_timeout(), "try_again_later")
        period = float(settings.SANDBOX_LEDGER_CLOSE_S)
        problem = core.check_valid(
            env, core.LedgerState(), ledger_seq=last.sequence + 1,
            close_time_lower=last.close_time,
            close_time_upper=max(int(time.time()), last.close_time) + math.ceil(period))
        if problem is not None:
            return Refused(problem)
        if with_faults:
            if _fault_for(FAULT_TRY_AGAIN_LATER, env) is not None:
                return Pending(env.hash, now + _submission_timeout(), "try_again_later")
            dropped = _fault_for(FAULT_DROP, env)
            if dropped is not None:
                wait = float(dropped.get("wait_s", _submission_timeout().total_seconds()))
                return Pending(env.hash, now + timedelta(seconds=wait), "dropped")
        try:
            with transaction.atomic(using=DB):
                if existing is not None:  # dropped earlier: core has forgotten it
                    models.Submission.objects.using(DB).filter(pk=existing.pk).update(
                        status=models.Submission.QUEUED, reason="", submitted_at=now,
                        queued_ledger=last.sequence, envelope_xdr=env.raw)
                else:
                    models.Submission.objects.using(DB).create(
                        hash=env.hash, envelope_xdr=env.raw, source_account=env.source,
                        sequence=env.sequence, submitted_at=now, queued_ledger=last.sequence)
        except IntegrityError:  # another submission of this source got in first
            return Pending(env.hash, now + _submission_timeout(), "try_again_later")
        respond_504 = with_faults and _fault_for(FAULT_504_AFTER_APPLY, env) is not None
        return Pending(env.hash, now + _submission_timeout(), "queued", respond_504)


def await_transaction(tx_hash: str, deadline: datetime,
                      view: NodeView | None = None) -> models.Transaction | None:
    """Block until ``tx_hash`` is in a closed ledger (its row) that ``view``'s node has
    ingested, or ``deadline`` passes (None)."""
    while True:
        tx = models.Transaction.objects.using(DB).filter(hash=tx_hash).first()
        if tx is not None and (view is None or view.sees(tx)):
            return tx
        remaining = (deadline - _now()).total_seconds()
        if remaining <= 0:
            return None
        seen = close_count()
        wait_for_close(seen, min(remaining, 0.1))


def _submit_internal(sources: list[Keypair], build: Callable[[Keypair, int], str],
                     timeout: float) -> models.Transaction | core.TxResult | None:
    """Submit a transaction of the sandbox's own accounts (friendbot, fund) like a
    well-behaved client: build it from the first of ``sources`` whose queue slot is
    free (core queues one transaction per source), with that account's current
    sequence; when every source is busy or a sequence raced, wait for the next ledger
    close and try again. Faults do not apply. Returns the ingested transaction, the
    refusal, or None when ``timeout`` seconds pass."""
    deadline = _now() + timedelta(seconds=timeout)
    while _now() < deadline:
        seen = close_count()
        for source in sources:
            account = models.Account.objects.using(DB).get(pk=source.public_key)
            env = core.parse_envelope(build(source, account.sequence + 1), passphrase())
            outcome = submit(env, with_faults=False)
            if isinstance(outcome, Known):
                return outcome.tx
            if isinstance(outcome, Refused):
                if outcome.result.code != core.TX.txBAD_SEQ:
                    return outcome.result
            elif outcome.status in ("queued", "duplicate"):
                return await_transaction(env.hash, deadline)
        wait_for_close(seen, max(0.0, (deadline - _now()).total_seconds()))
    return None


class AlreadyFunded(Exception):
    """Friendbot: the account exists."""


class NoTrustline(Exception):
    """Fund: the account has no USDC trustline (or does not exist)."""


def friendbot(address: str) -> models.Transaction | core.TxResult | None:
    """Create ``address`` with 10,000 XLM from one of friendbot's minion accounts
    (testnet friendbot). Raises AlreadyFunded when it exists. Returns like
    ``_submit_internal``."""
    if models.Account.objects.using(DB).filter(pk=address).exists():
        raise AlreadyFunded(address)
    minions = [sandbox_keypair(name) for name in MINIONS]
    start = int.from_bytes(address.encode()[-4:], "big") % len(minions)

    def build(source: Keypair, sequence: int) -> str:
        return _signed(source, sequence,
                       lambda b: b.append_create_account_op(address, FRIENDBOT_XLM),
                       timeout=60)

    return _submit_internal(minions[start:] + minions[:start], build,
                            float(settings.SANDBOX_SUBMISSION_TIMEOUT_S))


def fund_usdc(address: str, amount) -> models.Transaction | core.TxResult | None:
    """The USDC issuer pays ``amount`` (Decimal, USDC, 7 dp) to ``address``, which must
    hold a USDC trustline (raises NoTrustline). Returns like ``_submit_internal``."""
    asset = usdc()
    if not models.Trustline.objects.using(DB).filter(
            account_id=address, asset_code=asset.code, asset_issuer=asset.issuer).exists():
        raise NoTrustline(address)

    def build(source: Keypair, sequence: int) -> str:
        return _signed(source, sequence,
                       lambda b: b.append_payment_op(address, asset, core.format_amount(amount)),
                       timeout=60)

    return _submit_internal([USDC_ISSUER], build,
                            float(settings.SANDBOX_SUBMISSION_TIMEOUT_S))
