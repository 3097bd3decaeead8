"""RazorpayX Fund Account Validation (penny drop for bank accounts, VPA check for UPI) and
the comparison of the bank's registered name with our KYC name (razorpay/TREASURY.md §6).

``create_validation`` validates an existing fund account (``fa_...``, TREASURY §6.2 form
1) and ``fetch_validation`` reads one back; both return a ``Validation``. Only the
client: deciding whether a beneficiary may be paid is the payout guard's.

Idempotency: RazorpayX documents no idempotency key for validations (every one is
charged, TREASURY §6.1), so the create carries our ``reference`` in ``notes.reference``
and first looks among our recent validations (``GET /v1/fund_accounts/validations``) for
one with that reference: a retry after a lost answer gets the first validation back
instead of paying for a second. Two creates of one reference at the same moment are
not caught here; callers that can race hold a row lock on their beneficiary first.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from django.conf import settings

from anchor import razorpay as rzp
from common.http import tls_context
from payouts.providers.base import ProviderError

VALIDATIONS = "/v1/fund_accounts/validations"
REFERENCE_NOTE = "reference"
MAX_REFERENCE = 40
FIND_PAGE = 100  # the list's largest page
FIND_PAGES = 5  # newest 500 validations searched for a reference
DEFAULT_AMOUNT_PAISE = 100  # ₹1.00, RazorpayX's default (docs api/x/account-validation)


class ValidationRefused(ProviderError):
    """RazorpayX refused the request for good (4xx other than 429): nothing was created.
    ``field`` and ``description`` come from Razorpay's error body."""

    def __init__(self, description: str, field: str | None = None):
        super().__init__(f"{field or ''}: {description}")
        self.field = field
        self.description = description


class ValidationNotFound(ValidationRefused):
    """RazorpayX holds no validation under this id for our key."""


@dataclass(frozen=True)
class Validation:
    """One fund account validation as RazorpayX reports it.

    id: ``fav_...``. status: ``created`` (waiting for the bank: do not pay), ``completed``
    (the check ran; read ``account_status``) or ``failed`` (technical failure, charge
    reversed). account_status: ``active``, ``invalid``, or None while ``created`` (an empty
    string from RazorpayX is None here; ``completed`` with None means invalid, FAQ Q13).
    registered_name: the name the bank holds, or None. utr: bank reference of the penny
    credit, or None (VPA checks and invalid accounts have none). fee_paise: the charge
    in integer paise when the entity reports one, else None (the documented entities and
    webhook samples carry no fee). fund_account_id: ``fa_...``. reference: our
    ``notes.reference``, or None.
    """

    id: str
    status: str
    account_status: str | None
    registered_name: str | None
    utr: str | None
    fee_paise: int | None
    fund_account_id: str
    reference: str | None = None

    @property
    def active(self) -> bool:
        """The check ran and the bank (or NPCI) confirmed the account."""
        return self.status == "completed" and self.account_status == "active"


def parse_validation(entity: dict) -> Validation:
    """A ``Validation`` from a validation entity: shape 1 (``results``, as
    ``webhook_fund_account_validation_completed.json``) or the composite shape 2
    (``validation_results``). Values are read case-insensitively (TREASURY §6.2: the
    reverse penny drop sample writes ``"Bank_Account"``). Raises ValueError for an
    entity without an id, a status, a fund account, or with a fee that is not an
    integer of paise."""
    if not isinstance(entity, dict) or not isinstance(entity.get("id"), str):
        raise ValueError("not a fund account validation entity")
    status = entity.get("status")
    if not isinstance(status, str) or not status:
        raise ValueError("validation without a status")
    results = entity.get("results")
    if results is None:
        results = entity.get("validation_results")
    results = results if isinstance(results, dict) else {}
    fund_account = entity.get("fund_account")
    if not isinstance(fund_account, dict) or not isinstance(fund_account.get("id"), str):
        raise ValueError("validation without a fund account id")
    fee = entity.get("fees")
    if fee is not None and (isinstance(fee, bool) or not isinstance(fee, int) or fee < 0):
        raise ValueError(f"fees must be an integer of paise, got {fee!r}")
    notes = entity.get("notes")
    reference = notes.get(REFERENCE_NOTE) if isinstance(notes, dict) else None
    return Validation(
        id=entity["id"], status=status.lower(),
        account_status=_text(results.get("account_status"), lower=True),
        registered_name=_text(results.get("registered_name")),
        utr=_text(entity.get("utr")), fee_paise=fee, fund_account_id=fund_account["id"],
        reference=reference if isinstance(reference, str) else None,
    )


def _text(value, *, lower: bool = False) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip().lower() if lower else value.strip()


def _client() -> httpx.Client:
    return httpx.Client(base_url=settings.RAZORPAY_API_URL.rstrip("/"),
                        auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET),
                        timeout=settings.HTTP_TIMEOUT_S, verify=tls_context())


