"""Customers and KYC behind the Anchor Platform: SEP-12 through AP's callbacks
``GET /customer``, ``PUT /customer`` and ``DELETE /customer/{id}`` (AP callback API,
``bundled-callbacks.yaml``; anchor-platform SEP31-RECEIVE.md §5), and the operators'
decisions.

Identity (SEP-12 "Customer PUT", SEP31-RECEIVE.md §5.2): Corridor assigns the ``id``
(``cus_…``); without one a customer is (``account``, ``memo``, ``memo_type``, ``type``),
the SEP-10 account being the sending anchor's (SEP-31) or the wallet user's (SEP-24). An
``id`` that is unknown, deleted, or registered by another ``account`` is a 404 (SEP-12:
"404 ... if the id is not found"; AP 4.4.0 #1946 closed the cross-account read). A
``sep31-*`` PUT with neither ``id`` nor ``memo`` is refused: keyed on the account alone
it would overwrite the sending anchor's previous customer.

Fields: only the SEP-9 names AP forwards (``PutCustomerRequest``); another name is a 400
naming it. Text values are strings without control characters, at most 256 characters
(``address`` 512); formats checked here, each failure a 400 naming the field:

- ``birth_date``, ``id_issue_date``, ``id_expiration_date``: ISO dates (YYYY-MM-DD);
- ``email_address``: an e-mail address; ``mobile_number``: E.164 (``+919876543210``);
- country codes: ISO 3166-1 alpha-3 as SEP-9 says, or alpha-2 as AP's own tests send;
- ``tax_id`` with ``tax_id_name`` ``PAN``: the Indian PAN, ``AAAAA9999A``;
- ``bank_number``: the IFSC, ``AAAA0XXXXXX`` (4 letters, a zero, 6 letters or digits);
- ``bank_account_number``: 9 to 18 digits, or a UPI VPA (``name@bank``), in which case
  no IFSC is needed (SEP-9 has no VPA field; SEP31-RECEIVE.md §5.6);
- binary fields (multipart only): JPEG, PNG or PDF by their first bytes (AP names every
  file ``application/octet-stream``), non-empty, at most CUSTOMER_FILE_MAX_BYTES.

What each type needs (``REQUIRED``), and its status (SEP-12 "Customer GET"):
``REJECTED`` (an operator rejected; ``message`` says why) > ``NEEDS_INFO`` (a required
field missing, or fields an operator asked for not given again since: ``fields`` lists
them) > ``PROCESSING`` (complete, waiting for a person: types in KYC_REVIEW_TYPES, and
every customer after an operator asked for more) > ``ACCEPTED``. A later PUT that
changes a value of an accepted customer of a reviewed type sends it back to a person.

Deletion (SEP-12 "Customer DELETE": "delete all personal information"): every type of
that (account, memo) is deleted for AP at once; the personal data is erased now, or,
for a customer who moved money, when its retention ends (``erase_due``; the model's
docstring lists what survives and why).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, date, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone
from stellar_sdk import StrKey

from anchor import pii
from anchor.models import Customer, CustomerDenial, CustomerEvent, CustomerFile
from common.console import OperationRefused, Preview, clean_note, operator_name, require_permission
from corridor import inbound

log = logging.getLogger(__name__)

ACCEPTED, PROCESSING, NEEDS_INFO, REJECTED = "ACCEPTED", "PROCESSING", "NEEDS_INFO", "REJECTED"
SENDER, RECEIVER, SEP24 = "sep31-sender", "sep31-receiver", "sep24-customer"
TYPES = (SENDER, RECEIVER, SEP24)
DEFAULT_TYPE = SEP24
IDENTITY = ("id", "account", "memo", "memo_type", "type", "transaction_id", "lang")
MEMO_TYPES = ("id", "hash", "text")

# SEP-9 fields AP forwards (PutCustomerRequest / PutCustomerMultipartRequest), with what
# Corridor tells a client about each: (SEP-12 type, description).
TEXT_FIELDS: dict[str, tuple[str, str]] = {
    "first_name": ("string", "Given name, as on the ID"),
    "last_name": ("string", "Family name, as on the ID"),
    "additional_name": ("string", "Middle name or other names"),
    "address_country_code": ("string", "Country of residence, ISO 3166-1 alpha-3 (IND)"),
    "state_or_province": ("string", "State or province"),
    "city": ("string", "City"),
    "postal_code": ("string", "Postal code (PIN code in India)"),
    "address": ("string", "Street address"),
    "mobile_number": ("string", "Mobile number in E.164 (+919876543210)"),
    "email_address": ("string", "E-mail address"),
    "birth_date": ("date", "Date of birth, YYYY-MM-DD"),
    "birth_place": ("string", "Place of birth"),
    "birth_country_code": ("string", "Country of birth, ISO 3166-1 alpha-3"),
    "bank_name": ("string", "Name of the bank"),
    "bank_account_number": ("string", "Indian bank account number (9-18 digits), or a UPI "
                                      "ID (name@bank) for a UPI payout"),
    "bank_account_type": ("string", "savings or current (checking)"),
    "bank_number": ("string", "IFSC of the bank branch (11 characters, e.g. HDFC0001234); "
                              "not needed with a UPI ID"),
    "bank_phone_number": ("string", "Phone number of the bank"),
    "bank_branch_number": ("string", "Branch code"),
    "external_transfer_memo": ("string", "Not used for INR payouts"),
    "clabe_number": ("string", "Not used for INR payouts"),
    "cbu_number": ("string", "Not used for INR payouts"),
    "cbu_alias": ("string", "Not used for INR payouts"),
    "mobile_money_number": ("string", "Not used for INR payouts"),
    "mobile_money_provider": ("string", "Not used for INR payouts"),
    "crypto_address": ("string", "Not used for INR payouts"),
    "crypto_memo": ("string", "Not used (deprecated in SEP-9)"),
    "tax_id": ("string", "PAN (Permanent Account Number, AAAAA9999A) with tax_id_name PAN"),
    "tax_id_name": ("string", "PAN"),
    "occupation": ("string", "Occupation (ISCO code or words)"),
    "employer_name": ("string", "Employer"),
    "employer_address": ("string", "Employer's address"),
    "language_code": ("string", "Preferred language, ISO 639-1"),
    "id_type": ("string", "ID document: passport, aadhaar, voter_id, driving_licence"),
    "id_country_code": ("string", "Country that issued the ID, ISO 3166-1 alpha-3"),
    "id_issue_date": ("date", "ID issue date, YYYY-MM-DD"),
    "id_expiration_date": ("date", "ID expiry date, YYYY-MM-DD"),
    "id_number": ("string", "ID document number"),
    "ip_address": ("string", "IP address of the customer's device"),
    "sex": ("string", "male, female or other"),
    "referral_id": ("string", "Referral id"),
    "mobile_number_verification": ("string", "Verification code sent to the mobile"),
    "email_address_verification": ("string", "Verification code sent by e-mail"),
}
BINARY_FIELDS: dict[str, tuple[str, str]] = {
    "photo_id_front": ("binary", "Front of the ID document (JPEG, PNG or PDF)"),
    "photo_id_back": ("binary", "Back of the ID document (JPEG, PNG or PDF)"),
    "notary_approval_of_photo_id": ("binary", "Notary approval of the ID (JPEG, PNG or PDF)"),
    "photo_proof_residence": ("binary", "Proof of address (JPEG, PNG or PDF)"),
    "photo_proof_of_income": ("binary", "Proof of income (JPEG, PNG or PDF)"),
    "proof_of_liveness": ("binary", "Liveness check (JPEG, PNG or PDF)"),
}
ALL_FIELDS = {**TEXT_FIELDS, **BINARY_FIELDS}
LONG_FIELDS = {"address": 512, "employer_address": 512}
MAX_TEXT = 256

REQUIRED: dict[str, tuple[str, ...]] = {
    SENDER: ("first_name", "last_name", "address_country_code"),
    RECEIVER: ("first_name", "last_name", "bank_account_number", "bank_number"),
    SEP24: (),
}
OPTIONAL: dict[str, tuple[str, ...]] = {
    SENDER: ("birth_date", "address", "city", "id_type", "id_number"),
    RECEIVER: ("mobile_number", "tax_id", "tax_id_name", "email_address"),
    SEP24: (),
}

PAN = re.compile(r"[A-Z]{5}[0-9]{4}[A-Z]")
IFSC = re.compile(r"[A-Z]{4}0[A-Z0-9]{6}")
ACCOUNT_NUMBER = re.compile(r"[0-9]{9,18}")
VPA = re.compile(r"[A-Za-z0-9._-]{2,256}@[A-Za-z]{2,64}")
E164 = re.compile(r"\+[1-9][0-9]{6,14}")
COUNTRY = re.compile(r"[A-Z]{2,3}")
MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"),
         (b"%PDF-", "application/pdf"))


class CustomerInputError(inbound.InboundError):
    """A request that cannot be applied: ``status`` 400 (malformed) or 404 (no such
    customer for this caller); nothing was written."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Upload:
    """One binary field of a multipart PUT: its bytes as received."""

    name: str
    content: bytes


