"""Hot accounts (issue 11 §4; ledger/services.py, migration 0003): posts to accounts
matching LEDGER_HOT_ACCOUNTS neither lock nor update the account row — their postings
become ``ledger_balance_deltas`` rows that ``rollup`` folds into the balance — while the
ledger keeps its invariants: entries balanced, posts idempotent, no overdraft of a
LEDGER_NON_NEGATIVE_ACCOUNTS account, balances exact after any interleaving of posts
and rollups, the trial balance unchanged by a rollup.

Each protection is switched off once (``..._without_...`` tests) to show what it stops:
LEDGER_LOCK_NON_NEGATIVE=False (a non-negative account read without its lock is
overdrawn), LEDGER_HOT_ACCOUNTS=[] (posts queue on the account row again) and
LEDGER_ROLLUP_SKIP_LOCKED=False (two rollups fold the same deltas twice)."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
from django.db import OperationalError, connection, connections, transaction

from ledger import services as ledger
from ledger import tasks
from ledger.models import Account, BalanceDelta, Entry
from ledger.services import Line
from tests.factories import BalanceDeltaFactory
from tests.flows import wait_for
from tests.ledgerops import in_threads, move

pytestmark = pytest.mark.django_db(transaction=True)

D = Decimal




@pytest.fixture(autouse=True)
def _ledger_settings(settings):
    settings.LEDGER_HOT_ACCOUNTS = ["test:*"]
    settings.LEDGER_NON_NEGATIVE_ACCOUNTS = ["wallet:*"]
    settings.LEDGER_ROLLUP_BATCH = 50
    settings.LEDGER_ROLLUP_PERIOD_S = 1.0


def stored(code: str, ccy: str = "USDC") -> Decimal:
    return Account.objects.get(code=code, currency=ccy).balance


def test_a_hot_post_appends_deltas_and_leaves_the_account_row_alone():
    move("k1", "test:partner", "test:hub", "10")
    move("k2", "test:hub", "plain", "4")

    assert (stored("test:partner"), stored("test:hub"), stored("plain")) == (0, 0, D("4"))
    assert Account.objects.get(code="test:hub").hot
    assert sorted(BalanceDelta.objects.values_list("amount", flat=True)) == [
        D("-10"), D("-4"), D("10")]
    assert ledger.balance(account="test:hub", currency="USDC") == D("6")
    assert ledger.balances(prefix="test:") == {("test:hub", "USDC"): D("6"),
                                               ("test:partner", "USDC"): D("-10")}
    assert ledger.trial_balance().ok


def test_a_rollup_folds_every_delta_exactly_and_leaves_the_trial_balance_unchanged():
    for i in range(120):
        move(f"k{i}", "test:partner", "test:hub", f"{i}.0000001")
    before = ledger.trial_balance()

    folded = [ledger.rollup(batch=50) for _ in range(4)]

    assert folded == [50, 50, 50, 50]  # 240 deltas, one per account per post
    assert tasks.rollup_balances() == 40
    after = ledger.trial_balance()
    assert after.ok and after.accounts == before.accounts and after.totals == before.totals
    total = sum(D(f"{i}.0000001") for i in range(120))
    assert (stored("test:hub"), stored("test:partner")) == (total, -total)
    assert not BalanceDelta.objects.exists()


def test_hot_posts_stay_balanced_and_idempotent_under_concurrency():
    results = in_threads(12, lambda i: ledger.post(
        idempotency_key=f"conv-{i % 4}", kind="test.convert",
        lines=[Line("test:hub", "USDC", D("-10")), Line("test:fx", "USDC", D("10")),
               Line("test:fx", "INR", D("-850")), Line("test:payable", "INR", D("850"))]))

    assert all(isinstance(r, Entry) for r in results), results
    assert Entry.objects.count() == 4 and sum(not r.replayed for r in results) == 4
    assert ledger.balance(account="test:payable", currency="INR") == D("3400")
    assert BalanceDelta.objects.count() == 4 * 4  # one per account; replays: none
    trial = ledger.trial_balance()
    assert trial.ok and not trial.unbalanced
    with pytest.raises(ledger.IdempotencyConflict):
        move("conv-0", "test:hub", "test:fx", "10")


def test_posts_to_a_hot_account_never_wait_for_another_posts_lock():
    move("open", "test:partner", "test:hub", "1")
    assert held_open_while_posting("test:hub") is None


def test_without_hot_accounts_posts_queue_on_the_account_row(settings):
    """The protection switched off: the same account, not hot, is locked by the open
    transaction and the second post times out waiting for it."""
    settings.LEDGER_HOT_ACCOUNTS = []
    move("open", "test:partner", "test:hub", "1")
    assert isinstance(held_open_while_posting("test:hub"), OperationalError)


def held_open_while_posting(account: str):
    """Post to ``account`` in a transaction held open by another thread; return what a
    second post to it raised within a 1 s lock_timeout (None: it went through)."""
    posted, release = threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                move("holder", "test:partner", account, "1")
                posted.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert posted.wait(10)
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET LOCAL lock_timeout = '1s'")
            move("second", "test:partner", account, "1")
        return None
    except OperationalError as exc:
        return exc
    finally:
        release.set()
        thread.join(10)


def overdraw(n: int) -> list:
    """``n`` concurrent withdrawals of 10 from a wallet holding 10, each pausing 0.3 s
    between its balance read and its writes."""
    move("fund", "bank", "wallet:w", "10")

    def slow(balances):
        time.sleep(0.3)

    return in_threads(n, lambda i: move(f"out-{i}", "wallet:w", f"test:dst-{i}", "10",
                                        precondition=slow))


def test_a_non_negative_account_is_locked_and_never_overdrawn(settings):
    settings.LEDGER_HOT_ACCOUNTS = ["test:*", "wallet:*"]  # non-negative wins
    results = overdraw(6)

    assert sum(isinstance(r, Entry) for r in results) == 1, results
    refused = [r for r in results if isinstance(r, ledger.Overdraft)]
    assert len(refused) == 5 and refused[0].account == ("wallet:w", "USDC")
    assert ledger.balance(account="wallet:w", currency="USDC") == 0
    assert not Account.objects.get(code="wallet:w").hot
    assert ledger.trial_balance().ok


def test_without_the_lock_a_non_negative_account_is_overdrawn(settings):
    """The protection switched off: every withdrawal reads 10 before any commits."""
    settings.LEDGER_LOCK_NON_NEGATIVE = False
    results = overdraw(6)

    assert all(isinstance(r, Entry) for r in results), results
    assert ledger.balance(account="wallet:w", currency="USDC") == D("-50")


def test_an_overdraft_is_refused_before_any_write_and_a_replay_is_not_checked():
    move("fund", "bank", "wallet:w", "5")
    with pytest.raises(ledger.Overdraft):
        move("big", "wallet:w", "test:dst", "6")
    assert not Entry.objects.filter(idempotency_key="big").exists()
    move("ok", "wallet:w", "test:dst", "5")
    assert move("ok", "wallet:w", "test:dst", "5").replayed
    with pytest.raises(ledger.Overdraft):
        move("fresh", "wallet:new", "test:dst", "1")  # an account never used holds 0


def test_rollups_and_posts_running_together_leave_exact_balances():
    stop = threading.Event()

    def poster(i):
        for j in range(25):
            move(f"p{i}-{j}", "test:partner", "test:hub", "1.25")
        return "posted"

    def roller(i):
        folded = 0
        while not stop.is_set():
            folded += ledger.rollup(batch=7)
        return folded

    rollers = []
    for i in range(3):
        t = threading.Thread(target=lambda i=i: (roller(i), connections.close_all()))
        t.start()
        rollers.append(t)
    try:
        assert in_threads(4, poster) == ["posted"] * 4
    finally:
        stop.set()
        for t in rollers:
            t.join(10)
    while ledger.rollup():
        pass

    assert (stored("test:hub"), stored("test:partner")) == (D("125"), D("-125"))
    assert not BalanceDelta.objects.exists()
    assert ledger.trial_balance().ok


def two_rollups_behind_a_locked_account() -> list:
    """Two rollups start while the test holds the hot account's row lock (so each has
    read its batch before either can fold it); return what each folded."""
    for i in range(5):
        move(f"k{i}", "test:partner", "test:hub", "2")
    hub = Account.objects.get(code="test:hub").pk
    partner = Account.objects.get(code="test:partner").pk
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT id FROM ledger_accounts WHERE id IN (%s, %s) FOR UPDATE",
                        [hub, partner])
        results: list = [None, None]

        def run(i):
            try:
                results[i] = ledger.rollup()
            finally:
                connections.close_all()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()

        def settled() -> bool:  # each rollup finished, or read its batch and waits on us
            with connection.cursor() as cur:
                # pg_stat_activity is read once per transaction unless the snapshot is
                # cleared, and this check runs inside the transaction holding the lock.
                cur.execute("SELECT pg_stat_clear_snapshot()")
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND wait_event_type = 'Lock'")
                waiting = cur.fetchone()[0]
            return waiting + sum(not t.is_alive() for t in threads) >= 2

        wait_for(settled, timeout=15, interval=0.05, what="both rollups past their read")
    for t in threads:
        t.join(10)
    return results


def test_two_rollups_never_fold_the_same_delta():
    results = two_rollups_behind_a_locked_account()

    assert sorted(results) == [0, 10]  # the second skipped the claimed deltas
    assert (stored("test:hub"), stored("test:partner")) == (D("10"), D("-10"))
    assert ledger.trial_balance().ok


def test_without_skip_locked_two_rollups_fold_the_same_deltas_twice(settings):
    """The protection switched off: both rollups read the same deltas unlocked."""
    settings.LEDGER_ROLLUP_SKIP_LOCKED = False
    results = two_rollups_behind_a_locked_account()

    assert results == [10, 10]
    assert stored("test:hub") == D("20")
    assert not ledger.trial_balance().ok  # drift: stored balance above its postings


def test_the_rollup_is_a_beat_schedule():
    from corridor.schedules import periodic_tasks

    assert ("ledger rollup of hot-account deltas", "ledger.tasks.rollup_balances",
            1.0) in periodic_tasks()


def test_sync_hot_flags_follows_the_settings_and_balances_stay_exact(settings):
    move("k1", "test:partner", "test:hub", "3")
    settings.LEDGER_HOT_ACCOUNTS = []

    assert ledger.sync_hot_flags() == 2
    move("k2", "test:partner", "test:hub", "3")  # now updates the row, deltas remain

    assert ledger.balance(account="test:hub", currency="USDC") == D("6")
    assert stored("test:hub") == D("3")
    ledger.rollup()
    assert stored("test:hub") == D("6") and ledger.trial_balance().ok


def test_the_trial_balance_counts_deltas_and_reports_one_without_postings():
    move("k1", "test:partner", "test:hub", "3")
    hub = Account.objects.get(code="test:hub")
    assert ledger.trial_balance().ok

    BalanceDeltaFactory(account=hub, amount=D("5"))

    trial = ledger.trial_balance()
    assert not trial.ok
    assert trial.drift == [("test:hub", "USDC", D("8"), D("3"))]
