"""Reconciliation: Corridor's books compared with the outside (issue 13 §2;
razorpay/TREASURY.md §3-§5).

``reconcile(day)`` reads only what the providers' own APIs return (never the sandbox's
fault switches) and records every difference as a break (treasury/models.py), kept
across runs by its key ``source:kind:reference``:

Razorpay (pay-ins), ``settlement_recon`` of ``day``, the day after (Razorpay's days are
Asia/Kolkata's) and the TREASURY_RECON_LOOKBACK_DAYS before it (Razorpay groups rows by
settlement date, not capture date):

- each settled payment row (a refunded payment's too: Razorpay settles the capture and
  deducts the refund as a row of its own) is matched with Corridor's payment by payment
  id (none: ``missing_in_books``); its amount and its fee and tax with the payment
  entity's (``fetch_payment``; differing: ``amount_differs``); then booked
  (``ledger.chart.payment_settled``: the row's figures, what the bank received);
- each refund row (``rfnd_...``, ``debit`` = the refund's amount) is matched with
  Corridor's deposit refund by refund id (none, or not booked processed:
  ``missing_in_books``), its amount with the refund's (``amount_differs``); then booked
  (``ledger.chart.refund_settled``: the deduction, so ``bank:settlements`` holds what
  Razorpay settled);
- each settlement's amount with the sum of its rows' ``credit - debit``
  (``amount_differs``, reference the settlement id);
- a confirmed payment captured more than TREASURY_SETTLEMENT_WINDOW_S ago (and not
  older than the look-back besides) that no settlement carries, and a refund the books
  hold processed more than that window ago that no settlement deducted:
  ``missing_outside``. Inside the window it is not a break (T+2 by default, docs
  ``payments/settlements``).

RazorpayX (payouts), the account statement since the look-back's first day:

- ``bank_transfer`` rows (top-ups, the opening balance) are booked as funding;
- each ``payout`` row is matched with Corridor's payout by payout id (none:
  ``missing_in_books``), then its amount, its fees and tax (``amount_differs``) and its
  UTR (``utr_differs``; not for a reversed payout an operator confirmed paid, whose UTR
  is the new payment's); a payout Corridor booked paid that the statement does not show
  after TREASURY_STATEMENT_GRACE_S: ``missing_outside``;
- each ``reversal`` row of a payout Corridor booked paid and not reversed:
  ``missing_in_books`` (a reversal seen only in the statement, TREASURY §5); of one
  booked reversed, its credit with what the books' reversal put back (``amount_differs``,
  reference ``reversal:<payout id>``: RazorpayX gives back what its debit row took, so a
  debit row's fees that differ come back differing too and the pair nets out);
- the balance (``banking_balances``) with ``razorpayx:current`` once the payouts in
  flight (debited there, not booked paid yet) and the row breaks above (less what an
  operator's adjusting entry for one put in the books already) are taken into account:
  what is left is ``balance_differs``.

Horizon: the distribution account's USDC with ``stellar:distribution`` plus the
customers' receipts not accounted for yet, and the hub's USDC with ``hub``; compared
only while nothing is in flight on the account (a release or refund submitting, a saga
running; not a release waiting, failed op_no_trust, for a trustline: its envelope is
spent), else reported as not compared. XLM (channels' fees) is reported, not booked.

A Razorpay or Horizon read that fails fails the run (status ``failed``, no break
changed): a missing answer is never a missing payment. A run that could not compare a
subject (an account busy with money in flight, a payout inside the statement's grace,
a payment or refund older than the look-back, a row no longer read) never clears,
closes or archives its breaks: each source names the break keys it did compare
(``covered``), and only a covered break no longer seen is cleared (issue 25 §4).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from stellar_sdk import Asset

from anchor import razorpay as rzp
from anchor import stellar
from anchor.models import DepositPayment, DepositRefund, DepositRelease
from ledger import chart
from ledger import services as ledger
from ledger.models import Posting
from payouts import receipts
from payouts import statement as rzpx
from payouts.models import WithdrawalPayout, WithdrawalRefund
from sagas.models import Saga
from treasury.models import Break, ReconRun

log = logging.getLogger(__name__)
K = Break.Kind
ZERO = Decimal(0)


@dataclass
class Found:
    """One difference seen by this run (becomes or refreshes a ``Break``)."""

    source: str
    kind: str
    reference: str
    account: str
    currency: str
    difference: Decimal
    books: dict = field(default_factory=dict)
    outside: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.source}:{self.kind}:{self.reference}"[:200]


def _keys(source: str, reference: str, *kinds: str) -> set[str]:
    """The break keys ``source`` compared for ``reference`` (``Found.key``'s shape)."""
    return {f"{source}:{kind}:{reference}"[:200] for kind in kinds}


def _rupees(paise: int | None) -> Decimal:
    return chart.rupees(paise or 0)


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


# --- Razorpay settlements -------------------------------------------------------------

def _razorpay(day: date, counts: dict, covered: set[str]) -> list[Found]:
    found: list[Found] = []
    lookback = settings.TREASURY_RECON_LOOKBACK_DAYS
    # Razorpay's days are Asia/Kolkata's (UTC+5:30): the UTC day's rows may sit on the next.
    rows = [row for d in range(lookback, -2, -1)
            for row in rzp.settlement_recon(day - timedelta(days=d))
            if row.type in ("payment", "refund")]
    per_settlement: dict[str, list[rzp.ReconItem]] = {}
    for row in rows:
        if row.settlement_id:
            per_settlement.setdefault(row.settlement_id, []).append(row)
        covered |= _keys("razorpay", row.entity_id, K.MISSING_IN_BOOKS, K.AMOUNT_DIFFERS,
                         K.MISSING_OUTSIDE)
        if row.type == "refund":
            found += _refund_row(row)
            continue
        ours = DepositPayment.objects.filter(payment_id=row.entity_id).first()
        if ours is None or not chart.posted(chart.deposit_captured_key(row.entity_id)):
            found.append(Found("razorpay", K.MISSING_IN_BOOKS, row.entity_id,
                               chart.RAZORPAY_PENDING, "INR", _rupees(row.amount_paise),
                               {"payment": None}, row.raw))
            continue
        entity = rzp.fetch_payment(row.entity_id)
        ours_fee, ours_tax = entity.get("fee"), entity.get("tax")
        if row.amount_paise != ours.amount_paise or (row.fee_paise, row.tax_paise) != (
                ours_fee, ours_tax):
            found.append(Found(
                "razorpay", K.AMOUNT_DIFFERS, row.entity_id, chart.BANK_SETTLEMENTS, "INR",
                _rupees(row.credit_paise - (ours.amount_paise - (ours_fee or 0))),
                {"amount_paise": ours.amount_paise, "payment_fee": ours_fee,
                 "payment_tax": ours_tax, "transaction_id": ours.transaction_id},
                row.raw))
        chart.payment_settled(payment_id=row.entity_id, settlement_id=row.settlement_id or "",
                              amount=_rupees(row.amount_paise), fee=_rupees(row.fee_paise),
                              tax=_rupees(row.tax_paise))
    for settlement_id, items in per_settlement.items():
        covered |= _keys("razorpay", settlement_id, K.AMOUNT_DIFFERS)
        settled = rzp.settlement(settlement_id)
        expected = sum(item.net_paise for item in items)
        if settled.amount_paise != expected:
            found.append(Found(
                "razorpay", K.AMOUNT_DIFFERS, settlement_id, chart.BANK_SETTLEMENTS, "INR",
                _rupees(settled.amount_paise - expected),
                {"rows_net_paise": expected,
                 "payments": [i.entity_id for i in items if i.type == "payment"],
                 "refunds": [i.entity_id for i in items if i.type == "refund"]},
                settled.raw))
    now = timezone.now()
    window = timedelta(seconds=settings.TREASURY_SETTLEMENT_WINDOW_S)
    since = _day_start(day - timedelta(days=lookback)) - window
    due = DepositPayment.objects.filter(
        confirmation=DepositPayment.Confirmation.CONFIRMED, captured_at__lt=now - window,
        captured_at__gte=since)
    # Compared: every payment and refund of the look-back (one not confirmed, or not
    # processed, owes no settlement row); one older is not read, and keeps its break.
    for reference in DepositPayment.objects.filter(captured_at__gte=since).values_list(
            "payment_id", flat=True):
        covered |= _keys("razorpay", reference, K.MISSING_OUTSIDE)
    for reference in DepositRefund.objects.filter(refund_id__isnull=False).filter(
            Q(processed_at__isnull=True) | Q(processed_at__gte=since)).values_list(
            "refund_id", flat=True):
        covered |= _keys("razorpay", reference, K.MISSING_OUTSIDE)
    for payment in due:
        if not chart.posted(chart.settled_key(payment.payment_id)):
            found.append(Found(
                "razorpay", K.MISSING_OUTSIDE, payment.payment_id, chart.RAZORPAY_PENDING,
                "INR", -_rupees(payment.amount_paise),
                {"payment_id": payment.payment_id, "transaction_id": payment.transaction_id,
                 "amount_paise": payment.amount_paise,
                 "captured_at": payment.captured_at.isoformat()},
                {"settled": False, "window_s": settings.TREASURY_SETTLEMENT_WINDOW_S}))
    refunds_due = DepositRefund.objects.filter(
        status__in=(DepositRefund.Status.PROCESSED, DepositRefund.Status.COMPLETED),
        refund_id__isnull=False, processed_at__lt=now - window, processed_at__gte=since)
    for refund in refunds_due:
        if not chart.posted(chart.settled_key(refund.refund_id)):
            found.append(Found(
                "razorpay", K.MISSING_OUTSIDE, refund.refund_id, chart.RAZORPAY_PENDING,
                "INR", _rupees(refund.amount_paise),
                {"refund_id": refund.refund_id, "payment_id": refund.payment_id,
                 "transaction_id": refund.transaction_id, "amount_paise": refund.amount_paise,
                 "processed_at": refund.processed_at.isoformat()},
                {"settled": False, "window_s": settings.TREASURY_SETTLEMENT_WINDOW_S}))
    counts["razorpay"] = {"recon_rows": len(rows), "settlements": len(per_settlement),
                          "refund_rows": sum(1 for row in rows if row.type == "refund")}
    return found


def _refund_row(row: rzp.ReconItem) -> list[Found]:
    """A settlement's refund row (TREASURY §3.2-§3.3): matched with Corridor's deposit
    refund by refund id (none, or its refund not booked processed: ``missing_in_books``),
    its amount with the refund's (``amount_differs``), then booked: the deduction from the
    settlement (``ledger.chart.refund_settled``, the row's ``debit``)."""
    ours = DepositRefund.objects.filter(refund_id=row.entity_id).first()
    if ours is None or not chart.posted(chart.deposit_refund_key(ours.pk)):
        return [Found("razorpay", K.MISSING_IN_BOOKS, row.entity_id, chart.RAZORPAY_PENDING,
                      "INR", -_rupees(row.debit_paise),
                      {"refund": None if ours is None else ours.status}, row.raw)]
    found = []
    if row.amount_paise != ours.amount_paise or row.debit_paise != ours.amount_paise:
        found.append(Found(
            "razorpay", K.AMOUNT_DIFFERS, row.entity_id, chart.BANK_SETTLEMENTS, "INR",
            _rupees(ours.amount_paise - row.debit_paise),
            {"amount_paise": ours.amount_paise, "payment_id": ours.payment_id,
             "transaction_id": ours.transaction_id}, row.raw))
    chart.refund_settled(refund_id=row.entity_id, settlement_id=row.settlement_id or "",
                         amount=_rupees(row.debit_paise))
    return found


# --- RazorpayX statement and balance --------------------------------------------------

def _razorpayx(day: date, counts: dict, balances: dict, covered: set[str]) -> list[Found]:
    found: list[Found] = []
    since = _day_start(day - timedelta(days=settings.TREASURY_RECON_LOOKBACK_DAYS))
    now = timezone.now()
    rows = rzpx.statement(since, now)
    delta = ZERO  # the outside minus the books, as the row breaks explain it
    in_flight = ZERO  # debited there, not booked paid yet
    listed: set[str] = set()
    for row in rows:
        if row.kind == "bank_transfer":
            _funded(row)
            continue
        payout = WithdrawalPayout.objects.filter(provider_payout_id=row.payout_id or "").first()
        charged = _rupees(row.debit_paise + row.fees_paise)
        covered |= _keys("razorpayx", row.payout_id or row.transaction_id, K.MISSING_IN_BOOKS,
                         K.AMOUNT_DIFFERS, K.UTR_DIFFERS, K.MISSING_OUTSIDE)
        covered |= _keys("razorpayx", f"reversal:{row.payout_id}", K.MISSING_IN_BOOKS,
                         K.AMOUNT_DIFFERS)
        if row.kind == "payout":
            listed.add(row.payout_id or "")
            if payout is None:
                found.append(Found("razorpayx", K.MISSING_IN_BOOKS, row.payout_id or
                                   row.transaction_id, chart.RAZORPAYX_CURRENT, "INR",
                                   -charged, {"payout": None}, row.raw))
                delta -= charged
                continue
            booked = chart.posted(chart.paid_key(_kind(payout), payout.transaction_id))
            if not booked:
                in_flight += charged  # processing, or failed (its reversal gives it back)
            books = {"amount_paise": payout.amount_paise, "fees_paise": payout.fees_paise,
                     "tax_paise": payout.tax_paise, "utr": payout.reference,
                     "status": payout.status, "transaction_id": payout.transaction_id}
            if booked and (row.amount_paise, row.fees_paise, row.tax_paise) != (
                    payout.amount_paise, payout.fees_paise or 0, payout.tax_paise or 0):
                off = charged - _rupees(payout.amount_paise + (payout.fees_paise or 0))
                found.append(Found("razorpayx", K.AMOUNT_DIFFERS, row.payout_id,
                                   chart.RAZORPAYX_CURRENT, "INR", -off, books, row.raw))
                delta -= off
            # A reversed payout an operator confirmed paid holds the new payment's UTR
            # (payout_confirm_paid): the row keeps the reversed one's, no break.
            if row.utr and payout.reference and row.utr != payout.reference and not \
                    chart.posted(f"{_kind(payout)}:{payout.transaction_id}:repaid"):
                found.append(Found("razorpayx", K.UTR_DIFFERS, row.payout_id,
                                   chart.RAZORPAYX_CURRENT, "INR", ZERO, books, row.raw))
        elif row.kind == "reversal":
            credit = _rupees(row.credit_paise)
            if payout is None:
                found.append(Found("razorpayx", K.MISSING_IN_BOOKS, f"reversal:{row.payout_id}",
                                   chart.RAZORPAYX_CURRENT, "INR", credit, {"payout": None},
                                   row.raw))
                delta += credit
                continue
            kind = _kind(payout)
            reversed_key = f"{kind}:{payout.transaction_id}:reversed"
            if not chart.posted(chart.paid_key(kind, payout.transaction_id)):
                in_flight -= credit  # a payout that failed after its debit: nets out
            elif not chart.posted(reversed_key):
                found.append(Found("razorpayx", K.MISSING_IN_BOOKS, f"reversal:{row.payout_id}",
                                   chart.RAZORPAYX_CURRENT, "INR", credit,
                                   {"status": payout.status, "booked": "paid, not reversed",
                                    "transaction_id": payout.transaction_id}, row.raw))
                delta += credit
            elif off := credit - _booked(reversed_key):
                # RazorpayX gives back what its debit row took, the books what they paid:
                # a debit row that took other fees (its own amount_differs) is given back
                # other fees too, and the pair nets to nothing on both sides.
                found.append(Found("razorpayx", K.AMOUNT_DIFFERS, f"reversal:{row.payout_id}",
                                   chart.RAZORPAYX_CURRENT, "INR", off,
                                   {"status": payout.status, "booked": str(credit - off),
                                    "amount_paise": payout.amount_paise,
                                    "fees_paise": payout.fees_paise,
                                    "transaction_id": payout.transaction_id}, row.raw))
                delta += off
    grace = now - timedelta(seconds=settings.TREASURY_STATEMENT_GRACE_S)
    # Compared: every payout of the look-back but a paid one still inside the grace
    # (one not completed is owed no statement row); one older is not read.
    for payout in WithdrawalPayout.objects.filter(updated_at__gte=since).exclude(
            status=WithdrawalPayout.Status.COMPLETED, updated_at__gte=grace).only(
            "provider_payout_id", "transaction_id"):
        covered |= _keys("razorpayx", payout.provider_payout_id or payout.transaction_id,
                         K.MISSING_OUTSIDE)
    for payout in WithdrawalPayout.objects.filter(
            status=WithdrawalPayout.Status.COMPLETED, updated_at__gte=since,
            updated_at__lt=grace).exclude(provider_payout_id__in=listed):
        paid = _rupees(payout.amount_paise + (payout.fees_paise or 0))
        found.append(Found("razorpayx", K.MISSING_OUTSIDE, payout.provider_payout_id or
                           payout.transaction_id, chart.RAZORPAYX_CURRENT, "INR", paid,
                           {"transaction_id": payout.transaction_id,
                            "amount_paise": payout.amount_paise, "status": payout.status},
                           {"statement_row": None}))
        delta += paid
    # A row break an operator explained has its adjusting entry in the books already:
    # that part of it explains the balance no more.
    delta -= _adjusted([item.key for item in found])
    outside = _rupees(rzpx.balance().amount_paise)
    covered |= _keys("razorpayx", chart.RAZORPAYX_CURRENT, K.BALANCE_DIFFERS)
    books = ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR")
    left = outside - (books - in_flight + delta)
    balances["razorpayx:current INR"] = _balance(books, outside, in_flight, delta, left)
    if left:
        found.append(Found("razorpayx", K.BALANCE_DIFFERS, chart.RAZORPAYX_CURRENT,
                           chart.RAZORPAYX_CURRENT, "INR", left,
                           {"balance": str(books), "in_flight": str(in_flight),
                            "explained_by_breaks": str(delta)},
                           {"balance": str(outside)}))
    counts["razorpayx"] = {"statement_rows": len(rows)}
    return found


def _adjusted(keys: list[str]) -> Decimal:
    """What operators' adjusting entries for the breaks ``keys`` posted on
    ``razorpayx:current`` (``chart.adjusted``, key ``adjust:<break key>``)."""
    adjusting = list(Break.objects.filter(
        key__in=keys, status=Break.Status.EXPLAINED).exclude(adjusting_key="").values_list(
        "adjusting_key", flat=True))
    return sum(Posting.objects.filter(
        entry__idempotency_key__in=adjusting,
        account__code=chart.RAZORPAYX_CURRENT, account__currency="INR",
    ).values_list("amount", flat=True), ZERO)


def _booked(key: str) -> Decimal:
    """What the books' entry ``key`` posted on ``razorpayx:current`` (INR)."""
    return sum(Posting.objects.filter(
        entry__idempotency_key=key, account__code=chart.RAZORPAYX_CURRENT,
        account__currency="INR").values_list("amount", flat=True), ZERO)


def _funded(row: rzpx.StatementRow) -> bool:
    """Book a ``bank_transfer`` statement row (a top-up, the opening balance) as funding of
    ``razorpayx:current``, once (key ``funding:razorpayx:<txn id>``); True when booked now."""
    key = f"razorpayx:{row.transaction_id}"
    if chart.posted(f"funding:{key}"):
        return False
    chart.funded(key=key, account=chart.RAZORPAYX_CURRENT, currency="INR",
                 amount=_rupees(row.credit_paise - row.debit_paise),
                 reference=row.transaction_id)
    return True


def _kind(payout: WithdrawalPayout) -> str:
    from payouts.models import WithdrawalRequest

    request = WithdrawalRequest.objects.filter(transaction_id=payout.transaction_id).first()
    return request.kind if request is not None else "withdrawal"


def _balance(books, outside, in_flight, explained, left) -> dict:
    """A compared balance as stored (JSON strings, plain notation: ``0.0000000``, not
    the ``0E-7`` that ``str`` gives a zero sum of 7-dp amounts)."""
    return {"books": _plain(books), "outside": _plain(outside),
            "in_flight": _plain(in_flight), "explained_by_breaks": _plain(explained),
            "difference": _plain(left)}


def _plain(value) -> str:
    return format(value, "f") if isinstance(value, Decimal) else str(value)


# --- Horizon ----------------------------------------------------------------------------

def _horizon(counts: dict, balances: dict, covered: set[str]) -> list[Found]:
    found: list[Found] = []
    usdc = stellar.usdc()
    distribution = stellar.distribution_keypair().public_key
    # A release ``failed`` on op_no_trust has its envelope spent (it landed, failed): it
    # waits for a trustline, perhaps for ever, with nothing in flight until it goes back
    # to ``submitting``. Any other failed one may still land (refused while alive).
    busy = (DepositRelease.objects.filter(status__in=DepositRelease.OPEN_STATUSES).exclude(
                status=DepositRelease.Status.FAILED,
                failure_code=DepositRelease.FailureCode.NO_TRUST).exists()
            or WithdrawalRefund.objects.filter(status__in=("submitting", "submitted")).exists())
    chain = stellar.asset_balance(distribution, usdc) or ZERO
    books = ledger.balance(account=chart.DISTRIBUTION, currency="USDC")
    unaccounted = _unaccounted()
    left = chain - books - unaccounted
    balances["stellar:distribution USDC"] = {
        **_balance(books, chain, unaccounted, ZERO, left), "compared": not busy}
    if not busy:  # busy: not compared, its break stays as it is
        covered |= _keys("horizon", distribution, K.BALANCE_DIFFERS)
    if left and not busy:
        found.append(Found("horizon", K.BALANCE_DIFFERS, distribution, chart.DISTRIBUTION,
                           "USDC", left, {"balance": str(books),
                                          "receipts_not_accounted": str(unaccounted)},
                           {"balance": str(chain), "account": distribution}))
    hub = stellar.hub_keypair().public_key
    hub_chain = stellar.asset_balance(hub, usdc) or ZERO
    hub_books = ledger.balance(account="hub", currency="USDC")
    hub_busy = Saga.objects.filter(status__in=Saga.OPEN_STATUSES).exists()
    balances["hub USDC"] = {**_balance(hub_books, hub_chain, ZERO, ZERO, hub_chain - hub_books),
                            "compared": not hub_busy}
    if not hub_busy:
        covered |= _keys("horizon", hub, K.BALANCE_DIFFERS)
    if hub_chain != hub_books and not hub_busy:
        found.append(Found("horizon", K.BALANCE_DIFFERS, hub, "hub", "USDC",
                           hub_chain - hub_books, {"balance": str(hub_books)},
                           {"balance": str(hub_chain), "account": hub}))
    for address in [distribution, hub, *stellar.channel_keypairs()]:
        balances[f"XLM {address[:6]}…{address[-4:]}"] = {
            "outside": _plain(stellar.asset_balance(address, Asset.native()) or ZERO)}
    counts["horizon"] = {"accounts": 2 + len(stellar.channel_keypairs()), "busy": busy}
    return found


def _unaccounted() -> Decimal:
    """USDC customers sent the distribution account that no posting counts yet: the
    open receipts (``receipts.open_receipts``), less those a withdrawal already booked
    as received (its ``chain_evidence`` names the receipt; the classifier settles the
    receipt row a little later)."""
    total = ZERO
    for receipt in receipts.open_receipts():
        booked = any(
            chart.posted(chart.received_key(request.kind, request.transaction_id))
            and any(e.get("tx_hash") == receipt.tx_hash for e in request.chain_evidence or [])
            for request in receipts.memo_requests(receipt))
        if not booked:
            total += receipt.amount - receipt.consumed_amount
    return total


# --- the run ----------------------------------------------------------------------------

SOURCES = (("razorpay", _razorpay), ("razorpayx", _razorpayx), ("horizon", _horizon))


def reconcile(day: date | None = None, *, trigger: str = "beat", operator: str = "") -> ReconRun:
    """Run every comparison for ``day`` (default: today, UTC) and store the breaks;
    returns the run (``status`` done, or failed with ``error`` when a provider could
    not be read: no break is changed then). Idempotent: a rerun refreshes the same
    breaks (by key) and clears those no longer seen among the ones it compared (a
    break whose subject this run did not compare stays as it is)."""
    day = day or timezone.now().date()
    run = ReconRun.objects.create(day=day, trigger=trigger, operator=operator)
    found: list[Found] = []
    counts: dict = {}
    balances: dict = {}
    covered: set[str] = set()
    try:
        found += _razorpay(day, counts, covered)
        found += _razorpayx(day, counts, balances, covered)
        found += _horizon(counts, balances, covered)
    except (rzp.RazorpayError, stellar.HorizonUnavailable) as exc:
        log.warning("reconciliation %s failed: %s", day, exc)
        ReconRun.objects.filter(pk=run.pk).update(
            status=ReconRun.Status.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000],
            finished_at=timezone.now(), counts=counts, balances=balances)
        run.refresh_from_db()
        return run
    with transaction.atomic():
        seen = set()
        for item in found:
            seen.add(item.key)
            current = Break.objects.select_for_update().filter(key=item.key).first()
            values = {"source": item.source, "kind": item.kind, "reference": item.reference[:100],
                      "account": item.account, "currency": item.currency,
                      "difference": item.difference, "books": _json(item.books),
                      "outside": _json(item.outside), "last_run": run}
            if current is None:
                Break.objects.create(key=item.key, first_run=run, **values)
                continue
            if current.status in CLOSED and current.difference != item.difference:
                # What an operator decided on was another difference: this one is new.
                _archive(current)
                Break.objects.create(key=item.key, first_run=run, **values)
                continue
            if current.status == Break.Status.CLEARED:
                values["status"] = Break.Status.OPEN
            Break.objects.filter(pk=current.pk).update(updated_at=timezone.now(), **values)
        # Only what this run compared and no longer saw is over; a break whose subject
        # it could not compare (busy, in the grace, past the look-back) stays as it is.
        gone = [pk for pk, key in Break.objects.filter(status=Break.Status.OPEN).exclude(
            key__in=seen).values_list("pk", "key") if key in covered]
        Break.objects.filter(pk__in=gone).update(
            status=Break.Status.CLEARED, resolution="no longer seen by the reconciliation",
            resolved_at=timezone.now(), last_run=run, updated_at=timezone.now())
        # A closed break no longer seen is over: the next difference under its key (a
        # balance break's key is the account's) is a new break, not this closed one.
        for closed in Break.objects.filter(status__in=CLOSED).exclude(key__in=seen).exclude(
                key__contains="#"):
            if closed.key in covered:
                _archive(closed)
        counts["breaks"] = len(found)
        ReconRun.objects.filter(pk=run.pk).update(
            status=ReconRun.Status.DONE, finished_at=timezone.now(), counts=counts,
            balances=balances)
    run.refresh_from_db()
    return run