@dataclass
class Answer:
    """A ``GetCustomerResponse``."""

    status: str
    id: str | None = None
    fields: dict[str, dict] = field(default_factory=dict)
    provided_fields: dict[str, dict] = field(default_factory=dict)
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": self.status}
        if self.id:
            body["id"] = self.id
        if self.fields:
            body["fields"] = self.fields
        if self.provided_fields:
            body["provided_fields"] = self.provided_fields
        if self.message:
            body["message"] = self.message
        return body


# --- reading -------------------------------------------------------------------------

def _text(params: dict, name: str, max_length: int = 200) -> str:
    value = params.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CustomerInputError(f"{name} must be a string")
    try:
        return inbound.text(value, name, max_length=max_length).strip()
    except inbound.InboundError as exc:
        raise CustomerInputError(str(exc)) from exc


def _type(params: dict, *, default: str | None) -> str | None:
    kind = _text(params, "type", 40)
    if not kind:
        return default
    if kind not in TYPES:
        raise CustomerInputError(f"type {kind!r} is not one of {', '.join(TYPES)}")
    return kind


def _memo(params: dict) -> tuple[str, str]:
    memo, memo_type = _text(params, "memo", 64), _text(params, "memo_type", 8)
    if memo_type and memo_type not in MEMO_TYPES:
        raise CustomerInputError(f"memo_type must be one of {', '.join(MEMO_TYPES)}")
    if memo and not memo_type:
        memo_type = "id"  # AP's default (Sep12Service#updateRequestMemoAndMemoType)
    if memo and memo_type == "id":
        if not (memo.isascii() and memo.isdigit() and int(memo) < 2**64):
            raise CustomerInputError("an id memo is a decimal unsigned 64-bit integer")
        memo = str(int(memo))  # "012" and "12" are one memo (Horizon shows the number)
    if memo_type and not memo:
        memo_type = ""
    return memo, memo_type


