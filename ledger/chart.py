"""The chart of accounts of Corridor's own money paths and one posting rule per state
change (issue 13 §1): deposits, withdrawals, SEP-31 receives, payouts, reversals and
USDC refunds. The remittance sagas keep their own plan (sagas/plans/remittance.py).

Sign convention (ledger.services): a positive amount is a debit. Assets hold positive
balances, liabilities and revenue negative ones. Amounts are ``Decimal``: INR at 2 dp
(rupees; the Razorpay boundary converts paise), USDC at 7 dp.

Accounts (code, currency):

- assets: ``razorpay:pending`` INR (captured on Razorpay, awaiting settlement),
  ``razorpayx:current`` INR (the RazorpayX current account payouts are debited from),
  ``stellar:distribution`` USDC (the distribution account: withdrawals and receives
  are paid into it, releases and refunds paid from it);
- liabilities: ``owed:deposits`` INR (captured INR until its USDC is released),
  ``owed:withdrawals`` / ``owed:receives`` USDC (USDC received until its INR is paid
  or the USDC refunded), ``owed:reversed`` INR (a payout the bank sent back: INR we
  hold for the customer again), ``owed:receipts`` USDC (an addition to the issue's
  chart: a receipt no verified withdrawal counted, booked when it is sent back);
- ``fx`` INR and USDC: the conversion position (what was sold at the quoted rate in
  one currency against what was bought in the other);
- ``revenue:fees`` INR (deposit fees) and USDC (withdrawal and receive fees);
- ``expense:provider_fees`` INR and ``expense:taxes`` INR: RazorpayX's payout fee and
  its GST, from the payout entity (``fees`` includes ``tax``, razorpay/NOTES.md §2.4),
  and Razorpay's per-payment fee and its GST, from the settlement recon row;
- ``bank:settlements`` INR (asset: the bank account Razorpay settles into; treasury,
  issue 13 §2);
- ``equity:funding`` INR and USDC: money the anchor put in (RazorpayX top-ups and its
  opening balance, the distribution account's opening USDC);
- ``equity:adjustments`` INR and USDC: the other side of an operator's adjusting entry
  explaining a reconciliation break.

Every rule is keyed on the external reference of the state change (the Razorpay
payment id, the AP transaction id, the refund row), so replaying the state change
writes nothing (``post`` returns the entry, ``replayed``). Every rule is called in
the caller's transaction, the one that makes the status change, so a rollback loses
both. The entries are facts (money that moved on chain or at a bank): no rule refuses
on a balance, since a refusal would roll the status change back and leave the fact
unrecorded; callers may still pass ``precondition`` (``post``'s hook) to add a check
of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from ledger.models import Entry, Posting
from ledger.services import EntrySpec, Line, Precondition, post_many

INR, USDC = "INR", "USDC"
RAZORPAY_PENDING = "razorpay:pending"
RAZORPAYX_CURRENT = "razorpayx:current"
DISTRIBUTION = "stellar:distribution"
OWED_DEPOSITS = "owed:deposits"
OWED_REVERSED = "owed:reversed"
OWED_RECEIPTS = "owed:receipts"
FX = "fx"
FEES = "revenue:fees"
PROVIDER_FEES = "expense:provider_fees"
TAXES = "expense:taxes"
BANK_SETTLEMENTS = "bank:settlements"
FUNDING = "equity:funding"
ADJUSTMENTS = "equity:adjustments"
OWED = {"withdrawal": "owed:withdrawals", "receive": "owed:receives"}
PAISA = Decimal("0.01")

# Every account of this chart with what it holds: the admin's trial balance lists them.
ACCOUNTS = [
    (RAZORPAY_PENDING, INR, "asset: captured on Razorpay, awaiting settlement"),
    (RAZORPAYX_CURRENT, INR, "asset: the RazorpayX current account"),
    (DISTRIBUTION, USDC, "asset: the Stellar distribution account"),
    (OWED_DEPOSITS, INR, "liability: captured INR whose USDC is not released yet"),
    (OWED["withdrawal"], USDC, "liability: withdrawal USDC whose INR is not paid yet"),
    (OWED["receive"], USDC, "liability: SEP-31 USDC whose INR is not paid yet"),
    (OWED_REVERSED, INR, "liability: payouts the bank reversed, held for the customer"),
    (OWED_RECEIPTS, USDC, "liability: receipts no withdrawal counted, until sent back"),
    (FX, INR, "conversion position"),
    (FX, USDC, "conversion position"),
    (FEES, INR, "revenue: deposit fees"),
    (FEES, USDC, "revenue: withdrawal and receive fees"),
    (PROVIDER_FEES, INR, "expense: RazorpayX payout fees"),
    (TAXES, INR, "expense: GST on RazorpayX payout fees"),
    (BANK_SETTLEMENTS, INR, "asset: the bank account Razorpay settles into"),
    (FUNDING, INR, "equity: INR the anchor put in (RazorpayX top-ups)"),
    (FUNDING, USDC, "equity: USDC the anchor put in (distribution opening)"),
    (ADJUSTMENTS, INR, "equity: operators' adjusting entries"),
    (ADJUSTMENTS, USDC, "equity: operators' adjusting entries"),
]


def owed(kind: str) -> str:
    """The liability account of a withdrawal request's ``kind`` (withdrawal|receive)."""
    return OWED[kind]


