"""The receiving anchor's payment watcher: it follows the payments of its receiving
account (``sandbox.keys.ANCHOR31``) on the sandbox Horizon, over HTTP, from a cursor kept
in the database, the way ``sandbox.ap.observer`` follows the distribution account.

Every ``SANDBOX_ANCHOR31_POLL_S`` (0.2 s) it pages ``GET {SANDBOX_URL}/horizon/accounts/
{anchor}/payments?cursor=<stored>&order=asc&limit=200&join=transactions`` and, for each
``payment`` / ``path_payment_strict_*`` record sent *to* the account (its own refunds go
the other way), records a ``Sep31Payment`` and then stores the cursor:

- matching uses the memo only (SEP-31 "Authentication": "Only the payment transaction's
  memo should be used to match incoming payments"; the source account plays no part):
  the transaction with this destination, memo type and memo (the ``id`` memo as Horizon's
  decimal string; a ``text`` memo "123" does not match the ``id`` memo 123);
- the first payment of a ``pending_sender`` transaction (or of one rejected before
  funding) is ``matched`` and the transaction is due for its next step
  (``sandbox.anchor31.machine`` checks asset and amount); a later payment with the same
  memo is ``duplicate`` and kept by the anchor (not refunded: an operator's matter);
  anything else is ``no_match``.

Cursor: a reset stores the newest operation of the account's fixed-world history; with no
stored cursor the watcher starts from the account's newest payment. The cursor is written
``WHERE epoch = <epoch read>``, so a pass that straddles a reset drops its page.
"""

from __future__ import annotations

import logging
import threading
from decimal import Decimal

import httpx
from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.utils import timezone

from common.http import tls_context
from sandbox.anchor31 import machine, stellar
from sandbox.anchor31.models import Sep31ObserverState, Sep31Payment, Sep31Transaction
from sandbox.keys import ANCHOR31

log = logging.getLogger(__name__)

DB = "sandbox"
PAGE = 200
PAYMENT_TYPES = {"payment", "path_payment_strict_send", "path_payment_strict_receive"}
TX = Sep31Transaction


class Reset(Exception):
    """A reset replaced the cursor while this pass ran."""


def poll_interval() -> float:
    return float(getattr(settings, "SANDBOX_ANCHOR31_POLL_S", 0.2))


def load_state() -> Sep31ObserverState:
    state = Sep31ObserverState.objects.using(DB).filter(pk=1).first()
    if state is not None:
        return state
    try:
        with transaction.atomic(using=DB):
            return Sep31ObserverState.objects.using(DB).create(pk=1)
    except IntegrityError:
        return Sep31ObserverState.objects.using(DB).get(pk=1)


def save_cursor(cursor: str, epoch: int) -> None:
    updated = (Sep31ObserverState.objects.using(DB).filter(pk=1, epoch=epoch)
               .update(cursor=cursor, updated_at=timezone.now()))
    if updated != 1:
        raise Reset()


def reset_state(cursor: str | None) -> None:
    """Start over from ``cursor`` with a new epoch (``sandbox.anchor31.service.reset``)."""
    updated = (Sep31ObserverState.objects.using(DB).filter(pk=1)
               .update(cursor=cursor, epoch=F("epoch") + 1, updated_at=timezone.now()))
    if not updated:
        Sep31ObserverState.objects.using(DB).create(pk=1, cursor=cursor, epoch=1,
                                                    updated_at=timezone.now())


def _get(client: httpx.Client, path: str, params: dict) -> dict:
    response = client.get(stellar.horizon_url() + path, params=params)
    response.raise_for_status()
    return response.json()


def payments_page(client: httpx.Client, cursor: str | None, *, order: str = "asc",
                  limit: int = PAGE) -> list[dict]:
    params = {"order": order, "limit": limit, "join": "transactions"}
    if cursor:
        params["cursor"] = cursor
    page = _get(client, f"/accounts/{ANCHOR31.public_key}/payments", params)
    return page.get("_embedded", {}).get("records", [])


