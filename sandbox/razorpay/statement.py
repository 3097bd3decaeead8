"""RazorpayX account statement and balance of the stand-in (TREASURY §4.2, §5): every
movement of our RazorpayX account is a statement row with the running balance.

Endpoints (views.py):

- ``GET /v1/transactions?account_number=<ours>[&from=&to=][&count<=100][&skip=]`` and ``GET
  /v1/transactions/{id}`` (docs ``api/x/transactions/entity``, ``fetch-all``; rows shaped
  as the docs' samples and, for reversals, ``webhook_transaction_created_reversal.json``):
  newest first, ``from``/``to`` bound ``created_at`` (Unix seconds, inclusive);
- ``GET /v1/banking_balances[?account_type=current_account|razorpayx_lite][&bank_code=]
  [&count<=100][&skip=]`` (docs ``api/x/account-validation/balance-fetch``, TREASURY §4.2):
  our one account as a ``banking_balance`` item, a RazorpayX Lite account (FAV runs on
  it, TREASURY §6.1), so ``bank_name``/``bank_code`` are null; ``available_amount`` =
  ``amount`` (no liens, no overdraft); ``refreshed_at`` = the time of the read (Lite is
  RazorpayX's own ledger, nothing to refresh from a bank);
- ``POST /razorpay/sandbox/banking_balances/topup {"amount": paise, "payer_name",
  "payer_account", "payer_ifsc", "mode": "NEFT"|"IMPS"|"RTGS"}`` (sandbox only, test mode's
  "Add test balance", NOTES §4.1): a ``bank_transfer`` credit.

Rows (amounts integer paise; ``amount`` excludes fees, as the docs say):

- ``payout`` debit when a payout is created (it is ``processing`` at once here; the docs
  populate fees at ``processing``): ``debit`` = amount, and the fees (tax included) are
  taken from the balance in the same row, so ``balance`` = previous - ``debit`` - fees.
  ``source`` is the payout as it is now (``status``, ``utr`` appear as it moves);
- ``reversal`` credit when a payout is reversed, or fails after its debit (money comes
  back: NOTES §2.6 "failed -> reversed: money was debited and later credited back"):
  ``credit`` = amount + the fees its debit took, as the ``transaction.created`` sample
  and NOTES §2.6; this is also the entity sent in that webhook (same id and balance);
- ``bank_transfer`` credit: a top-up, and the account's opening balance (₹1 crore) as its
  first row, so the rows always add up to the balance.

Fault switches, taken once per payout create (``sandbox.razorpay.payouts``):

- ``razorpayx.statement_fee_mismatch`` ``{"fees_extra": 100, "tax_extra": 0}``: the debit
  row charges the payout's fees + ``fees_extra`` (tax + ``tax_extra``) while the payout
  entity keeps its own; a later reversal gives back what the row took;
- ``razorpayx.statement_utr_mismatch`` ``{"utr": ...}``: the payout's rows show another
  UTR than the payout entity (default ``STMT`` + the entity's), as a bank reference the
  statement reports apart from the one in the payout webhook;
- ``razorpayx.statement_omit_payout``: the payout is never debited (no row, the balance
  unchanged) while it is processed as usual;
- ``razorpayx.reversal_statement_only`` ``{"after_s": 1, "reason": ...}``: ``processed``,
  then ``after_s`` later ``reversed`` with its reversal credit in the statement, but
  neither ``payout.reversed`` nor ``transaction.created`` is sent (only the API shows it).

Not modelled: FAV charges (the docs say every validation is charged but show neither a
price nor a statement row for it, TREASURY §6.1, §9.2), queueing on a low balance (the
balance may go negative), current accounts.
"""

from __future__ import annotations

import secrets

from django.db import IntegrityError, transaction
from django.utils import timezone

from sandbox.razorpay.common import RazorpayError, new_id
from sandbox.razorpay.models import AccountTransaction, BankingAccount, Payout

DB = "sandbox"
OPENING_BALANCE = 10_000_000_00  # paise (₹1 crore)
OPENING_PAYER = {"payer_name": "Sandbox Treasury", "payer_account": "0000000000000001",
                 "payer_ifsc": "RATN0000001", "mode": "NEFT"}
ACCOUNT_TYPES = {"current_account", "razorpayx_lite"}  # case-sensitive (TREASURY §4.2)
TOPUP_FIELDS = {"amount", "payer_name", "payer_account", "payer_ifsc", "mode"}
TOPUP_MODES = {"NEFT", "IMPS", "RTGS"}
MAX_COUNT = 100


def _x_error(description: str, field: str | None = None) -> RazorpayError:
    return RazorpayError(description, field=field, step=None)


def _digits(n: int) -> str:
    return "".join(secrets.choice("0123456789") for _ in range(n))


