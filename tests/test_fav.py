"""Corridor's Fund Account Validation client (payouts/fav.py) against the sandbox over real
HTTP, and the registered-name / KYC-name matcher."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from django.conf import settings

from anchor import razorpay as rzp
from payouts import fav
from tests.conftest import reference_path
from tests.flows import (
    bank_fund_account,
    unique_account_number,
    validation_account,
    vpa_fund_account,
    wait_for,
)


def reference() -> str:
    return f"fav-{uuid.uuid4().hex[:20]}"


def validations_with(sandbox, ref: str) -> list[dict]:
    response = httpx.get(f"{sandbox.url}/razorpay/v1/fund_accounts/validations",
                         params={"account_number": settings.RAZORPAYX_ACCOUNT_NUMBER,
                                 "count": 100},
                         auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET),
                         timeout=10)
    response.raise_for_status()
    return [v for v in response.json()["items"] if v["notes"].get("reference") == ref]


# --- the client over HTTP ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_create_validates_an_active_bank_fund_account(clean_sandbox):
    fund_account = bank_fund_account(clean_sandbox, holder="Kavita Nair")
    ref = reference()

    got = fav.create_validation(fund_account_id=fund_account["id"], reference=ref,
                                amount_paise=137, notes={"customer": "c-9"})

    assert got.id.startswith("fav_")
    assert (got.status, got.account_status, got.registered_name) == (
        "completed", "active", "Kavita Nair")
    assert got.active
    assert got.utr and isinstance(got.utr, str)
    assert got.fee_paise is None  # the entity reports no fee
    assert (got.fund_account_id, got.reference) == (fund_account["id"], ref)
    [row] = validations_with(clean_sandbox, ref)
    assert (row["amount"], row["notes"]) == (137, {"customer": "c-9", "reference": ref})
    assert fav.fetch_validation(got.id) == got
    assert fav.name_match(got.registered_name, "Smt. Kavita Nair").matched


@pytest.mark.django_db(transaction=True)
def test_a_second_create_with_the_reference_returns_the_first_and_pays_for_no_other(
    clean_sandbox
):
    fund_account = bank_fund_account(clean_sandbox)
    ref = reference()
    first = fav.create_validation(fund_account_id=fund_account["id"], reference=ref)

    again = fav.create_validation(fund_account_id=fund_account["id"], reference=ref)

    assert again == first
    assert len(validations_with(clean_sandbox, ref)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_reference_of_another_fund_account_is_refused(clean_sandbox):
    ref = reference()
    fav.create_validation(fund_account_id=bank_fund_account(clean_sandbox)["id"], reference=ref)
    other = bank_fund_account(clean_sandbox)

    with pytest.raises(fav.ValidationRefused) as refused:
        fav.create_validation(fund_account_id=other["id"], reference=ref)

    assert refused.value.field == "notes.reference"
    assert len(validations_with(clean_sandbox, ref)) == 1


@pytest.mark.django_db(transaction=True)
def test_a_pending_validation_is_created_then_fetched_completed(clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, pending_s=1.0)
    fund_account = bank_fund_account(clean_sandbox, holder="Gurpreet Singh", number=number)

    got = fav.create_validation(fund_account_id=fund_account["id"], reference=reference())

    assert (got.status, got.account_status, got.registered_name, got.utr) == (
        "created", None, None, None)
    assert not got.active
    done = wait_for(lambda: (v := fav.fetch_validation(got.id)).status == "completed" and v,
                    timeout=10)
    assert (done.account_status, done.registered_name) == ("active", "Gurpreet Singh")


@pytest.mark.django_db(transaction=True)
def test_an_invalid_account_parses_as_not_active_without_a_name(clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, account_status="invalid")
    fund_account = bank_fund_account(clean_sandbox, number=number)

    got = fav.create_validation(fund_account_id=fund_account["id"], reference=reference())

    assert (got.status, got.account_status, got.registered_name, got.utr) == (
        "completed", "invalid", None, None)
    assert not got.active
    assert not fav.name_match(got.registered_name, "Priya Sharma").matched


@pytest.mark.django_db(transaction=True)
def test_a_failed_validation_has_no_account_status(clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, status="failed")
    fund_account = bank_fund_account(clean_sandbox, number=number)

    got = fav.create_validation(fund_account_id=fund_account["id"], reference=reference())

    assert (got.status, got.account_status, got.registered_name) == ("failed", None, None)
    assert not got.active


@pytest.mark.django_db(transaction=True)
def test_a_different_registered_name_is_a_name_mismatch(clean_sandbox):
    number = unique_account_number()
    validation_account(clean_sandbox, account_number=number, registered_name="DEEPAK CHAUDHARY")
    fund_account = bank_fund_account(clean_sandbox, holder="Kavita Nair", number=number)

    got = fav.create_validation(fund_account_id=fund_account["id"], reference=reference())

    assert got.active and got.registered_name == "DEEPAK CHAUDHARY"
    decision = fav.name_match(got.registered_name, "Kavita Nair")
    assert decision.matched is False
    assert decision.score == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_vpa_validates_with_no_utr(clean_sandbox):
    fund_account = vpa_fund_account(clean_sandbox, name="Ravi Kumar")

    got = fav.create_validation(fund_account_id=fund_account["id"], reference=reference())

    assert (got.status, got.account_status, got.registered_name, got.utr) == (
        "completed", "active", "Ravi Kumar", None)


@pytest.mark.django_db(transaction=True)
def test_refusals_and_outages_raise_their_errors(clean_sandbox, settings):
    with pytest.raises(fav.ValidationRefused) as refused:
        fav.create_validation(fund_account_id="fa_00000000000000", reference=reference())
    assert (refused.value.field, refused.value.description) == (
        "fund_account.id", "The id provided does not exist")
    assert not isinstance(refused.value, fav.ValidationNotFound)

    with pytest.raises(fav.ValidationNotFound):
        fav.fetch_validation("fav_00000000000000")

    for bad in ({"reference": ""}, {"reference": "x" * 41}, {"amount_paise": 99},
                {"amount_paise": 1.5}):
        with pytest.raises(ValueError):
            fav.create_validation(**{"fund_account_id": "fa_x", "reference": "r-1", **bad})

    settings.RAZORPAY_KEY_SECRET = "wrong"
    with pytest.raises(rzp.RazorpayError):
        fav.fetch_validation("fav_00000000000000")

    settings.RAZORPAY_API_URL = "http://127.0.0.1:9"  # discard port: nothing listens
    with pytest.raises(rzp.RazorpayError) as unreachable:
        fav.create_validation(fund_account_id="fa_x", reference=reference())
    assert not isinstance(unreachable.value, fav.ValidationRefused)


# --- parsing ---------------------------------------------------------------------------------


def test_parse_the_real_webhook_entity():
    path = reference_path("razorpay", "webhook_fund_account_validation_completed.json")
    entity = json.loads(path.read_text(encoding="utf-8"))[
        "payload"]["fund_account.validation"]["entity"]

    assert fav.parse_validation(entity) == fav.Validation(
        id="fav_Fa6RwlxjoX0xeO", status="completed", account_status="active",
        registered_name="Test User", utr="XXXXR7310682908954385XX", fee_paise=None,
        fund_account_id="fa_Fa6Rq1WwNrpMoK", reference=None)


def test_parse_composite_shape_fees_and_bad_entities():
    entity = {"id": "fav_1", "status": "Completed", "fees": 590,
              "validation_results": {"account_status": "ACTIVE", "registered_name": " A B "},
              "fund_account": {"id": "fa_1"}, "notes": {"reference": "r-1"}}

    got = fav.parse_validation(entity)

    assert got == fav.Validation(id="fav_1", status="completed", account_status="active",
                                 registered_name="A B", utr=None, fee_paise=590,
                                 fund_account_id="fa_1", reference="r-1")
    for broken in ({**entity, "id": None}, {**entity, "status": ""},
                   {**entity, "fund_account": None}, {**entity, "fees": "5.90"},
                   {**entity, "fees": True}, {**entity, "fees": -1}, []):
        with pytest.raises(ValueError):
            fav.parse_validation(broken)


# --- name matching ---------------------------------------------------------------------------

MATCHES = [  # (registered name from the bank, KYC name)
    ("PRIYA SHARMA", "Priya Sharma"),
    ("RAJESH KUMAR", "Mr. Rajesh Kumar"),
    ("LAKSHMI DEVI", "Smt. Lakshmi Devi"),
    ("VENKATESH IYER", "Shri Venkatesh  Iyer"),
    ("SHARMA PRIYA", "Priya Sharma"),
    ("ANIL KUMAR VERMA", "A. K. Verma"),
    ("ANIL KUMAR VERMA", "AK Verma"),
    ("SUBRAMANIAM RAMESH", "S Ramesh"),
    ("MOHAMMAD IRFAN SHAIKH", "Mohammed Irfan Shaikh"),
    ("RAMDAS PATIL", "Ram Das Patil"),
    ("D'SOUZA MARIA", "Maria D Souza"),
    ("SOUMYA BANERJEE", "Soumya Banerjee."),
    ("PRIYA RANI SHARMA", "Priya Sharma"),  # a middle name missing: 0.8, the default edge
]
MISMATCHES = [
    ("DEEPAK CHAUDHARY", "Kavita Nair"),
    ("PRIYA VERMA", "Priya Sharma"),  # same given name, another family
    ("SUNIL SHARMA", "Amit Sharma"),  # same family, another person
    ("SURESH KUMAR", "R Kumar"),  # an initial that begins no word
    ("A K VERMA", "Anil Verma"),  # an initial left over
    ("", "Priya Sharma"),
    (None, "Priya Sharma"),
    ("MR", "Mr"),  # nothing left once honorifics go
]


@pytest.mark.parametrize(("registered", "kyc"), MATCHES)
def test_names_that_match(registered, kyc, settings):
    settings.FAV_NAME_MATCH_THRESHOLD = 0.8

    decision = fav.name_match(registered, kyc)

    assert decision.matched, decision
    assert 0.8 <= decision.score <= 1.0
    assert decision.threshold == 0.8


@pytest.mark.parametrize(("registered", "kyc"), MISMATCHES)
def test_names_that_do_not_match(registered, kyc, settings):
    settings.FAV_NAME_MATCH_THRESHOLD = 0.8

    decision = fav.name_match(registered, kyc)

    assert not decision.matched, decision
    assert 0.0 <= decision.score < 0.8


def test_scores_are_exact_where_the_rule_says_so():
    assert fav.name_match_score("PRIYA SHARMA", "Ms. priya  SHARMA") == 1.0
    assert fav.name_match_score("ANIL KUMAR VERMA", "A K Verma") == pytest.approx(0.9333)
    assert fav.name_match_score("PRIYA RANI SHARMA", "Priya Sharma") == 0.8
    assert fav.name_match_score("PRIYA VERMA", "Priya Sharma") == 0.5
    assert fav.name_words("Smt. Lakshmi-Devi R.") == ["LAKSHMI", "DEVI", "R"]
    assert fav.name_words("José Dsouza") == ["JOSE", "DSOUZA"]


def test_the_threshold_setting_decides(settings):
    settings.FAV_NAME_MATCH_THRESHOLD = 0.95

    assert not fav.name_match("ANIL KUMAR VERMA", "A K Verma").matched
    assert fav.name_match("ANIL KUMAR VERMA", "A K Verma", threshold=0.9).matched
    with pytest.raises(ValueError):
        fav.name_match("A", "A", threshold=1.5)


def test_the_threshold_is_a_documented_setting():
    from tests.conftest import ROOT

    assert isinstance(settings.FAV_NAME_MATCH_THRESHOLD, float)
    assert 0.0 <= settings.FAV_NAME_MATCH_THRESHOLD <= 1.0
    assert "\nFAV_NAME_MATCH_THRESHOLD=0.8\n" in (ROOT / ".env.example").read_text()