def _answer(response: httpx.Response, what: str, *, not_found: bool = False):
    """The JSON of a 200; ValidationRefused / ValidationNotFound for a 4xx with Razorpay's
    error body; rzp.RazorpayError for 401, 429, 5xx and unreadable answers."""
    if response.status_code == 200:
        try:
            return response.json()
        except ValueError as exc:
            raise rzp.RazorpayError(f"{what}: unreadable answer") from exc
    if response.status_code in (401, 429) or response.status_code >= 500:
        raise rzp.RazorpayError(f"{what}: HTTP {response.status_code}")
    try:
        error = response.json()["error"]
        description, field = str(error.get("description") or ""), error.get("field")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise rzp.RazorpayError(f"{what}: HTTP {response.status_code}") from None
    if not_found:
        raise ValidationNotFound(description, field)
    raise ValidationRefused(description, field)


def fetch_validation(validation_id: str) -> Validation:
    """``GET /v1/fund_accounts/validations/{id}`` (TREASURY §6.3): the validation now.
    Raises ValidationNotFound (400/404: no such validation for our key),
    rzp.RazorpayError (unreachable, 401, 429, 5xx, unreadable: ask again later)."""
    try:
        with _client() as client:
            response = client.get(f"{VALIDATIONS}/{quote(validation_id, safe='')}")
    except httpx.HTTPError as exc:
        raise rzp.RazorpayError(f"fetch validation: {type(exc).__name__}") from exc
    entity = _answer(response, f"fetch validation {validation_id}", not_found=True)
    try:
        return parse_validation(entity)
    except ValueError as exc:
        raise rzp.RazorpayError(f"fetch validation {validation_id}: {exc}") from exc


def find_validation(reference: str) -> Validation | None:
    """Our validation carrying ``notes.reference == reference`` among the newest
    ``FIND_PAGES * FIND_PAGE`` (``GET /v1/fund_accounts/validations?account_number=``,
    newest first), or None. Raises rzp.RazorpayError when RazorpayX cannot be asked,
    ValidationRefused for a refused query."""
    for page in range(FIND_PAGES):
        try:
            with _client() as client:
                response = client.get(VALIDATIONS, params={
                    "account_number": settings.RAZORPAYX_ACCOUNT_NUMBER,
                    "count": FIND_PAGE, "skip": page * FIND_PAGE})
        except httpx.HTTPError as exc:
            raise rzp.RazorpayError(f"find validation: {type(exc).__name__}") from exc
        body = _answer(response, "find validation")
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise rzp.RazorpayError("find validation: answer without items")
        for item in items:
            notes = item.get("notes") if isinstance(item, dict) else None
            if isinstance(notes, dict) and notes.get(REFERENCE_NOTE) == reference:
                try:
                    return parse_validation(item)
                except ValueError as exc:
                    raise rzp.RazorpayError(f"find validation: {exc}") from exc
        if len(items) < FIND_PAGE:
            return None
    return None


