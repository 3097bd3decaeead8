"""RazorpayX Fund Account Validation stand-in: penny drop for bank accounts, VPA check for
UPI (TREASURY §6; docs ``api/x/account-validation/bank-account``,
``api/x/composite-account-validation/*``, ``webhooks/account-validation``).

Two request forms of ``POST /v1/fund_accounts/validations`` (TREASURY §6.2):

1. an existing fund account: ``{"account_number": <ours>, "fund_account": {"id": "fa_..."},
   "amount": 100, "currency": "INR", "notes": {...}}``; ``amount`` (paise, fees
   excluded) defaults to 100 and must be at least 100, ``currency`` defaults to INR;
   answered with shape 1 (``results``), as ``webhook_fund_account_validation_completed.json``;
2. composite: ``{"source_account_number": <ours>, "validation_type": "pennydrop",
   "reference_id": ..., "notes": {...}, "fund_account": {"account_type": "bank_account" |
   "vpa", "bank_account": {...} | "vpa": {...}, "contact": {<create-contact body>}}}``:
   the contact and fund account are created (or found) as ``POST /v1/contacts`` and
   ``POST /v1/fund_accounts`` would, then validated; answered with shape 2
   (``validation_results``, ``status_details``, ``reference_id``). ``upi_intent``
   (reverse penny drop) is not modelled.

Life cycle: ``created`` -> ``completed`` (the check ran: ``account_status`` ``active`` with a
``registered_name``, or ``invalid`` with nulls, FAQ Q13) | ``failed`` (technical failure;
results carry empty strings, as the failed sample). An ending queues
``fund_account.validation.completed`` / ``.failed`` to the RazorpayX webhook URL
(``{SANDBOX_WEBHOOK_URL}/payouts``, signed like the payout webhooks), payload
``{"fund_account.validation": {"entity": <entity in its form>}}``.

What the "bank" answers is chosen per beneficiary account, not by fault switches (a
validation is a lookup of one account, and tests running side by side must not see each
other's choice): ``POST /razorpay/sandbox/fund_accounts/validations/accounts`` with
``{"account_number": ...} | {"vpa": ...}`` and ``registered_name`` (null: derived),
``account_status`` (``active`` | ``invalid``), ``status`` (``completed`` | ``failed``),
``pending_s`` (seconds spent ``created`` first; 0: the create answers the ending at once, as
"most complete instantly", FAQ Q9), ``payout_failure`` (a ``status_details`` reason: every
payout to the account fails with it at settle time, an account that validates and then
refuses the credit). Without a row: ``active``, at once, registered name =
the bank account's holder name, or the contact's name for a VPA.

Fees: the docs say every validation is charged and the charge reversed when ``failed``,
but neither the entity samples nor the webhook sample carry a fee field, so the entity
carries none (TREASURY §6.1, §9.2). ``utr``: the bank reference of the penny credit,
set for a bank account that took the credit (``active``); null for a VPA check (no
money moves; inference) and for an invalid or failed one.

``name_match_score`` (0-100): the sandbox's own similarity of the registered name with the
name we gave (holder name, else contact name), difflib over upper-cased words (inference:
Razorpay does not document its scoring).
"""

from __future__ import annotations

import difflib
import re
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from sandbox.razorpay import payouts, webhooks
from sandbox.razorpay.common import RazorpayError, new_id
from sandbox.razorpay.models import FundAccount, FundAccountValidation, ValidationAccount
from sandbox.razorpay.payouts import x_error

DB = "sandbox"
DEFAULT_AMOUNT = 100  # paise (docs: default 100)
MAX_PENDING_S = 3 * 86400.0  # T+3 (FAQ Q9)
SHAPE1_FIELDS = {"account_number", "fund_account", "amount", "currency", "notes"}
COMPOSITE_FIELDS = {"source_account_number", "validation_type", "reference_id", "notes",
                    "fund_account"}
COMPOSITE_FUND_ACCOUNT_FIELDS = {"account_type", "bank_account", "vpa", "contact"}
ACCOUNT_FIELDS = {"account_number", "vpa", "registered_name", "account_status", "status",
                  "payout_failure",
                  "pending_s"}
DETAILS = {  # results.details (the active one quoted from the webhook sample)
    "active": "The beneficiary account is valid.",
    "invalid": "The beneficiary account is invalid.",
    "failed": "Validation failed at the beneficiary bank. Please retry.",
}
STATUS_DETAILS = {  # composite status_details (created/completed quoted from the docs)
    "created": ("validation_request_created", "internal", "Validation request is created"),
    "completed": ("validation_completed", "beneficiary_bank",
                  "Validation request is completed"),
    "failed": ("validation_failed", "beneficiary_bank", "Validation request has failed"),
}


