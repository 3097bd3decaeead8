"""Money that arrives after a saga stopped waiting for it (issue 25 §1).

A remittance stops in ``manual_review`` when its funded anchor failed and no refund was
seen in time: ``anchor.payout`` ("the anchor failed a payout it was funded for, with no
refund", or "whether it refunded is not proven") or the ``anchor.fund`` compensation
("no refund from the anchor by <deadline>"). The anchor may still refund, at any later
time; the design says "until the anchor's refund is confirmed, a person closes it"
(DESIGN.md §6). This sweep is that confirmation, run by beat
(``sagas.tasks.sweep_late_money``, every LATE_MONEY_SWEEP_PERIOD_S) over the sagas in
manual_review for one of those reasons (``awaiting_sql``, served by the partial index
``sagas_review_idx``), at most LATE_MONEY_BATCH per run:

- **confirmed**: the refund is on chain (successful USDC payments anchor -> hub under
  the funding's memo, ``remittance.chain_refunds``) AND in the anchor's own record
  (SEP-31 ``GET /transactions/{id}``: ``refunded``, or ``error`` with refunds, whose
  ``refunds.amount_refunded`` equals the sum on chain and whose ``payments[].id`` are
  exactly those hashes), no more than the funding, and whole or short by exactly the
  refund fees the record states (``remittance.refund_fee``: what the compensation can
  book; a short refund the fees do not explain stays in review, its reason saying so,
  since the compensation would stop again and this sweep reopen it, for ever) -> the
  saga is compensated by Corridor itself (``operations.saga_auto_compensate``, actor
  ``system:late-money``): the engine books the refund under its hash
  (``anchor.refund:<hash>``), undoes the conversion and returns the partner's USDC
  through the hub's outbox, last step first, exactly as an operator's "compensate"
  would;
- **seen, not confirmed** (on chain only, or in the record only): the review reason is
  replaced with what each side says now (``operations.saga_review_evidence``), so the
  queue never says "no refund" while one is on chain; the saga stays for the next run;
- **nothing**: the reason stands (it is still true); nothing is written.

An operator who acted first wins: both writes are conditional on the saga still being
in manual_review for the reason this run read.

The same run looks at the remittances that expired unfunded (``bridge.fill``: "not
funded by ..."; ended ``compensated`` within LATE_MONEY_FUNDING_WINDOW_S,
``expired_sql``, index ``sagas_compensated_idx``, newest first): a partner payment
under the reference that arrived anyway is matched and returned (``late_funding_check``).
And at the remittances that settled (``completed`` or ``compensated``) within the
same window with their ``bridge.fill`` booked (``settled_sql``, index
``sagas_settled_idx``): any other payment to the hub under the reference (a partner
who paid twice, another sender) is booked as owed back, returned to its sender through
the hub's outbox and the return booked, once (``excess_check``).
Each candidate costs one Horizon read of the hub's payments after the saga's cursor;
past LATE_MONEY_BATCH candidates a run reads the newest only.
Last, money no saga owns (``unmatched_check``): one page of the hub's payments after a
stored cursor; each USDC payment under a memo no saga (nor hub payment) owns starts one
``hub_return`` saga (sagas/plans/hubreturn.py) that books it in suspense and returns it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from anchor import stellar
from ledger import services as ledger
from ledger.models import Entry
from ledger.services import Line
from payouts.models import ChainCursor
from payouts.receipts import treasury_accounts
from sagas import anchor31, engine, hub, operations
from sagas.legs import LegContext, SagaInfo
from sagas.models import HubPayment, Saga, SagaStep
from sagas.plans import hubreturn, remittance

log = logging.getLogger(__name__)

ACTOR = "system:late-money"
# Reasons a later arrival of the anchor's refund resolves (the leg's own wording).
AWAITING_REFUND = (r"funded for, with no refund|no refund from the anchor by|"
                   r"whether it refunded is not proven|a refund arrived after")
LATE = "a refund arrived after the saga stopped waiting"
# USDC on the hub that arrived beside a saga's fill, owed back to its sender until the
# return is booked (nets to zero per payment).
EXCESS = "owed:remittance-excess"


def awaiting_sql(*, limit: int | None = None) -> tuple[str, list]:
    """(sql, params): ids of remittances in manual_review for a reason a late refund
    resolves, least recently changed first (``late_refund_check`` then reads whether
    the anchor was funded). Registered in corridor/periodic.py."""
    return ("SELECT id FROM sagas WHERE status = 'manual_review' "
            "AND kind = 'remittance' AND error ~ %s ORDER BY updated_at LIMIT %s",
            [AWAITING_REFUND, limit or settings.LATE_MONEY_BATCH])


def expired_sql(*, limit: int | None = None) -> tuple[str, list]:
    """(sql, params): ids of remittances that ended ``compensated`` within
    LATE_MONEY_FUNDING_WINDOW_S, newest first (``late_funding_check`` then reads
    whether it was their funding that expired). Served by ``sagas_compensated_idx``;
    registered in corridor/periodic.py."""
    return ("SELECT id FROM sagas WHERE status = 'compensated' AND kind = 'remittance' "
            "AND updated_at > clock_timestamp() - make_interval(secs => %s) "
            "ORDER BY updated_at DESC LIMIT %s",
            [settings.LATE_MONEY_FUNDING_WINDOW_S, limit or settings.LATE_MONEY_BATCH])


def settled_sql(*, limit: int | None = None) -> tuple[str, list]:
    """(sql, params): ids of remittances that ended ``completed`` or ``compensated``
    within LATE_MONEY_FUNDING_WINDOW_S, newest first (``excess_check`` then reads
    whether money beside the fill arrived under their reference). Served by
    ``sagas_settled_idx``; registered in corridor/periodic.py."""
    return ("SELECT id FROM sagas WHERE status IN ('completed', 'compensated') "
            "AND kind = 'remittance' "
            "AND updated_at > clock_timestamp() - make_interval(secs => %s) "
            "ORDER BY updated_at DESC LIMIT %s",
            [settings.LATE_MONEY_FUNDING_WINDOW_S, limit or settings.LATE_MONEY_BATCH])


def sweep_late_money() -> dict[str, int]:
    """One run of the sweep (module docstring): {outcome: count}. A saga whose check
    fails (Horizon or the anchor unreachable) is left for the next run. Nothing when
    LATE_MONEY_SWEEP is off (a test-only switch: ``chaos --protection-off late_money``)."""
    counts: dict[str, int] = {}
    if not settings.LATE_MONEY_SWEEP:
        return counts
    for sql, check in ((awaiting_sql(), late_refund_check),
                       (expired_sql(), late_funding_check),
                       (settled_sql(), excess_check)):
        with connection.cursor() as cur:
            cur.execute(*sql)
            ids = [row[0] for row in cur.fetchall()]
        for saga_id in ids:
            try:
                outcome = check(saga_id=saga_id)
            except Exception:  # one saga's trouble never stops the others'
                log.exception("late money: saga %s could not be checked", saga_id)
                outcome = "failed"
            counts[outcome] = counts.get(outcome, 0) + 1
    try:
        for outcome in unmatched_check():
            counts[outcome] = counts.get(outcome, 0) + 1
    except stellar.HorizonUnavailable as exc:
        log.warning("late money: the hub's payments could not be read: %s", exc)
        counts["unreadable"] = counts.get("unreadable", 0) + 1
    if any(k not in QUIET for k in counts):
        log.info("late money: %s", counts)
    return counts


# Outcomes that change nothing: a run with only these logs nothing.
QUIET = ("skipped", "unchanged", "owned", "outgoing", "treasury", "not_usdc")
# Where the scan of the hub's payments for money no saga owns stopped (stellar_cursors).
UNMATCHED_CURSOR = "sagas.hub-unmatched"


def unmatched_check() -> list[str]:
    """USDC that arrived at the hub under a memo no saga owns (issue 25 §2: a failover
    lost the commits that created a remittance after its 202 had given the partner the
    hub account and the memo, and the partner paid): each such payment starts one
    ``hub_return`` saga (``sagas/plans/hubreturn.py``: booked in suspense in the commit
    of its first leg, returned to its sender once through the hub's outbox), reference
    ``unmatched:<hash>``, so a second sweep starts nothing.

    Reads one page (HUB_UNMATCHED_BATCH, at most 200) of the hub's payments after the
    scan's cursor (``stellar_cursors`` row ``UNMATCHED_CURSOR``; made at the hub's
    latest payment on the first run), oldest first, after Horizon's history height. A
    USDC payment to the hub from outside Corridor (not ``treasury_accounts``) is owned
    when its memo is the reference of a saga whose cursor precedes it (``bridge.fill``
    and the late-money checks read after that cursor: one whose cursor follows it never
    sees it) or when its sender and memo are those of a hub payment (an anchor's refund
    of its funding, a partner's of a return). A payment is judged only once the
    history reaches HUB_UNMATCHED_GRACE_S past it (a saga's envelope whose row a
    failover lost can still land until its max_time: the return leg must see it); the
    cursor stops before the first that is not, and moves forward only (a conditional
    UPDATE). Returns the outcome per payment read: ``started``, ``owned``, ``treasury``,
    ``not_usdc``, ``outgoing``. Raises stellar.HorizonUnavailable (nothing moved)."""
    address = hub.hub_address()
    state = ChainCursor.objects.filter(account=UNMATCHED_CURSOR).first()
    if state is None:
        state, _ = ChainCursor.objects.get_or_create(
            account=UNMATCHED_CURSOR,
            defaults={"cursor": stellar.latest_payment_cursor(address) or "0"})
        return []
    _, history = stellar.history_height()
    page, last = stellar.transfers_page(address, state.cursor,
                                        limit=settings.HUB_UNMATCHED_BATCH)
    incoming = [t for t in page if t.destination == address and t.source != address]
    memos = {t.memo for t in incoming}
    sagas = dict(owning_sagas(memos))
    refunds = set(refunded_hub_payments(memos)) | set(funded_anchor_intents(memos))
    own = set(treasury_accounts())
    grace = timedelta(seconds=settings.HUB_UNMATCHED_GRACE_S)
    outcomes: list[str] = []
    for transfer in page:
        if transfer not in incoming:
            outcomes.append("outgoing")
        elif history < datetime.fromisoformat(transfer.created_at) + grace:
            last = _before(page, transfer, state.cursor)
            break
        elif transfer.source in own:
            outcomes.append("treasury")
        elif transfer.asset != stellar.usdc_asset_id():
            outcomes.append("not_usdc")
        elif (transfer.memo in sagas and _int(sagas[transfer.memo])
              < _int(transfer.paging_token)) or (transfer.source, transfer.memo) in refunds:
            outcomes.append("owned")
        else:
            outcomes.append(_start_return(transfer))
    if last and last != state.cursor:
        with connection.cursor() as cur:
            cur.execute("UPDATE stellar_cursors SET cursor = %s WHERE account = %s "
                        "AND (cursor = '' OR cursor::numeric < %s::numeric)",
                        [last, UNMATCHED_CURSOR, last])
    return outcomes


def owning_sagas(memos: Iterable[str]) -> QuerySet:
    """(reference, stellar_cursor) of the sagas whose reference is one of ``memos``.
    Served by the unique ``sagas.reference``; registered in corridor/periodic.py."""
    return Saga.objects.filter(reference__in=list(memos)).values_list("reference",
                                                                      "stellar_cursor")


def refunded_hub_payments(memos: Iterable[str]) -> QuerySet:
    """(destination, memo) of the hub's payments under one of ``memos``: a payment to
    the hub from that destination under that memo refunds or returns it. Served by
    ``saga_hub_payments_memo_idx``; registered in corridor/periodic.py."""
    return HubPayment.objects.filter(memo__in=list(memos)).values_list("destination", "memo")


def funded_anchor_intents(memos: Iterable[str]) -> QuerySet:
    """(account, memo) of the anchor legs' intents under one of ``memos``: the hub funded
    that anchor account under that memo (or was about to), so a payment from it under
    the memo is the anchor's refund, this saga's, even when the funding's
    ``saga_hub_payments`` row was lost and the leg found the payment on chain instead
    (20-seed loaded campaign at ffcbf26, seeds 7-9: such refunds were booked twice,
    ``hub.unmatched`` by a hub return and ``anchor.refund`` by their saga). Served by
    ``saga_steps_fund_memo_idx``; registered in corridor/periodic.py."""
    return SagaStep.objects.filter(kind="anchor.fund").annotate(
        memo=KeyTextTransform("memo", "intent"), account=KeyTextTransform(
            "account", "intent")).filter(memo__in=list(memos)).values_list("account", "memo")


def _int(paging_token: str) -> int:
    return int(paging_token or 0)


def _before(page: list[stellar.Transfer], transfer: stellar.Transfer, cursor: str) -> str:
    """The paging token just before ``transfer`` in ``page`` (``cursor`` if first)."""
    index = page.index(transfer)
    return page[index - 1].paging_token if index else cursor


def _start_return(transfer: stellar.Transfer) -> str:
    log.warning("late money: %s USDC from %s under memo %r (%s) arrived at the hub for no "
                "saga: returning it", transfer.amount, transfer.source, transfer.memo,
                transfer.tx_hash)
    engine.start(kind=hubreturn.KIND, reference=hubreturn.reference_for(transfer.tx_hash),
                 input={"hash": transfer.tx_hash, "from": transfer.source,
                        "amount": format(transfer.amount, "f"), "asset": transfer.asset,
                        "memo_type": transfer.memo_type, "memo": transfer.memo,
                        "at": transfer.created_at},
                 stellar_cursor=transfer.paging_token)
    return "started"


def late_funding_check(*, saga_id: int) -> str:
    """A remittance that expired unfunded (``bridge.fill`` failed "not funded by
    ..."): look for the partner's payment under its reference on chain now. One
    payment that matches (source = the partner's account, amount, USDC) ->
    ``compensating`` (``operations.saga_reopen_funded``: the oldest that matches is
    booked as ``bridge.fill`` under its hash in the transaction that reopens the saga;
    the compensation returns it to the partner through the hub's outbox, once; any
    other payment under the reference is ``excess_check``'s once the saga settles
    again); payments none of which matches ->
    ``review`` (manual_review with the evidence: a person returns it); nothing ->
    ``unchanged``; ``skipped`` when the saga is not such a one (or moved on)."""
    saga = Saga.objects.filter(pk=saga_id, status=Saga.Status.COMPENSATED,
                               kind="remittance").first()
    step = SagaStep.objects.filter(saga_id=saga_id, idx=0, kind="bridge.fill").first()
    if saga is None or step is None or step.status != "failed" \
            or "not funded by" not in step.error:
        return "skipped"
    address = hub.hub_address()
    try:
        incoming = [t for t in stellar.find_transfers_by_reference(
            address, saga.reference, saga.stellar_cursor) if t.destination == address]
    except stellar.HorizonUnavailable as exc:
        log.warning("late money: saga %s: %s", saga_id, exc)
        return "unreadable"
    if not incoming:
        return "unchanged"
    inp = saga.input
    amount = Decimal(str(inp["amount"]))
    seen = [{"hash": t.tx_hash, "from": t.source, "amount": str(t.amount),
             "asset": t.asset, "at": t.created_at} for t in incoming]
    first = remittance.first_match(incoming, inp)
    if first is not None:
        partner = remittance.partner_account(inp["partner"])
        booking = ledger.EntrySpec(
            idempotency_key=f"bridge.fill:{first.tx_hash}", kind="bridge.fill",
            lines=[Line(remittance.HUB, remittance.USDC, amount),
                   Line(partner, remittance.USDC, -amount)],
            reference=first.tx_hash, saga_id=saga_id)
        done = operations.saga_reopen_funded(
            saga_id=saga_id, actor=ACTOR, idx=0, booking=booking,
            output={"tx_hash": first.tx_hash, "from": first.source, "amount": str(amount),
                    "late": True},
            evidence={**seen[incoming.index(first)], "reference": saga.reference,
                      "expired": step.error, "payments": seen})
        return "compensating" if done else "skipped"
    listed = ", ".join(f"{t.tx_hash} {t.source} {t.amount} {t.asset}" for t in incoming)
    reason = (f"what arrived under {saga.reference} after the remittance expired "
              f"({step.error}) does not match it ({inp['partner_account']} {amount} "
              f"USDC): {listed}; it is on the hub, unbooked: a person returns it")
    moved = operations.saga_review_late_money(saga_id=saga_id, actor=ACTOR, reason=reason,
                                              evidence={"payments": seen})
    return "review" if moved else "skipped"


def excess_check(*, saga_id: int) -> str:
    """A settled remittance whose ``bridge.fill`` was booked: every other payment to the
    hub under its reference (a partner's retry, another sender or amount) is excess.
    Each USDC one is booked (``remittance.excess``: hub +X, EXCESS -X, keyed on its
    hash) with an ``auto.excess`` audit row in one transaction
    (``operations.saga_book_late_money``), returned to its sender through the hub's
    outbox (``hub.pay``, key ``{saga_id}:excess:{hash}``, memo ``hub.return_memo``: the
    look-up by that memo first, so a run that died between paying and booking never
    pays again), and the return booked under its own hash
    (``remittance.excess_return``: EXCESS +X, hub -X, with ``auto.excess_returned``).
    Every write is keyed, so concurrent or repeated runs move it once. A payment in
    another asset is left where it is (logged: the hub's USDC books are not touched by
    it). Returns ``returned``, ``booked`` (the hub was busy or its payment's fate is not
    known yet: the next run finishes), ``unchanged``, ``unreadable`` or ``skipped``."""
    saga = Saga.objects.filter(pk=saga_id, kind="remittance", status__in=[
        Saga.Status.COMPLETED, Saga.Status.COMPENSATED]).first()
    fill = Entry.objects.filter(saga_id=saga_id, kind="bridge.fill") \
        .values_list("reference", flat=True).first()
    if saga is None or fill is None:
        return "skipped"
    address = hub.hub_address()
    key = f"{EXCESS_CURSOR}:{saga_id}"
    try:
        start, read, last = _scan(address, key, saga.stellar_cursor)
    except stellar.HorizonUnavailable as exc:
        log.warning("late money: saga %s: %s", saga_id, exc)
        return "unreadable"
    excess = [t for t in read if t.memo == saga.reference and t.destination == address
              and t.source != address and t.tx_hash != fill]
    outcome = "unchanged"
    for transfer in excess:
        if transfer.asset != stellar.usdc_asset_id():
            log.warning("late money: saga %s: %s %s %s under %s is not USDC: a person "
                        "returns it", saga_id, transfer.tx_hash, transfer.amount,
                        transfer.asset, saga.reference)
            continue
        if Entry.objects.filter(idempotency_key=f"remittance.excess_return:"
                                                f"{transfer.tx_hash}").exists():
            continue
        outcome = _return_excess(saga, transfer)
        if outcome != "returned":  # the next run reads from just before this one
            last = _before(read, transfer, start)
            break
    _scanned(key, last)
    return outcome


# Where each settled remittance's look for excess stopped (stellar_cursors, per saga).
EXCESS_CURSOR = "sagas.excess"


def _scan(address: str, key: str, since: str) -> tuple[str, list[stellar.Transfer], str]:
    """The hub's successful payments after the look's stored cursor (``key``; the
    saga's own ``since`` before its first look, or with LATE_MONEY_SCAN_CURSOR off),
    oldest first, at most LATE_MONEY_SCAN_PAGES pages: (where it started, the
    payments, the paging token of the last record read). A lagging history serves a
    prefix, so what it did not show comes after that token. Raises
    stellar.HorizonUnavailable."""
    cursor = since or ""
    if settings.LATE_MONEY_SCAN_CURSOR:
        state = ChainCursor.objects.filter(account=key).first()
        if state is not None and _int(state.cursor) > _int(cursor):
            cursor = state.cursor
    start, read = cursor, []
    for _ in range(settings.LATE_MONEY_SCAN_PAGES):
        page, last = stellar.transfers_page(address, cursor, limit=200)
        if last == cursor:
            break
        read += page
        cursor = last
    return start, read, cursor


def _scanned(key: str, cursor: str) -> None:
    """Move the look's stored cursor forward to ``cursor`` (never back: a conditional
    UPDATE, after an INSERT that does nothing if the row exists)."""
    if not settings.LATE_MONEY_SCAN_CURSOR or not cursor:
        return
    ChainCursor.objects.get_or_create(account=key, defaults={"cursor": cursor})
    with connection.cursor() as cur:
        cur.execute("UPDATE stellar_cursors SET cursor = %s WHERE account = %s "
                    "AND (cursor = '' OR cursor::numeric < %s::numeric)",
                    [cursor, key, cursor])


def _return_excess(saga: Saga, transfer: stellar.Transfer) -> str:
    amount, payment_hash = transfer.amount, transfer.tx_hash
    evidence = {"hash": payment_hash, "from": transfer.source, "amount": str(amount),
                "asset": transfer.asset, "at": transfer.created_at,
                "reference": saga.reference}
    operations.saga_book_late_money(
        saga_id=saga.id, actor=ACTOR, event="auto.excess", evidence=evidence,
        booking=ledger.EntrySpec(
            idempotency_key=f"remittance.excess:{payment_hash}", kind="remittance.excess",
            lines=[Line(remittance.HUB, remittance.USDC, amount),
                   Line(EXCESS, remittance.USDC, -amount)],
            reference=payment_hash, saga_id=saga.id))
    ctx = LegContext(
        saga=SagaInfo(id=saga.id, kind=saga.kind, reference=saga.reference,
                      input=saga.input, stellar_cursor=saga.stellar_cursor),
        idx=0, leg="remittance.excess", idempotency_key=f"{saga.id}:excess:{payment_hash}",
        outputs=[], attempt=1, intent=None, worker=ACTOR)
    payment = hub.Payment(destination=transfer.source, amount=amount, memo_type="hash",
                          memo=hub.return_memo(payment_hash))
    try:
        tx_hash = hub.pay(ctx, payment, crash_name="remittance.excess_return.paid")
    except (hub.HubBusy, hub.HubPaymentUnknown) as exc:
        log.info("late money: saga %s: return of %s waits: %s", saga.id, payment_hash, exc)
        return "booked"
    operations.saga_book_late_money(
        saga_id=saga.id, actor=ACTOR, event="auto.excess_returned",
        evidence={**evidence, "returned_in": tx_hash},
        booking=ledger.EntrySpec(
            idempotency_key=f"remittance.excess_return:{payment_hash}",
            kind="remittance.excess_return",
            lines=[Line(EXCESS, remittance.USDC, amount),
                   Line(remittance.HUB, remittance.USDC, -amount)],
            reference=tx_hash, saga_id=saga.id))
    return "returned"


def late_refund_check(*, saga_id: int) -> str:
    """Check one saga (module docstring) and act: ``compensating`` (confirmed, saga
    reopened), ``evidence`` (reason updated), ``unchanged``, ``skipped`` (not a saga
    this sweep is for, or an operator moved it), ``unreadable`` (Horizon or the anchor
    could not be read: nothing decided)."""
    saga = Saga.objects.filter(pk=saga_id, status=Saga.Status.MANUAL_REVIEW).first()
    if saga is None or not re.search(AWAITING_REFUND, saga.error):
        return "skipped"
    step = SagaStep.objects.filter(saga_id=saga_id, kind="anchor.fund",
                                   status__in=["done", "compensating"]).first()
    fund = step.output if step else None
    if not fund or not fund.get("memo") or not fund.get("anchor_tx_id"):
        return "skipped"
    read_at = timezone.now()
    try:
        seen = remittance.chain_refunds(fund, cursor=saga.stellar_cursor)
        record = anchor31.get_transaction(fund["anchor_tx_id"])
    except (stellar.HorizonUnavailable, anchor31.AnchorError) as exc:
        log.warning("late money: saga %s: %s", saga_id, exc)
        return "unreadable"
    recorded, payments = anchor31.refunds_of(record)
    status = record.get("status")
    funded = Decimal(str(fund["amount"]))
    evidence: dict[str, Any] = {
        "read_at": read_at.isoformat(), "funded": str(funded), "memo": fund["memo"],
        "anchor_account": fund["account"], "anchor_tx_id": fund["anchor_tx_id"],
        "chain": [{"hash": t.tx_hash, "amount": str(t.amount), "at": t.created_at}
                  for t in seen.refunds],
        "chain_as_of_ledger": seen.ledger, "chain_ledger_closed_at": seen.closed_at.isoformat(),
        "anchor_status": status, "anchor_refunded": str(recorded),
        "anchor_refund_payments": [str(p.get("id")) for p in payments]}
    on_chain = {t.tx_hash for t in seen.refunds}
    agreed = (bool(on_chain) and status in (anchor31.REFUNDED, anchor31.ERROR)
              and recorded == seen.total and recorded <= funded
              and {str(p.get("id")) for p in payments} == on_chain)
    # Confirmed only what the compensation completes (a short refund: the record's fee
    # explains the rest), else it stops again at its deadline and this sweep reopens
    # it again, for ever (found by the attacker: four reopenings in 8 s).
    fee = remittance.refund_fee(record, funded=funded, received=seen.total) \
        if agreed else None
    confirmed = agreed and fee is not None
    if confirmed:
        done = operations.saga_auto_compensate(
            saga_id=saga_id, actor=ACTOR, reason_was=saga.error, evidence=evidence,
            note=f"the anchor's refund of {seen.total} USDC is confirmed on chain "
                 f"({', '.join(sorted(on_chain))}) and in its record ({status})")
        return "compensating" if done else "skipped"
    if not on_chain and recorded == 0:
        return "unchanged"
    chain_says = seen.describe()
    reason = (f"{LATE}: {chain_says}; the anchor's record says {status}, refunded "
              f"{recorded} USDC (payments {', '.join(evidence['anchor_refund_payments']) or 'none'}"
              f"); funded {funded} USDC. Compensated by Corridor once both agree")
    if recorded > funded or seen.total > funded:
        reason += "; more than the funding came back: a person decides"
    elif agreed:
        fees = sum((Decimal(str(p.get("fee") or "0")) for p in payments), Decimal(0))
        reason += (f"; both agree on {seen.total} USDC, but the anchor kept "
                   f"{funded - seen.total} USDC that its record's refund fees ({fees}) "
                   f"do not explain ({status}): a person decides")
    # The height moves on every read: compare what the sides say, not when.
    if _stable(reason) == _stable(saga.error):
        return "unchanged"
    # What arrived on the hub is booked now, with the reason that names it (the hub's
    # books equal its chain while a person decides; found by the loaded campaign: a
    # short refund the record's fees did not explain sat on the hub unbooked). The keys
    # are the compensation's own (``anchor.refund:<hash>``), so it replays them.
    arrived = [ledger.EntrySpec(
        idempotency_key=f"anchor.refund:{t.tx_hash}", kind="anchor.refund",
        lines=[Line(remittance.HUB, remittance.USDC, t.amount),
               Line(remittance.ANCHOR, remittance.USDC, -t.amount)],
        reference=t.tx_hash, saga_id=saga_id) for t in seen.refunds]
    changed = operations.saga_review_evidence(saga_id=saga_id, actor=ACTOR,
                                              reason_was=saga.error, reason=reason,
                                              evidence=evidence, bookings=arrived)
    return "evidence" if changed else "skipped"


def _stable(reason: str) -> str:
    return re.sub(r"\(Horizon's history as of ledger \d+, closed [^)]*\)", "", reason)
