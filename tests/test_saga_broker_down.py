"""A saga's Celery enqueue fails after its commit (the broker is down): the commit
stands, the caller returns normally and the resume sweep owns the saga.

Found by ``make chaos`` (a Redis restart while sagas ran): ``on_commit(partial(...),
robust=True)`` made Django's own error logging raise ``AttributeError`` (a ``partial``
has no ``__qualname__``), so the worker's task crashed after a good commit. The broker
refusing a publish is a failure the real Redis cannot be made to give on demand without
taking it from every other test, so ``_enqueue`` alone raises kombu's error here."""

from __future__ import annotations

import time

import pytest
from kombu.exceptions import OperationalError

from sagas import engine
from sagas.models import Saga

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker_down(monkeypatch):
    calls = []

    def refuse(saga_id, delay_s):
        calls.append(saga_id)
        raise OperationalError("Error 111 connecting to 127.0.0.1:63799. Connection refused.")

    monkeypatch.setattr(engine, "_enqueue", refuse)
    return calls


def test_a_started_saga_survives_a_broker_down_at_enqueue(broker_down):
    saga = engine.start(kind="testing", reference=f"broker-down-{time.time_ns()}",
                        input={"amount": "10.00"}, dispatch=True)

    assert broker_down == [saga.pk]  # it was tried, after the commit
    assert Saga.objects.get(pk=saga.pk).status == "running"
    assert saga.pk in engine.resume_due()  # the sweep owns it


def test_a_retry_commit_survives_a_broker_down_at_enqueue(broker_down, settings):
    settings.SAGA_DEFAULT_BACKOFF_MS = 1
    saga = engine.start(kind="testing", reference=f"broker-down-{time.time_ns()}",
                        input={"amount": "10.00", "faults": {"fail_at": {
                            "leg": "test.fill", "mode": "retryable", "times": 1}}},
                        dispatch=False)

    result = engine.run(saga.pk, "w1", dispatch=True)

    assert result.leased and broker_down == [saga.pk]
    row = Saga.objects.get(pk=saga.pk)
    assert (row.status, row.lease_owner) == ("running", "")  # the retry is committed
