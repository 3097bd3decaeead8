"""KYC above a threshold and per-customer limits on the SEP-24 pages (anchor/limits.py),
driven as a wallet user does: the sandbox wallet starts a deposit or withdrawal at the
sandbox AP, the person follows the interactive URL and posts the forms over HTTP to
Corridor's live server. Two tabs of one customer racing past the daily limit: one
passes, the other is told how much is left."""

from __future__ import annotations

import re
import threading
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from anchor import customers
from anchor.models import Customer, CustomerVolume, DepositOrder
from sandbox.drivers import Customer as Person
from sandbox.drivers import Wallet

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KYC = {"first_name": "Asha", "last_name": "Verma", "tax_id": "ABCDE1234F",
       "birth_date": "1990-04-01"}


class Tab:
    """One browser tab on a transaction's form."""

    def __init__(self, person: Person, url: str):
        self.person = person
        opened = person.open(url)
        assert opened.status_code == 302, opened.text[:300]
        self.form_url = str(opened.url.join(opened.headers["location"]))
        self.page = person.http.get(self.form_url)

    def post(self, **data):
        self.page = self.person.http.post(self.form_url,
                                          data={**data, **self.person._csrf(self.page)})
        return self.page


def deposit_tab(sbx, wallet=None, person=None) -> tuple[str, Tab]:
    wallet = wallet or Wallet(sbx)
    transaction_id, url = wallet.start_deposit()
    return transaction_id, Tab(person or Person(sbx), url)


def error_text(page) -> str:
    found = re.findall(r'class="field-error">([^<]*)<', page.text)
    return " ".join(found)


def test_a_small_deposit_needs_no_kyc_and_counts_against_the_limit(clean_sandbox):
    transaction_id, tab = deposit_tab(clean_sandbox)

    assert tab.post(amount="1000").status_code == 200
    done = tab.post(amount="1000", confirm="yes")

    assert done.status_code == 302
    volume = CustomerVolume.objects.get(transaction_id=transaction_id)
    assert (volume.kind, volume.amount_inr) == ("deposit", Decimal("1000.00"))
    assert volume.customer.type == "sep24-customer" and volume.customer.provided == []


def test_above_the_threshold_the_page_asks_for_kyc_then_takes_the_deposit(clean_sandbox,
                                                                          settings):
    settings.KYC_SEP24_THRESHOLD_INR = Decimal("5000")
    transaction_id, tab = deposit_tab(clean_sandbox)

    asked = tab.post(amount="6000")
    assert asked.status_code == 200 and 'name="tax_id"' in asked.text
    assert "Amounts above ₹5000" in asked.text and "You receive" not in asked.text
    bad = tab.post(amount="6000", **{**KYC, "tax_id": "ABC123"})
    assert bad.status_code == 400 and "not a PAN" in error_text(bad)
    quoted = tab.post(amount="6000", **KYC)
    assert quoted.status_code == 200 and "You receive" in quoted.text
    done = tab.post(amount="6000", confirm="yes")

    assert done.status_code == 302
    assert DepositOrder.objects.get(transaction_id=transaction_id).amount_in == 6000
    customer = Customer.objects.get(type="sep24-customer")
    assert customers.personal_data(customer)["tax_id"] == "ABCDE1234F"
    assert b"ABCDE1234F" not in bytes(customer.data)


def test_a_rejected_customer_cannot_go_above_the_threshold(clean_sandbox, settings):
    settings.KYC_SEP24_THRESHOLD_INR = Decimal("5000")
    wallet, person = Wallet(clean_sandbox), Person(clean_sandbox)
    _, tab = deposit_tab(clean_sandbox, wallet, person)
    tab.post(amount="6000", **KYC)
    Customer.objects.filter(type="sep24-customer").update(review="rejected",
                                                           message="sanctions")

    _, again = deposit_tab(clean_sandbox, wallet, person)
    refused = again.post(amount="6000")
    small = again.post(amount="1000")

    assert refused.status_code == 400 and "cannot move more than" in error_text(refused)
    assert small.status_code == 200 and "You receive" in small.text


