"""Remittances as partners see them: partners and their API keys, the creation of a
``remittance`` saga (sagas/plans/remittance.py) at a locked quote, and its read view.

- ``partner_create`` / ``partner_authenticate``: an API key ``cpk_<prefix>_<secret>``
  is shown once; Corridor keeps the prefix (lookup) and the sha256 of the whole key.
- ``remittance_create``: idempotent per (partner, ``Idempotency-Key``): the saga's
  reference (the memo the partner pays with) is derived from both, so two requests
  with one key can only ever make one saga (the unique reference decides a race); the
  same key with another request raises ``IdempotencyConflict`` (Brandur,
  ledger-and-sagas.md §1.1: parameters compared, mismatch refused).
- ``remittance_view``: status, steps and the saga's ledger bookings.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from decimal import ROUND_DOWN, Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from anchor import stellar
from ledger.models import Entry
from sagas import engine
from sagas.models import Partner, Saga, SagaStep

KIND = "remittance"
KEY_PREFIX = "cpk_"
MEMO_TYPE = "text"
INR_PLACES = Decimal("0.01")


@dataclass(frozen=True)
class Corridor:
    """A route Corridor pays: what the partner sends, what the beneficiary gets, the
    beneficiary fields the receiving anchor needs, and the asset's decimal places."""

    code: str
    send: str
    receive: str
    send_places: int
    beneficiary_fields: tuple[str, ...]


CORRIDORS = {
    "USDC-INR": Corridor("USDC-INR", "USDC", "INR", 7, ("name", "account_number", "ifsc")),
}


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with another request."""


# --- partners ---------------------------------------------------------------------

def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def partner_create(*, name: str, stellar_account: str) -> tuple[Partner, str]:
    """Create partner ``name`` and return it with its API key (the only time the key
    exists in clear). Raises IntegrityError if the name is taken."""
    prefix = secrets.token_hex(6)
    key = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    partner = Partner.objects.create(name=name, key_prefix=prefix, key_hash=_digest(key),
                                     stellar_account=stellar_account)
    return partner, key


def partner_authenticate(key: str) -> Partner | None:
    """The active partner whose API key is ``key``, or None."""
    if not key.startswith(KEY_PREFIX) or key.count("_") < 2:
        return None
    prefix = key[len(KEY_PREFIX):].split("_", 1)[0]
    partner = Partner.objects.filter(key_prefix=prefix, is_active=True).first()
    if partner is None or not hmac.compare_digest(partner.key_hash, _digest(key)):
        return None
    return partner


# --- create -----------------------------------------------------------------------

def reference_for(partner: Partner, idempotency_key: str) -> str:
    """The remittance reference (a 20-character text memo) of a partner's key."""
    digest = hashlib.sha256(f"{partner.pk}:{idempotency_key}".encode()).digest()
    return "CR" + base64.b32encode(digest).decode()[:18]


