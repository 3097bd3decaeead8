"""Two applies of one payout's status racing for its row lock (payouts.guard).

A webhook saying ``processed`` and a poll that read ``processing`` a moment earlier both
call ``payout_apply_status``; the row lock orders them. The later one must judge "forward
only" by what the earlier one wrote, i.e. read the attempt's status under the lock.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from payouts import guard
from payouts.models import PayoutAttempt, WithdrawalPayout
from payouts.providers.base import ProviderPayout
from tests.factories import PayoutAttemptFactory
from tests.flows import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


def test_a_stale_processing_behind_a_processed_does_not_write_its_rank_back():
    attempt = PayoutAttemptFactory(payout__status="processing", provider_status="processing")
    payout = attempt.payout
    processed = ProviderPayout(attempt.provider_payout_id, "processed", 79800, utr="UTR0001")
    processing = ProviderPayout(attempt.provider_payout_id, "processing", 79800)
    locked, release, errors = threading.Event(), threading.Event(), []

    def webhook():  # holds the row lock first, applies "processed" after the poll queued
        try:
            with transaction.atomic():
                WithdrawalPayout.objects.select_for_update().get(pk=payout.pk)
                locked.set()
                release.wait(10)
                guard.payout_apply_status(payout=payout, state=processed, complete_ap=False)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    def poll():  # read "processing" from RazorpayX before the webhook committed
        try:
            guard.payout_apply_status(payout=WithdrawalPayout.objects.get(pk=payout.pk),
                                      state=processing, complete_ap=False)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=webhook)
    first.start()
    assert locked.wait(10)
    second = threading.Thread(target=poll)
    second.start()
    wait_for(lambda: _waiting_on_a_lock() >= 1, timeout=10, what="the poll waiting on the row")
    release.set()
    first.join(10)
    second.join(10)

    assert errors == []
    assert WithdrawalPayout.objects.get(pk=payout.pk).status == "completed"
    assert PayoutAttempt.objects.get(pk=attempt.pk).provider_status == "processed"