def _account(params: dict) -> str:
    """The SEP-10 ``account`` of a callback ("" if absent: AP's own look-ups, such as
    ``GET ?id=&transaction_id=`` after ``notify_customer_info_updated``, carry none).
    Raises CustomerInputError unless it is a Stellar account, G... or muxed M... (SEP-12
    ``account``: "The Stellar account ID of the customer")."""
    account = _text(params, "account", 69)
    if account and not (StrKey.is_valid_ed25519_public_key(account)
                        or StrKey.is_valid_med25519_public_key(account)):
        raise CustomerInputError("account must be a Stellar account (G... or M...)")
    return account


def account_of(params) -> str:
    """``_account`` of a query dict (``DELETE ?account=``: AP sends none, a caller that
    does is held to it). Raises CustomerInputError."""
    return _account({k: params.get(k) for k in ("account",) if k in params})


def _owned(customer_id: str, account: str) -> Customer:
    customer = Customer.objects.filter(pk=customer_id, deleted_at__isnull=True).first()
    if customer is None or (account and customer.account != account):
        raise CustomerInputError(f"customer {customer_id} not found", status=404)
    return customer


def find(params: dict) -> Customer | None:
    """The live customer named by ``params`` (``id``, or ``account`` + ``memo`` +
    ``memo_type`` [+ ``type``]); None if there is none yet. Raises CustomerInputError
    (404 for an ``id`` that is unknown, deleted or another account's)."""
    customer_id, account = _text(params, "id", 40), _account(params)
    if customer_id:
        return _owned(customer_id, account)
    if not account:
        return None
    memo, memo_type = _memo(params)
    rows = Customer.objects.filter(account=account, memo=memo, memo_type=memo_type,
                                   deleted_at__isnull=True)
    kind = _type(params, default=None)
    if kind is not None:
        rows = rows.filter(type=kind)
    return rows.order_by("created_at").first()