def is_reference(memo_type: str, memo: str) -> bool:
    """Whether a payment's memo has the shape of a remittance reference Corridor issues
    (``reference_for``: a text memo ``CR`` + 18 base32 characters)."""
    return (memo_type == MEMO_TYPE and len(memo) == 20 and memo.startswith("CR")
            and all(c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" for c in memo[2:]))


def _request_hash(order: dict[str, Any]) -> str:
    canonical = json.dumps(order, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def remittance_create(*, partner: Partner, idempotency_key: str,
                      order: dict[str, Any]) -> tuple[Saga, bool]:
    """Lock the quote and start the remittance saga for a validated ``order``
    (``{"amount": Decimal USDC, "corridor", "send_currency", "receive_currency",
    "beneficiary": {...}}``). Returns (saga, created): created is False when the same
    key and the same order came before (that saga is returned).

    Moves no money; one commit (the saga, its steps, its first event) and a Celery run
    after it. Raises IdempotencyConflict, stellar.HorizonUnavailable (the saga's
    Horizon cursor could not be read; nothing was written)."""
    order = {**order, "amount": format(order["amount"].normalize(), "f")}
    reference = reference_for(partner, idempotency_key)
    request_hash = _request_hash(order)
    existing = Saga.objects.filter(reference=reference).first()
    if existing is not None:
        return _replayed(existing, request_hash), False
    corridor = CORRIDORS[order["corridor"]]
    amount = Decimal(order["amount"])
    rate = settings.REMITTANCE_RATE_INR_PER_USDC
    hub = stellar.hub_keypair().public_key
    cursor = stellar.latest_payment_cursor(hub)
    fund_by = timezone.now() + timedelta(seconds=settings.REMITTANCE_FUNDING_DEADLINE_S)
    saga_input = {
        "partner": partner.name, "partner_id": partner.pk,
        "partner_account": partner.stellar_account, "hub_account": hub,
        "corridor": corridor.code, "amount": order["amount"],
        "asset_code": settings.STELLAR_USDC_CODE, "asset_issuer": settings.STELLAR_USDC_ISSUER,
        "rate": format(rate, "f"), "receive_currency": corridor.receive,
        "receive_amount": format((amount * rate).quantize(INR_PLACES, ROUND_DOWN), "f"),
        "beneficiary": order["beneficiary"], "memo_type": MEMO_TYPE,
        "fund_by": fund_by.isoformat(), "idempotency_key": idempotency_key,
        "request_hash": request_hash,
    }
    try:
        saga = engine.start(kind=KIND, reference=reference, input=saga_input,
                            stellar_cursor=cursor)
    except engine.SagaConflict:  # the same key at the same moment: the first one won
        return _replayed(Saga.objects.get(reference=reference), request_hash), False
    return saga, True


def _replayed(saga: Saga, request_hash: str) -> Saga:
    if saga.kind != KIND or saga.input.get("request_hash") != request_hash:
        raise IdempotencyConflict("this Idempotency-Key was used with another request")
    return saga


# --- read -------------------------------------------------------------------------

def _masked(beneficiary: dict[str, Any]) -> dict[str, Any]:
    shown = dict(beneficiary)
    number = str(shown.get("account_number", ""))
    if number:
        shown["account_number"] = "*" * max(0, len(number) - 4) + number[-4:]
    return shown


def remittance_summary(saga: Saga) -> dict[str, Any]:
    """What the partner needs to fund the remittance (the 202 answer)."""
    inp = saga.input
    return {
        "id": saga.pk, "status": saga.status, "reference": saga.reference,
        "hub_account": inp["hub_account"], "memo_type": inp["memo_type"],
        "memo": saga.reference, "amount": inp["amount"], "asset_code": inp["asset_code"],
        "asset_issuer": inp["asset_issuer"], "corridor": inp["corridor"],
        "quote": {"rate": inp["rate"], "receive_amount": inp["receive_amount"],
                  "receive_currency": inp["receive_currency"]},
        "fund_by": inp["fund_by"], "beneficiary": _masked(inp["beneficiary"]),
    }


def remittance_view(saga: Saga) -> dict[str, Any]:
    """The summary plus the saga's steps and every ledger entry it booked."""
    saga.refresh_from_db()
    steps = [{"idx": s.idx, "kind": s.kind, "status": s.status, "attempts": s.attempts,
              "undo_attempts": s.undo_attempts, "error": s.error, "output": s.output,
              "undo_output": s.undo_output}
             for s in SagaStep.objects.filter(saga=saga).order_by("idx")]
    entries = Entry.objects.filter(saga_id=saga.pk).order_by("id").prefetch_related(
        "postings__account")
    bookings = [{"kind": e.kind, "reference": e.reference,
                 "idempotency_key": e.idempotency_key, "created_at": e.created_at,
                 "postings": [{"account": p.account.code, "currency": p.account.currency,
                               "amount": format(p.amount, "f")}
                              for p in sorted(e.postings.all(), key=lambda p: p.pk)]}
                for e in entries]
    return {**remittance_summary(saga), "error": saga.error, "created_at": saga.created_at,
            "updated_at": saga.updated_at, "steps": steps, "bookings": bookings}


def remittance_for(partner: Partner, saga_id: int) -> Saga | None:
    """The partner's own remittance ``saga_id``; None for any other saga."""
    saga = Saga.objects.filter(pk=saga_id, kind=KIND).first()
    if saga is None or saga.input.get("partner_id") != partner.pk:
        return None
    return saga
