"""The stored event row is the queue (anchor/inbox.py, issue 11 §3): a delivery is
durable before its 2xx, and its follow-up is dispatched exactly once, by the wake-up's
drain or, when the wake-up is lost, by the beat sweep (the same task)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time

import jwt
import pytest
from django.db import connection

from anchor import inbox, tasks
from anchor.models import DepositOrder, InboundEvent

pytestmark = pytest.mark.django_db(transaction=True)


def _ap_post(client, settings, event_id="evt-q1", tx_id="tx-q1"):
    token = jwt.encode({"exp": int(time.time()) + 30}, settings.AP_CALLBACK_AUTH_SECRET,
                       algorithm="HS256")
    event = {"id": event_id, "type": "transaction_status_changed",
             "timestamp": "2026-12-02T00:00:00Z",
             "payload": {"transaction": {"id": tx_id, "kind": "deposit",
                                         "status": "pending_anchor"}}}
    return client.post("/callbacks/event", event, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def _payment_post(client, settings, event_id="evt-qp1"):
    body = json.dumps({"event": "payment.captured", "payload": {"payment": {"entity": {
        "id": "pay_q1", "order_id": "order_q1", "amount": 100000, "currency": "INR",
        "status": "captured", "method": "upi", "created_at": 1764633600}}}}).encode()
    signature = hmac.new(settings.RAZORPAY_WEBHOOK_SECRET.encode(), body,
                         hashlib.sha256).hexdigest()
    return client.post("/webhooks/razorpay/payments", body, content_type="application/json",
                       HTTP_X_RAZORPAY_SIGNATURE=signature, HTTP_X_RAZORPAY_EVENT_ID=event_id)


@pytest.fixture
def lost_wakeups(monkeypatch):
    """Every wake-up is lost (the web died after its 2xx, or the broker refused the
    publish); the follow-ups the drains dispatch are collected instead of published."""
    dispatched: list[tuple[str, list]] = []
    monkeypatch.setattr(inbox, "wake", lambda: None)
    monkeypatch.setattr(inbox, "_dispatch",
                        lambda name, args, producer=None: dispatched.append((name, args)))
    return dispatched


def test_an_event_whose_wake_up_is_lost_is_dispatched_once_by_the_sweep(
        client, settings, lost_wakeups):
    response = _ap_post(client, settings)

    assert response.json() == {"outcome": "release_scheduled"}
    row = InboundEvent.objects.get(source="ap", event_id="evt-q1")
    assert (row.follow_ups, row.processed_at) == ([["anchor.tasks.deposit_release",
                                                    ["tx-q1"]]], None)
    assert lost_wakeups == []  # stored, never published

    assert tasks.inbound_drain() == 1  # the beat sweep's task
    assert tasks.inbound_drain() == 0

    assert lost_wakeups == [("anchor.tasks.deposit_release", ["tx-q1"])]
    row.refresh_from_db()
    assert row.processed_at is not None


def test_a_replayed_event_is_acted_on_once(client, settings, lost_wakeups):
    first = _ap_post(client, settings)
    tasks.inbound_drain()
    again = _ap_post(client, settings)
    tasks.inbound_drain()

    assert (first.json()["outcome"], again.json()["outcome"]) == ("release_scheduled",
                                                                  "duplicate")
    assert lost_wakeups == [("anchor.tasks.deposit_release", ["tx-q1"])]
    assert InboundEvent.objects.filter(source="ap").count() == 1


def test_a_recorded_payment_webhook_hands_its_confirmation_to_the_drain_once(
        client, settings, lost_wakeups):
    DepositOrder.objects.create(transaction_id="tx-qp1", order_id="order_q1",
                                amount_in="1000.00", amount_in_paise=100000, fee="20.00",
                                amount_out="11.5294118", rate="85.0000")

    first = _payment_post(client, settings)
    replay = _payment_post(client, settings)
    assert tasks.inbound_drain() == 1
    tasks.inbound_drain()

    assert (first.json()["outcome"], replay.json()["outcome"]) == ("received", "duplicate")
    assert lost_wakeups == [("anchor.tasks.deposit_funds_received", ["tx-qp1"])]
    assert InboundEvent.objects.get(event_id="evt-qp1").outcome == "recorded"


def _order():
    return DepositOrder.objects.create(
        transaction_id="tx-qp1", order_id="order_q1", amount_in="1000.00",
        amount_in_paise=100000, fee="20.00", amount_out="11.5294118", rate="85.0000")


class WorkerKilled(BaseException):
    """A SIGKILL of the worker mid-drain, as far as the database sees it: the drain's
    transaction never commits (BaseException: nothing in the drain catches it)."""


def test_a_webhook_whose_drain_is_killed_mid_way_is_applied_once_by_the_next(
        client, settings, monkeypatch, lost_wakeups):
    """The payment webhook is stored (received), its wake-up lost; the first drain is
    killed after applying it, while it publishes: its transaction rolls back (the
    payment row with it). The sweep's drain applies it once: one payment, one
    follow-up published after the kill, the row processed."""
    from anchor.models import DepositPayment

    _order()
    assert _payment_post(client, settings).json()["outcome"] == "received"

    def killed(name, args, producer=None):
        raise WorkerKilled

    monkeypatch.setattr(inbox, "_dispatch", killed)
    with pytest.raises(WorkerKilled):
        tasks.inbound_drain()
    assert not DepositPayment.objects.exists()
    assert InboundEvent.objects.get(event_id="evt-qp1").outcome == "received"

    monkeypatch.setattr(inbox, "_dispatch",
                        lambda name, args, producer=None: lost_wakeups.append((name, args)))
    assert tasks.inbound_drain() == 1
    assert tasks.inbound_drain() == 0

    assert DepositPayment.objects.count() == 1
    assert lost_wakeups == [("anchor.tasks.deposit_funds_received", ["tx-qp1"])]
    row = InboundEvent.objects.get(event_id="evt-qp1")
    assert (row.outcome, row.processed_at is not None) == ("recorded", True)


@pytest.mark.parametrize("claim", [True, False])
def test_two_concurrent_drains_apply_a_stored_webhook_once(client, settings, monkeypatch,
                                                           lost_wakeups, claim):
    """Drain A is applying the stored payment webhook (inside ``payment_record``) when
    drain B runs. With the claim (FOR UPDATE SKIP LOCKED) B skips the row; without
    (INBOUND_DRAIN_CLAIM=False) B applies the same webhook a second time."""
    from anchor import deposits

    settings.INBOUND_DRAIN_CLAIM = claim
    _order()
    _payment_post(client, settings)
    real = deposits.payment_record
    applied: list[str] = []
    a_inside, b_done = threading.Event(), threading.Event()

    def payment_record(**kwargs):
        applied.append(threading.current_thread().name)
        if threading.current_thread().name == "drain-a":
            a_inside.set()
            b_done.wait(timeout=3)
        return real(**kwargs)

    monkeypatch.setattr(deposits, "payment_record", payment_record)
    results = _two_drains(a_inside, b_done)

    if claim:
        assert (applied, results) == (["drain-a"], {"drain-a": 1, "drain-b": 0})
        assert lost_wakeups == [("anchor.tasks.deposit_funds_received", ["tx-qp1"])]
    else:  # the protection off: the same webhook is applied twice
        assert sorted(applied) == ["drain-a", "drain-b"]


def test_a_drain_whose_publish_fails_leaves_the_follow_up_waiting(client, settings,
                                                                  monkeypatch):
    monkeypatch.setattr(inbox, "wake", lambda: None)
    _ap_post(client, settings)

    def broker_down(name, args, producer=None):
        raise ConnectionError("broker down")

    monkeypatch.setattr(inbox, "_dispatch", broker_down)
    with pytest.raises(ConnectionError):
        inbox.drain()

    assert InboundEvent.objects.get(event_id="evt-q1").processed_at is None


def test_a_drain_whose_batched_publish_fails_at_its_flush_leaves_the_follow_up_waiting(
        client, settings, monkeypatch):
    """The drain's messages go to Redis in one pipeline when the batch ends (kombu's
    Producer.batch): a flush that fails rolls the drain's transaction back."""
    from kombu.transport import redis as kombu_redis

    monkeypatch.setattr(inbox, "wake", lambda: None)
    _ap_post(client, settings)

    def broker_down(self):
        raise ConnectionError("broker down at the flush")

    monkeypatch.setattr(kombu_redis.PublishBatch, "flush", broker_down)
    with pytest.raises(ConnectionError):
        inbox.drain()

    assert InboundEvent.objects.get(event_id="evt-q1").processed_at is None