def _lines(*triples: tuple[str, str, Decimal]) -> list[Line]:
    """Lines without the zero ones (a zero fee, no provider fee)."""
    return [Line(a, c, amount) for a, c, amount in triples if amount != 0]


def _post(specs: Sequence[EntrySpec], precondition: Precondition | None) -> list[Entry]:
    return post_many(entries=[s for s in specs if s.lines], precondition=precondition)


def posted(key: str) -> bool:
    """Whether an entry with idempotency key ``key`` exists (in this transaction's view)."""
    return Entry.objects.filter(idempotency_key=key).exists()


def owed_amount(*, account: str, currency: str, reference: str) -> Decimal:
    """What the entries with ``reference`` left on ``account``, as a liability (credits
    less debits: positive while owed)."""
    total = sum((p.amount for p in Posting.objects.filter(
        entry__reference=reference, account__code=account, account__currency=currency)),
        Decimal(0))
    return -total


# --- deposits -----------------------------------------------------------------------

def deposit_captured_key(payment_id: str) -> str:
    return f"deposit:{payment_id}:captured"


def deposit_captured(*, payment_id: str, transaction_id: str, amount_in: Decimal,
                     precondition: Precondition | None = None) -> Entry:
    """Rule 1, a deposit's INR captured and confirmed with Razorpay
    (anchor/deposits.py ``payment_confirm``): Dr ``razorpay:pending`` / Cr
    ``owed:deposits``, ``amount_in`` INR (the order's amount, which the confirmed
    payment's paise equal). Key ``deposit:<payment id>:captured``, reference the AP id."""
    return _post([_captured(payment_id, transaction_id, amount_in)], precondition)[0]


def _captured(payment_id: str, transaction_id: str, amount_in: Decimal) -> EntrySpec:
    return EntrySpec(deposit_captured_key(payment_id), "deposit.captured", _lines(
        (RAZORPAY_PENDING, INR, amount_in), (OWED_DEPOSITS, INR, -amount_in)),
        reference=transaction_id)


def deposit_refund_key(refund_id: int) -> str:
    return f"deposit_refund:{refund_id}"


