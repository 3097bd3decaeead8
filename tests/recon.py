"""Helpers the reconciliation tests share (tests/test_treasury_rules.py, and any later
one; no test module imports another): the open breaks of given references, the balance
breaks of a source, an entry's lines, and the last run's compared RazorpayX balance."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.models import User

from ledger.models import Entry
from payouts.models import WithdrawalPayout
from tests.flows import pay_and_wait_for_ap, settle, start_withdrawal
from treasury.models import Break, ReconRun

RAZORPAYX = "razorpayx:current INR"


def mine(*references: str) -> list[tuple[str, str, str]]:
    """(source, kind, reference) of the open breaks of ``references``, sorted."""
    return sorted((b.source, b.kind, b.reference) for b in Break.objects.filter(
        reference__in=references, status=Break.Status.OPEN))


def balance_breaks(source: str) -> dict[str, Decimal]:
    """The open balance breaks of ``source``: key -> difference."""
    return {b.key: b.difference for b in Break.objects.filter(
        kind=Break.Kind.BALANCE_DIFFERS, status=Break.Status.OPEN, source=source)}


def entry_lines(key: str) -> dict[tuple[str, str], Decimal]:
    """The postings of entry ``key``: (account, currency) -> summed amount."""
    out: dict[tuple[str, str], Decimal] = {}
    for p in Entry.objects.get(idempotency_key=key).postings.select_related("account"):
        k = (p.account.code, p.account.currency)
        out[k] = out.get(k, Decimal(0)) + p.amount
    return out


def compared(run: ReconRun, key: str = RAZORPAYX) -> dict[str, Decimal]:
    """A run's compared balance of ``key`` as Decimals (books, outside, in_flight,
    explained_by_breaks, difference)."""
    return {k: Decimal(v) for k, v in run.balances[key].items() if k != "compared"}


def unexplained(run: ReconRun, key: str = RAZORPAYX) -> Decimal:
    """What the run could not explain of ``key``'s difference. The sandbox is shared by
    the session (its statement carries earlier tests' money, this database not), so a
    test compares this before and after its own flow."""
    return compared(run, key)["difference"]


def superuser(name: str = "treasury-ops") -> User:
    """An operator with every permission (the treasury and books tests' actor)."""
    return User.objects.create_superuser(name, f"{name}@example.com", "pw")


def paid_withdrawal(sandbox) -> WithdrawalPayout:
    """A SEP-24 withdrawal paid through the sandbox's RazorpayX to ``completed``."""
    wallet, transaction_id, pay = start_withdrawal(sandbox)
    pay_and_wait_for_ap(wallet, pay)
    payout = settle(transaction_id)
    assert payout.status == "completed"
    return payout