def get(params: dict) -> Answer:
    """``GET /customer``: the customer's status and fields, or for one not registered
    yet ``NEEDS_INFO`` with the fields its type needs (SEP-12). Raises
    CustomerInputError (400 when the request names nobody: neither ``id`` nor
    ``account``, which AP always fills from the SEP-10 token)."""
    if not _text(params, "id", 40) and not _account(params):
        raise CustomerInputError("id or account is required")
    customer = find(params)
    kind = _type(params, default=None)
    if customer is None:
        kind = kind or DEFAULT_TYPE
        return Answer(status=NEEDS_INFO if REQUIRED[kind] else ACCEPTED,
                      fields=_describe(REQUIRED[kind], optional=OPTIONAL[kind]))
    return answer(customer, kind=kind)


def answer(customer: Customer, *, kind: str | None = None) -> Answer:
    """The SEP-12 view of ``customer`` (as the type ``kind``, default its own)."""
    kind = kind or customer.type
    provided = set(customer.provided)
    missing = [name for name in REQUIRED[kind] if name not in provided]
    asked = _still_asked(customer)
    review = customer.review
    if review == Customer.Review.REJECTED:
        status = REJECTED
    elif missing or asked:
        status = NEEDS_INFO
    elif review in (Customer.Review.PENDING, Customer.Review.NEEDS_INFO):
        status = PROCESSING
    else:
        status = ACCEPTED
    field_status = {ACCEPTED: "ACCEPTED", REJECTED: "REJECTED"}.get(status, "PROCESSING")
    provided_fields = {}
    for name in customer.provided:
        if name in asked:
            continue
        kind_of, description = ALL_FIELDS[name]
        provided_fields[name] = {"type": kind_of, "description": description,
                                 "status": field_status}
    wanted = [*missing, *[a for a in asked if a not in missing]]
    optional = [] if not missing or status != NEEDS_INFO else [
        n for n in OPTIONAL[kind] if n not in provided and n not in wanted]
    message = customer.message if status in (REJECTED, NEEDS_INFO) else ""
    if status == REJECTED and not message:
        message = "rejected"
    return Answer(status=status, id=customer.id, fields=_describe(wanted, optional=optional),
                  provided_fields=provided_fields, message=message)