def deposit_refunded(*, refund_id: int, payment_id: str, transaction_id: str,
                     amount: Decimal, precondition: Precondition | None = None) -> Entry:
    """A deposit's INR sent back through Razorpay's refunds API (anchor/refunds.py, the
    refund's move to ``processed``): Dr ``owed:deposits`` / Cr ``razorpay:pending``,
    ``amount`` INR (the refund's paise). The capture is booked first if it never was (a
    payment confirmed before the books existed). Key ``deposit_refund:<refund row id>``,
    reference the AP id."""
    specs = [] if posted(deposit_captured_key(payment_id)) else [
        _captured(payment_id, transaction_id, amount)]
    specs.append(EntrySpec(deposit_refund_key(refund_id), "deposit.refunded", _lines(
        (OWED_DEPOSITS, INR, amount), (RAZORPAY_PENDING, INR, -amount)),
        reference=transaction_id))
    return _post(specs, precondition)[-1]


def deposit_released(*, transaction_id: str, payment_id: str | None, amount_in: Decimal,
                     fee: Decimal, amount_out: Decimal,
                     precondition: Precondition | None = None) -> Entry:
    """Rule 2, a deposit's USDC landed on chain (anchor/releases.py ``_mark_submitted``:
    the release moved to ``submitted``): Dr ``owed:deposits`` ``amount_in`` INR, Cr
    ``revenue:fees`` ``fee`` INR, Cr ``fx`` ``amount_in - fee`` INR; Dr ``fx``
    ``amount_out`` USDC, Cr ``stellar:distribution`` ``amount_out`` USDC. Amounts from
    the deposit order (the quote AP was given). Key ``deposit:<AP id>:released``.
    A capture never booked (a payment confirmed before these books existed) is booked
    with it, so ``owed:deposits`` clears."""
    specs = [] if payment_id is None or posted(deposit_captured_key(payment_id)) else \
        [_captured(payment_id, transaction_id, amount_in)]
    specs.append(EntrySpec(f"deposit:{transaction_id}:released", "deposit.released", _lines(
        (OWED_DEPOSITS, INR, amount_in), (FEES, INR, -fee), (FX, INR, fee - amount_in),
        (FX, USDC, amount_out), (DISTRIBUTION, USDC, -amount_out)),
        reference=transaction_id))
    return _post(specs, precondition)[-1]


# --- withdrawals and SEP-31 receives ----------------------------------------------------

def received_key(kind: str, transaction_id: str) -> str:
    return f"{kind}:{transaction_id}:received"


def _received(kind: str, transaction_id: str, received: Decimal) -> EntrySpec:
    return EntrySpec(received_key(kind, transaction_id), f"{kind}.received", _lines(
        (DISTRIBUTION, USDC, received), (owed(kind), USDC, -received)),
        reference=transaction_id)


def payout_received(*, kind: str, transaction_id: str, received: Decimal,
                    precondition: Precondition | None = None) -> Entry:
    """Rule 3, a withdrawal's or receive's USDC verified on chain (the request moved to
    ``funds_verified``: payouts/poller.py ``withdrawal_process``, or an operator's
    ``withdrawal_accept_short``): Dr ``stellar:distribution`` / Cr ``owed:<kind>``
    ``received`` USDC (every receipt under the memo, summed, as verified). Key
    ``<kind>:<AP id>:received``."""
    return _post([_received(kind, transaction_id, received)], precondition)[0]


def paid_key(kind: str, transaction_id: str) -> str:
    return f"{kind}:{transaction_id}:paid"


def _paid(kind, transaction_id, amount_in, fee, amount_out, provider_fee, tax) -> EntrySpec:
    return EntrySpec(paid_key(kind, transaction_id), f"{kind}.paid", _lines(
        (owed(kind), USDC, amount_in), (FEES, USDC, -fee), (FX, USDC, fee - amount_in),
        (FX, INR, amount_out), (RAZORPAYX_CURRENT, INR, -amount_out),
        (PROVIDER_FEES, INR, provider_fee), (TAXES, INR, tax),
        (RAZORPAYX_CURRENT, INR, -(provider_fee + tax))), reference=transaction_id)