def _object(value, field: str | None = None) -> dict:
    if not isinstance(value, dict):
        raise x_error(f"The {field or 'request body'} must be a JSON object.", field)
    return value


def _ours(value, field: str) -> None:
    if value is None or value == "":
        raise x_error(f"The {field.replace('_', ' ')} field is required.", field)
    if (not isinstance(value, str | int) or isinstance(value, bool)
            or str(value) != payouts.account_number()):
        raise x_error("The RazorpayX Account number is invalid", field)


def _amount(data: dict) -> int:
    amount = data.get("amount", DEFAULT_AMOUNT)
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise x_error("The amount must be an integer.", "amount")
    if amount < DEFAULT_AMOUNT:
        raise x_error("The amount must be at least INR 1.00", "amount")
    return amount


def _currency(data: dict) -> str:
    currency = data.get("currency", "INR")
    if currency != "INR":
        raise x_error("Currency is not supported", "currency")
    return currency


def _prefixed(exc: RazorpayError, prefix: str) -> RazorpayError:
    """A contact / fund account error of the composite body, its field under ``prefix``."""
    error = exc.body["error"]
    if error.get("field"):
        error["field"] = f"{prefix}.{error['field']}"
    return exc


def _shape1(data: dict) -> dict:
    payouts._no_extra_fields(data, SHAPE1_FIELDS)
    _ours(data.get("account_number"), "account_number")
    if data.get("fund_account") is None:
        raise x_error("The fund account field is required.", "fund_account")
    section = _object(data["fund_account"], "fund_account")
    payouts._no_extra_fields(section, {"id"})
    fund_account_id = section.get("id")
    if not fund_account_id:
        raise x_error("The fund account id field is required.", "fund_account.id")
    fund_account = None
    if isinstance(fund_account_id, str):
        fund_account = (FundAccount.objects.using(DB).select_related("contact")
                        .filter(pk=fund_account_id).first())
    if fund_account is None:
        raise x_error("The id provided does not exist", "fund_account.id")
    return {"form": "fund_account", "fund_account": fund_account, "amount": _amount(data),
            "currency": _currency(data), "notes": payouts._notes(data), "reference_id": None}


def _composite(data: dict) -> dict:
    payouts._no_extra_fields(data, COMPOSITE_FIELDS)
    _ours(data.get("source_account_number"), "source_account_number")
    kind = data.get("validation_type")
    if kind is None:
        raise x_error("The validation type field is required.", "validation_type")
    if kind == "upi_intent":
        raise x_error("validation_type upi_intent (reverse penny drop) is not supported by "
                      "the sandbox", "validation_type")
    if kind != "pennydrop":
        raise x_error(f"Invalid validation type: {kind}", "validation_type")
    reference_id = payouts._optional_str(data, "reference_id", "reference id",
                                         payouts.MAX_REFERENCE_ID)
    notes = payouts._notes(data)
    if data.get("fund_account") is None:
        raise x_error("The fund account field is required.", "fund_account")
    section = _object(data["fund_account"], "fund_account")
    payouts._no_extra_fields(section, COMPOSITE_FUND_ACCOUNT_FIELDS)
    if section.get("contact") is None:
        raise x_error("The fund account.contact field is required.", "fund_account.contact")
    _object(section["contact"], "fund_account.contact")
    account = {k: v for k, v in section.items() if k != "contact"}
    # Check the account before creating anything, so a refused body leaves no contact.
    try:
        payouts._validate_fund_account({"contact_id": "cont_check", **account})
        contact_id = payouts.create_contact(data=section["contact"])["id"]
    except RazorpayError as exc:
        raise _prefixed(exc, "fund_account") from None
    fund_account_id = payouts.create_fund_account(
        data={"contact_id": contact_id, **account})["id"]
    fund_account = (FundAccount.objects.using(DB).select_related("contact")
                    .get(pk=fund_account_id))
    return {"form": "composite", "fund_account": fund_account, "amount": DEFAULT_AMOUNT,
            "currency": "INR", "notes": notes, "reference_id": reference_id}


def _key(fund_account: FundAccount) -> str:
    details = fund_account.details
    return details.get("address") or details["account_number"]


def _given_name(fund_account: FundAccount) -> str:
    return fund_account.details.get("name") or fund_account.contact.name