@pytest.mark.parametrize("claim", [True, False])
def test_two_concurrent_drains_dispatch_a_follow_up_once(client, settings, monkeypatch,
                                                         claim):
    """Drain A holds the row mid-dispatch while drain B runs. With the claim (FOR UPDATE
    SKIP LOCKED) B skips it; without (INBOUND_DRAIN_CLAIM=False) B dispatches it too."""
    settings.INBOUND_DRAIN_CLAIM = claim
    monkeypatch.setattr(inbox, "wake", lambda: None)
    _ap_post(client, settings)
    dispatched: list[str] = []
    a_inside, b_done = threading.Event(), threading.Event()

    def dispatch(name, args, producer=None):
        dispatched.append(threading.current_thread().name)
        if threading.current_thread().name == "drain-a":
            a_inside.set()
            b_done.wait(timeout=5)

    monkeypatch.setattr(inbox, "_dispatch", dispatch)
    results = _two_drains(a_inside, b_done)

    if claim:
        assert (dispatched, results) == (["drain-a"], {"drain-a": 1, "drain-b": 0})
    else:  # the protection off: the same follow-up goes out twice
        assert sorted(dispatched) == ["drain-a", "drain-b"]


def test_a_delivery_wakes_a_drain_on_the_broker(client, settings, monkeypatch):
    from corridor.celery import app

    monkeypatch.setattr(inbox, "wake", inbox._waker.wake)  # the real one, not conftest's

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("celery")
        _ap_post(client, settings)
        deadline = time.monotonic() + 3
        names = []
        while time.monotonic() < deadline and "anchor.tasks.inbound_drain" not in names:
            time.sleep(0.05)
            client_redis = conn.default_channel.client
            names = [json.loads(m)["headers"]["task"] for m in client_redis.lrange("celery", 0, -1)]
        conn.default_channel.queue_purge("celery")

    assert "anchor.tasks.inbound_drain" in names
    assert InboundEvent.objects.get(event_id="evt-q1").processed_at is None  # no worker here


def _two_drains(a_inside: threading.Event, b_done: threading.Event) -> dict[str, int]:
    """Run ``inbox.drain`` in threads ``drain-a`` and ``drain-b``, b starting once a is
    inside (``a_inside``) and a held until b is done (``b_done``): the race a claim must
    win. Returns thread name -> rows drained."""
    results: dict[str, int] = {}

    def run(name):
        try:
            if name == "drain-b":
                a_inside.wait(timeout=5)
            results[name] = inbox.drain()
        finally:
            if name == "drain-b":
                b_done.set()
            connection.close()

    threads = [threading.Thread(target=run, args=(n,), name=n) for n in ("drain-a", "drain-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    return results