def _locked_account(account_number: str, now) -> BankingAccount:
    """Our account row, locked for this transaction; made on first use with its opening
    balance credited as the first row (concurrent first uses make one)."""
    account = (BankingAccount.objects.using(DB).select_for_update()
               .filter(pk=account_number).first())
    if account is not None:
        return account
    try:
        with transaction.atomic(using=DB):
            account = BankingAccount.objects.using(DB).create(
                account_number=account_number, created_ts=now)
    except IntegrityError:
        return BankingAccount.objects.using(DB).select_for_update().get(pk=account_number)
    _append(account, now, kind="bank_transfer", amount=OPENING_BALANCE, credit=OPENING_BALANCE,
            details={"id": new_id("bt_"), **OPENING_PAYER,
                     "bank_reference": "SBXOPENING" + _digits(6)})
    return account


def _append(account: BankingAccount, now, *, kind: str, amount: int, credit: int = 0,
            debit: int = 0, fees: int = 0, tax: int = 0, payout: Payout | None = None,
            details: dict | None = None) -> AccountTransaction:
    """Append one row to ``account`` (locked by the caller) and move its balance by
    ``credit - debit - fees``."""
    account.balance += credit - debit - fees
    account.last_seq += 1
    BankingAccount.objects.using(DB).filter(pk=account.pk).update(
        balance=account.balance, last_seq=account.last_seq)
    return AccountTransaction.objects.using(DB).create(
        id=new_id("txn_"), account=account, seq=account.last_seq, kind=kind, payout=payout,
        amount=amount, credit=credit, debit=debit, fees=fees, tax=tax,
        balance=account.balance, details=details or {}, created_at=int(now.timestamp()),
        created_ts=now,
    )


def debit_payout(payout: Payout, now) -> AccountTransaction | None:
    """The debit row of a just created payout (saved), fees as fault
    ``razorpayx.statement_fee_mismatch`` in ``payout.faults["statement_fee"]`` says; None
    under ``razorpayx.statement_omit_payout`` (never debited). Inside the create's
    transaction."""
    if payout.faults.get("statement_omit"):
        return None
    extra = payout.faults.get("statement_fee") or {}
    account = _locked_account(payout.debit_account_number, now)
    return _append(account, now, kind="payout", payout=payout, amount=payout.amount,
                   debit=payout.amount,
                   fees=payout.fees + int(extra.get("fees_extra", 0)),
                   tax=payout.tax + int(extra.get("tax_extra", 0)))


def credit_reversal(payout: Payout, now) -> AccountTransaction | None:
    """The reversal credit of a reversed or failed payout: amount + the fees its debit row
    took. None when the payout was never debited. At most one per payout (the payout row
    is locked by the caller, and a payout is reversed or failed once)."""
    debit = AccountTransaction.objects.using(DB).filter(payout=payout, kind="payout").first()
    if debit is None:
        return None
    existing = AccountTransaction.objects.using(DB).filter(payout=payout, kind="reversal").first()
    if existing is not None:
        return existing
    account = _locked_account(payout.debit_account_number, now)
    credit = debit.amount + debit.fees
    return _append(account, now, kind="reversal", payout=payout, amount=credit, credit=credit,
                   details={"id": new_id("rvrsl_"), "fee": debit.fees, "tax": debit.tax})


def reversal_entity(payout: Payout) -> dict | None:
    """The transaction entity of the payout's reversal credit (the ``transaction.created``
    payload), or None."""
    row = (AccountTransaction.objects.using(DB).select_related("payout")
           .filter(payout=payout, kind="reversal").first())
    return None if row is None else transaction_entity(row)


def _utr(payout: Payout) -> str | None:
    """The payout's UTR as the statement shows it (fault ``razorpayx.statement_utr_mismatch``:
    another one)."""
    other = payout.faults.get("statement_utr")
    if other is None or not payout.utr:
        return payout.utr
    return other.get("utr") or f"STMT{payout.utr}"


def _source(row: AccountTransaction) -> dict:
    """``source`` of a row: the payout now (docs fetch-all sample keys), the reversal
    (``webhook_transaction_created_reversal.json`` keys) or the bank transfer (docs
    sample keys)."""
    details = row.details
    if row.kind == "payout":
        payout = row.payout
        return {
            "id": payout.id,
            "entity": "payout",
            "fund_account_id": payout.fund_account_id,
            "amount": payout.amount,
            "notes": payout.notes,
            "fees": row.fees,
            "tax": row.tax,
            "status": payout.status,
            "utr": _utr(payout),
            "mode": payout.mode,
            "created_at": payout.created_at,
            "fee_type": None,
        }
    if row.kind == "reversal":
        return {
            "id": details["id"],
            "entity": "reversal",
            "payout_id": row.payout_id,
            "amount": row.amount,
            "fee": details["fee"],
            "tax": details["tax"],
            "currency": row.currency,
            "utr": _utr(row.payout),
            "created_at": row.created_at,
        }
    return {
        "id": details["id"],
        "entity": "bank_transfer",
        "payer_name": details["payer_name"],
        "payer_account": details["payer_account"],
        "payer_ifsc": details["payer_ifsc"],
        "mode": details["mode"],
        "bank_reference": details["bank_reference"],
        "amount": row.amount,
    }


