"""Attack (treasury_open): ``treasury_open`` (``make run`` runs it on every start until it
has booked once) while a payout is in flight: RazorpayX has debited it, the books have
not booked it paid. The opening is the balance less the books, so it is short by the
payout: once the payout is booked paid, ``razorpayx:current`` is below RazorpayX's
balance by the payout's amount for ever (the opening funding is simply wrong)."""

from __future__ import annotations

import pytest

from ledger import chart
from ledger import services as ledger
from payouts import statement as rzpx
from tests.flows import processing_payout
from tests.sandbox.razorpayx_calls import get_payout
from treasury.reconcile import open_distribution, open_razorpayx

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_treasury_open_with_a_payout_in_flight_books_the_opening_before_its_debit(
        settings, clean_sandbox):
    settings.RECEIPT_GRACE_S = 0.3
    open_distribution()
    stuck = processing_payout(clean_sandbox, "razorpayx.payout_stuck_processing")
    debited = get_payout(clean_sandbox, stuck.provider_payout_id)
    charged = chart.rupees(debited["amount"] + debited["fees"])
    assert charged > 0
    assert not chart.posted(chart.paid_key("withdrawal", stuck.transaction_id))

    open_razorpayx(operator="test")

    outside = chart.rupees(rzpx.balance().amount_paise)
    books = ledger.balance(account=chart.RAZORPAYX_CURRENT, currency="INR")
    # The books must hold what the account held before the in-flight debit: booking the
    # payout paid later takes it off once.
    assert books == outside + charged, (books, outside, charged)
