"""Saga tables (DESIGN.md §3: ``sagas``, ``saga_steps``, ``saga_events``).

The engine (``sagas/engine.py``) writes these with conditional SQL inside fenced
transactions; the models are for reading (admin, tests) and for the migrations."""

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Saga(models.Model):
    """One durable run of a plan. State machine (the seed's, DESIGN.md §6):
    ``running -> completed | compensating | manual_review``,
    ``compensating -> compensated | manual_review``.

    Lease: ``lease_owner``/``lease_until`` (taken by conditional UPDATE; '' and NULL when
    free); ``fence`` grows by one on every new grant (a takeover, or a fresh run) and
    stays on a renewal; every commit of the engine checks it (ledger-and-sagas.md §1.3).
    ``wake_at``: when the saga is next due (now while it runs, the retry or pending
    time while it waits, NULL once it stops). ``recoveries`` counts takeovers of a lease
    whose holder never released it (a crashed or stalled worker)."""

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        COMPENSATING = "compensating"
        COMPENSATED = "compensated"
        MANUAL_REVIEW = "manual_review"

    OPEN_STATUSES = (Status.RUNNING, Status.COMPENSATING)

    kind = models.CharField(max_length=64)
    reference = models.CharField(max_length=128, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RUNNING)
    input = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    lease_owner = models.CharField(max_length=200, blank=True, default="", db_default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    fence = models.BigIntegerField(default=0, db_default=0)
    recoveries = models.IntegerField(default=0, db_default=0)
    wake_at = models.DateTimeField(null=True, blank=True)
    stellar_cursor = models.CharField(max_length=64, blank=True, default="", db_default="")
    error = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "sagas"
        indexes = [
            # The resume sweep reads only open sagas: its cost follows them, not the table.
            models.Index(fields=["wake_at"], name="sagas_due_idx",
                         condition=Q(status__in=["running", "compensating"])),
        ]

    def __str__(self) -> str:
        return f"saga {self.pk} {self.kind} {self.reference} {self.status}"


class SagaStep(models.Model):
    """One leg of a saga, idx 0..n-1. ``attempts`` counts forward attempts that failed
    or that committed an intent; ``undo_attempts`` the same for the compensation.
    ``intent``: what an external leg committed before its side effect. ``fence``: the
    fence of the last commit that wrote this row."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        COMPENSATING = "compensating"
        COMPENSATED = "compensated"

    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="steps")
    idx = models.PositiveIntegerField()
    kind = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0, db_default=0)
    undo_attempts = models.PositiveIntegerField(default=0, db_default=0)
    intent = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    output = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    undo_output = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    error = models.TextField(blank=True, default="", db_default="")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    fence = models.BigIntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "saga_steps"
        constraints = [
            models.UniqueConstraint(fields=["saga", "idx"], name="saga_steps_saga_idx"),
        ]
        ordering = ["saga_id", "idx"]

    def __str__(self) -> str:
        return f"step {self.saga_id}:{self.idx} {self.kind} {self.status}"


class SagaEvent(models.Model):
    """Append-only audit trail: one row per transition, written in the same transaction
    as the transition, with the worker and the fence it held."""

    saga = models.ForeignKey(Saga, on_delete=models.CASCADE, related_name="events")
    idx = models.IntegerField(null=True, blank=True)
    event = models.CharField(max_length=40)
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    worker = models.CharField(max_length=200, blank=True, default="", db_default="")
    fence = models.BigIntegerField(default=0, db_default=0)
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "saga_events"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.saga_id}:{self.idx} {self.event}"