CLOSED = (Break.Status.EXPLAINED, Break.Status.FIXED)


def _archive(row: Break) -> None:
    """Move a closed break off its key (``<key>#<id>``): its decision stays on record,
    and the key is free for the next difference the reconciliation sees under it."""
    Break.objects.filter(pk=row.pk).update(key=f"{row.key[:180]}#{row.pk}",
                                           updated_at=timezone.now())


def _json(value):
    """Evidence as stored (JSON): Decimals and datetimes as strings."""
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, Decimal | datetime | date):
        return str(value)
    return value


def open_distribution(*, operator: str = "") -> Decimal:
    """Book the distribution account's opening USDC (what it held before Corridor's
    books started: the chain balance less the books and the receipts not accounted
    for), once (``funding:stellar:distribution:opening``); returns the amount booked
    (0 when it was booked already or nothing is missing). Raises HorizonUnavailable."""
    key = "stellar:distribution:opening"
    if chart.posted(f"funding:{key}"):
        return ZERO
    chain = stellar.asset_balance(stellar.distribution_keypair().public_key,
                                  stellar.usdc()) or ZERO
    books = ledger.balance(account=chart.DISTRIBUTION, currency="USDC")
    amount = chain - books - _unaccounted()
    if amount:
        chart.funded(key=key, account=chart.DISTRIBUTION, currency="USDC", amount=amount,
                     reference=operator or "opening")
    return amount