def payout_paid(*, kind: str, transaction_id: str, amount_in: Decimal, fee: Decimal,
                amount_out: Decimal, provider_fee: Decimal = Decimal(0),
                tax: Decimal = Decimal(0), received: Decimal | None = None,
                precondition: Precondition | None = None) -> Entry:
    """Rule 4, the INR paid (payouts/guard.py ``payout_apply_status``: processing ->
    completed on the provider's ``processed``; or an operator's
    ``payout_confirm_paid`` from manual_review): Dr ``owed:<kind>`` ``amount_in`` USDC,
    Cr ``revenue:fees`` ``fee`` USDC, Cr ``fx`` ``amount_in - fee`` USDC; Dr ``fx``
    ``amount_out`` INR, Cr ``razorpayx:current`` ``amount_out`` INR; and RazorpayX's
    charge: Dr ``expense:provider_fees`` ``provider_fee`` (``fees - tax`` of the
    payout entity), Dr ``expense:taxes`` ``tax``, Cr ``razorpayx:current`` both (a
    separate line: the account statement debits them apart from the amount). Amounts
    from the withdrawal request (the quote AP holds), fees from the payout row. Key
    ``<kind>:<AP id>:paid``. ``received``: book rule 3 too if it never was (USDC
    verified before these books existed)."""
    specs = []
    if received is not None and not posted(received_key(kind, transaction_id)):
        specs.append(_received(kind, transaction_id, received))
    specs.append(_paid(kind, transaction_id, amount_in, fee, amount_out, provider_fee, tax))
    return _post(specs, precondition)[-1]


def payout_reversed(*, kind: str, transaction_id: str, amount_out: Decimal,
                    provider_fee: Decimal = Decimal(0), tax: Decimal = Decimal(0),
                    paid: dict | None = None,
                    precondition: Precondition | None = None) -> Entry:
    """Rule 5, a processed payout the bank sent back (``payout_apply_status``: ->
    reversed): Dr ``razorpayx:current`` ``amount_out + provider_fee + tax`` (RazorpayX
    credits amount and fees back: the reversal transaction's ``amount`` = payout amount
    + fees, razorpay/TREASURY.md §5), Cr ``expense:provider_fees``, Cr
    ``expense:taxes``, Cr ``owed:reversed`` ``amount_out`` INR. The USDC stays sold:
    the rupees are owed to the customer again. Key ``<kind>:<AP id>:reversed``.
    ``paid``: ``payout_paid``'s amounts, booked first when the payout went from
    processing straight to reversed (its ``processed`` was never seen here)."""
    specs = []
    if paid is not None and not posted(paid_key(kind, transaction_id)):
        specs.append(_paid(kind, transaction_id, paid["amount_in"], paid["fee"], amount_out,
                           provider_fee, tax))
    specs.append(EntrySpec(f"{kind}:{transaction_id}:reversed", f"{kind}.reversed", _lines(
        (RAZORPAYX_CURRENT, INR, amount_out + provider_fee + tax),
        (PROVIDER_FEES, INR, -provider_fee), (TAXES, INR, -tax),
        (OWED_REVERSED, INR, -amount_out)), reference=transaction_id))
    return _post(specs, precondition)[-1]


def payout_repaid(*, kind: str, transaction_id: str, amount_out: Decimal,
                  precondition: Precondition | None = None) -> Entry:
    """An operator confirms a reversed payout paid after all
    (payouts/operations.py ``payout_confirm_paid`` from ``reversed``): the rupees held
    again left the current account: Dr ``owed:reversed`` / Cr ``razorpayx:current``
    ``amount_out`` INR. Key ``<kind>:<AP id>:repaid``."""
    return _post([EntrySpec(f"{kind}:{transaction_id}:repaid", f"{kind}.repaid", _lines(
        (OWED_REVERSED, INR, amount_out), (RAZORPAYX_CURRENT, INR, -amount_out)),
        reference=transaction_id)], precondition)[0]


# --- USDC refunds ---------------------------------------------------------------------

def refund_key(refund_id: int) -> str:
    return f"refund:{refund_id}"