def transaction_entity(row: AccountTransaction) -> dict:
    """The transaction entity (docs ``api/x/transactions/entity``, keys in its order)."""
    return {
        "id": row.id,
        "entity": "transaction",
        "account_number": row.account_id,
        "amount": row.amount,
        "currency": row.currency,
        "credit": row.credit,
        "debit": row.debit,
        "balance": row.balance,
        "source": _source(row),
        "created_at": row.created_at,
    }


def _ours(params, account_number: str, field: str = "account_number") -> None:
    value = params.get(field)
    if not value:
        raise _x_error("The account number field is required.", field)
    if value != account_number:
        raise _x_error("The RazorpayX Account number is invalid", field)


def _count_skip(params) -> tuple[int, int]:
    count, skip = params.get("count"), params.get("skip")
    if count is not None and (not count.isdigit() or not 1 <= int(count) <= MAX_COUNT):
        raise _x_error(f"The count must be between 1 and {MAX_COUNT}.", "count")
    if skip is not None and not skip.isdigit():
        raise _x_error("The skip must be an integer.", "skip")
    return int(count or 10), int(skip or 0)


def list_transactions(*, params, account_number: str) -> dict:
    """``GET /v1/transactions?account_number=&from=&to=&count=&skip=``: newest first (the
    statement order reversed). ``account_number``: ours; another is refused as
    ``GET /v1/payouts`` refuses it."""
    _ours(params, account_number)
    count, skip = _count_skip(params)
    rows = (AccountTransaction.objects.using(DB).select_related("payout")
            .filter(account_id=account_number).order_by("-seq"))
    for name, lookup in (("from", "created_at__gte"), ("to", "created_at__lte")):
        value = params.get(name)
        if value is not None:
            if not value.isdigit():
                raise _x_error(f"The {name} must be an integer.", name)
            rows = rows.filter(**{lookup: int(value)})
    with transaction.atomic(using=DB):
        _locked_account(account_number, timezone.now())  # the opening row exists
    items = [transaction_entity(r) for r in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def get_transaction(transaction_id: str) -> dict:
    row = (AccountTransaction.objects.using(DB).select_related("payout")
           .filter(pk=transaction_id).first())
    if row is None:
        raise _x_error("The id provided does not exist")
    return transaction_entity(row)


def banking_balances(*, params, account_number: str) -> dict:
    """``GET /v1/banking_balances``: our account's ``banking_balance`` (TREASURY §4.2)."""
    account_type = params.get("account_type")
    if account_type is not None and account_type not in ACCOUNT_TYPES:
        raise _x_error("The selected account type is invalid.", "account_type")
    count, skip = _count_skip(params)
    now = timezone.now()
    with transaction.atomic(using=DB):
        account = _locked_account(account_number, now)
    items = [{
        "entity": "banking_balance",
        "currency": "INR",
        "account_number": account.account_number,
        "account_type": "razorpayx_lite",
        "bank_name": None,
        "bank_code": None,
        "amount": account.balance,
        "available_amount": account.balance,
        "refreshed_at": int(now.timestamp()),
    }]
    if account_type == "current_account" or params.get("bank_code") is not None:
        items = []
    items = items[skip : skip + count]
    return {"entity": "collection", "count": len(items), "items": items}


def top_up(*, data, account_number: str) -> dict:
    """``POST /razorpay/sandbox/banking_balances/topup``: credit ``amount`` paise to our
    account as a ``bank_transfer`` row. Returns the transaction entity; raises
    ``RazorpayError``."""
    if not isinstance(data, dict):
        raise _x_error("The request body must be a JSON object.")
    extra = sorted(set(data) - TOPUP_FIELDS)
    if extra:
        raise _x_error(f"{', '.join(extra)} is/are not required and should not be sent",
                       extra[0])
    amount = data.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 100:
        raise _x_error("The amount must be an integer of at least 100 paise (sandbox).",
                       "amount")
    mode = data.get("mode", "NEFT")
    if mode not in TOPUP_MODES:
        raise _x_error(f"Invalid mode: {mode}", "mode")
    details = {"id": new_id("bt_"), "payer_name": str(data.get("payer_name", "Test User")),
               "payer_account": str(data.get("payer_account", "0000000000000002")),
               "payer_ifsc": str(data.get("payer_ifsc", "UTIB0000002")), "mode": mode,
               "bank_reference": "SBX" + mode[0] + _digits(12)}
    now = timezone.now()
    with transaction.atomic(using=DB):
        account = _locked_account(account_number, now)
        row = _append(account, now, kind="bank_transfer", amount=amount, credit=amount,
                      details=details)
    return transaction_entity(row)


def reset() -> None:
    """Empty the statement and the account (the next use credits the opening balance)."""
    with transaction.atomic(using=DB):
        AccountTransaction.objects.using(DB).all().delete()
        BankingAccount.objects.using(DB).all().delete()
