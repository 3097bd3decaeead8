"""The fate of a stored Stellar envelope: one rule, used by every Stellar outbox in
Corridor (deposit releases, withdrawal refunds, the hub's sends, operator re-drives).

The rule (DESIGN.md §4 step 3; horizon/NOTES.md §2.6 rule 3, corrected): an envelope is

- ``landed`` when Horizon shows a transaction with our hash (successful, or included
  but failed: its fee was charged and its sequence consumed; ``Fate.successful`` and
  ``Fate.transaction`` say which);
- ``dead`` (a rebuild is allowed) only with a proof from data Horizon guarantees
  consistent:
  (a) ONE read of the source account, whose ``Latest-Ledger`` header is L, shows the
      account's sequence still below the envelope's, and ledger L closed after
      ``max_time`` (``GET /ledgers/L``, ``closed_at``) or L >= ``max_ledger`` - 1
      (``max_ledger`` is exclusive): the envelope was not applied up to L and no later
      ledger can apply it (stellar-core ``isTooLate``); or
  (b) the account's sequence is at or past the envelope's and the transaction that
      consumed the envelope's sequence (found in ``/accounts/{source}/transactions`` by
      ``source_account_sequence``) has another hash: one sequence applies once;
- ``alive`` when (a) shows the sequence below ours and ledger L closed at or before
  ``max_time``: it may still land; re-post the same envelope or wait;
- ``unknown`` otherwise: the sequence is consumed but its transaction is not findable
  yet (a lagging or load-balanced Horizon: stellar-disbursement-platform-backend PR
  #1208, django-polaris #640), ledger L is not served yet, the header is missing, the
  account is missing. A 404 for our hash proves nothing on its own, and an unproven
  height is never a proof. Callers wait and ask again, never rebuild; once
  ``unknown_overdue`` (ENVELOPE_UNKNOWN_REVIEW_S past ``max_time``) they put the row in
  ``manual_review`` with the evidence.

Order of reads: the account first, then (only if the sequence is consumed) the hash
and the account's transactions. A landing between any two reads cannot yield ``dead``:
(a) rests on one read plus an immutable ledger header, and (b) on a fact that never
changes once true (another transaction used the sequence). ``Latest-Ledger`` is sent by
Horizon's ``StateMiddleware`` only (stellar-horizon ``internal/httpx/middleware.go``,
``router.go`` @ 2abda012), so it is read from the account response, never from a
transaction lookup.

``ENVELOPE_RULE = "naive"`` (test-only) decides with the old rule instead: the hash
first, then "sequence at or past ours, or the latest ledger closed after max_time" as
dead. Behind a lagging Horizon it pays twice; the tests show it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from stellar_sdk import exceptions as sdk_errors
from stellar_sdk.client.requests_client import RequestsClient

from anchor import stellar

log = logging.getLogger(__name__)

LANDED, ALIVE, DEAD, UNKNOWN = "landed", "alive", "dead", "unknown"
CONSUMER_PAGES = 5  # pages of 200 of the source's transactions searched for the consumer


@dataclass(frozen=True)
class Fate:
    """The fate of one stored envelope. ``state``: ``landed`` | ``alive`` | ``dead`` |
    ``unknown``; ``reason``: one sentence for people; ``evidence``: what it rests on
    (JSON-able: hash, sequence, source, max_time, the account's sequence and
    ``Latest-Ledger``, the ledger's ``closed_at``, the consumer's hash...);
    ``transaction``: Horizon's transaction resource when landed."""

    state: str
    reason: str
    evidence: dict = field(default_factory=dict)
    transaction: dict | None = None

    @property
    def successful(self) -> bool | None:
        """For ``landed``: whether the transaction succeeded (False = included but
        failed: fee charged, sequence used, no payment made)."""
        if self.transaction is None:
            return None
        return bool(self.transaction.get("successful"))


def unknown_overdue(max_time: datetime) -> bool:
    """Whether an ``unknown`` envelope has waited long enough for a person: more than
    ENVELOPE_UNKNOWN_REVIEW_S seconds after its ``max_time``."""
    return timezone.now() > max_time + timedelta(seconds=settings.ENVELOPE_UNKNOWN_REVIEW_S)