def test_the_daily_limit_says_what_is_left(clean_sandbox, settings):
    settings.LIMIT_DAILY_INR = Decimal("3000")
    wallet, person = Wallet(clean_sandbox), Person(clean_sandbox)
    _, first = deposit_tab(clean_sandbox, wallet, person)
    first.post(amount="2000")
    assert first.post(amount="2000", confirm="yes").status_code == 302

    _, second = deposit_tab(clean_sandbox, wallet, person)
    over = second.post(amount="1500")

    assert over.status_code == 400
    assert "₹1000.00 is left" in error_text(over)
    assert second.post(amount="1000").status_code == 200


def test_two_tabs_racing_past_the_daily_limit_pass_one_at_a_time(clean_sandbox, settings):
    settings.LIMIT_DAILY_INR = Decimal("3000")
    wallet = Wallet(clean_sandbox)
    tabs = []
    for _ in range(2):
        _, tab = deposit_tab(clean_sandbox, wallet, Person(clean_sandbox))
        assert tab.post(amount="2000").status_code == 200  # each quote alone fits
        tabs.append(tab)
    answers = [None, None]
    barrier = threading.Barrier(2)

    def confirm(i):
        barrier.wait()
        answers[i] = tabs[i].post(amount="2000", confirm="yes")

    threads = [threading.Thread(target=confirm, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    codes = sorted(a.status_code for a in answers)
    assert codes == [302, 400], [a.text[:300] for a in answers]
    assert "over your limit" in error_text(next(a for a in answers if a.status_code == 400))
    assert CustomerVolume.objects.count() == 1
    assert DepositOrder.objects.count() == 1


def test_a_withdrawal_counts_its_rupees_against_the_limit(clean_sandbox, settings):
    settings.LIMIT_DAILY_INR = Decimal("500")
    wallet = Wallet(clean_sandbox)
    wallet.fund_usdc("100")
    _, url = wallet.start_withdrawal()
    tab = Tab(Person(clean_sandbox), url)
    fields = {"name": "Asha Verma", "method": "bank_account",
              "account_number": "50100123456789", "ifsc": "HDFC0001234"}

    over = tab.post(amount="10", **fields)  # about ₹835

    assert over.status_code == 400 and "₹500.00 is left" in error_text(over)
    assert tab.post(amount="5", **fields).status_code == 200


# --- a SEP-12 DELETE resets nothing (found by an attacker trial, 2026-12-04) ------------

def sep12_delete(sbx, wallet: Wallet):
    token = sbx.http.post("/ap/sep/sandbox-token", json={"account": wallet.address}
                          ).raise_for_status().json()["token"]
    return sbx.http.request("DELETE", f"/ap/sep/sep12/customer/{wallet.address}", json={},
                            headers={"Authorization": f"Bearer {token}"})


def test_a_rejected_customer_cannot_delete_itself_and_go_above_the_threshold(clean_sandbox,
                                                                             settings):
    settings.KYC_SEP24_THRESHOLD_INR = Decimal("5000")
    wallet, person = Wallet(clean_sandbox), Person(clean_sandbox)
    _, tab = deposit_tab(clean_sandbox, wallet, person)
    tab.post(amount="6000", **KYC)
    operator = User.objects.create_superuser("olga-ops")
    customers.review(customer_id=Customer.objects.get(type="sep24-customer").id,
                     decision="reject", operator=operator, note="OPS-9 sanctions hit")
    _, again = deposit_tab(clean_sandbox, wallet, person)
    assert again.post(amount="6000").status_code == 400  # rejected: held below

    assert sep12_delete(clean_sandbox, wallet).status_code == 200
    _, fresh = deposit_tab(clean_sandbox, wallet, person)
    quoted = fresh.post(amount="6000", **KYC)  # the same PAN, name and birth date
    done = fresh.post(amount="6000", confirm="yes")

    assert done.status_code != 302, (
        f"the rejected customer deleted itself and deposited INR 6000 above the "
        f"threshold with the same PAN: quote page {quoted.status_code}, confirm "
        f"{done.status_code}; customers "
        f"{list(Customer.objects.values_list('id', 'review', 'deleted_at'))}")


def test_deleting_the_customer_does_not_reset_the_daily_limit(clean_sandbox, settings):
    settings.LIMIT_DAILY_INR = Decimal("3000")
    wallet, person = Wallet(clean_sandbox), Person(clean_sandbox)
    _, first = deposit_tab(clean_sandbox, wallet, person)
    first.post(amount="3000")
    assert first.post(amount="3000", confirm="yes").status_code == 302
    _, second = deposit_tab(clean_sandbox, wallet, person)
    assert second.post(amount="3000").status_code == 400  # the day is used up

    assert sep12_delete(clean_sandbox, wallet).status_code == 200
    _, third = deposit_tab(clean_sandbox, wallet, person)
    third.post(amount="3000")
    done = third.post(amount="3000", confirm="yes")

    assert done.status_code != 302, (
        f"after a SEP-12 DELETE the same wallet account deposited another INR 3000 today "
        f"over a daily limit of 3000 ({error_text(done)!r})")


def test_a_customer_with_kyc_withdraws_only_to_an_account_in_their_own_name(clean_sandbox,
                                                                            settings):
    """Found by an attacker trial: fund account validation compared the bank's name
    with the name typed on the form, so a KYC'd user could pay anyone by typing their
    name."""
    settings.KYC_SEP24_THRESHOLD_INR = Decimal("5000")
    wallet, person = Wallet(clean_sandbox), Person(clean_sandbox)
    _, tab = deposit_tab(clean_sandbox, wallet, person)
    assert tab.post(amount="6000", **KYC).status_code == 200  # KYC given: Asha Verma
    wallet.fund_usdc("100")
    _, url = wallet.start_withdrawal()
    withdraw = Tab(person, url)
    fields = {"method": "bank_account", "account_number": "50100123456789",
              "ifsc": "HDFC0001234"}

    stranger = withdraw.post(amount="5", name="Rahul Mehta", **fields)
    own = withdraw.post(amount="5", name="ASHA VERMA", **fields)

    assert stranger.status_code == 400 and "your own name" in error_text(stranger)
    assert own.status_code == 200 and "You receive" in own.text


def test_a_withdrawal_above_the_threshold_is_not_paid_once_its_customer_is_rejected(
        settings):
    """Issue 25 §4: the gate let the withdrawal through (KYC given, not rejected); an
    operator rejects the customer before the USDC is paid out. The claim re-reads the
    customer: the request goes to review, no payout row is written, nothing is paid."""
    from payouts import guard
    from payouts.models import WithdrawalPayout, WithdrawalRequest
    from tests.factories import CustomerFactory, CustomerVolumeFactory, WithdrawalRequestFactory

    settings.KYC_SEP24_THRESHOLD_INR = Decimal("500")
    person = CustomerFactory(type=customers.SEP24, review="rejected", message="fraud ring")
    request = WithdrawalRequestFactory(status="funds_verified")  # ₹798.00
    CustomerVolumeFactory(transaction_id=request.transaction_id, customer=person,
                          kind="withdraw", amount_inr=request.amount_out)

    with pytest.raises(guard.NotPayable, match="rejected"):
        guard.payout_claim(request=request)

    assert not WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).exists()
    held = WithdrawalRequest.objects.get(pk=request.pk)
    assert held.status == "manual_review" and "fraud ring" in held.review_reason
    # Below the threshold the gate never asked for KYC, and the claim does not either.
    settings.KYC_SEP24_THRESHOLD_INR = Decimal("50000")
    small = WithdrawalRequestFactory(status="funds_verified")
    CustomerVolumeFactory(transaction_id=small.transaction_id, customer=person,
                          kind="withdraw", amount_inr=small.amount_out)
    assert guard.payout_claim(request=small) is not None
