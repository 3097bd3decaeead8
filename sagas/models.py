"""Saga tables (DESIGN.md §3: ``sagas``, ``saga_steps``, ``saga_events``).

The engine (``sagas/engine.py``) writes these with conditional SQL inside fenced
transactions; the models are for reading (admin, tests) and for the migrations."""

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
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
            # The late-money sweep reads only the review queue's sagas (sagas/latemoney.py).
            models.Index(fields=["updated_at"], name="sagas_review_idx",
                         condition=Q(status="manual_review")),
            # ... and the remittances that ended compensated (a late partner payment).
            models.Index(fields=["updated_at"], name="sagas_compensated_idx",
                         condition=Q(status="compensated", kind="remittance")),
            # ... and the remittances that settled (a second payment beside the fill).
            models.Index(fields=["updated_at"], name="sagas_settled_idx",
                         condition=Q(status__in=["completed", "compensated"],
                                     kind="remittance")),
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
        indexes = [
            # The late-money sweep's owner of an anchor's refund whose funding row was
            # lost (sagas/latemoney.py ``funded_anchor_intents``).
            models.Index(KeyTextTransform("memo", "intent"), name="saga_steps_fund_memo_idx",
                         condition=Q(kind="anchor.fund")),
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


class Partner(models.Model):
    """A business that sends remittances through Corridor's API. Its API key is shown
    once (``manage.py create_partner``) and stored as ``key_prefix`` (the lookup) and
    ``key_hash`` (sha256 of the whole key): the key carries 256 random bits, so a fast
    hash is enough and checking it costs nothing per request (a password hasher exists
    for guessable secrets). ``stellar_account``: where its USDC comes from, and where
    refunds go."""

    name = models.SlugField(max_length=50, unique=True)
    key_prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    stellar_account = models.CharField(max_length=56)
    is_active = models.BooleanField(default=True, db_default=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "partners"

    def __str__(self) -> str:
        return self.name


class HubPayment(models.Model):
    """One payment the hub makes for a saga leg (``key``: the leg's idempotency key,
    ``{saga_id}:{idx}`` or ``{saga_id}:{idx}:undo``), written in a fenced commit before
    its envelope is submitted, so a payment can never be on chain without its hash here
    (DESIGN.md §4 step 1 applied to the hub). The envelope is re-posted as is until it
    lands or is provably dead (past ``max_time`` or its sequence used); only then is a
    new one built, replacing these columns (``rebuilds`` counts them)."""

    key = models.CharField(max_length=100, unique=True)
    saga = models.ForeignKey(Saga, on_delete=models.PROTECT, related_name="hub_payments")
    destination = models.CharField(max_length=56)
    amount = models.DecimalField(max_digits=30, decimal_places=7)
    memo_type = models.CharField(max_length=8)
    memo = models.CharField(max_length=64)
    sequence = models.BigIntegerField()
    max_time = models.BigIntegerField()
    envelope_xdr = models.TextField()
    tx_hash = models.CharField(max_length=64, unique=True)
    rebuilds = models.PositiveIntegerField(default=0, db_default=0)
    last_result = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "saga_hub_payments"
        indexes = [
            # The unmatched-money scan asks which hub payment a payment to the hub
            # under a memo refunds (sagas/latemoney.py ``unmatched_check``).
            models.Index(fields=["memo"], name="saga_hub_payments_memo_idx"),
        ]

    def __str__(self) -> str:
        return f"hub payment {self.key} {self.tx_hash}"


class ReviewItem(models.Model):
    """One row of the operators' manual-review queue: a read-only, unmanaged model over
    the SQL view ``operator_review_queue`` (created by a migration of ``sagas``), the
    union of everything waiting for a person (DESIGN.md §1 "Operators", §5, §6):

    - ``saga``: sagas in ``manual_review``;
    - ``release``: deposit releases in ``manual_review``;
    - ``payout``: withdrawal payouts in ``manual_review``, ``failed`` (a new attempt or a
      refund is a person's call) or ``reversed`` (processed, then returned by the bank);
    - ``withdrawal``: withdrawal requests in ``manual_review`` (a payment that does not
      match: short, wrong asset, shared memo...) that have not been refunded;
    - ``inbound``: signed provider webhooks and AP events acknowledged as ``rejected``
      because they could never be stored (``inbound_events``; ``reference`` is
      ``source:event_id``, ``reason`` the event type and why);
    - ``notify``: confirmed INR payments AP refused ``notify_offchain_funds_received``
      for AP_NOTIFY_REVIEW_S (the sweeper keeps retrying; ``reason`` has its last error);
    - ``receipt``: USDC receipts no withdrawal consumed (``reference`` the Stellar hash,
      ``amount`` the unconsumed USDC, ``reason`` why and the on-chain evidence), until
      their refund on chain is done;
    - ``refund``: deposit refunds through Razorpay (``deposit_refunds``) that Razorpay
      failed or that wait for a person (``manual_review``: AP expired the deposit and
      cannot show the refund, an unknown outcome, a refusal).

    ``key`` is ``"{kind}:{object_id}"``; ``reference`` the AP transaction id or the
    saga's reference; ``amount``/``currency`` what is at stake (USDC for releases and
    withdrawal requests, INR rupees for payouts, the saga input's amount); ``since``
    when the row last changed state (the age operators sort by, oldest first).

    The saga operator permissions live here (app ``sagas``) so that the engine's own
    tables keep their options untouched."""

    key = models.CharField(max_length=80, primary_key=True)
    kind = models.CharField(max_length=20)
    status = models.CharField(max_length=20)
    object_id = models.BigIntegerField()
    reference = models.CharField(max_length=128)
    amount = models.DecimalField(max_digits=30, decimal_places=7, null=True)
    currency = models.CharField(max_length=12)
    reason = models.TextField()
    since = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "operator_review_queue"
        ordering = ["since", "key"]
        verbose_name = "manual-review item"
        verbose_name_plural = "manual-review queue"
        permissions = [
            ("resume_saga", "Can resume a saga in manual review"),
            ("retry_saga_step", "Can retry the step a saga stopped at"),
            ("compensate_saga", "Can compensate a saga in manual review"),
            ("resolve_saga", "Can close a saga in manual review as resolved"),
        ]

    def __str__(self) -> str:
        return self.key