def _memo(tx: dict) -> tuple[str, str | None]:
    memo_type = tx.get("memo_type") or "none"
    return memo_type, (None if memo_type == "none" else str(tx.get("memo", "")))


def handle_payment(record: dict) -> Sep31Payment | None:
    """Record one incoming payment and link it to its transaction (module docstring).
    Idempotent: a payment already recorded (same operation id) is left alone (None)."""
    operation_id = str(record.get("id"))
    if Sep31Payment.objects.using(DB).filter(operation_id=operation_id).exists():
        return None
    tx_json = record.get("transaction") or {}
    memo_type, memo = _memo(tx_json)
    payment = Sep31Payment(
        operation_id=operation_id, paging_token=str(record.get("paging_token")),
        operation_type=str(record.get("type")),
        stellar_transaction_id=record.get("transaction_hash") or tx_json.get("hash") or "",
        from_account=record.get("from") or "", to_account=record.get("to") or "",
        to_muxed=record.get("to_muxed"), asset_type=record.get("asset_type") or "",
        asset_code=record.get("asset_code"), asset_issuer=record.get("asset_issuer"),
        amount=Decimal(str(record.get("amount") or "0")), memo_type=memo_type, memo=memo,
        observed_at=timezone.now())
    with transaction.atomic(using=DB):
        tx = None
        if memo is not None:
            tx = (TX.objects.using(DB).select_for_update()
                  .filter(stellar_account_id=payment.to_account, memo_type=memo_type,
                          memo=memo).first())
        if tx is None:
            payment.outcome = Sep31Payment.NO_MATCH
        else:
            payment.transaction = tx
            funded = tx.payments.using(DB).filter(outcome=Sep31Payment.MATCHED).exists()
            takes = tx.status == TX.PENDING_SENDER or (tx.status == TX.ERROR and tx.reject)
            if funded or not takes:
                payment.outcome = Sep31Payment.DUPLICATE
                payment.detail = (f"transaction {tx.id} already has its payment" if funded
                                  else f"transaction {tx.id} is {tx.status}")
            else:
                payment.outcome = Sep31Payment.MATCHED
                delay = (machine.settle_delay(tx) if tx.status == TX.ERROR
                         else machine.first_delay(tx))
                tx.due_at = timezone.now() + machine.seconds(delay)
                tx.save(using=DB, update_fields=["due_at"])
        payment.save(using=DB)
    log.info("anchor31: payment %s (%s %s, memo %s) %s", operation_id, payment.amount,
             payment.asset_code or payment.asset_type, memo, payment.outcome)
    return payment


def poll(client: httpx.Client) -> int:
    """One pass over the new payments. Returns how many it handled."""
    state = load_state()
    cursor, epoch = state.cursor, state.epoch
    if cursor is None:
        newest = payments_page(client, None, order="desc", limit=1)
        if not newest:
            return 0
        cursor = str(newest[0]["paging_token"])
        save_cursor(cursor, epoch)
    handled = 0
    while True:
        records = payments_page(client, cursor)
        for record in records:
            if (record.get("type") in PAYMENT_TYPES
                    and record.get("to") == ANCHOR31.public_key):
                handle_payment(record)
                handled += 1
            cursor = str(record["paging_token"])
            save_cursor(cursor, epoch)
        if len(records) < PAGE:
            return handled


def run(stop: threading.Event) -> None:
    """The watcher loop until ``stop``; survives resets, Horizon errors (the account
    may not exist yet: 404) and database restarts."""
    timeout = float(getattr(settings, "HTTP_TIMEOUT_S", 10.0))
    try:
        with httpx.Client(timeout=timeout, verify=tls_context()) as client:
            while not stop.is_set():
                try:
                    poll(client)
                except Reset:
                    log.info("anchor31: reset during a pass; restarting")
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    log.debug("anchor31: Horizon unavailable (%s); retrying", exc)
                    stop.wait(0.5)
                except Exception:
                    log.exception("anchor31: watcher pass failed; retrying")
                    connections[DB].close()
                    stop.wait(0.5)
                stop.wait(poll_interval())
    finally:
        connections[DB].close()