def _outcome(fund_account: FundAccount) -> dict:
    """The bank's answer for this account (``ValidationAccount``, else the default)."""
    row = ValidationAccount.objects.using(DB).filter(pk=_key(fund_account)).first()
    if row is None:
        return {"status": "completed", "account_status": "active",
                "registered_name": _given_name(fund_account), "pending_s": 0.0}
    return {"status": row.status, "account_status": row.account_status,
            "registered_name": row.registered_name or _given_name(fund_account),
            "pending_s": row.pending_s}


def name_score(given: str, registered: str | None) -> int | None:
    """Sandbox ``name_match_score``: 0-100, difflib ratio of the upper-cased, sorted words."""
    if not registered:
        return None

    def words(name: str) -> str:
        return " ".join(sorted(re.findall(r"[A-Z0-9]+", name.upper())))

    return round(100 * difflib.SequenceMatcher(None, words(given), words(registered)).ratio())


def create_validation(*, data) -> dict:
    """``POST /v1/fund_accounts/validations``: validate a fund account (form 1) or create and
    validate one (composite), as the module docstring says. Returns the entity in its
    form's shape: ``created`` while the account's ``pending_s`` runs, else already ended
    with its webhook queued. Raises ``RazorpayError`` (400, Razorpay's error body)."""
    data = _object(data)
    composite = "source_account_number" in data or "validation_type" in data
    fields = _composite(data) if composite else _shape1(data)
    fund_account = fields["fund_account"]
    outcome = _outcome(fund_account)
    now = timezone.now()
    with transaction.atomic(using=DB):
        validation = FundAccountValidation(
            id=new_id("fav_"), account_number=payouts.account_number(), status="created",
            outcome=outcome, created_at=int(now.timestamp()), created_ts=now, **fields,
        )
        if outcome["pending_s"] > 0:
            validation.complete_ts = now + timedelta(seconds=outcome["pending_s"])
        else:
            _end(validation, now)
        validation.save(using=DB, force_insert=True)
    return entity(validation)


def get_validation(validation_id: str) -> dict:
    """``GET /v1/fund_accounts/validations/:id``: the validation in its latest state."""
    validation = (FundAccountValidation.objects.using(DB)
                  .select_related("fund_account__contact").filter(pk=validation_id).first())
    if validation is None:
        raise x_error("The id provided does not exist")
    return entity(validation)


def list_validations(*, params, count: int = 10, skip: int = 0) -> dict:
    """``GET /v1/fund_accounts/validations?account_number=<ours>[&count=&skip=]``: newest
    first, ``{"entity": "collection", "count": N, "items": [...]}``."""
    _ours(params.get("account_number"), "account_number")
    rows = (FundAccountValidation.objects.using(DB).select_related("fund_account__contact")
            .order_by("-created_ts", "-id")[skip : skip + count])
    items = [entity(v) for v in rows]
    return {"entity": "collection", "count": len(items), "items": items}


def _end(validation: FundAccountValidation, now) -> None:
    """End a ``created`` validation as its outcome says and queue its webhook (inside the
    caller's transaction; the caller saves)."""
    outcome = validation.outcome
    fund_account = validation.fund_account
    validation.complete_ts = None
    validation.completed_ts = now
    if outcome["status"] == "failed":
        validation.status = "failed"
        validation.account_status = validation.registered_name = ""
        validation.details = DETAILS["failed"]
        name = "fund_account.validation.failed"
    else:
        validation.status = "completed"
        validation.account_status = outcome["account_status"]
        validation.details = DETAILS[outcome["account_status"]]
        if outcome["account_status"] == "active":
            validation.registered_name = outcome["registered_name"]
            validation.name_match_score = name_score(_given_name(fund_account),
                                                     validation.registered_name)
            if fund_account.account_type == "bank_account":
                validation.utr = payouts._utr("IMPS")
        name = "fund_account.validation.completed"
    webhooks.enqueue(target="payouts", entity_id=validation.id,
                     events=[(name, {"fund_account.validation": {"entity": entity(validation)}})])


def advance_due() -> int:
    """End every ``created`` validation whose ``complete_ts`` has come (background loop),
    each locked (``SKIP LOCKED``) in its own transaction with its webhook."""
    done = 0
    while True:
        now = timezone.now()
        with transaction.atomic(using=DB):
            validation = (FundAccountValidation.objects.using(DB)
                          .select_for_update(skip_locked=True, of=("self",))
                          .select_related("fund_account__contact")
                          .filter(complete_ts__lte=now, status="created")
                          .order_by("complete_ts").first())
            if validation is None:
                return done
            _end(validation, now)
            validation.save(using=DB)
            done += 1