def request_refund_landed(*, refund_id: int, kind: str, transaction_id: str,
                          amount: Decimal, reversed_: dict | None = None,
                          precondition: Precondition | None = None) -> Entry:
    """Rule 6 for a withdrawal's or receive's own refund, landed on chain
    (payouts/refunds.py ``_landed``: submitting -> submitted): Dr ``owed:<kind>`` / Cr
    ``stellar:distribution``, ``amount`` USDC. Key ``refund:<refund row id>``.

    - After a reversal (``reversed_``: the request's ``amount_in``, ``fee``,
      ``amount_out``; only a receive can be refunded then), the rupees held in
      ``owed:reversed`` are bought back at the same rate and the fee is given back, the
      exact undo of rule 4's conversion: Dr ``owed:reversed`` / Cr ``fx`` amount_out
      INR, Dr ``fx`` ``amount_in - fee`` and Dr ``revenue:fees`` ``fee`` / Cr
      ``owed:<kind>`` ``amount_in`` USDC (key ``refund:<id>:reconverted``). RazorpayX's
      fees came back with the reversal (rule 5), so nothing is left on the expenses.
    - USDC this refund sends back that no rule 3 booked (a short payment never
      verified, a payment after the verification) is booked received first: Dr
      ``stellar:distribution`` / Cr ``owed:<kind>`` (key ``refund:<id>:received``), so
      the distribution account moves as the chain did and ``owed:<kind>`` clears.
      What is still owed above the refund (it cannot be) is left owed."""
    key = refund_key(refund_id)
    specs = []
    reconverted = Decimal(0)
    if reversed_ is not None:
        amount_in, fee, amount_out = (reversed_["amount_in"], reversed_["fee"],
                                      reversed_["amount_out"])
        specs.append(EntrySpec(f"{key}:reconverted", f"{kind}.refund.reconvert", _lines(
            (OWED_REVERSED, INR, amount_out), (FX, INR, -amount_out),
            (FX, USDC, amount_in - fee), (FEES, USDC, fee), (owed(kind), USDC, -amount_in)),
            reference=transaction_id))
        if not posted(f"{key}:reconverted"):
            reconverted = amount_in
    if not posted(key):
        held = owed_amount(account=owed(kind), currency=USDC, reference=transaction_id)
        unbooked = amount - held - reconverted
        if unbooked > 0:
            specs.append(EntrySpec(f"{key}:received", f"{kind}.received", _lines(
                (DISTRIBUTION, USDC, unbooked), (owed(kind), USDC, -unbooked)),
                reference=transaction_id))
    specs.append(EntrySpec(key, f"{kind}.refund", _lines(
        (owed(kind), USDC, amount), (DISTRIBUTION, USDC, -amount)), reference=transaction_id))
    return _post(specs, precondition)[-1]


def receipt_refund_landed(*, refund_id: int, receipt_id: int, amount: Decimal,
                          kind: str | None = None, transaction_id: str = "",
                          precondition: Precondition | None = None) -> Entry:
    """Rule 6 for a receipt's own refund (the unconsumed part of a USDC receipt, landed:
    payouts/refunds.py ``_landed``). ``kind`` and ``transaction_id``: the withdrawal
    whose rule 3 booked this receipt (the excess of an overpayment it verified), when
    there is one: Dr ``owed:<kind>`` / Cr ``stellar:distribution`` ``amount`` USDC.
    Otherwise no rule ever booked the receipt (no memo, an unknown one, a second
    payment after the verification): it is booked received and sent back in one
    transaction, Dr ``stellar:distribution`` / Cr ``owed:receipts`` (key
    ``receipt:<receipt id>:received``) then Dr ``owed:receipts`` / Cr
    ``stellar:distribution``. Key ``refund:<refund row id>``."""
    key = refund_key(refund_id)
    if kind is not None:
        return _post([EntrySpec(key, f"{kind}.refund", _lines(
            (owed(kind), USDC, amount), (DISTRIBUTION, USDC, -amount)),
            reference=transaction_id)], precondition)[0]
    reference = f"receipt:{receipt_id}"
    return _post([
        EntrySpec(f"{reference}:received", "receipt.received", _lines(
            (DISTRIBUTION, USDC, amount), (OWED_RECEIPTS, USDC, -amount)), reference=reference),
        EntrySpec(key, "receipt.refund", _lines(
            (OWED_RECEIPTS, USDC, amount), (DISTRIBUTION, USDC, -amount)), reference=reference),
    ], precondition)[-1]