def envelope_fate(*, tx_hash: str, source_account: str, sequence: int, max_time: datetime,
                  max_ledger: int | None = None) -> Fate:
    """Decide the fate of the stored envelope ``tx_hash`` (hex), whose transaction
    source is ``source_account`` (G...), with sequence ``sequence`` and time bound
    ``max_time`` (aware datetime; ``max_ledger``: its exclusive ledger bound, if any).
    Reads Horizon only (an account read, then at most a ledger, the hash and a few
    pages of the source's transactions). Raises stellar.HorizonUnavailable when Horizon
    cannot be read at all (nothing is known: ask again later)."""
    if settings.ENVELOPE_RULE == "naive":
        return _naive_fate(tx_hash=tx_hash, source_account=source_account,
                           sequence=sequence, max_time=max_time)
    evidence: dict[str, Any] = {"tx_hash": tx_hash, "source_account": source_account,
                                "sequence": str(sequence), "max_time": max_time.isoformat(),
                                "max_ledger": max_ledger}
    account, latest = _read_account(source_account)
    evidence["latest_ledger"] = latest
    if account is None:
        return Fate(UNKNOWN, f"Horizon does not show the source account {source_account}"
                             f" (as of ledger {latest})", evidence)
    current = int(account["sequence"])
    evidence["account_sequence"] = str(current)
    if current < sequence:
        return _not_consumed(evidence, latest=latest, max_time=max_time,
                             max_ledger=max_ledger)
    return _consumed(evidence, tx_hash=tx_hash, source_account=source_account,
                     sequence=sequence)


def _not_consumed(evidence: dict, *, latest: int | None, max_time: datetime,
                  max_ledger: int | None) -> Fate:
    """Rule (a): the account read showed the sequence below ours as of ledger L."""
    if latest is None:
        return Fate(UNKNOWN, "the account read carried no Latest-Ledger header, so the "
                             "height behind its sequence is unknown", evidence)
    if max_ledger and latest >= max_ledger - 1:
        return Fate(DEAD, f"its sequence was unused as of ledger {latest}, the last ledger "
                          f"its bounds allow (max_ledger {max_ledger}): it can never land",
                    evidence)
    closed_at = _ledger_closed_at(latest)
    evidence["latest_ledger_closed_at"] = closed_at.isoformat() if closed_at else None
    if closed_at is None:
        return Fate(UNKNOWN, f"ledger {latest} is not served yet, so when it closed is "
                             "unknown", evidence)
    if closed_at > max_time:
        return Fate(DEAD, f"its sequence was unused as of ledger {latest}, which closed at "
                          f"{closed_at.isoformat()}, after its max_time: it can never "
                          "land", evidence)
    return Fate(ALIVE, f"not applied as of ledger {latest} (closed "
                       f"{closed_at.isoformat()}); it may land until "
                       f"{evidence['max_time']}", evidence)


def _consumed(evidence: dict, *, tx_hash: str, source_account: str,
              sequence: int) -> Fate:
    """Rule (b): the sequence is used; by ours (landed) or by another (dead)?"""
    found = stellar.find_transaction(tx_hash)
    if found is not None:
        return _landed(evidence, found)
    consumer = _consumer(source_account, sequence)
    if consumer is None:
        return Fate(UNKNOWN, f"sequence {sequence} is used but the transaction that used "
                             "it is not findable on Horizon yet", evidence)
    if consumer.get("hash") == tx_hash:
        return _landed(evidence, consumer)
    evidence["consumed_by"] = consumer.get("hash")
    return Fate(DEAD, f"sequence {sequence} was used by another transaction "
                      f"{consumer.get('hash')}: this envelope can never land", evidence)


def _landed(evidence: dict, resource: dict) -> Fate:
    evidence.update(ledger=resource.get("ledger"), successful=resource.get("successful"),
                    created_at=resource.get("created_at"))
    outcome = "successful" if resource.get("successful") else "included but failed"
    return Fate(LANDED, f"{resource.get('hash')} is on chain in ledger "
                        f"{resource.get('ledger')} ({outcome})", evidence, resource)


# --- Horizon reads -----------------------------------------------------------------

