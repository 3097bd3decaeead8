"""The double-entry ledger (DESIGN.md §3 ``ledger_*``; ledger-and-sagas.md §4).

Four tables:

- ``ledger_accounts``: one row per (code, currency), with a stored ``balance`` kept by
  a database trigger on ``ledger_postings`` (pgledger's stored balance, §4.1), so
  "balances equal the sum of postings" holds even for rows written without Python.
- ``ledger_entries``: one row per movement, unique ``idempotency_key`` (the same key
  posted twice is one entry), ``kind`` (``bridge.fill``, ``fx.convert``, ...), an
  external ``reference`` and the ``saga_id`` that booked it (a plain column: the
  ledger imports nothing from the apps above it).
- ``ledger_postings``: signed amounts (``Decimal``, 7 dp; never a float). Every entry
  sums to zero per currency: a deferred constraint trigger checks it at commit
  (hordak's ``check_leg``, §4.2), and postings are append-only (corrections are new
  entries, as in TigerBeetle §2.4). Both rules live in migration 0002.
- ``ledger_balance_deltas``: the pending balance changes of hot accounts (record now,
  fold into the balance later, like Modern Treasury's asynchronous balance updates),
  appended by the balance trigger (migration 0003), consumed by
  ``ledger.services.rollup``.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Account(models.Model):
    """A ledger account in one currency. ``balance`` is the sum of its postings,
    maintained by the database (trigger ``ledger_postings_balance``)."""

    code = models.CharField(max_length=100)
    currency = models.CharField(max_length=12)
    balance = models.DecimalField(max_digits=30, decimal_places=7, default=0, db_default=0)
    # A hot account (LEDGER_HOT_ACCOUNTS) is never locked or updated by a post: its
    # postings land in ``ledger_balance_deltas`` and ``ledger.services.rollup`` folds
    # them in. Its balance is ``balance`` + its unrolled deltas (migration 0003).
    hot = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "ledger_accounts"
        constraints = [
            models.UniqueConstraint(fields=["code", "currency"], name="ledger_account_code_ccy"),
        ]

    def __str__(self) -> str:
        return f"{self.code} ({self.currency})"


class Entry(models.Model):
    """One movement of money. Immutable once committed."""

    idempotency_key = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=64)
    reference = models.CharField(max_length=200, blank=True, default="", db_default="",
                                 db_index=True)
    saga_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "ledger_entries"
        verbose_name_plural = "entries"

    def __str__(self) -> str:
        return f"{self.kind} {self.idempotency_key}"


class Posting(models.Model):
    """One signed line of an entry: positive and negative amounts of one currency
    cancel out within the entry."""

    entry = models.ForeignKey(Entry, on_delete=models.PROTECT, related_name="postings")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="postings")
    amount = models.DecimalField(max_digits=30, decimal_places=7)

    class Meta:
        db_table = "ledger_postings"
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="ledger_posting_nonzero"),
        ]

    def __str__(self) -> str:
        return f"{self.account_id} {self.amount}"


class BalanceDelta(models.Model):
    """A change of a hot account's balance not folded into ``Account.balance`` yet:
    the sum of one INSERT statement's postings to that account. Written only by the
    trigger ``ledger_postings_balance``; deleted only by ``rollup``, in the
    transaction that adds it to the balance."""

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="deltas")
    amount = models.DecimalField(max_digits=30, decimal_places=7)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "ledger_balance_deltas"

    def __str__(self) -> str:
        return f"{self.account_id} {self.amount}"
