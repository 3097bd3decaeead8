"""``withdrawal_requests.awaits_payout`` is exact whatever writes the payouts
(payouts/migrations/0006): true while the withdrawal has no payout or only a failed one,
the condition ``corridor.stranded`` reads to leave out the receipts a withdrawal still
owns. Real rows, written the ways the code writes them (the factories' INSERTs,
``WithdrawalPayout.transition``'s conditional UPDATEs, a queryset delete, a stale
``save()``), and the PostgreSQL triggers doing the work.

Protection off: the two triggers are dropped inside the test's transaction (rolled back
after) and the same walk fails at its first step."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from payouts.models import WithdrawalPayout, WithdrawalRequest
from tests.factories import WithdrawalPayoutFactory, WithdrawalRequestFactory

P = WithdrawalPayout.Status
TRIGGERS = (("withdrawal_payouts", "withdrawal_payouts_awaits_payout"),
            ("withdrawal_requests", "withdrawal_requests_awaits_payout"))


def assert_awaits(request: WithdrawalRequest, expected: bool) -> None:
    """The stored flag is ``expected`` and equals the anti-join it replaces."""
    stored = WithdrawalRequest.objects.values_list("awaits_payout", flat=True).get(
        pk=request.pk)
    truth = not WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).exclude(
        status=P.FAILED).exists()
    assert (stored, truth) == (expected, expected), f"stored {stored}, payouts say {truth}"


def move(payout: WithdrawalPayout, to: str) -> None:
    WithdrawalPayout.transition(payout.pk, payout.status, to, require=True)
    payout.refresh_from_db()


def walk() -> None:
    """A withdrawal through every payout state that changes whether it owns receipts."""
    request = WithdrawalRequestFactory()
    assert_awaits(request, True)  # no payout yet

    payout = WithdrawalPayoutFactory(transaction_id=request.transaction_id)  # the claim
    assert payout.status == P.PROCESSING
    assert_awaits(request, False)

    move(payout, P.FAILED)  # the provider said failed: the withdrawal owns them again
    assert_awaits(request, True)

    move(payout, P.PROCESSING)  # an operator's new attempt
    assert_awaits(request, False)

    move(payout, P.COMPLETED)
    assert_awaits(request, False)

    move(payout, P.REVERSED)  # came back from the bank: still paid out as far as we know
    assert_awaits(request, False)

    move(payout, P.MANUAL_REVIEW)
    assert_awaits(request, False)

    move(payout, P.FAILED)  # an operator's mark-failed
    assert_awaits(request, True)

    move(payout, P.PROCESSING)
    WithdrawalPayout.objects.filter(pk=payout.pk).delete()
    assert_awaits(request, True)

    # A payout written before its request (factories, a replayed import): the request
    # row is right from its insert.
    early = WithdrawalPayoutFactory(status=P.COMPLETED)
    late = WithdrawalRequestFactory(transaction_id=early.transaction_id)
    assert_awaits(late, False)

    # A save() of a copy read before the claim writes every column back, the flag too:
    # the database keeps the true value, not the stale one.
    stale = WithdrawalRequest.objects.get(pk=request.pk)
    assert stale.awaits_payout is True
    WithdrawalPayoutFactory(transaction_id=request.transaction_id)
    stale.review_reason = "noted"
    stale.save()
    assert_awaits(request, False)

    # A payout moved to another transaction id: both requests are recomputed.
    other = WithdrawalRequestFactory()
    WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).update(
        transaction_id=other.transaction_id)
    assert_awaits(request, True)
    assert_awaits(other, False)

    # One statement moving many payouts (the row trigger runs per row).
    many = WithdrawalRequestFactory.create_batch(3)
    for each in many:
        WithdrawalPayoutFactory(transaction_id=each.transaction_id)
    WithdrawalPayout.objects.filter(transaction_id__in=[r.transaction_id for r in many]
                                    ).update(status=P.FAILED)
    for each in many:
        assert_awaits(each, True)


@pytest.mark.django_db
def test_the_flag_follows_every_payout_write():
    walk()


@pytest.mark.django_db
def test_protection_off_without_the_triggers_the_same_walk_fails():
    with connection.cursor() as cursor:
        for table, trigger in TRIGGERS:
            cursor.execute(f'DROP TRIGGER "{trigger}" ON {table}')

    with pytest.raises(AssertionError, match="stored True, payouts say False"):
        walk()


@pytest.mark.django_db
def test_protection_off_without_the_request_trigger_a_stale_save_wins():
    """The requests trigger alone is what defeats a stale save()."""
    with connection.cursor() as cursor:
        cursor.execute('DROP TRIGGER "withdrawal_requests_awaits_payout" ON withdrawal_requests')
    request = WithdrawalRequestFactory()
    stale = WithdrawalRequest.objects.get(pk=request.pk)
    WithdrawalPayoutFactory(transaction_id=request.transaction_id)
    assert_awaits(request, False)  # the payouts trigger did its part

    stale.save()

    with pytest.raises(AssertionError, match="stored True, payouts say False"):
        assert_awaits(request, False)


@pytest.mark.django_db(transaction=True)
def test_a_stale_save_waiting_on_a_concurrent_claim_keeps_the_claims_flag():
    """A claim in another transaction holds the request's row lock (its trigger wrote the
    flag); a stale save() waits for it, then recomputes the flag with a snapshot that
    sees the committed payout (the trigger's own statement, READ COMMITTED)."""
    request = WithdrawalRequestFactory()
    stale = WithdrawalRequest.objects.get(pk=request.pk)
    claimed, commit = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def claim() -> None:
        try:
            with transaction.atomic():
                WithdrawalPayoutFactory(transaction_id=request.transaction_id)
                claimed.set()
                assert commit.wait(timeout=10)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            claimed.set()
        finally:
            connection.close()

    claimer = threading.Thread(target=claim)
    claimer.start()
    assert claimed.wait(timeout=10)
    timer = threading.Timer(0.5, commit.set)
    timer.start()
    started = time.monotonic()
    stale.review_reason = "noted"
    stale.save()  # blocks on the row lock until the claim commits
    waited = time.monotonic() - started
    claimer.join(timeout=10)
    timer.cancel()

    assert errors == []
    assert waited >= 0.4, f"the save did not wait for the claim ({waited:.2f}s)"
    assert_awaits(request, False)
    assert WithdrawalRequest.objects.get(pk=request.pk).review_reason == "noted"