def _read_account(address: str) -> tuple[dict | None, int | None]:
    """``GET /accounts/{address}``: (the account or None on 404, its ``Latest-Ledger``
    or None). Read through stellar-sdk's client to keep the header the call builders
    drop. Raises stellar.HorizonUnavailable."""
    client = RequestsClient(num_retries=0, request_timeout=settings.HTTP_TIMEOUT_S,
                            post_timeout=settings.STELLAR_SUBMIT_TIMEOUT_S)
    url = f"{settings.HORIZON_URL.rstrip('/')}/accounts/{address}"
    try:
        response = client.get(url)
    except (sdk_errors.ConnectionError, sdk_errors.BaseRequestError) as exc:
        raise stellar.HorizonUnavailable(str(exc)) from exc
    finally:
        client.close()
    headers = {k.lower(): v for k, v in (response.headers or {}).items()}
    latest_text = headers.get("latest-ledger")
    try:
        latest = int(latest_text) if latest_text else None
    except ValueError:
        latest = None
    if response.status_code == 404:
        return None, latest
    if response.status_code != 200:
        raise stellar.HorizonUnavailable(f"GET /accounts/{address}: {response.status_code}")
    return response.json(), latest


def _ledger_closed_at(sequence: int) -> datetime | None:
    """``closed_at`` of ledger ``sequence``, None when Horizon does not serve it (yet)."""
    try:
        record = stellar.server().ledgers().ledger(sequence).call()
    except sdk_errors.NotFoundError:
        return None
    except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
        raise stellar.HorizonUnavailable(str(exc)) from exc
    return datetime.fromisoformat(record["closed_at"].replace("Z", "+00:00")).astimezone(UTC)


def history_shows_sequence(source_account: str, sequence: int) -> bool:
    """Whether Horizon's history already shows the transaction of ``source_account``
    that used ``sequence`` (a sequence number read from its state, ``/accounts/{id}``):
    then every transaction of that account up to it is in the history a read that
    follows returns (a lagging node shows state before history: the sandbox's
    ``horizon.lookup_lag``). An account that never sent one (its sequence's low 32 bits
    are 0, as created) has nothing to show. Raises stellar.HorizonUnavailable."""
    return sequence & 0xFFFFFFFF == 0 or _consumer(source_account, sequence) is not None


def _consumer(source_account: str, sequence: int) -> dict | None:
    """The transaction whose source is ``source_account`` and whose sequence is
    ``sequence`` (failed ones included), searched newest first in the account's
    transactions; None when Horizon does not show it (yet). Raises
    stellar.HorizonUnavailable."""
    cursor = ""
    for _ in range(CONSUMER_PAGES):
        try:
            page = (stellar.server().transactions().for_account(source_account)
                    .include_failed(True).cursor(cursor).order(desc=True).limit(200).call())
        except sdk_errors.NotFoundError:
            return None
        except (sdk_errors.BaseRequestError, sdk_errors.ConnectionError) as exc:
            raise stellar.HorizonUnavailable(str(exc)) from exc
        records = page["_embedded"]["records"]
        for record in records:
            cursor = record["paging_token"]
            if record.get("source_account") != source_account:
                continue
            used = int(record.get("source_account_sequence", "0"))
            if used == sequence:
                return record
            if used < sequence:
                return None  # newest first: older transactions cannot hold ours
        if len(records) < 200:
            return None
    return None


# --- the old rule (test-only) --------------------------------------------------------

def _naive_fate(*, tx_hash: str, source_account: str, sequence: int,
                max_time: datetime) -> Fate:
    """What every outbox used to decide, kept only to show it pays twice: a hash
    lookup first, then "sequence at or past ours" or "latest ledger closed after
    max_time" as proof of death."""
    evidence = {"tx_hash": tx_hash, "rule": "naive"}
    found = stellar.find_transaction(tx_hash)
    if found is not None:
        return _landed(evidence, found)
    if stellar.account_sequence(source_account) >= sequence:
        return Fate(DEAD, "naive: the source's sequence moved past ours", evidence)
    if stellar.latest_ledger_close_time() > max_time:
        return Fate(DEAD, "naive: the latest ledger closed after max_time", evidence)
    return Fate(ALIVE, "naive: not found, may still land", evidence)
