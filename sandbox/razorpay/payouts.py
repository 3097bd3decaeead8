"""RazorpayX stand-in: contacts, fund accounts, payouts with ``X-Payout-Idempotency``, the
payout life cycle and the payout webhooks (NOTES §2).

Amounts are integer paise (NOTES §0.1); ``fees`` includes ``tax`` (docs samples
``"fees": 590, "tax": 90``). Entity shapes follow ``api_create_payout_response_queued.json``,
``webhook_payout_processed_upi.json``, ``webhook_payout_reversed_imps.json`` and
``webhook_transaction_created_reversal.json``; descriptions not quoted from the docs are
sandbox wording (inference) and should not be matched by text.

Life cycle (driven by the background loop, ``advance_due``)::

    create -> processing   (answer; webhook payout.initiated)
      + settle delay -> processed, UTR set   (payout.updated, then payout.processed)
                     |  failed                (payout.failed)   fault razorpayx.fail_payout
      processed + after_s -> reversed         (payout.reversed + transaction.created)

The settle delay is ``SANDBOX_PAYOUT_SETTLE_S`` (default 1.0 s), overridden by fault
``razorpayx.settle_delay`` params ``{"seconds": 0.2}`` (the sandbox process reads settings
from its environment once, so tests change timing through this switch). In Razorpay test
mode a payout stays ``processing`` until moved in the dashboard (NOTES §4.1): the
sandbox-only ``settle`` does that by hand.

Fault switches (``POST /sandbox/faults {"name", "times", "params"}``), taken once per create
(only by a create that passes validation) and applied to that payout's whole life:

- ``razorpayx.settle_delay`` ``{"seconds": float}``: settle delay of the payout;
- ``razorpayx.payout_stuck_processing``: never leaves ``processing``; at settle time only its
  ``status_details`` turn ``beneficiary_bank_confirmation_pending`` (one ``payout.updated``),
  as IMPS/UPI under NPCI deemed success (NOTES §2.6, §5.4);
- ``razorpayx.processed_then_reversed`` ``{"after_s": 1, "reason":
  "beneficiary_bank_offline"}``: ``processed``, then ``after_s`` later ``reversed``
  (UTR kept) with ``payout.reversed`` and a ``transaction.created`` reversal crediting
  amount + fees (NOTES §2.6, §5.9);
- ``razorpayx.fail_payout`` ``{"reason": "beneficiary_bank_rejected"}``: ``processing`` ->
  ``failed`` at settle time, ``payout.failed``; the key is dead from then on (NOTES §2.5);
- ``razorpayx.create_5xx_after_create``: the payout is created and lives normally, but the
  create call answers 500 ``SERVER_ERROR`` (NOTES §2.5, "Handling 5XX Errors");
- ``razorpayx.webhook_before_create_returns`` ``{"timeout_s": 10}``: the payout settles at
  once and the create call answers only after the first delivery attempt of its terminal
  webhook (``payout.processed``, or ``payout.failed``) has been answered by the merchant, at
  most ``timeout_s``; the answer is still the entity as created (``processing``, no UTR),
  so it arrives after the webhook that supersedes it (NOTES §2.8, §5.5);
- ``razorpayx.webhook_duplicate`` ``{"copies": 3, "concurrent": false}``: each payout
  webhook is delivered ``copies`` times with the same event id and bytes (NOTES §5.6);
- ``razorpayx.webhook_reorder``: when the payout will also be reversed automatically
  (``processed_then_reversed``), ``payout.updated`` and ``payout.processed`` are held back
  and delivered after ``payout.reversed`` and ``transaction.created`` (NOTES §5.9: reversed
  before processed); without a scheduled reversal it changes nothing;
- ``razorpayx.webhook_lose``: the payout's webhooks are recorded but never sent (a later
  dashboard replay, ``POST /razorpay/sandbox/webhooks/redeliver``, still works);
- ``razorpayx.reversal_statement_only`` ``{"after_s": 1, "reason": ...}``: as
  ``processed_then_reversed``, but the reversal sends no webhook: only ``GET
  /v1/payouts/{id}`` and the account statement show it;
- ``razorpayx.statement_fee_mismatch`` ``{"fees_extra": 100, "tax_extra": 0}``: the
  statement's debit row charges other fees than the payout entity shows;
- ``razorpayx.statement_utr_mismatch`` ``{"utr": ...}``: the statement's rows of the
  payout show another UTR (default ``STMT`` + the payout's) than the payout entity;
- ``razorpayx.statement_omit_payout``: the payout lives as usual (processed, webhooks)
  but the account is never debited: no statement row, the balance unchanged (a payout
  reported paid that the bank's ledger lacks).

Every payout is debited in the account statement at create, and credited back by a
reversal row when it is reversed or fails (``sandbox.razorpay.statement``).

A payout to a beneficiary account the sandbox's "bank" was told refuses credits
(``payout_failure`` in ``POST /razorpay/sandbox/fund_accounts/validations/accounts``)
fails at settle time with that reason, as ``razorpayx.fail_payout`` would, whichever payout
it is (tests running side by side each choose their own accounts).

Read faults:

- ``razorpayx.payout_fetch_5xx`` (taken once per call, so ``times: null`` is an outage
  until cleared): ``GET /v1/payouts/{id}`` answers 500 ``SERVER_ERROR`` (the payouts API
  down while webhooks still arrive).
- ``razorpayx.list_lag`` ``{"seconds": 300}`` (read, not taken, by every list call while
  on): ``GET /v1/payouts`` leaves out payouts created less than ``seconds`` ago, as a
  search index that has not caught up. Razorpay's 5xx guide polls the list by
  ``reference_id`` only from 5 minutes after creation and retries the create with the
  same key before that (NOTES §2.5), so a client must not read "not listed" as "not
  created".

Idempotency (NOTES §2.5): the key is checked before the body; a key is claimed (committed)
before the payout is created and stays ``in_flight`` until the create call answers, so a
concurrent duplicate gets 409. A later request with the key and an equal body (compared
as decoded JSON: key order and whitespace do not matter, ``100`` and ``100.0`` do) gets the
payout in its latest state; a different body gets 400. A request refused by validation does
not keep its key. Keys do not expire (Razorpay keeps them 7 days).

Sandbox-only endpoints (views.py): ``GET /razorpay/sandbox/payouts`` (every payout with its
key, for tests and the demo's double-payout count), ``POST
/razorpay/sandbox/payouts/{id}/settle`` (move by hand), ``POST
/razorpay/sandbox/payouts/reset`` (empty the RazorpayX tables only).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import JsonResponse
from django.utils import timezone

from sandbox.control import faults
from sandbox.razorpay import statement, webhooks
from sandbox.razorpay.common import RazorpayError, new_id, server_error
from sandbox.razorpay.models import (
    Contact,
    FundAccount,
    FundAccountValidation,
    Payout,
    PayoutIdempotencyKey,
    ValidationAccount,
    WebhookDelivery,
    WebhookEvent,
)

DB = "sandbox"
DEFAULT_ACCOUNT_NUMBER = "2323230041626905"
IDEMPOTENCY_HEADER = "X-Payout-Idempotency"
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_\- ]{4,36}")  # NOTES §2.5
IN_FLIGHT_LEASE = timedelta(seconds=120)  # an in-flight claim older than this is abandoned
MIN_AMOUNT = 100  # paise, NOTES §2.4
MAX_NOTES = 15
MAX_NOTE_VALUE = 256
MAX_REFERENCE_ID = 40
CONTACT_TYPES = {"vendor", "customer", "employee", "self"}  # API-creatable (NOTES §2.2)
CONTACT_FIELDS = {"name", "email", "contact", "type", "reference_id", "notes"}
CONTACT_NAME = re.compile(r"[A-Za-z0-9 ’'\-_/(),.]{3,50}")  # docs api/x/contacts/create
FUND_ACCOUNT_FIELDS = {"contact_id", "account_type", "bank_account", "vpa"}
IFSC = re.compile(r"[A-Z]{4}0[A-Z0-9]{6}")
BANK_ACCOUNT_NUMBER = re.compile(r"[A-Za-z0-9]{5,35}")
VPA = re.compile(r"[A-Za-z0-9.\-_]{2,256}@[A-Za-z0-9]{2,64}")
PAYOUT_FIELDS = {
    "account_number", "fund_account_id", "amount", "currency", "mode", "purpose",
    "queue_if_low_balance", "reference_id", "narration", "notes",
}
PURPOSES = {"refund", "cashback", "payout", "salary", "utility bill", "vendor bill"}
MODES = {"bank_account": {"NEFT", "RTGS", "IMPS"}, "vpa": {"UPI"}}  # case-sensitive
# Mode limits in paise (docs x/payouts; NOTES §2.4): (minimum, maximum or None).
MODE_LIMITS = {
    "IMPS": (MIN_AMOUNT, 500_000_00),
    "UPI": (MIN_AMOUNT, 100_000_00),
    "RTGS": (200_000_00, None),
    "NEFT": (MIN_AMOUNT, None),
}
NARRATION = re.compile(r"[A-Za-z0-9 ]{1,30}")
# Sandbox fee schedule, paise before 18 % GST: IMPS 500 -> fees 590, tax 90 (docs samples).
BASE_FEE = {"IMPS": 500, "NEFT": 300, "RTGS": 2000, "UPI": 300}
GST_PERCENT = 18
BANK_NAMES = {
    "HDFC": "HDFC Bank", "ICIC": "ICICI Bank", "SBIN": "State Bank of India",
    "UTIB": "Axis Bank", "KKBK": "Kotak Mahindra Bank", "YESB": "Yes Bank",
    "RATN": "RBL Bank", "IDFB": "IDFC First Bank",
}
PROCESSED_DETAILS = (  # webhook_payout_processed_upi.json
    "payout_processed", "beneficiary_bank",
    "Payout is processed and the money has been credited into the beneficiary account.",
)
PENDING_DETAILS = (
    "beneficiary_bank_confirmation_pending", "beneficiary_bank",
    "Payout is pending confirmation from the beneficiary bank.",
)
# status_details.reason -> (source, description) for failures and reversals
# (docs errors/x/payout-status-details; NOTES §2.6).
REASONS = {
    "bank_account_closed": ("beneficiary_bank", "The beneficiary bank account is closed."),
    "bank_account_frozen": ("beneficiary_bank", "The beneficiary bank account is frozen."),
    "bank_account_invalid": ("beneficiary_bank", "The beneficiary bank account is invalid."),
    "beneficiary_account_dormant": ("beneficiary_bank",
                                    "The beneficiary bank account is dormant."),
    "beneficiary_bank_failure": ("beneficiary_bank",
                                 "Payout failed at the beneficiary bank. Please retry."),
    "beneficiary_bank_offline": ("beneficiary_bank",  # webhook_payout_reversed_imps.json
                                 "Beneficiary bank systems are offline, please retry after "
                                 "30 min"),
    "beneficiary_bank_rejected": ("beneficiary_bank",
                                  "The beneficiary bank rejected the payout."),
    "beneficiary_bank_technical_error": ("beneficiary_bank",
                                         "Technical error at the beneficiary bank. "
                                         "Please retry."),
    "beneficiary_psp_offline": ("beneficiary_bank",
                                "The beneficiary's UPI app is offline. Please retry."),
    "imps_not_allowed": ("beneficiary_bank",
                         "IMPS is not enabled on beneficiary account, Retry with different "
                         "mode"),
    "invalid_ifsc_code": ("beneficiary_bank", "The IFSC code is invalid."),
    "npci_beneficiary_timeout": ("beneficiary_bank",
                                 "The beneficiary bank did not answer NPCI in time."),
    "transaction_limit_exceeded": ("beneficiary_bank",
                                   "The beneficiary account's transaction limit is exceeded."),
    "amount_limit_exhausted_neft": ("business", "The NEFT amount limit is exhausted."),
    "beneficiary_account_invalid": ("business", "The beneficiary account is invalid."),
    "beneficiary_vpa_invalid": ("business", "The beneficiary VPA is invalid."),
    "insufficient_funds": ("business", "Insufficient balance in the business account."),
    "invalid_beneficiary": ("business", "The beneficiary details are invalid."),
    "gateway_down": ("gateway", "The partner bank is down. Please retry."),
    "gateway_technical_error": ("gateway", "Technical error at the partner bank. "
                                           "Please retry."),
}
DEFAULT_FAIL_REASON = "beneficiary_bank_rejected"
DEFAULT_REVERSE_REASON = "beneficiary_bank_offline"
SERVER_ERROR = {  # Razorpay's 5xx body shape (docs errors); sandbox wording
    "error": {
        "code": "SERVER_ERROR",
        "description": "We are facing some trouble completing your request at the moment. "
                       "Please try again shortly.",
        "source": "NA", "step": "NA", "reason": "NA", "metadata": {}, "field": None,
    }
}


def account_number() -> str:
    """Our RazorpayX account number (customer identifier), NOTES §2.1."""
    return str(getattr(settings, "RAZORPAYX_ACCOUNT_NUMBER", DEFAULT_ACCOUNT_NUMBER))


def x_error(description: str, field: str | None = None, **kwargs) -> RazorpayError:
    """A RazorpayX 4xx: ``step`` is null there (docs ``errors/x/fund-account`` sample)."""
    kwargs.setdefault("step", None)
    return RazorpayError(description, field=field, **kwargs)


def _not_found(field: str | None = None) -> RazorpayError:
    return x_error("The id provided does not exist", field)


def _sha256(value) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _digits(n: int) -> str:
    return "".join(secrets.choice("0123456789") for _ in range(n))


def _object(data) -> dict:
    if not isinstance(data, dict):
        raise x_error("The request body must be a JSON object.")
    return data


def _no_extra_fields(data: dict, allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise x_error(f"{', '.join(extra)} is/are not required and should not be sent",
                      extra[0], reason="extra_field_sent")


def _optional_str(data: dict, field: str, label: str, max_len: int) -> str | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise x_error(f"The {label} must be a string.", field)
    if len(value) > max_len:
        raise x_error(f"The {label} may not be greater than {max_len} characters.", field)
    return value


def _notes(data: dict):
    """``notes``: at most 15 pairs of at most 256 characters; ``[]`` when empty (PHP style,
    as the pay-in entities)."""
    notes = data.get("notes")
    if notes is None or notes == [] or notes == {}:
        return []
    if not isinstance(notes, dict):
        raise x_error("The notes must be an array.", "notes")
    if len(notes) > MAX_NOTES:
        raise x_error("Number of fields in notes should be less than or equal to 15", "notes")
    for key, value in notes.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise x_error(f"The notes.{key} must be a string.", "notes")
        if len(str(value)) > MAX_NOTE_VALUE:
            raise x_error(f"The notes.{key} may not be greater than 256 characters.", "notes")
    return notes


# --- contacts -------------------------------------------------------------------------


def contact_entity(contact: Contact) -> dict:
    """The contact entity (docs ``api/x/contacts/create`` sample, keys in its order)."""
    return {
        "id": contact.id,
        "entity": "contact",
        "name": contact.name,
        "contact": contact.contact,
        "email": contact.email,
        "type": contact.type,
        "reference_id": contact.reference_id,
        "batch_id": None,
        "active": contact.active,
        "notes": contact.notes,
        "created_at": contact.created_at,
    }


def _validate_contact(data) -> dict:
    """Check a create-contact body (NOTES §2.2): ``name`` 3-50 characters of
    ``a-z A-Z 0-9 space ’ - _ / ( ) , .``, starting with a letter or digit and not ending
    with a special character other than ``.``; ``type`` one of ``CONTACT_TYPES``;
    ``reference_id`` ≤ 40; ``notes`` ≤ 15 pairs. Error texts of the docs page where it has
    them ("The name field is invalid.", "Invalid type: ...")."""
    data = _object(data)
    _no_extra_fields(data, CONTACT_FIELDS)
    name = data.get("name")
    if name is None or name == "":
        raise x_error("The name field is required.", "name")
    if not isinstance(name, str):
        raise x_error("The name field is invalid.", "name")
    if len(name) < 3:
        raise x_error("The name must be at least 3 characters.", "name")
    if len(name) > 50:
        raise x_error("The name may not be greater than 50 characters.", "name")
    if (not CONTACT_NAME.fullmatch(name) or not name[0].isalnum()
            or not (name[-1].isalnum() or name[-1] == ".")):
        raise x_error("The name field is invalid.", "name")
    email = _optional_str(data, "email", "email", 200)
    if email is not None and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
        raise x_error("The email must be a valid email address.", "email")
    phone = data.get("contact")
    if phone is not None:
        if isinstance(phone, bool) or not isinstance(phone, str | int):
            raise x_error("The contact format is invalid.", "contact")
        phone = str(phone)
        if not re.fullmatch(r"\+?[0-9]{8,15}", phone):
            raise x_error("The contact format is invalid.", "contact")
    kind = data.get("type")
    if kind is not None and kind not in CONTACT_TYPES:
        raise x_error(f"Invalid type: {kind}", "type")
    reference_id = _optional_str(data, "reference_id", "reference id", MAX_REFERENCE_ID)
    return {"name": name, "email": email, "contact": phone, "type": kind,
            "reference_id": reference_id, "notes": _notes(data)}


def create_contact(*, data) -> dict:
    """``POST /v1/contacts``: create a contact, or return the existing one when name, email,
    contact, type and reference_id all equal it (docs ``api/x/contacts/create``; a unique
    column makes concurrent identical creates return one contact). Returns the contact
    entity; raises ``RazorpayError``."""
    fields = _validate_contact(data)
    key = _sha256([fields[f] for f in ("name", "email", "contact", "type", "reference_id")])
    now = timezone.now()
    try:
        with transaction.atomic(using=DB):
            contact = Contact.objects.using(DB).create(
                id=new_id("cont_"), details_key=key, created_at=int(now.timestamp()),
                created_ts=now, **fields,
            )
    except IntegrityError:
        contact = Contact.objects.using(DB).filter(details_key=key).first()
        if contact is None:
            raise
    return contact_entity(contact)


def get_contact(contact_id: str) -> dict:
    contact = Contact.objects.using(DB).filter(pk=contact_id).first()
    if contact is None:
        raise _not_found()
    return contact_entity(contact)


def list_contacts(*, params: dict, count: int = 10, skip: int = 0) -> dict:
    """``GET /v1/contacts?[reference_id=&active=&type=]`` (NOTES §2.2; docs
    ``api/x/contacts/fetch-all``): newest first, ``{"entity": "collection", "count": N,
    "items": [...]}``."""
    rows = Contact.objects.using(DB).order_by("-created_ts", "-id")
    for name in ("reference_id", "type"):
        if params.get(name) is not None:
            rows = rows.filter(**{name: params[name]})
    if params.get("active") is not None:
        rows = rows.filter(active=params["active"] in ("1", "true"))
    items = [contact_entity(c) for c in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


# --- fund accounts --------------------------------------------------------------------


def fund_account_entity(fund_account: FundAccount) -> dict:
    """The fund account entity (``webhook_payout_processed_upi.json`` ``fund_account``;
    bank accounts as docs ``api/x/fund-accounts/create/bank-account``)."""
    entity = {
        "id": fund_account.id,
        "entity": "fund_account",
        "contact_id": fund_account.contact_id,
        "account_type": fund_account.account_type,
        "batch_id": None,
    }
    details = fund_account.details
    if fund_account.account_type == "vpa":
        username, _, handle = details["address"].partition("@")
        entity["vpa"] = {"username": username, "handle": handle, "address": details["address"]}
    else:
        entity["bank_account"] = {
            "ifsc": details["ifsc"],
            "bank_name": BANK_NAMES.get(details["ifsc"][:4], "Sandbox Bank"),
            "name": details["name"],
            "notes": [],
            "account_number": details["account_number"],
        }
    entity["active"] = fund_account.active
    entity["created_at"] = fund_account.created_at
    return entity


def _validate_fund_account(data) -> dict:
    """Check a create-fund-account body (NOTES §2.3): ``bank_account{name 3-120, ifsc 11
    characters (``AAAA0XXXXXX``), account_number 5-35 alphanumerics}`` or
    ``vpa{address 3-100, user@handle}``."""
    data = _object(data)
    _no_extra_fields(data, FUND_ACCOUNT_FIELDS)
    contact_id = data.get("contact_id")
    if not contact_id:
        raise x_error("The contact id field is required.", "contact_id")
    if not isinstance(contact_id, str):
        raise _not_found("contact_id")
    account_type = data.get("account_type")
    if account_type is None:
        raise x_error("The account type field is required.", "account_type")
    if account_type not in MODES:
        raise x_error(f"Invalid account type: {account_type}", "account_type")
    other = "vpa" if account_type == "bank_account" else "bank_account"
    if data.get(other) is not None:
        raise x_error(f"{other} is/are not required and should not be sent", other,
                      reason="extra_field_sent")
    section = data.get(account_type)
    if not isinstance(section, dict):
        raise x_error(f"The {account_type.replace('_', ' ')} field is required when account "
                      f"type is {account_type}.", account_type)
    if account_type == "vpa":
        _no_extra_fields(section, {"address"})
        address = section.get("address")
        if not isinstance(address, str) or not 3 <= len(address) <= 100 or not VPA.fullmatch(
            address
        ):
            raise x_error("Invalid VPA. Please enter a valid Virtual Payment Address",
                          "vpa.address")
        details = {"address": address}
    else:
        _no_extra_fields(section, {"name", "ifsc", "account_number"})
        name = section.get("name")
        if not isinstance(name, str) or not 3 <= len(name) <= 120:
            raise x_error("The bank_account.name must be between 3 and 120 characters.",
                          "bank_account.name")
        ifsc = section.get("ifsc")
        if not isinstance(ifsc, str) or len(ifsc) != 11:
            raise x_error("The bank_account.ifsc must be 11 characters.", "bank_account.ifsc")
        if not IFSC.fullmatch(ifsc):
            raise x_error("Invalid IFSC Code in Bank Account", "bank_account.ifsc")
        number = section.get("account_number")
        if not isinstance(number, str) or not BANK_ACCOUNT_NUMBER.fullmatch(number):
            raise x_error("The bank_account.account_number must be between 5 and 35 "
                          "alphanumeric characters.", "bank_account.account_number")
        details = {"name": name, "ifsc": ifsc, "account_number": number}
    return {"contact_id": contact_id, "account_type": account_type, "details": details}


def create_fund_account(*, data) -> dict:
    """``POST /v1/fund_accounts``: create a fund account under an existing contact, or return
    the existing one with identical details under that contact (NOTES §2.3). Returns the
    fund account entity; raises ``RazorpayError`` (unknown contact: "The id provided does not
    exist")."""
    fields = _validate_fund_account(data)
    if not Contact.objects.using(DB).filter(pk=fields["contact_id"]).exists():
        raise _not_found("contact_id")
    key = _sha256([fields["contact_id"], fields["account_type"], fields["details"]])
    now = timezone.now()
    try:
        with transaction.atomic(using=DB):
            fund_account = FundAccount.objects.using(DB).create(
                id=new_id("fa_"), details_key=key, created_at=int(now.timestamp()),
                created_ts=now, **fields,
            )
    except IntegrityError:
        fund_account = FundAccount.objects.using(DB).filter(details_key=key).first()
        if fund_account is None:
            raise
    return fund_account_entity(fund_account)


def list_fund_accounts(*, params: dict, count: int = 10, skip: int = 0) -> dict:
    """``GET /v1/fund_accounts?[contact_id=&account_type=]`` (docs
    ``api/x/fund-accounts/fetch-all``): newest first, ``{"entity": "collection",
    "count": N, "items": [...]}``."""
    rows = FundAccount.objects.using(DB).order_by("-created_ts", "-id")
    for name in ("contact_id", "account_type"):
        if params.get(name) is not None:
            rows = rows.filter(**{name: params[name]})
    items = [fund_account_entity(f) for f in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def get_fund_account(fund_account_id: str) -> dict:
    fund_account = FundAccount.objects.using(DB).filter(pk=fund_account_id).first()
    if fund_account is None:
        raise _not_found()
    return fund_account_entity(fund_account)


# --- payout entity --------------------------------------------------------------------


def payout_entity(payout: Payout, *, with_fund_account: bool = False) -> dict:
    """The payout entity (NOTES §2.4). Keys: the union of the reference payloads'
    (``api_create_payout_response_queued.json``, ``webhook_payout_processed_upi.json``,
    ``webhook_payout_reversed_imps.json``); ``fund_account`` embedded in webhooks only.
    ``failure_reason`` and ``error`` are the deprecated mirrors of ``status_details``."""
    entity = {"id": payout.id, "entity": "payout", "fund_account_id": payout.fund_account_id}
    if with_fund_account:
        entity["fund_account"] = fund_account_entity(payout.fund_account)
    problem = payout.status in ("failed", "reversed")
    entity.update({
        "amount": payout.amount,
        "currency": payout.currency,
        "notes": payout.notes,
        "fees": payout.fees,
        "tax": payout.tax,
        "status": payout.status,
        "purpose": payout.purpose,
        "utr": payout.utr,
        "mode": payout.mode,
        "reference_id": payout.reference_id,
        "narration": payout.narration,
        "debit_account_number": payout.debit_account_number,
        "batch_id": None,
        "failure_reason": payout.status_description if problem else None,
        "status_details": {
            "reason": payout.status_reason,
            "description": payout.status_description,
            "source": payout.status_source,
        },
        "created_at": payout.created_at,
        "fee_type": "",
        "error": {
            "source": payout.status_source if problem else None,
            "reason": payout.status_reason if problem else None,
            "description": payout.status_description if problem else None,
            "code": "BAD_REQUEST_ERROR" if problem else "NA",
            "step": "NA",
            "metadata": {},
        },
    })
    return entity


def fee_and_tax(mode: str) -> tuple[int, int]:
    """Sandbox fee schedule in paise: ``(fees including tax, tax)``, flat per mode plus 18 %
    GST; IMPS -> (590, 90) as in the docs samples."""
    base = BASE_FEE[mode]
    tax = (base * GST_PERCENT + 50) // 100
    return base + tax, tax


def _utr(mode: str) -> str:
    """A synthetic UTR (NOTES §2.7): 12 digits (an RRN) for IMPS/UPI, a bank-style
    ``SBXBN`` + 11 digits for NEFT/RTGS (docs example ``HDFCN00000000001``)."""
    if mode in ("IMPS", "UPI"):
        return _digits(12)
    return "SBXB" + ("N" if mode == "NEFT" else "R") + _digits(11)


# --- creating payouts -----------------------------------------------------------------


def check_idempotency_key(key: str | None) -> str:
    """Validate the ``X-Payout-Idempotency`` header value (NOTES §2.5): missing -> the
    documented 400 body (``reason`` the string ``"null"``); not 4-36 characters of
    ``[A-Za-z0-9-_ ]`` -> 400 (sandbox wording, same shape)."""
    if not key:
        raise RazorpayError(
            "Idempotency key is missing. Include idempotency header and key in the request.",
            field=IDEMPOTENCY_HEADER, step=None, reason="null",
        )
    if not IDEMPOTENCY_KEY.fullmatch(key):
        raise RazorpayError(
            "Idempotency key is invalid. It must be 4 to 36 characters long and can contain "
            "only alphabets, numbers, hyphens, underscores and spaces.",
            field=IDEMPOTENCY_HEADER, step=None, reason="null",
        )
    return key


def _validate_payout(data) -> dict:
    """Check a create-payout body (NOTES §2.4). Returns the fields plus ``fund_account``."""
    data = _object(data)
    _no_extra_fields(data, PAYOUT_FIELDS)
    ours = data.get("account_number")
    if ours is None or ours == "":
        raise x_error("The account number field is required.", "account_number")
    if not isinstance(ours, str | int) or isinstance(ours, bool) or str(ours) != account_number():
        raise x_error("The RazorpayX Account number is invalid", "account_number")
    fund_account_id = data.get("fund_account_id")
    if not fund_account_id:
        raise x_error("The fund account id field is required.", "fund_account_id")
    fund_account = None
    if isinstance(fund_account_id, str):
        fund_account = (FundAccount.objects.using(DB).select_related("contact")
                        .filter(pk=fund_account_id).first())
    if fund_account is None:
        raise _not_found("fund_account_id")
    if "amount" not in data:
        raise x_error("The amount field is required.", "amount")
    amount = data["amount"]
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise x_error("The amount must be an integer.", "amount")
    if amount < MIN_AMOUNT:
        raise x_error("The amount must be at least INR 1.00", "amount")
    currency = data.get("currency")
    if currency is None:
        raise x_error("The currency field is required.", "currency")
    if currency != "INR":
        raise x_error("Currency is not supported", "currency")
    mode = data.get("mode")
    if mode is None:
        raise x_error("The mode field is required.", "mode")
    if not isinstance(mode, str) or mode not in MODE_LIMITS:
        raise x_error(f"Invalid mode: {mode}", "mode")  # modes are case-sensitive
    if mode not in MODES[fund_account.account_type]:
        raise x_error(f"{mode} is not a valid mode for a fund account of type "
                      f"{fund_account.account_type}", "mode")
    low, high = MODE_LIMITS[mode]
    if amount < low:
        raise x_error(f"The amount must be at least INR {low // 100:,}.00 for {mode}", "amount")
    if high is not None and amount > high:
        raise x_error(f"The amount may not be greater than INR {high // 100:,}.00 for {mode}",
                      "amount")
    purpose = data.get("purpose")
    if purpose is None:
        raise x_error("The purpose field is required.", "purpose")
    if purpose not in PURPOSES:
        raise x_error(f"Invalid purpose: {purpose}", "purpose")
    queue = data.get("queue_if_low_balance", False)
    if not isinstance(queue, bool):
        raise x_error("The queue if low balance field must be true or false.",
                      "queue_if_low_balance")
    reference_id = _optional_str(data, "reference_id", "reference id", MAX_REFERENCE_ID)
    narration = data.get("narration")
    if narration is not None:
        if not isinstance(narration, str):
            raise x_error("The narration must be a string.", "narration")
        if len(narration) > 30:
            raise x_error("The narration may not be greater than 30 characters.", "narration")
        if not NARRATION.fullmatch(narration):
            raise x_error("The narration format is invalid.", "narration")
    return {
        "fund_account": fund_account, "amount": amount, "currency": currency, "mode": mode,
        "purpose": purpose, "queue_if_low_balance": queue, "reference_id": reference_id,
        "narration": narration, "notes": _notes(data),
    }


def _settle_delay_s() -> float:
    override = faults.take("razorpayx.settle_delay")
    if override is not None and "seconds" in override:
        return float(override["seconds"])
    return float(getattr(settings, "SANDBOX_PAYOUT_SETTLE_S", 1.0))


def _take_faults() -> dict:
    """Fault switches of one payout, taken once at create (see the module docstring)."""
    flags: dict = {"settle_s": _settle_delay_s()}
    if faults.take("razorpayx.payout_stuck_processing") is not None:
        flags["stuck"] = True
    reverse = faults.take("razorpayx.processed_then_reversed")
    if reverse is not None:
        flags["reverse"] = {"after_s": float(reverse.get("after_s", 1.0)),
                            "reason": reverse.get("reason", DEFAULT_REVERSE_REASON)}
    fail = faults.take("razorpayx.fail_payout")
    if fail is not None:
        flags["fail"] = {"reason": fail.get("reason", DEFAULT_FAIL_REASON)}
    if faults.take("razorpayx.create_5xx_after_create") is not None:
        flags["create_5xx"] = True
    early = faults.take("razorpayx.webhook_before_create_returns")
    if early is not None:
        flags["webhook_first"] = {"timeout_s": float(early.get("timeout_s", 10.0))}
    duplicate = faults.take("razorpayx.webhook_duplicate")
    if duplicate is not None:
        flags["duplicate"] = {"copies": int(duplicate.get("copies", 3)),
                              "concurrent": bool(duplicate.get("concurrent", False))}
    if faults.take("razorpayx.webhook_reorder") is not None:
        flags["reorder"] = True
    if faults.take("razorpayx.webhook_lose") is not None:
        flags["lose"] = True
    silent = faults.take("razorpayx.reversal_statement_only")
    if silent is not None:
        flags["reverse"] = {"after_s": float(silent.get("after_s", 1.0)),
                            "reason": silent.get("reason", DEFAULT_REVERSE_REASON),
                            "silent": True}
    fee = faults.take("razorpayx.statement_fee_mismatch")
    if fee is not None:
        flags["statement_fee"] = {"fees_extra": int(fee.get("fees_extra", 100)),
                                  "tax_extra": int(fee.get("tax_extra", 0))}
    utr = faults.take("razorpayx.statement_utr_mismatch")
    if utr is not None:
        flags["statement_utr"] = {"utr": str(utr.get("utr") or "")}
    if faults.take("razorpayx.statement_omit_payout") is not None:
        flags["statement_omit"] = True
    return flags


def _account_failure(fund_account: FundAccount) -> str | None:
    """The reason every payout to this beneficiary account fails with, as the sandbox's
    "bank" was told (``ValidationAccount.payout_failure``, sandbox/razorpay/validations.py),
    or None."""
    key = fund_account.details.get("address") or fund_account.details.get("account_number")
    return (ValidationAccount.objects.using(DB).filter(pk=key)
            .values_list("payout_failure", flat=True).first())


def claim_key(model, key: str, request_hash: str, entity: str, in_progress):
    """Claim idempotency ``key`` for this request in ``model`` (a key table whose row has
    ``in_flight``, ``created_ts`` and a nullable foreign key ``entity``: the payout or
    refund it made), committed at once. Returns None when claimed now, or the existing
    claim of an earlier request. An in-flight claim that never got its entity and is
    older than ``IN_FLIGHT_LEASE`` (its request died) is taken over. Raises
    ``in_progress()`` after three lost races. Payouts and refunds share it."""
    rows = model.objects.using(DB)
    for _ in range(3):
        try:
            with transaction.atomic(using=DB):
                rows.create(key=key, request_hash=request_hash, created_ts=timezone.now())
            return None
        except IntegrityError:
            existing = rows.filter(key=key).first()
            if existing is None:  # released meanwhile by a refused request
                continue
            if (existing.in_flight and getattr(existing, f"{entity}_id") is None
                    and existing.created_ts < timezone.now() - IN_FLIGHT_LEASE):
                rows.filter(key=key, in_flight=True, created_ts=existing.created_ts,
                            **{f"{entity}__isnull": True}).delete()
                continue
            return existing
    raise in_progress()


def _claim(key: str, request_hash: str) -> PayoutIdempotencyKey | None:
    return claim_key(PayoutIdempotencyKey, key, request_hash, "payout", _in_progress)


def _in_progress() -> RazorpayError:
    """409 for a key whose first request has not answered yet (NOTES §2.5, §7.1: undocumented
    for payouts; Route transfers answer 409)."""
    return x_error("Request failed because another payout operation with the same "
                   "Idempotency Key is in progress", IDEMPOTENCY_HEADER, status=409)


def _replay(existing: PayoutIdempotencyKey, request_hash: str) -> dict:
    """A later request with a known key (NOTES §2.5)."""
    abandoned = existing.created_ts < timezone.now() - IN_FLIGHT_LEASE
    if existing.in_flight and not (abandoned and existing.payout_id):
        raise _in_progress()
    if existing.request_hash != request_hash:
        raise x_error("Different request body sent for the same Idempotency Header",
                      IDEMPOTENCY_HEADER)
    return get_payout(existing.payout_id)


def create_payout(*, idempotency_key: str | None, data) -> JsonResponse:
    """``POST /v1/payouts`` (NOTES §2.4, §2.5): create a payout of ``data["amount"]`` paise
    to ``data["fund_account_id"]``, status ``processing`` with fees/tax set, webhook
    ``payout.initiated`` queued, settle scheduled. ``idempotency_key``: the
    ``X-Payout-Idempotency`` header. Replays, 409 and 400 as in the module docstring.
    Returns the HTTP response (200 with the payout entity, or 500 under
    ``razorpayx.create_5xx_after_create``); raises ``RazorpayError``."""
    key = check_idempotency_key(idempotency_key)
    data = _object(data)
    request_hash = _sha256(data)
    existing = _claim(key, request_hash)
    if existing is not None:
        return JsonResponse(_replay(existing, request_hash))
    created = False
    try:
        fields = _validate_payout(data)
        fund_account = fields.pop("fund_account")
        now = timezone.now()
        fees, tax = fee_and_tax(fields["mode"])
        with transaction.atomic(using=DB):
            flags = _take_faults()
            failure = _account_failure(fund_account)
            if failure and "fail" not in flags:
                flags["fail"] = {"reason": failure}
            payout = Payout(
                id=new_id("pout_"), fund_account=fund_account, idempotency_key=key,
                status="processing", fees=fees, tax=tax,
                debit_account_number=account_number(), faults=flags,
                created_at=int(now.timestamp()), created_ts=now, **fields,
            )
            if not flags.get("webhook_first"):
                payout.next_step = "settle"
                payout.next_step_ts = now + timedelta(seconds=flags["settle_s"])
            payout.save(using=DB, force_insert=True)
            statement.debit_payout(payout, now)
            PayoutIdempotencyKey.objects.using(DB).filter(key=key).update(payout=payout)
            answer = payout_entity(payout)
            _queue(payout, ["payout.initiated"])
            if flags.get("webhook_first"):
                _settle(payout, now)
                payout.save(using=DB)
        created = True
        if flags.get("webhook_first"):
            _wait_for_terminal_webhook(payout, flags["webhook_first"]["timeout_s"])
    finally:
        claims = PayoutIdempotencyKey.objects.using(DB).filter(key=key, in_flight=True)
        if not created:
            claims.delete()  # refused or crashed before creating: the key stays free
        else:
            claims.update(in_flight=False)
    if flags.get("create_5xx"):
        return JsonResponse(SERVER_ERROR, status=500)
    return JsonResponse(answer)


def _wait_for_terminal_webhook(payout: Payout, timeout_s: float) -> None:
    """Block until the merchant answered the first delivery attempt of the payout's
    ``payout.processed`` / ``payout.failed`` / ``payout.reversed`` event, or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    names = ["payout.processed", "payout.failed", "payout.reversed"]
    while time.monotonic() < deadline:
        if WebhookDelivery.objects.using(DB).filter(
            event__entity_id=payout.id, event__event__in=names, attempts__gt=0
        ).exists():
            return
        time.sleep(0.02)


# --- reading --------------------------------------------------------------------------


def get_payout(payout_id: str) -> dict:
    """``GET /v1/payouts/:id``: the payout in its latest state (also the replay of a
    create; the read fault is taken by ``fetch_payout`` only)."""
    payout = Payout.objects.using(DB).filter(pk=payout_id).first()
    if payout is None:
        raise _not_found()
    return payout_entity(payout)


def fetch_payout(payout_id: str) -> dict:
    """The ``GET /v1/payouts/:id`` endpoint: ``get_payout`` behind the read fault."""
    if faults.take("razorpayx.payout_fetch_5xx") is not None:
        raise server_error()
    return get_payout(payout_id)


def list_payouts(*, params: dict, count: int = 10, skip: int = 0) -> dict:
    """``GET /v1/payouts?account_number=<ours>[&reference_id=&fund_account_id=&contact_id=
    &mode=&status=&from=&to=]`` (NOTES §2.9; docs ``api/x/payouts/fetch-all``): newest
    first, ``{"entity": "collection", "count": N, "items": [...]}``. ``reference_id`` is not
    unique: several payouts can match."""
    ours = params.get("account_number")
    if not ours:
        raise x_error("The account number field is required.", "account_number")
    if ours != account_number():
        raise x_error("The RazorpayX Account number is invalid", "account_number")
    rows = Payout.objects.using(DB).order_by("-created_ts", "-id")
    lag = faults.peek("razorpayx.list_lag")
    if lag is not None:
        rows = rows.filter(created_ts__lte=timezone.now()
                           - timedelta(seconds=float(lag.get("seconds", 300))))
    for name, column in (("reference_id", "reference_id"), ("fund_account_id",
                         "fund_account_id"), ("contact_id", "fund_account__contact_id"),
                         ("mode", "mode"), ("status", "status")):
        if params.get(name) is not None:
            rows = rows.filter(**{column: params[name]})
    for name, lookup in (("from", "created_at__gte"), ("to", "created_at__lte")):
        value = params.get(name)
        if value is not None:
            if not value.isdigit():
                raise x_error(f"The {name} must be an integer.", name)
            rows = rows.filter(**{lookup: int(value)})
    items = [payout_entity(p) for p in rows[skip : skip + count]]
    return {"entity": "collection", "count": len(items), "items": items}


def describe(payout: Payout) -> dict:
    """One row of the sandbox-only ``GET /razorpay/sandbox/payouts``."""
    details = payout.fund_account.details
    return {
        "id": payout.id,
        "reference_id": payout.reference_id,
        "idempotency_key": payout.idempotency_key,
        "amount": payout.amount,
        "currency": payout.currency,
        "mode": payout.mode,
        "status": payout.status,
        "utr": payout.utr,
        "fees": payout.fees,
        "tax": payout.tax,
        "status_details": {"reason": payout.status_reason,
                           "description": payout.status_description,
                           "source": payout.status_source},
        "fund_account_id": payout.fund_account_id,
        "contact_id": payout.fund_account.contact_id,
        "beneficiary": details.get("address")
        or f"{details.get('ifsc')}/{details.get('account_number')}",
        "faults": payout.faults,
        "created_at": payout.created_at,
        "created": payout.created_ts.isoformat(),
        "next_step": payout.next_step or None,
        "next_step_at": payout.next_step_ts.isoformat() if payout.next_step_ts else None,
    }


def sandbox_listing(*, reference_id=None, status=None, idempotency_key=None,
                    fund_account_id=None) -> list[dict]:
    """Every payout, oldest first (``GET /razorpay/sandbox/payouts``), optionally filtered."""
    rows = Payout.objects.using(DB).select_related("fund_account").order_by("created_ts", "id")
    if fund_account_id is not None:
        rows = rows.filter(fund_account_id=fund_account_id)
    if reference_id is not None:
        rows = rows.filter(reference_id=reference_id)
    if status is not None:
        rows = rows.filter(status=status)
    if idempotency_key is not None:
        rows = rows.filter(idempotency_key=idempotency_key)
    return [describe(p) for p in rows]


# --- life cycle -----------------------------------------------------------------------


def _last_delivery(payout: Payout) -> WebhookDelivery | None:
    return (WebhookDelivery.objects.using(DB)
            .filter(event__entity_id=payout.id, kind="original").order_by("-id").first())


def _payload(payout: Payout, name: str) -> dict:
    if name == "transaction.created":
        return {"transaction": {"entity": statement.reversal_entity(payout)}}
    return {"payout": {"entity": payout_entity(payout, with_fund_account=True)}}


def _queue(payout: Payout, names: list[str], *, held: list | None = None) -> None:
    """Queue ``names`` (payload from the payout as it is now), then any ``held`` events
    (``[[name, payload], ...]``), after the payout's earlier events (first attempts in
    order), with the payout's webhook faults. Inside the caller's transaction."""
    flags = payout.faults
    duplicate = flags.get("duplicate") or {}
    events = [(name, _payload(payout, name)) for name in names]
    events += [(name, payload) for name, payload in held or []]
    webhooks.enqueue(
        target="payouts", entity_id=payout.id, events=events,
        lost=bool(flags.get("lose")), copies=int(duplicate.get("copies", 1)),
        concurrent=bool(duplicate.get("concurrent", False)), after=_last_delivery(payout),
    )


def _set_details(payout: Payout, reason, source, description) -> None:
    payout.status_reason, payout.status_source, payout.status_description = (
        reason, source, description)


def _reason(reason: str) -> tuple[str, str, str]:
    source, description = REASONS.get(reason, ("beneficiary_bank", reason.replace("_", " ")))
    return reason, source, description


def _process(payout: Payout, now, *, hold: bool = False) -> None:
    """-> ``processed`` with a UTR; ``payout.updated`` (UTR arrival) + ``payout.processed``
    queued, or kept in ``held_events`` when ``hold``."""
    payout.status = "processed"
    payout.utr = payout.utr or _utr(payout.mode)
    payout.processed_ts = now
    _set_details(payout, *PROCESSED_DETAILS[:2], PROCESSED_DETAILS[2])
    names = ["payout.updated", "payout.processed"]
    if hold:
        payout.held_events = [[name, _payload(payout, name)] for name in names]
    else:
        _queue(payout, names)


def _fail(payout: Payout, now, reason: str) -> None:
    """-> ``failed`` with ``status_details`` of ``reason``; ``payout.failed`` queued."""
    payout.status = "failed"
    payout.failed_ts = now
    _set_details(payout, *_reason(reason))
    statement.credit_reversal(payout, now)  # the debit comes back, without a webhook
    _queue(payout, ["payout.failed"])


def _reverse(payout: Payout, now, reason: str) -> None:
    """-> ``reversed`` (UTR kept, NOTES §2.7) with its reversal credit in the statement;
    ``payout.reversed`` + ``transaction.created`` (that credit) queued, then any held
    events. A ``silent`` reversal (fault ``razorpayx.reversal_statement_only``) queues only
    the held events."""
    payout.status = "reversed"
    payout.reversed_ts = now
    _set_details(payout, *_reason(reason))
    statement.credit_reversal(payout, now)
    held, payout.held_events = payout.held_events, []
    silent = bool((payout.faults.get("reverse") or {}).get("silent"))
    names = [] if silent else ["payout.reversed", "transaction.created"]
    if names or held:
        _queue(payout, names, held=held)


def _settle(payout: Payout, now) -> None:
    """The settle step of a ``processing`` payout, as its faults say."""
    flags = payout.faults
    payout.next_step, payout.next_step_ts = "", None
    if flags.get("stuck"):
        _set_details(payout, PENDING_DETAILS[0], PENDING_DETAILS[1], PENDING_DETAILS[2])
        _queue(payout, ["payout.updated"])
        return
    if flags.get("fail"):
        _fail(payout, now, flags["fail"]["reason"])
        return
    reverse = flags.get("reverse")
    _process(payout, now, hold=bool(reverse and flags.get("reorder")))
    if reverse:
        payout.next_step = "reverse"
        payout.next_step_ts = now + timedelta(seconds=reverse["after_s"])


def advance_due() -> int:
    """Apply every due ``next_step`` (background loop). Each payout is locked
    (``SKIP LOCKED``) and moved in its own transaction with its webhooks. Returns how many
    steps ran."""
    done = 0
    while True:
        now = timezone.now()
        with transaction.atomic(using=DB):
            payout = (Payout.objects.using(DB).select_for_update(skip_locked=True, of=("self",))
                      .select_related("fund_account").filter(next_step_ts__lte=now)
                      .order_by("next_step_ts").first())
            if payout is None:
                return done
            step = payout.next_step
            if step == "settle" and payout.status == "processing":
                _settle(payout, now)
            elif step == "reverse" and payout.status == "processed":
                payout.next_step, payout.next_step_ts = "", None
                _reverse(payout, now, payout.faults["reverse"]["reason"])
            else:  # moved by hand meanwhile
                payout.next_step, payout.next_step_ts = "", None
            payout.save(using=DB)
            done += 1


SETTLE_FROM = {
    "processed": {"processing"},
    "failed": {"processing"},
    "reversed": {"processing", "processed"},
}


def settle(*, payout_id: str, data) -> dict:
    """``POST /razorpay/sandbox/payouts/{id}/settle {"status": "processed"|"failed"|
    "reversed", "reason": <status_details.reason>}`` (sandbox only): move a payout by hand,
    as in the test-mode dashboard (NOTES §4.1), with the same webhooks as the automatic
    moves. Allowed: processing -> processed | failed | reversed; processed -> reversed.
    Cancels any scheduled automatic step. Returns the payout entity; raises
    ``RazorpayError`` (unknown id, bad status, move not allowed)."""
    data = data if isinstance(data, dict) else {}
    target = data.get("status")
    if target not in SETTLE_FROM:
        raise x_error("status must be processed, failed or reversed (sandbox)", "status")
    reason = data.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise x_error("reason must be a string (sandbox)", "reason")
    with transaction.atomic(using=DB):
        payout = (Payout.objects.using(DB).select_for_update(of=("self",))
                  .select_related("fund_account").filter(pk=payout_id).first())
        if payout is None:
            raise _not_found()
        if payout.status not in SETTLE_FROM[target]:
            raise x_error(f"Payout cannot be moved from {payout.status} to {target} (sandbox)",
                          "status")
        now = timezone.now()
        payout.next_step, payout.next_step_ts = "", None
        if target == "processed":
            _process(payout, now)
        elif target == "failed":
            _fail(payout, now, reason or DEFAULT_FAIL_REASON)
        else:
            _reverse(payout, now, reason or DEFAULT_REVERSE_REASON)
        payout.save(using=DB)
    return payout_entity(payout)


def reset() -> None:
    """Empty the RazorpayX tables (statement and account, idempotency keys, payouts, fund
    account validations and the validation accounts, fund accounts, contacts) and the
    RazorpayX webhooks (target ``payouts``) of the shared outbox."""
    with transaction.atomic(using=DB):
        WebhookDelivery.objects.using(DB).filter(event__target="payouts").delete()
        WebhookEvent.objects.using(DB).filter(target="payouts").delete()
        statement.reset()
        FundAccountValidation.objects.using(DB).all().delete()
        ValidationAccount.objects.using(DB).all().delete()
        PayoutIdempotencyKey.objects.using(DB).all().delete()
        Payout.objects.using(DB).all().delete()
        FundAccount.objects.using(DB).all().delete()
        Contact.objects.using(DB).all().delete()