def create_validation(*, fund_account_id: str, reference: str,
                      amount_paise: int = DEFAULT_AMOUNT_PAISE,
                      notes: dict[str, str] | None = None) -> Validation:
    """Validate fund account ``fund_account_id`` (``fa_...``) once per ``reference``:
    return the validation already made under ``reference`` (``find_validation``), else
    ``POST /v1/fund_accounts/validations`` {``account_number``: RAZORPAYX_ACCOUNT_NUMBER,
    ``fund_account``: {``id``}, ``amount``: ``amount_paise`` (integer paise, at least 100,
    fees excluded; the bank credits it to the beneficiary, TREASURY §6.2), ``currency``
    INR, ``notes``: ``notes`` + {``reference``}}. Costs one RazorpayX validation charge
    when it creates. The answer may still be ``created``: fetch later or take the
    ``fund_account.validation.*`` webhook.

    reference: our idempotency reference, 1-40 characters. Raises ValueError (bad
    reference or amount; nothing sent), ValidationRefused (RazorpayX refused the body,
    or ``reference`` names a validation of another fund account), rzp.RazorpayError
    (unreachable, 401, 429, 5xx, unreadable: call again with the same reference)."""
    if not isinstance(reference, str) or not 1 <= len(reference) <= MAX_REFERENCE:
        raise ValueError(f"reference must be 1 to {MAX_REFERENCE} characters")
    if isinstance(amount_paise, bool) or not isinstance(amount_paise, int) or amount_paise < 100:
        raise ValueError("amount_paise must be an integer of at least 100 paise")
    existing = find_validation(reference)
    if existing is not None:
        if existing.fund_account_id != fund_account_id:
            raise ValidationRefused(f"reference {reference} already validated fund account "
                                    f"{existing.fund_account_id}", "notes.reference")
        return existing
    body = {"account_number": settings.RAZORPAYX_ACCOUNT_NUMBER,
            "fund_account": {"id": fund_account_id}, "amount": amount_paise,
            "currency": "INR", "notes": {**(notes or {}), REFERENCE_NOTE: reference}}
    try:
        with _client() as client:
            response = client.post(VALIDATIONS, content=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
    except httpx.HTTPError as exc:
        raise rzp.RazorpayError(f"create validation: {type(exc).__name__}") from exc
    entity = _answer(response, "create validation")
    try:
        return parse_validation(entity)
    except ValueError as exc:
        raise rzp.RazorpayError(f"create validation: {exc}") from exc


# --- name matching ----------------------------------------------------------------------

# Titles and honorifics written before Indian names (English and Hindi forms).
HONORIFICS = frozenset({
    "MR", "MRS", "MS", "MISS", "MSTR", "MASTER", "DR", "PROF", "SHRI", "SHREE", "SRI",
    "SMT", "SHRIMATI", "KUM", "KUMARI", "SUSHRI", "SELVI", "THIRU", "TMT", "LATE",
})
INITIAL_SCORE = 0.9  # an initial standing for a whole name ("A" for "ANIL")
SPELLING_FLOOR = 0.8  # difflib ratio below which two words are different names


@dataclass(frozen=True)
class NameMatch:
    """score: in [0, 1] (1 = the same name once normalised); matched: score >= threshold;
    threshold: the one applied."""

    score: float
    matched: bool
    threshold: float


def name_words(name: str | None) -> list[str]:
    """The words of ``name`` upper-cased, accents and punctuation removed, honorifics
    dropped: ``"Smt. Lakshmi-Devi R."`` -> ``["LAKSHMI", "DEVI", "R"]``."""
    if not name:
        return []
    text = unicodedata.normalize("NFKD", name)
    text = "".join(c for c in text if not unicodedata.combining(c)).upper()
    words = re.findall(r"[A-Z0-9]+", text.replace("'", "").replace("’", ""))
    return [w for w in words if w not in HONORIFICS]


def _pair(a: str, b: str) -> float:
    if a == b:
        return 1.0
    if (len(a) == 1 and b.startswith(a)) or (len(b) == 1 and a.startswith(b)):
        return INITIAL_SCORE
    if len(a) == 1 or len(b) == 1:
        return 0.0
    ratio = difflib.SequenceMatcher(None, a, b).ratio()
    return ratio if ratio >= SPELLING_FLOOR else 0.0


def _words_score(a: list[str], b: list[str]) -> float:
    """Dice-style: pair the words best-first regardless of order; twice the paired
    scores over the number of words on both sides."""
    if not a or not b:
        return 0.0
    pairs = sorted(((_pair(x, y), i, j) for i, x in enumerate(a) for j, y in enumerate(b)),
                   reverse=True)
    used_a, used_b, total = set(), set(), 0.0
    for score, i, j in pairs:
        if score and i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            total += score
    return 2 * total / (len(a) + len(b))


def _spelled_out(words: list[str]) -> list[str]:
    """Short words read as run-together initials: ``["AK", "VERMA"]`` ->
    ``["A", "K", "VERMA"]``."""
    out: list[str] = []
    for word in words:
        out.extend(word if len(word) <= 3 else [word])
    return out


def _glued(words: list[str], other: list[str]) -> list[str]:
    """A lone letter read as the start of the next word where ``other`` has that whole
    word: ``["D", "SOUZA"]`` -> ``["DSOUZA"]`` against ``["DSOUZA", ...]`` (D'Souza)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        if (len(words[i]) == 1 and i + 1 < len(words)
                and words[i] + words[i + 1] in other):
            out.append(words[i] + words[i + 1])
            i += 2
        else:
            out.append(words[i])
            i += 1
    return out


def name_match_score(registered_name: str | None, kyc_name: str | None) -> float:
    """How alike the bank's ``registered_name`` and our ``kyc_name`` are, in [0, 1]:
    case, accents, punctuation, whitespace (also inside a name: "RAM DAS" = "RAMDAS"),
    honorifics (Mr, Mrs, Shri, Smt, ...) and word order do not count; an initial matches
    a word it begins (0.9 of a word), or is glued to the next word when that makes a word
    of the other name ("D SOUZA" = "DSOUZA"); run-together initials ("AK") are read
    letter by letter; spelling variants count by their difflib ratio (0 below 0.8); a
    word missing on one side lowers the score. 0.0 when either name is empty. Pure: no I/O."""
    a, b = name_words(registered_name), name_words(kyc_name)
    if not a or not b:
        return 0.0
    if "".join(a) == "".join(b):  # spacing only: "RAM DAS" / "RAMDAS"
        return 1.0
    forms_a = (a, _spelled_out(a), _glued(a, b))
    forms_b = (b, _spelled_out(b), _glued(b, a))
    best = max(_words_score(x, y) for x in forms_a for y in forms_b)
    return round(min(1.0, best), 4)


def name_match(registered_name: str | None, kyc_name: str | None, *,
               threshold: float | None = None) -> NameMatch:
    """``name_match_score`` and the decision against ``threshold`` (default the
    ``FAV_NAME_MATCH_THRESHOLD`` setting, in [0, 1]). Raises ValueError for a threshold
    outside [0, 1]."""
    if threshold is None:
        threshold = float(settings.FAV_NAME_MATCH_THRESHOLD)
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"name match threshold must be in [0, 1], got {threshold}")
    score = name_match_score(registered_name, kyc_name)
    return NameMatch(score=score, matched=score >= threshold and score > 0.0,
                     threshold=threshold)