def open_razorpayx(*, operator: str = "") -> Decimal:
    """Book the RazorpayX account's opening balance (``banking_balances``, TREASURY §4.2)
    as funding of ``razorpayx:current``, so the books hold it from the start rather than
    from the first reconciliation: the statement's ``bank_transfer`` rows of the
    look-back are booked under the keys the reconciliation uses (``funding:razorpayx:<txn
    id>``: never twice), and what the balance holds beyond the books then (older money)
    once as ``funding:razorpayx:opening``, only while the books hold nothing on the
    account yet. Returns the INR booked now (0 when everything was booked already).
    Meant for a start before money moves (``treasury_open``): a payout in flight then
    is netted as the reconciliation nets it. Raises RazorpayError."""
    outside = _rupees(rzpx.balance().amount_paise)
    # The statement up to after that read: a row the balance holds (the account's opening
    # row is made by its first read) is booked under its own key, never in the rest.
    now = timezone.now()
    since = _day_start(now.date() - timedelta(days=settings.TREASURY_RECON_LOOKBACK_DAYS))
    booked = ZERO
    with transaction.atomic():
        # Books already open (anything posted on the account: an earlier opening, a
        # payout, a top-up): what the balance holds beyond them is no opening but a
        # difference for the reconciliation to show as a break (make run opens on every
        # start: a later difference was booked here as "opening" and hid its break).
        opened = Posting.objects.filter(account__code=chart.RAZORPAYX_CURRENT,
                                        account__currency="INR").exists()
        rows = rzpx.statement(since, now)
        for row in rows:
            if row.kind == "bank_transfer" and _funded(row):
                booked += _rupees(row.credit_paise - row.debit_paise)
        key = "razorpayx:opening"
        if not opened and not chart.posted(f"funding:{key}"):
            # A payout of ours in flight (debited there, not booked paid yet) is not
            # older money: it is netted as the reconciliation nets it, else the opening
            # would be short by it for good once the payout is booked paid.
            rest = outside + _in_flight(rows) - ledger.balance(
                account=chart.RAZORPAYX_CURRENT, currency="INR")
            if rest:
                chart.funded(key=key, account=chart.RAZORPAYX_CURRENT, currency="INR",
                             amount=rest, reference=operator or "opening")
                booked += rest
    return booked


def _in_flight(rows) -> Decimal:
    """What the statement ``rows`` debited for Corridor's payouts not booked paid yet,
    less their reversals (``_razorpayx``'s in-flight netting)."""
    total = ZERO
    for row in rows:
        if row.kind not in ("payout", "reversal"):
            continue
        payout = WithdrawalPayout.objects.filter(provider_payout_id=row.payout_id or "").first()
        if payout is None or chart.posted(chart.paid_key(_kind(payout), payout.transaction_id)):
            continue
        if row.kind == "payout":
            total += _rupees(row.debit_paise + row.fees_paise)
        else:
            total -= _rupees(row.credit_paise)
    return total
