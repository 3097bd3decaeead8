"""The ledger (ledger/services.py): entries sum to zero per currency — enforced by
PostgreSQL, not only by Python —, idempotent posts, preconditions before any write, and
concurrent posts to one account on real connections (ledger-and-sagas.md §4, §7 rule 6;
DESIGN.md §8 invariant 3)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from ledger import services as ledger
from ledger.models import Account, Entry, Posting
from ledger.services import Line
from tests.dbcount import count_write_commits
from tests.factories import AccountFactory
from tests.ledgerops import in_threads, move

pytestmark = pytest.mark.django_db(transaction=True)

D = Decimal




def test_post_writes_one_balanced_entry_and_moves_balances():
    entry = ledger.post(
        idempotency_key="k1", kind="fx.convert", reference="ref-1", saga_id=7,
        lines=[Line("hub", "USDC", D("-10")), Line("fx", "USDC", D("10")),
               Line("fx", "INR", D("-850.00")), Line("payable", "INR", D("850.00"))])

    stored = Entry.objects.get()
    assert (stored.pk, stored.kind, stored.reference, stored.saga_id) == \
        (entry.pk, "fx.convert", "ref-1", 7)
    assert entry.replayed is False
    assert Posting.objects.filter(entry=stored).count() == 4
    assert ledger.balances() == {("fx", "INR"): D("-850"), ("fx", "USDC"): D("10"),
                                 ("hub", "USDC"): D("-10"), ("payable", "INR"): D("850")}
    assert ledger.balance(account="payable", currency="INR") == D("850")
    assert ledger.balance(account="nobody", currency="INR") == 0
    trial = ledger.trial_balance()
    assert trial.ok and trial.totals == {"INR": 0, "USDC": 0}


def test_same_key_again_returns_the_entry_and_writes_nothing():
    first = move("k1", "a", "b", "5")

    with count_write_commits() as counted:
        again = move("k1", "a", "b", "5")

    assert counted["commits"] == 0
    assert again.pk == first.pk and again.replayed is True
    assert Entry.objects.count() == 1 and Posting.objects.count() == 2
    assert ledger.balance(account="b", currency="USDC") == D("5")


def test_same_key_with_other_lines_raises_and_writes_nothing():
    move("k1", "a", "b", "5")

    with pytest.raises(ledger.IdempotencyConflict):
        move("k1", "a", "b", "6")
    with pytest.raises(ledger.IdempotencyConflict):
        ledger.post(idempotency_key="k1", kind="other.kind",
                    lines=[Line("a", "USDC", D("-5")), Line("b", "USDC", D("5"))])

    assert Entry.objects.count() == 1
    assert ledger.balance(account="b", currency="USDC") == D("5")


@pytest.mark.parametrize("lines", [
    [Line("a", "USDC", D("-5")), Line("b", "USDC", D("4"))],
    [Line("a", "USDC", D("-5")), Line("b", "INR", D("5"))],  # zero overall, not per currency
    [Line("a", "USDC", D("5"))],
])
def test_unbalanced_lines_are_refused_before_any_sql(lines):
    with count_write_commits() as counted, pytest.raises(ledger.UnbalancedEntry):
        ledger.post(idempotency_key="bad", kind="test", lines=lines)
    assert counted["commits"] == 0 and not Entry.objects.exists()


@pytest.mark.parametrize("amount", [5.0, D("0"), D("0.00000001"), D("NaN")])
def test_amounts_must_be_nonzero_decimals_with_seven_places_at_most(amount):
    with pytest.raises(ledger.InvalidAmount):
        ledger.post(idempotency_key="bad", kind="test",
                    lines=[Line("a", "USDC", amount), Line("b", "USDC", D("1"))])
    assert not Entry.objects.exists()


def raw_entry(cur, key: str, postings: list[tuple[int, str]]) -> None:
    """Write an entry and its postings with plain SQL, as code bypassing ``post`` would."""
    cur.execute("INSERT INTO ledger_entries (idempotency_key, kind) VALUES (%s, 'raw') "
                "RETURNING id", [key])
    entry_id = cur.fetchone()[0]
    for account_id, amount in postings:
        cur.execute("INSERT INTO ledger_postings (entry_id, account_id, amount) "
                    "VALUES (%s, %s, %s)", [entry_id, account_id, amount])


@pytest.mark.parametrize("amounts", [
    [("usd_a", "-5"), ("usd_b", "4")],   # does not sum to zero
    [("usd_a", "-5"), ("inr_c", "5")],   # sums to zero overall, not per currency
    [("usd_a", "-5")],                   # a single posting
])
def test_the_database_refuses_an_unbalanced_entry_written_without_python(amounts):
    accounts = {"usd_a": AccountFactory(code="a", currency="USDC"),
                "usd_b": AccountFactory(code="b", currency="USDC"),
                "inr_c": AccountFactory(code="c", currency="INR")}

    with pytest.raises(IntegrityError, match="does not sum to zero"):
        with transaction.atomic(), connection.cursor() as cur:
            raw_entry(cur, "raw-1", [(accounts[name].pk, D(x)) for name, x in amounts])

    assert not Entry.objects.exists() and not Posting.objects.exists()
    assert ledger.trial_balance().ok


def test_the_database_accepts_a_balanced_raw_entry_and_keeps_balances():
    a = AccountFactory(code="a", currency="USDC")
    b = AccountFactory(code="b", currency="USDC")

    with transaction.atomic(), connection.cursor() as cur:
        raw_entry(cur, "raw-ok", [(a.pk, D("-3")), (b.pk, D("3"))])

    assert ledger.balance(account="b", currency="USDC") == D("3")  # trigger-maintained
    assert ledger.trial_balance().ok


def test_postings_and_entries_are_append_only():
    move("k1", "a", "b", "5")

    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        Posting.objects.update(amount=D("7"))
    with pytest.raises(IntegrityError, match="append-only"), connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_entries")

    assert ledger.balance(account="b", currency="USDC") == D("5")


def test_trial_balance_reports_a_balance_that_drifted_from_its_postings():
    move("k1", "a", "b", "5")
    Account.objects.filter(code="b").update(balance=D("9"))  # a write that bypasses post

    trial = ledger.trial_balance()

    assert not trial.ok
    assert trial.drift == [("b", "USDC", D("9"), D("5"))]
    assert trial.totals == {"USDC": D("4")}


def test_precondition_runs_inside_the_transaction_before_any_write():
    move("fund", "bank", "wallet", "3")
    seen = {}

    def precondition(balances):
        # Same transaction: it would see its own writes, had any been made.
        seen["written"] = (Entry.objects.filter(idempotency_key="k2").exists()
                           or Account.objects.filter(code="new").exists())
        seen["balances"] = dict(balances)
        seen["in_atomic"] = connection.in_atomic_block
        raise ledger.PreconditionFailed("no")

    with pytest.raises(ledger.PreconditionFailed):
        ledger.post(idempotency_key="k2", kind="test",
                    lines=[Line("wallet", "USDC", D("-1")), Line("new", "USDC", D("1"))],
                    precondition=precondition)

    assert seen == {"written": False, "in_atomic": True,
                    "balances": {("new", "USDC"): D("0"), ("wallet", "USDC"): D("3")}}
    assert Entry.objects.count() == 1 and not Account.objects.filter(code="new").exists()


def test_a_replay_does_not_run_the_precondition():
    move("k1", "wallet", "shop", "5")
    called = []

    again = move("k1", "wallet", "shop", "5", precondition=lambda b: called.append(b))

    assert again.replayed and called == []


def test_concurrent_posts_to_one_account_all_land():
    n = 12

    results = in_threads(n, lambda i: move(f"in-{i}", f"src-{i}", "hub", "1.5"))

    assert all(isinstance(r, Entry) for r in results), results
    assert ledger.balance(account="hub", currency="USDC") == D("18.0")
    trial = ledger.trial_balance()
    assert trial.ok and trial.accounts[("hub", "USDC")] == D("18")


def test_concurrent_withdrawals_never_overdraw_under_a_balance_precondition():
    move("fund", "bank", "wallet", "10")

    def withdraw(i):
        return move(f"out-{i}", "wallet", f"dst-{i}", "1",
                    precondition=ledger.require_balance("wallet", "USDC", D("1")))

    results = in_threads(16, withdraw)

    landed = [r for r in results if isinstance(r, Entry)]
    refused = [r for r in results if isinstance(r, ledger.PreconditionFailed)]
    assert (len(landed), len(refused)) == (10, 6), results
    assert ledger.balance(account="wallet", currency="USDC") == 0
    assert ledger.trial_balance().ok


def test_concurrent_posts_of_one_key_make_one_entry():
    results = in_threads(8, lambda i: move("same", "a", "b", "2"))

    assert all(isinstance(r, Entry) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert ledger.balance(account="b", currency="USDC") == D("2")


def test_post_many_locks_all_accounts_and_posts_each_key_once():
    specs = [ledger.EntrySpec("m1", "a.b", [Line("a", "USDC", D("-1")), Line("b", "USDC", D("1"))]),
             ledger.EntrySpec("m2", "b.c", [Line("b", "USDC", D("-1")), Line("c", "USDC", D("1"))])]

    first = ledger.post_many(entries=specs)
    again = ledger.post_many(entries=specs)

    assert [e.replayed for e in first] == [False, False]
    assert [e.replayed for e in again] == [True, True]
    assert ledger.balances() == {("a", "USDC"): D("-1"), ("b", "USDC"): D("0"),
                                 ("c", "USDC"): D("1")}