def rupees(paise: int | None) -> Decimal:
    """Integer paise (the Razorpay boundary) as rupees, 2 dp; None as 0."""
    return (Decimal(paise or 0) / 100).quantize(PAISA)


# --- treasury (issue 13 §2: treasury/reconcile.py) -----------------------------------

def settled_key(payment_id: str) -> str:
    return f"settlement:{payment_id}"


def payment_settled(*, payment_id: str, settlement_id: str, amount: Decimal,
                    fee: Decimal, tax: Decimal) -> Entry:
    """A captured payment Razorpay settled to our bank (a settlement recon row,
    TREASURY §3.2; ``fee`` includes ``tax`` as on the row): Dr ``bank:settlements``
    ``amount - fee``, Dr ``expense:provider_fees`` ``fee - tax``, Dr ``expense:taxes``
    ``tax``, Cr ``razorpay:pending`` ``amount`` INR. The row's figures are the fact
    (what the bank received); a fee that differs from the payment entity's is a break
    beside it. Key ``settlement:<payment id>``, reference the settlement id."""
    return _post([EntrySpec(settled_key(payment_id), "razorpay.settled", _lines(
        (BANK_SETTLEMENTS, INR, amount - fee), (PROVIDER_FEES, INR, fee - tax),
        (TAXES, INR, tax), (RAZORPAY_PENDING, INR, -amount)),
        reference=settlement_id)], None)[0]


def refund_settled(*, refund_id: str, settlement_id: str, amount: Decimal) -> Entry:
    """A deposit refund Razorpay deducted from a settlement (a settlement recon row of type
    ``refund``, TREASURY §3.2: ``debit`` = the refund's amount): Dr ``razorpay:pending`` /
    Cr ``bank:settlements`` ``amount`` INR, so ``bank:settlements`` holds what Razorpay
    settled (the refund's own rule credited ``razorpay:pending`` when it was processed).
    Key ``settlement:<refund id>``, reference the settlement id."""
    return _post([EntrySpec(settled_key(refund_id), "razorpay.refund_settled", _lines(
        (RAZORPAY_PENDING, INR, amount), (BANK_SETTLEMENTS, INR, -amount)),
        reference=settlement_id)], None)[0]


def funded(*, key: str, account: str, currency: str, amount: Decimal,
           reference: str) -> Entry:
    """Money the anchor put into one of its accounts (a RazorpayX ``bank_transfer``
    statement row, the distribution account's opening USDC): Dr ``account`` / Cr
    ``equity:funding`` ``amount`` (negative: taken out). Key ``funding:<key>``."""
    return _post([EntrySpec(f"funding:{key}", "treasury.funded", _lines(
        (account, currency, amount), (FUNDING, currency, -amount)),
        reference=reference)], None)[0]


def adjusted(*, break_key: str, account: str, currency: str, amount: Decimal,
             note: str) -> Entry:
    """An operator's adjusting entry explaining a reconciliation break: Dr ``account``
    ``amount`` (negative: Cr) / the other side ``equity:adjustments``. Key
    ``adjust:<break key>`` (one per break); reference the break key, ``note`` kept in
    the entry's metadata by the caller's audit row."""
    return _post([EntrySpec(f"adjust:{break_key}", "treasury.adjusted", _lines(
        (account, currency, amount), (ADJUSTMENTS, currency, -amount)),
        reference=break_key[:100])], None)[0]
