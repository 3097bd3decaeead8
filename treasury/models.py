"""Treasury tables (issue 13 §2): reconciliation runs and their breaks.

- ``recon_runs``: one row per run of ``treasury.reconcile.reconcile`` (the daily beat
  job or an operator's "reconcile now"): the day it covers, when it ran, what it read
  (``counts`` per source) and the balances it compared (``balances``: account ->
  books, outside, in flight, difference; amounts as strings of Decimal).
- ``recon_breaks``: a difference between the books and the outside, one row per
  ``key`` (``source:kind:reference``), kept across runs: a rerun that sees it again
  updates its evidence (``last_run``), a rerun that compared its subject and no longer
  sees it marks it ``cleared`` (a settlement that arrived late); one that could not
  compare it (busy, in a grace, past the look-back) leaves it as it is. ``open``
  breaks are in the operators' queue (kind ``break``); an operator closes one as
  ``explained`` (with an adjusting entry in the ledger, ``adjusting_key``, audited) or
  ``fixed`` (its cause mended outside), with a note.
"""

from __future__ import annotations

from django.db import models


class ReconRun(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    day = models.DateField()
    trigger = models.CharField(max_length=20, default="beat")  # beat | operator | demo
    operator = models.CharField(max_length=150, blank=True, default="")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    counts = models.JSONField(default=dict)
    balances = models.JSONField(default=dict)
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "recon_runs"
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"reconciliation {self.day} ({self.status})"


class Break(models.Model):
    class Source(models.TextChoices):
        HORIZON = "horizon"
        RAZORPAYX = "razorpayx"
        RAZORPAY = "razorpay"

    class Kind(models.TextChoices):
        MISSING_OUTSIDE = "missing_outside"  # in the books, not at the provider
        MISSING_IN_BOOKS = "missing_in_books"  # at the provider, not in the books
        AMOUNT_DIFFERS = "amount_differs"  # both sides, amounts (or fees) differ
        UTR_DIFFERS = "utr_differs"  # both sides, the bank reference differs
        BALANCE_DIFFERS = "balance_differs"  # a balance, after what is in flight

    class Status(models.TextChoices):
        OPEN = "open"
        EXPLAINED = "explained"
        FIXED = "fixed"
        CLEARED = "cleared"

    key = models.CharField(max_length=200, unique=True)
    source = models.CharField(max_length=10, choices=Source.choices)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    reference = models.CharField(max_length=100)
    account = models.CharField(max_length=40)
    currency = models.CharField(max_length=4)
    difference = models.DecimalField(max_digits=24, decimal_places=7)
    books = models.JSONField(default=dict)
    outside = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    first_run = models.ForeignKey(ReconRun, on_delete=models.PROTECT, related_name="+")
    last_run = models.ForeignKey(ReconRun, on_delete=models.PROTECT, related_name="breaks")
    resolution = models.TextField(blank=True, default="")
    adjusting_key = models.CharField(max_length=200, blank=True, default="")
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "recon_breaks"
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["updated_at"], name="recon_breaks_open_idx",
                                condition=models.Q(status="open"))]
        permissions = [("resolve_break", "Can explain or close a reconciliation break")]

    def __str__(self) -> str:
        return f"break {self.key} ({self.status})"


class BreakEvent(models.Model):
    """The audit row of an operator's decision on a break (or a run they started):
    ``action`` explain | fix | reconcile, who, their note, and what was posted."""

    break_row = models.ForeignKey(Break, on_delete=models.PROTECT, related_name="events",
                                  null=True, blank=True, db_column="break_id")
    action = models.CharField(max_length=20)
    operator = models.CharField(max_length=150)
    note = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "recon_break_events"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} by {self.operator}"