def _fund_account(validation: FundAccountValidation) -> dict:
    """The fund account as the validation samples embed it: the bank account without
    ``notes``; the composite form adds the contact."""
    shown = payouts.fund_account_entity(validation.fund_account)
    if "bank_account" in shown:
        shown["bank_account"] = {k: shown["bank_account"][k]
                                 for k in ("name", "bank_name", "ifsc", "account_number")}
    if validation.form == "composite":
        shown.pop("batch_id", None)
        shown["contact"] = payouts.contact_entity(validation.fund_account.contact)
    return shown


def entity(validation: FundAccountValidation) -> dict:
    """The validation entity. Shape 1 (keys in the order of
    ``webhook_fund_account_validation_completed.json``): ``results`` {``account_status``,
    ``registered_name``, ``details``, ``name_match_score``}, null while ``created``.
    Composite (docs ``api/x/composite-account-validation``): ``validation_results`` (with
    ``validated_account_type``), ``status_details``, ``reference_id``."""
    results = {
        "account_status": validation.account_status,
        "registered_name": validation.registered_name,
        "details": validation.details,
        "name_match_score": validation.name_match_score,
    }
    if validation.form == "composite":
        reason, source, description = STATUS_DETAILS[validation.status]
        return {
            "id": validation.id,
            "entity": "fund_account.validation",
            "status": validation.status,
            "utr": validation.utr,
            "validation_results": {**results, "validated_account_type":
                                   validation.fund_account.account_type},
            "status_details": {"description": description, "source": source,
                               "reason": reason},
            "reference_id": validation.reference_id,
            "notes": validation.notes,
            "fund_account": _fund_account(validation),
            "created_at": validation.created_at,
        }
    return {
        "id": validation.id,
        "entity": "fund_account.validation",
        "fund_account": _fund_account(validation),
        "status": validation.status,
        "amount": validation.amount,
        "currency": validation.currency,
        "notes": validation.notes,
        "results": results,
        "created_at": validation.created_at,
        "utr": validation.utr,
    }


def set_account(*, data) -> dict:
    """``POST /razorpay/sandbox/fund_accounts/validations/accounts`` (sandbox only): choose
    what validating one beneficiary account answers. Body: ``account_number`` (bank) or
    ``vpa`` (address), ``registered_name`` (string or null: derived), ``account_status``
    (``active`` | ``invalid``, default active), ``status`` (``completed`` | ``failed``,
    default completed), ``pending_s`` (0 to 259200 s, default 0). Applies to validations
    created from now on. Returns the row; raises ``RazorpayError``."""
    data = _object(data)
    payouts._no_extra_fields(data, ACCOUNT_FIELDS)
    number, vpa = data.get("account_number"), data.get("vpa")
    if (number is None) == (vpa is None):
        raise x_error("exactly one of account_number and vpa is required (sandbox)",
                      "account_number")
    key = number if vpa is None else vpa
    if not isinstance(key, str) or not key:
        raise x_error("account_number / vpa must be a non-empty string (sandbox)",
                      "vpa" if number is None else "account_number")
    name = data.get("registered_name")
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= 120):
        raise x_error("registered_name must be a string of 1 to 120 characters (sandbox)",
                      "registered_name")
    account_status = data.get("account_status", "active")
    if account_status not in ("active", "invalid"):
        raise x_error("account_status must be active or invalid (sandbox)", "account_status")
    status = data.get("status", "completed")
    if status not in ("completed", "failed"):
        raise x_error("status must be completed or failed (sandbox)", "status")
    pending_s = data.get("pending_s", 0)
    if (isinstance(pending_s, bool) or not isinstance(pending_s, int | float)
            or not 0 <= pending_s <= MAX_PENDING_S):
        raise x_error(f"pending_s must be a number from 0 to {MAX_PENDING_S:g} (sandbox)",
                      "pending_s")
    payout_failure = data.get("payout_failure")
    if payout_failure is not None and payout_failure not in payouts.REASONS:
        raise x_error("payout_failure must be null or a status_details reason (sandbox)",
                      "payout_failure")
    row, _ = ValidationAccount.objects.using(DB).update_or_create(
        key=key, defaults={"registered_name": name, "account_status": account_status,
                           "status": status, "pending_s": float(pending_s),
                           "payout_failure": payout_failure, "created_ts": timezone.now()})
    return {"key": row.key, "registered_name": row.registered_name,
            "account_status": row.account_status, "status": row.status,
            "pending_s": row.pending_s, "payout_failure": row.payout_failure}