def _stamp(moment) -> str:
    """A time as the sortable text ``field_updated`` keeps (UTC, microseconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _still_asked(customer: Customer) -> list[str]:
    if customer.review != Customer.Review.NEEDS_INFO or customer.requested_at is None:
        return []
    since = _stamp(customer.requested_at)
    return [name for name in customer.requested_fields
            if customer.field_updated.get(name, "") <= since]


def _describe(names, *, optional=()) -> dict[str, dict]:
    out = {}
    for name in names:
        kind_of, description = ALL_FIELDS[name]
        out[name] = {"type": kind_of, "description": description}
    for name in optional:
        kind_of, description = ALL_FIELDS[name]
        out[name] = {"type": kind_of, "description": description, "optional": True}
    return out


def personal_data(customer: Customer) -> dict[str, Any]:
    """The customer's SEP-9 text fields in the clear ({} once erased). Raises
    pii.PiiKeyError."""
    return pii.unseal_json(customer.data)


# --- identity ------------------------------------------------------------------------

def _hash(text: str) -> str:
    return hmac.new(settings.IDENTITY_KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def wallet_identity(account: str, memo: str) -> str:
    """The identity of a SEP-10 subject (a wallet user): account and memo."""
    return _hash(f"sep10:{account}:{memo}")


def payout_identity(data: dict[str, str]) -> str:
    """The identity of a payout destination: the UPI ID, or account number + IFSC;
    "" when the fields are not there."""
    account = (data.get("bank_account_number") or "").strip()
    if "@" in account:
        return _hash(f"upi:{account.lower()}")
    if account and data.get("bank_number"):
        return _hash(f"bank:{account}:{data['bank_number'].upper()}")
    return ""


def identities(customer: Customer, data: dict[str, str] | None = None) -> list[str]:
    """Keyed hashes naming the person behind ``customer`` whatever row or memo it is
    under: the PAN, the payout destination, and for a SEP-24 user the wallet account."""
    data = personal_data(customer) if data is None else data
    found = []
    if data.get("tax_id") and (data.get("tax_id_name") or "").upper() == "PAN":
        found.append(_hash(f"pan:{data['tax_id'].upper()}"))
    if payout_identity(data):
        found.append(payout_identity(data))
    if customer.type == SEP24:
        found.append(wallet_identity(customer.account, customer.memo))
    return found


def apply_denials(customer: Customer) -> bool:
    """Start ``customer`` rejected when one of its identities was rejected before
    (``CustomerDenial``); True if so. Saves the row."""
    if customer.review == Customer.Review.REJECTED:
        return True
    denial = CustomerDenial.objects.filter(identity__in=customer.identities).first()
    if denial is None:
        return False
    customer.review = Customer.Review.REJECTED
    customer.message = f"rejected earlier (customer {denial.customer_id})"
    customer.save(update_fields=["review", "message"])
    CustomerEvent.objects.create(customer=customer, event="review.denied_before",
                                 detail={"earlier": denial.customer_id})
    return True


# --- writing -------------------------------------------------------------------------

def _value(name: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise CustomerInputError(f"{name} must be a string")
    limit = LONG_FIELDS.get(name, MAX_TEXT)
    try:
        value = inbound.text(raw, name, max_length=limit).strip()
    except inbound.InboundError as exc:
        raise CustomerInputError(str(exc)) from exc
    if any(ord(c) < 32 for c in value):
        raise CustomerInputError(f"{name} holds a control character")
    if not value:
        raise CustomerInputError(f"{name} is empty")
    if TEXT_FIELDS[name][0] == "date":
        try:
            date.fromisoformat(value)
        except ValueError:
            raise CustomerInputError(f"{name} must be a date, YYYY-MM-DD") from None
        if len(value) != 10:
            raise CustomerInputError(f"{name} must be a date, YYYY-MM-DD")
    elif name == "email_address":
        try:
            validate_email(value)
        except ValidationError:
            raise CustomerInputError("email_address is not an e-mail address") from None
    elif name in ("mobile_number", "bank_phone_number") and not E164.fullmatch(value):
        raise CustomerInputError(f"{name} must be E.164, e.g. +919876543210")
    elif name.endswith("country_code"):
        value = value.upper()
        if not COUNTRY.fullmatch(value):
            raise CustomerInputError(f"{name} must be an ISO 3166-1 alpha-3 (or alpha-2) "
                                     f"country code")
    elif name == "bank_number":
        value = value.upper()
        if not IFSC.fullmatch(value):
            raise CustomerInputError("bank_number must be an IFSC: 4 letters, 0, then 6 "
                                     "letters or digits (HDFC0001234)")
    elif name == "bank_account_number":
        if "@" in value:
            if not VPA.fullmatch(value):
                raise CustomerInputError("bank_account_number with @ must be a UPI ID "
                                         "(name@bank)")
        elif not ACCOUNT_NUMBER.fullmatch(value):
            raise CustomerInputError("bank_account_number must be 9 to 18 digits, or a "
                                     "UPI ID (name@bank)")
    return value


def _check_tax_id(merged: dict[str, str]) -> None:
    tax_id, name = merged.get("tax_id"), merged.get("tax_id_name", "")
    if tax_id and name.upper() == "PAN":
        merged["tax_id"] = tax_id = tax_id.upper()
        if not PAN.fullmatch(tax_id):
            raise CustomerInputError("tax_id is not a PAN: 5 letters, 4 digits, 1 letter "
                                     "(ABCDE1234F)")


def _sniff(upload: Upload) -> str:
    if upload.name not in BINARY_FIELDS:
        raise CustomerInputError(f"{upload.name} is not a binary SEP-9 field")
    if not upload.content:
        raise CustomerInputError(f"{upload.name} is empty")
    if len(upload.content) > settings.CUSTOMER_FILE_MAX_BYTES:
        raise CustomerInputError(f"{upload.name} is {len(upload.content)} bytes, more than "
                                 f"the {settings.CUSTOMER_FILE_MAX_BYTES} allowed")
    for magic, content_type in MAGIC:
        if upload.content.startswith(magic):
            return content_type
    raise CustomerInputError(f"{upload.name} is not a JPEG, PNG or PDF file")


def put(body: dict, uploads: list[Upload] = ()) -> Customer:
    """``PUT /customer``: create or update a customer with the SEP-9 ``body`` (strings)
    and the multipart ``uploads``. Returns the customer (its ``answer`` is what AP
    gets). Raises CustomerInputError (400 malformed, 404 unknown id)."""
    unknown = sorted(k for k in body if k not in IDENTITY and k not in ALL_FIELDS)
    if unknown:
        raise CustomerInputError(f"not a SEP-9 field AP forwards: {', '.join(unknown[:5])}")
    binary_in_text = sorted(k for k in body if k in BINARY_FIELDS)
    if binary_in_text:
        raise CustomerInputError(f"{binary_in_text[0]} is a file: send it as multipart")
    values: dict[str, str] = {}
    for name in TEXT_FIELDS:
        if name in body and body[name] is not None:
            values[name] = _value(name, body[name])
    files = {u.name: (u, _sniff(u)) for u in uploads}
    account = _account(body)
    customer_id = _text(body, "id", 40)
    memo, memo_type = _memo(body)
    kind = _type(body, default=None)
    with transaction.atomic():
        if customer_id:
            customer = _owned(customer_id, account)
            customer = Customer.objects.select_for_update().get(pk=customer.pk)
            if kind is not None and kind != customer.type:
                raise CustomerInputError(f"customer {customer_id} is a {customer.type}, "
                                         f"not a {kind}")
            created = False
        else:
            if not account:
                raise CustomerInputError("account or id is required")
            kind = kind or DEFAULT_TYPE
            if kind in (SENDER, RECEIVER) and not memo:
                raise CustomerInputError("memo or id required: a sep31 customer keyed on "
                                         "the account alone would replace the last one")
            customer, created = Customer.objects.select_for_update().get_or_create(
                account=account, memo=memo, memo_type=memo_type, type=kind,
                deleted_at__isnull=True,
                defaults={"review": _initial_review(kind)})
        merged = personal_data(customer)
        changed = sorted([n for n, v in values.items() if merged.get(n) != v]
                         + [n for n, (u, _) in files.items() if _file_changed(customer, u)])
        merged.update(values)
        _check_tax_id(merged)
        now = timezone.now()
        customer.data = pii.seal_json(merged)
        customer.provided = sorted(set(merged) | set(files) | _stored_files(customer))
        given = [*values, *files]
        customer.field_updated = {**customer.field_updated,
                                  **{n: _stamp(now) for n in given}}
        customer.review = _review_after(customer, changed, created)
        customer.identities = identities(customer, merged)
        customer.updated_at = now
        customer.save()
        apply_denials(customer)
        for name, (upload, content_type) in files.items():
            CustomerFile.objects.update_or_create(
                customer=customer, field=name,
                defaults={"content_type": content_type, "size": len(upload.content),
                          "sha256": hashlib.sha256(upload.content).hexdigest(),
                          "data": pii.seal(upload.content), "uploaded_at": now})
        if created or changed:
            CustomerEvent.objects.create(customer=customer,
                                         event="created" if created else "updated",
                                         detail={"fields": changed, "review": customer.review})
    return customer


def _stored_files(customer: Customer) -> set[str]:
    if customer._state.adding:
        return set()
    return set(customer.files.values_list("field", flat=True))


def _file_changed(customer: Customer, upload: Upload) -> bool:
    digest = hashlib.sha256(upload.content).hexdigest()
    return not customer.files.filter(field=upload.name, sha256=digest).exists()


def _initial_review(kind: str) -> str:
    return Customer.Review.PENDING if kind in settings.KYC_REVIEW_TYPES else \
        Customer.Review.AUTO


def _review_after(customer: Customer, changed: list[str], created: bool) -> str:
    review = customer.review
    if created or review == Customer.Review.REJECTED:
        return review
    if review == Customer.Review.NEEDS_INFO:
        asked = _still_asked(customer)
        return Customer.Review.PENDING if not asked else review
    if not changed:
        return review
    if customer.type in settings.KYC_REVIEW_TYPES:
        return Customer.Review.PENDING  # changed data goes back to a person
    return review


# --- deletion and erasure ------------------------------------------------------------

def delete(customer_id: str, *, account: str = "") -> list[str]:
    """``DELETE /customer/{id}``: the customer and its other types under the same
    (account, memo) are deleted for AP; their personal data is erased now, or kept
    sealed until ``erase_after`` for one that moved money. Returns the ids deleted.
    Raises CustomerInputError (404)."""
    now = timezone.now()
    with transaction.atomic():
        customer = _owned(customer_id, account)
        siblings = list(Customer.objects.select_for_update().filter(
            account=customer.account, memo=customer.memo, memo_type=customer.memo_type,
            deleted_at__isnull=True))
        for row in siblings:
            row.deleted_at = now
            if row.used_at is None:
                _erase(row, now)
                detail = {"erased": True}
            else:
                row.erase_after = row.used_at + timedelta(days=settings.KYC_RETENTION_DAYS)
                row.save(update_fields=["deleted_at", "erase_after"])
                detail = {"erased": False, "erase_after": row.erase_after,
                          "why": "moved money: records kept for the retention period"}
            CustomerEvent.objects.create(customer=row, event="deleted", detail=detail)
    return [row.id for row in siblings]


def _erase(row: Customer, now) -> None:
    row.data = None
    row.erased_at = now
    row.erase_after = None
    row.save(update_fields=["data", "erased_at", "erase_after", "deleted_at"])
    row.files.all().delete()


ERASE_BATCH = 500


def erase_candidates(now=None):
    """Deleted customers whose retention ended, still holding personal data (through
    ``customers_erase_due_idx``; corridor/periodic.py)."""
    return Customer.objects.filter(erased_at__isnull=True, erase_after__isnull=False,
                                   erase_after__lte=now or timezone.now()
                                   ).order_by("erase_after")[:ERASE_BATCH]


def erase_due(*, now=None) -> int:
    """Erase the personal data of deleted customers whose retention ended (the beat
    task ``anchor.tasks.erase_customers``), ERASE_BATCH per run. Idempotent. Returns
    how many."""
    now = now or timezone.now()
    done = 0
    with transaction.atomic():
        due = list(erase_candidates(now).values_list("pk", flat=True))
        for row in Customer.objects.select_for_update(skip_locked=True).filter(
                pk__in=due, erased_at__isnull=True):
            _erase(row, now)
            CustomerEvent.objects.create(customer=row, event="erased",
                                         detail={"retention_days": settings.KYC_RETENTION_DAYS})
            done += 1
    return done


def mark_used(customer_id: str) -> None:
    """Record that ``customer_id`` took part in a money movement (its records then
    outlive a DELETE for the retention period)."""
    Customer.objects.filter(pk=customer_id).update(used_at=timezone.now())


# --- operators -----------------------------------------------------------------------

PERM = "anchor.review_customer"


def _live(customer_id: str) -> Customer:
    customer = Customer.objects.filter(pk=customer_id, deleted_at__isnull=True).first()
    if customer is None:
        raise OperationRefused(f"customer {customer_id} does not exist or was deleted")
    return customer


def _evidence(customer: Customer) -> list[tuple[str, Any]]:
    view = answer(customer)
    return [("customer", customer.id), ("type", customer.type),
            ("SEP-12 status now", view.status), ("review", customer.review),
            ("fields provided", ", ".join(customer.provided) or "none"),
            ("still needed", ", ".join(view.fields) or "nothing")]


def review_preview(*, customer_id: str, decision: str) -> Preview:
    """The confirmation page of ``review`` (same checks, read only)."""
    try:
        customer = _live(customer_id)
        _check_decision(customer, decision)
    except OperationRefused as exc:
        return Preview(refusal=str(exc))
    words = {
        "accept": "The customer becomes ACCEPTED for AP; payouts to it may proceed.",
        "reject": "The customer becomes REJECTED with your reason as its message; no "
                  "payout to it will be made.",
        "request_info": "The customer becomes NEEDS_INFO listing the fields you ask for; "
                        "once they are given again it waits for a person (PROCESSING).",
    }[decision]
    return Preview(will=[words], evidence=_evidence(customer))


def _check_decision(customer: Customer, decision: str) -> None:
    if decision not in ("accept", "reject", "request_info"):
        raise OperationRefused(f"unknown decision {decision}")
    if decision == "accept" and answer(customer).status == NEEDS_INFO:
        raise OperationRefused("the customer still lacks required fields: ask for them "
                               "instead")


def review(*, customer_id: str, decision: str, operator, note: str, message: str = "",
           fields: list[str] | None = None) -> Customer:
    """An operator's decision on a customer: ``accept``, ``reject`` (``message``: the
    reason AP shows; default the note) or ``request_info`` (``fields``: SEP-9 names to
    give again; ``message`` what to tell the customer). One transaction, one audit row
    naming the operator. Raises OperationRefused (nothing written)."""
    require_permission(operator, PERM)
    note = clean_note(note)
    with transaction.atomic():
        customer = Customer.objects.select_for_update().filter(
            pk=customer_id, deleted_at__isnull=True).first()
        if customer is None:
            raise OperationRefused(f"customer {customer_id} does not exist or was deleted")
        _check_decision(customer, decision)
        now = timezone.now()
        detail: dict[str, Any] = {"before": customer.review}
        if decision == "accept":
            customer.review, customer.message = Customer.Review.ACCEPTED, ""
            customer.requested_fields, customer.requested_at = [], None
        elif decision == "reject":
            customer.review = Customer.Review.REJECTED
            customer.message = (message or note)[:500]
            for identity in customer.identities:
                CustomerDenial.objects.get_or_create(
                    identity=identity, defaults={"customer_id": customer.id,
                                                 "reason": customer.message})
        else:
            asked = [f for f in (fields or []) if f in ALL_FIELDS]
            if not asked:
                raise OperationRefused("name at least one SEP-9 field to ask for")
            customer.review = Customer.Review.NEEDS_INFO
            customer.requested_fields, customer.requested_at = asked, now
            customer.message = (message or "please provide these fields again")[:500]
            detail["fields"] = asked
        customer.updated_at = now
        customer.save()
        detail["after"] = customer.review
        CustomerEvent.objects.create(customer=customer, event=f"review.{decision}",
                                     detail=detail, operator=operator_name(operator),
                                     note=note)
    return customer
