"""AP's Stellar payment observer, for SEP-24 withdrawals (NOTES §4.3 step 5, §4.4, §5)
and SEP-31 receives (SEP31-RECEIVE.md §3.3 "Observer matching").

AP-4.3.0 runs ``HorizonPaymentObserver`` (``platform/.../observer/stellar/``) beside the
platform server: it follows Horizon's payments from a cursor kept in the database
(``JdbcStellarPaymentStreamerCursorStore``) and hands every payment that touches an
observed account (the assets' distribution accounts) to ``DefaultPaymentListener``.
This stand-in polls instead of streaming: every ``SANDBOX_AP_OBSERVER_POLL_S`` (0.2 s)
it pages ``GET {SANDBOX_URL}/horizon/accounts/{distribution}/payments?cursor=<stored>
&order=asc&limit=200&join=transactions`` over HTTP, as AP reaches Horizon (every
configured Stellar asset has ``sandbox.keys.DISTRIBUTION`` as its distribution account, so
that one account's payments are all AP would dispatch; the paging tokens are the global
ones AP stores), and for each ``payment`` / ``path_payment_strict_*`` record sent to or
from it, in order:

1. ``DefaultPaymentListener.validate``: a transaction hash, a memo that is not an empty
   text memo, a native or issued asset; otherwise the payment is ignored.
2. Matching (``JdbcSep24TransactionStore.findOneByWithdrawAnchorAccountAndMemoAndStatus``):
   a transaction whose ``withdraw_anchor_account`` is the payment's ``to`` (Horizon's
   ``to``, i.e. the G-address behind a muxed ``M...`` destination) and whose ``memo``
   equals the joined transaction's memo as ``MemoHelper.memoAsString`` renders it: an
   ``id`` memo as its unsigned decimal (uint64 since PR #1918), a ``text`` memo as its
   UTF-8 text, a ``hash`` / ``return`` memo as lowercase hex, no memo as ``""``. Only the
   strings are compared, so a text memo ``"123"`` matches an id memo ``123``; the source
   account plays no part (issue #1056), and only status ``pending_user_transfer_start``
   is searched, so a second payment with the same memo after the first one moved the
   withdrawal to ``pending_anchor`` matches nothing and is silently ignored (§4.4 "split
   payment").
3. ``handleSep24Transaction``: for a withdrawal, ``PlatformApiClient
   .notifyOnchainFundsReceived`` = the JSON-RPC ``notify_onchain_funds_received`` with
   ``transaction_id``, ``message`` (``rpc.custom_messages.incoming_payment_received``,
   default ``Received an incoming payment``), ``stellar_transaction_id`` and ``amount_in
   {amount}`` = the amount received (``AssetHelper.fromXdrAmount``: 7 decimals,
   ``9.5000000``). It runs through the same code as the RPC endpoint
   (``sandbox.ap.rpc.handle_one``), so every rule of the handler applies: a wrong asset is
   accepted (``amount_in.asset`` stays the requested asset; only
   ``stellar_transactions[].payments[].amount.asset`` shows the truth), a short or over
   payment overwrites ``amount_in`` and leaves ``amount_out`` / ``fee_details`` alone, an
   amount with more decimals than the asset's ``significant_decimals`` is refused with
   -32602 ``'10.1234567' has invalid significant decimals. Expected: '2'``
   (``AssetValidationUtils``), and a hash AP's ledger cannot see yet gives -32603 (fault
   ``ap.rpc_32603_unindexed_hash``, PR #1962). ``checkAndWarnAssetAmountMismatch`` only
   logs at debug level.
4. ``PlatformApiClient.sendRpcNotification`` never reads the reply, and
   ``HorizonPaymentObserver.processOperation`` saves the cursor in ``finally``: a refused
   call is never retried, the withdrawal stays where it was (§4.4).

Several rows for one (account, memo): ``findOneBy...`` is a Spring Data JPA single-result
derived query without ORDER BY; with two rows Hibernate's ``getSingleResult`` throws
``NonUniqueResultException`` (Spring: ``IncorrectResultSizeDataAccessException``), which
``DefaultPaymentListener`` catches and logs, so the payment is credited to **neither**
withdrawal (inferred from Spring Data's documented behaviour, not observed on AP). PR #1929
describes the hazard as one customer's payment credited to another's transaction: that
happens here whenever only one of the rows sharing the memo is still
``pending_user_transfer_start``. Fault ``ap.observer_match_first`` makes the lookup take
one of several rows instead (``LIMIT 1`` without ORDER BY: PostgreSQL heap order, usually
the older row, guaranteed by nothing) for tests written to that reading of PR #1929.

Cursor (``HorizonPaymentObserver.fetchStreamingCursor``), applied whenever the observer
(re)starts: at process start, after a reset emptied the stored cursor, and when
``ap.observer_off`` is cleared (AP had to be restarted, issue #1943). Latest = the paging
token of the newest payment on the whole network (``GET /payments?order=desc&limit=1``);
no stored cursor -> latest; stored >= latest (a network reset) -> latest; otherwise
``max(stored, latest - 200)``. Paging tokens are TOIDs (``ledger << 32 | ...``), so
``latest - 200`` falls inside the newest transaction: after a restart, payments made
while the observer was down are skipped, except those of the newest transaction.

Fault switches (``POST /sandbox/faults``):

- ``ap.observer_off``: the observer does nothing while the switch is on; payments pile up
  unobserved and withdrawals stay ``pending_user_transfer_start`` (issue #1943, one bad
  Soroban event froze AP's observer until a restart). Clearing it restarts the observer
  with the cursor rule above.
- ``ap.observer_miss``: the next ``times`` payments that match a withdrawal are dropped
  without any RPC and the cursor moves past them (PR #1962: events lost between the
  event feed and the transaction lookup).
- ``ap.observer_match_first``: see "Several rows" above.
- ``ap.asset_decimals`` (``sandbox.ap.assets``) and ``ap.rpc_32603_unindexed_hash`` /
  ``ap.rpc_slow`` (``sandbox.ap.rpc``) act on the observer's RPC as on any other.

SEP-31: when no withdrawal matches, ``DefaultPaymentListener`` looks for a SEP-31
transaction ``findByToAccountAndMemoAndStatus(to, memo, pending_sender)`` (the
``destination_account`` and ``memo`` of ``request_onchain_funds``; the payer plays no
part, issue #1056) and sends it the same ``notify_onchain_funds_received`` with
``amount_in {amount}`` only: a short, over or wrong-asset payment is accepted, and a
second payment after the first moved it to ``pending_receiver`` matches nothing. Two
``pending_sender`` rows sharing (account, memo) make the lookup throw as above (4.3.0;
4.4.0 #1942 logs and skips: the same outcome). The observer pages only the
distribution account's payments (``sandbox.keys.DISTRIBUTION``): a
``destination_account`` elsewhere is never observed here (AP adds it to its watched
accounts).

Not reproduced: the muxed-id retry of ``DefaultPaymentListener`` (its ``toAccount
.startsWith("M")`` branch), which Horizon-sourced payments never reach because AP's ledger
conversion hands the listener the G-address; SEP-6 and SEP-31 matching; Soroban
``transfer`` events; ``path_payment_strict_send`` amounts (Horizon's destination amount is
used).

Every handled payment is recorded as an ``ApObservedPayment`` row, shown by the
sandbox-only ``GET /ap/sandbox/observer``.

Sources: ``DefaultPaymentListener``, ``HorizonPaymentObserver``, ``MemoHelper``,
``PlatformApiClient``, ``AssetValidationUtils`` and ``DepositInfoSelfGeneratorBase`` as
read in stored copies of stellar/anchor-platform that are not pinned to the 4.3.0 tag
(NOTES §0): check each rule against the deployed image.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
import uuid
from decimal import Decimal, InvalidOperation

import httpx
from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import F

from common.http import tls_context
from sandbox import keys
from sandbox.ap import assets, rpc
from sandbox.ap.models import ApObservedPayment, ApObserverState, ApTransaction
from sandbox.ap.objects import now
from sandbox.control import faults

log = logging.getLogger(__name__)

DB = "sandbox"
MAX_RESULTS = 200  # HorizonPaymentObserver.MAX_RESULTS
PENDING_USER_TRANSFER_START = "pending_user_transfer_start"
PENDING_SENDER = "pending_sender"
INCOMING_PAYMENT_RECEIVED = "Received an incoming payment"  # rpc.custom_messages default
OUTGOING_PAYMENT_SENT = "Outgoing payment sent"
PAYMENT_TYPES = {"payment", "path_payment_strict_send", "path_payment_strict_receive"}
OBSERVABLE_ASSET_TYPES = {"native", "credit_alphanum4", "credit_alphanum12"}
STROOP = Decimal("0.0000001")

FAULT_OFF = "ap.observer_off"
FAULT_MISS = "ap.observer_miss"
FAULT_MATCH_FIRST = "ap.observer_match_first"


class Reset(Exception):
    """The stored cursor was reset while this pass ran: drop the rest of the page."""


class LookupFailed(Exception):
    """The transaction lookup threw (AP logs it and moves on)."""


def observed_accounts() -> set[str]:
    """``PaymentObservingAccountsManager``: the distribution accounts of the Stellar assets."""
    return {a.distribution_account for a in assets.configured()
            if a.is_stellar and a.distribution_account}


def poll_interval() -> float:
    return float(getattr(settings, "SANDBOX_AP_OBSERVER_POLL_S", 0.2))


# --------------------------------------------------------------------------- cursor store


def load_state() -> ApObserverState:
    """The single cursor row, created empty on first use."""
    state = ApObserverState.objects.using(DB).filter(pk=1).first()
    if state is not None:
        return state
    try:
        with transaction.atomic(using=DB):
            return ApObserverState.objects.using(DB).create(pk=1)
    except IntegrityError:  # a reset created it first
        return ApObserverState.objects.using(DB).get(pk=1)


def save_cursor(cursor: str, epoch: int) -> None:
    """Store ``cursor`` unless a reset happened since ``epoch`` was read (raises Reset)."""
    updated = (ApObserverState.objects.using(DB).filter(pk=1, epoch=epoch)
               .update(cursor=cursor, updated_at=now()))
    if updated != 1:
        raise Reset()


def reset_state() -> None:
    """Forget the cursor (the next pass restarts from the latest payment) and every
    observation. Called by ``sandbox.ap.service.reset``."""
    with transaction.atomic(using=DB):
        ApObservedPayment.objects.using(DB).all().delete()
        updated = (ApObserverState.objects.using(DB).filter(pk=1)
                   .update(cursor=None, epoch=F("epoch") + 1, updated_at=now()))
        if not updated:
            ApObserverState.objects.using(DB).create(pk=1, epoch=1, updated_at=now())


# --------------------------------------------------------------------------- Horizon


def _horizon() -> str:
    return settings.SANDBOX_URL.rstrip("/") + "/horizon"


def _get(client: httpx.Client, path: str, params: dict) -> dict:
    response = client.get(_horizon() + path, params=params)
    response.raise_for_status()
    return response.json()


def latest_cursor(client: httpx.Client) -> str | None:
    """``fetchLatestCursorFromHorizon``: the newest payment's paging token on the whole
    network, or None when there is none."""
    page = _get(client, "/payments", {"order": "desc", "limit": 1})
    records = page.get("_embedded", {}).get("records", [])
    return records[0]["paging_token"] if records else None


def streaming_cursor(stored: str | None, latest: str | None) -> str | None:
    """``HorizonPaymentObserver.fetchStreamingCursor``: where a (re)started observer
    resumes. Both arguments are paging tokens (decimal strings) or None."""
    if not stored:
        return latest
    if latest is None:
        return stored
    last_stored, newest = int(stored), int(latest)
    if last_stored >= newest:  # "probably because of a test network reset"
        return str(newest)
    return str(max(last_stored, newest - MAX_RESULTS))


def payments_page(client: httpx.Client, account: str, cursor: str | None) -> list[dict]:
    """One page of ``account``'s payments after ``cursor``, oldest first, each with its
    transaction embedded."""
    params = {"order": "asc", "limit": MAX_RESULTS, "join": "transactions"}
    if cursor:
        params["cursor"] = cursor
    page = _get(client, f"/accounts/{account}/payments", params)
    return page.get("_embedded", {}).get("records", [])


# --------------------------------------------------------------------------- listener


def memo_as_string(tx: dict) -> tuple[str, str | None]:
    """``(memo_type, memo)`` of a Horizon transaction as AP's ``MemoHelper.memoAsString``
    renders it for matching; memo None means ``validate`` refuses the payment (an empty
    text memo)."""
    memo_type = tx.get("memo_type") or "none"
    if memo_type == "none":
        return memo_type, ""
    if memo_type == "id":
        return memo_type, str(tx.get("memo"))
    if memo_type == "text":
        raw = tx.get("memo_bytes")
        try:
            data = base64.b64decode(raw) if raw is not None else (tx.get("memo") or "").encode()
        except (binascii.Error, ValueError):
            data = (tx.get("memo") or "").encode()
        if not data:
            return memo_type, None
        # PostgreSQL text cannot hold NUL; such a memo can match no stored memo anyway.
        return memo_type, data.decode("utf-8", errors="replace").replace("\x00", "")
    try:
        return memo_type, base64.b64decode(tx.get("memo") or "").hex()
    except (binascii.Error, ValueError):
        return memo_type, tx.get("memo")


def xdr_amount(amount: str | None) -> str | None:
    """``AssetHelper.fromXdrAmount``: the amount at 7 decimals, plain (``9.5000000``)."""
    try:
        return format(Decimal(str(amount)).quantize(STROOP), "f")
    except (InvalidOperation, ValueError):
        return None


def find_transaction(to_account: str | None, memo: str) -> ApTransaction | None:
    """``findOneByWithdrawAnchorAccountAndMemoAndStatus(to, memo, pending_user_transfer_start)``.
    No kind filter, as AP (deposits have no ``withdraw_anchor_account``). Raises
    LookupFailed when several rows match, unless ``ap.observer_match_first`` is on."""
    rows = ApTransaction.objects.using(DB).filter(
        withdraw_anchor_account=to_account, memo=memo, status=PENDING_USER_TRANSFER_START)
    found = list(rows[:2])  # no ORDER BY, as the derived query
    if not found:
        rows = ApTransaction.objects.using(DB).filter(
            sep="31", to_account=to_account, memo=memo, status=PENDING_SENDER)
        found = list(rows[:2])
    if len(found) > 1 and faults.peek(FAULT_MATCH_FIRST) is None:
        count = rows.count()
        raise LookupFailed(
            "org.springframework.dao.IncorrectResultSizeDataAccessException: Query did not "
            f"return a unique result: {count} results were returned")
    return found[0] if found else None


def _asset_name(record: dict) -> str:
    return assets.sep11_name(record.get("asset_type"), record.get("asset_code"),
                             record.get("asset_issuer"))


def _warn_mismatch(txn: ApTransaction, record: dict, amount: str | None) -> None:
    """``checkAndWarnAssetAmountMismatch``: debug logging only, nothing is refused."""
    paid = "stellar:" + _asset_name(record)
    if txn.amount_in_asset != paid:
        log.debug("Payment asset %s does not match the expected asset %s.", paid,
                  txn.amount_in_asset)
    expected = assets.parse_decimal(txn.amount_expected)
    got = assets.parse_decimal(amount)
    if expected is not None and got is not None and got < expected:
        log.debug("The incoming payment amount was insufficient from Expected: %s, "
                  "Received: %s", txn.amount_expected, amount)


def notify_request(txn: ApTransaction, stellar_transaction_id: str, amount: str) -> dict:
    """The JSON-RPC request ``PlatformApiClient`` sends for a matched payment
    (``notifyOnchainFundsReceived``; a deposit would get ``notifyOnchainFundsSent``)."""
    if txn.kind == "deposit":
        method = "notify_onchain_funds_sent"
        params = {"transaction_id": txn.id, "message": OUTGOING_PAYMENT_SENT,
                  "stellar_transaction_id": stellar_transaction_id}
    else:
        method = "notify_onchain_funds_received"
        params = {"transaction_id": txn.id, "message": INCOMING_PAYMENT_RECEIVED,
                  "stellar_transaction_id": stellar_transaction_id,
                  "amount_in": {"amount": amount}}
    return {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}


def handle_payment(record: dict) -> ApObservedPayment:
    """``DefaultPaymentListener.onReceived`` for one Horizon payment record (with its
    transaction embedded): validate, match, notify. Never raises for the payment's own
    content; returns the stored observation."""
    tx = record.get("transaction") or {}
    memo_type, memo = memo_as_string(tx)
    amount = xdr_amount(record.get("amount"))
    observation = ApObservedPayment(
        paging_token=str(record.get("paging_token")), operation_id=str(record.get("id")),
        operation_type=str(record.get("type")),
        stellar_transaction_id=record.get("transaction_hash") or tx.get("hash") or "",
        from_account=record.get("from"), to_account=record.get("to"),
        to_muxed=record.get("to_muxed"), amount=amount, asset=_asset_name(record),
        memo_type=memo_type, memo=memo, observed_at=now())

    if not observation.stellar_transaction_id:
        observation.outcome, observation.detail = "ignored", "transaction without a hash"
    elif memo is None:
        observation.outcome, observation.detail = "ignored", "empty text memo"
    elif record.get("asset_type") not in OBSERVABLE_ASSET_TYPES:
        observation.outcome, observation.detail = "ignored", "not a native or issued asset"
    else:
        _match_and_notify(observation, record)
    observation.save(using=DB)
    return observation


def _match_and_notify(observation: ApObservedPayment, record: dict) -> None:
    try:
        txn = find_transaction(observation.to_account, observation.memo)
    except LookupFailed as exc:
        observation.outcome, observation.detail = "lookup_error", str(exc)
        log.error("observer: lookup failed for payment %s: %s", observation.operation_id, exc)
        return
    if txn is None:
        observation.outcome = "no_match"
        return
    observation.transaction_id = txn.id
    if faults.take(FAULT_MISS) is not None:
        observation.outcome, observation.detail = "missed", FAULT_MISS
        log.info("ap.observer_miss: dropped payment %s for %s", observation.operation_id,
                 txn.id)
        return
    _warn_mismatch(txn, record, observation.amount)
    request = notify_request(txn, observation.stellar_transaction_id, observation.amount)
    reply = rpc.handle_one(request)
    observation.rpc_request, observation.rpc_reply = request, reply
    if "error" in reply:
        observation.outcome = "refused"
        observation.detail = f"{reply['error'].get('code')}: {reply['error'].get('message')}"
        log.warning("observer: %s for %s refused: %s", request["method"], txn.id,
                    observation.detail)
    else:
        observation.outcome = "notified"


# --------------------------------------------------------------------------- loop


class Observer:
    """The observer's process-local state: whether it has (re)started since it was last
    off. The cursor itself lives in the database."""

    def __init__(self) -> None:
        self.started = False

    def poll(self, client: httpx.Client) -> int:
        """One pass: (re)start if needed, then handle every new payment, saving the
        cursor after each. Returns how many payments it handled."""
        if faults.peek(FAULT_OFF) is not None:
            self.started = False
            return 0
        state = load_state()
        cursor, epoch = state.cursor, state.epoch
        if not self.started or cursor is None:
            cursor = streaming_cursor(cursor, latest_cursor(client))
            if cursor is not None:
                save_cursor(cursor, epoch)
            self.started = True
            log.info("observer: (re)started at cursor %s", cursor)
        handled = 0
        accounts = observed_accounts()
        while True:
            records = payments_page(client, keys.DISTRIBUTION.public_key, cursor)
            for record in records:
                if faults.peek(FAULT_OFF) is not None:
                    self.started = False
                    return handled
                if record.get("type") in PAYMENT_TYPES and (
                        record.get("to") in accounts or record.get("from") in accounts):
                    try:
                        handle_payment(record)
                    except Reset:
                        raise
                    except Exception:  # AP logs a failed payment and moves on
                        log.exception("observer: payment %s not handled",
                                      record.get("paging_token"))
                    handled += 1
                cursor = str(record["paging_token"])
                save_cursor(cursor, epoch)  # HorizonPaymentObserver: in ``finally``
            if len(records) < MAX_RESULTS:
                return handled


def run(stop: threading.Event) -> None:
    """The observer loop: a pass every ``SANDBOX_AP_OBSERVER_POLL_S`` seconds until
    ``stop`` is set; survives resets, Horizon errors and database restarts."""
    observer = Observer()
    timeout = float(getattr(settings, "HTTP_TIMEOUT_S", 10.0))
    with httpx.Client(timeout=timeout, verify=tls_context()) as client:
        while not stop.is_set():
            try:
                observer.poll(client)
            except Reset:
                log.info("observer: reset during a pass; restarting")
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("observer: Horizon unavailable (%s); retrying", exc)
                stop.wait(0.5)
            except Exception:  # the loop must outlive a reset or a database restart
                log.exception("observer pass failed; retrying")
                connections[DB].close()
                stop.wait(0.5)
            stop.wait(poll_interval())
        connections[DB].close()

