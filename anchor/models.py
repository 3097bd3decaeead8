"""Deposit-side tables (DESIGN.md §3). Table names are fixed by the design."""

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class DepositRelease(models.Model):
    """One USDC release per AP deposit: the transfer-after-commit outbox (DESIGN.md §4).

    The row, its signed envelope and its hash are committed before anything is sent,
    so a payment can never exist on chain without its hash stored here."""

    class Status(models.TextChoices):
        SUBMITTING = "submitting"
        SUBMITTED = "submitted"
        FAILED = "failed"
        COMPLETED = "completed"
        MANUAL_REVIEW = "manual_review"

    OPEN_STATUSES = (Status.SUBMITTING, Status.SUBMITTED, Status.FAILED)

    transaction_id = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.SUBMITTING)
    attempts = models.PositiveIntegerField(default=1)
    destination = models.CharField(max_length=69)
    asset_code = models.CharField(max_length=12)
    asset_issuer = models.CharField(max_length=56)
    amount = models.DecimalField(max_digits=20, decimal_places=7)
    memo = models.CharField(max_length=128, blank=True, default="")
    memo_type = models.CharField(max_length=8, default="none")
    # Empty only for a release that went to manual_review before any envelope existed
    # (a C... destination, a missing account).
    source_account = models.CharField(max_length=56, blank=True, default="")
    sequence = models.BigIntegerField(null=True, blank=True)
    envelope_xdr = models.TextField(blank=True, default="")
    tx_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    max_time = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "deposit_releases"
        indexes = [
            # The reconciler's cost grows with the stuck rows, not the table.
            models.Index(
                fields=["updated_at"],
                name="deposit_releases_open_idx",
                condition=Q(status__in=["submitting", "submitted", "failed"]),
            )
        ]

    def __str__(self) -> str:
        return f"release {self.transaction_id} {self.status}"


class DepositPayment(models.Model):
    """Corridor's own record of captured INR: the only thing that makes a deposit
    releasable (DESIGN.md §4). One per Razorpay payment and one per AP transaction."""

    payment_id = models.CharField(max_length=40, unique=True)
    order_id = models.CharField(max_length=40)
    transaction_id = models.CharField(max_length=64, unique=True)
    amount_paise = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    method = models.CharField(max_length=20, blank=True, default="")
    captured_at = models.DateTimeField()
    ap_notified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "deposit_payments"

    def __str__(self) -> str:
        return f"{self.payment_id} for {self.transaction_id}"


class DepositOrder(models.Model):
    """The interactive deposit as the customer submitted it: the INR to collect, the
    USDC to release, and the Razorpay order that collects it (receipt = AP id)."""

    class Status(models.TextChoices):
        AWAITING_PAYMENT = "awaiting_payment"
        PAID = "paid"
        EXPIRED = "expired"

    transaction_id = models.CharField(max_length=64, unique=True)
    order_id = models.CharField(max_length=40, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices,
                              default=Status.AWAITING_PAYMENT)
    amount_in = models.DecimalField(max_digits=14, decimal_places=2)
    amount_in_paise = models.BigIntegerField()
    fee = models.DecimalField(max_digits=14, decimal_places=2)
    amount_out = models.DecimalField(max_digits=20, decimal_places=7)
    rate = models.DecimalField(max_digits=14, decimal_places=4)
    currency = models.CharField(max_length=3, default="INR")
    # Set once AP accepted request_offchain_funds: a repeat never sends it again.
    funds_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "deposit_orders"
        indexes = [
            models.Index(fields=["created_at"], name="deposit_orders_open_idx",
                         condition=Q(status="awaiting_payment"))
        ]

    def __str__(self) -> str:
        return f"{self.order_id} for {self.transaction_id}"


class InboundEvent(models.Model):
    """Dedupe of at-least-once deliveries: (source, event_id) is unique."""

    class Source(models.TextChoices):
        AP = "ap"
        RAZORPAY = "razorpay"
        RAZORPAYX = "razorpayx"

    source = models.CharField(max_length=12, choices=Source.choices)
    event_id = models.CharField(max_length=100)
    event_type = models.CharField(max_length=60, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        db_table = "inbound_events"
        constraints = [
            models.UniqueConstraint(fields=["source", "event_id"], name="inbound_events_unique")
        ]


class Sep24Customer(models.Model):
    """SEP-9 fields AP forwards with ``PUT /customer`` (type ``sep24-customer``)."""

    account = models.CharField(max_length=69)
    memo = models.CharField(max_length=128, blank=True, default="")
    fields = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "sep24_customers"
        constraints = [
            models.UniqueConstraint(fields=["account", "memo"], name="sep24_customers_unique")
        ]


class SourceAccount(models.Model):
    """A channel account: the source of release transactions, one in flight at a time.

    ``sequence`` is the last sequence number handed out (None = read it from Horizon
    on next use). ``leased_by`` holds the release whose envelope may still land; the
    lease ends when that envelope landed, or is provably dead after ``leased_until``."""

    address = models.CharField(max_length=56, unique=True)
    sequence = models.BigIntegerField(null=True, blank=True)
    leased_by = models.CharField(max_length=64, null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "stellar_source_accounts"

    def __str__(self) -> str:
        return self.address


class ReleaseEvent(models.Model):
    """Append-only audit of operator actions on a deposit release (the release-side
    ``saga_events``): written in the same transaction as the change it records, naming
    the operator and the note they gave (STYLE.md "one action, one transaction, one
    audit row"). ``detail`` holds the evidence the action relied on (chain lookup,
    old and new hash)."""

    release = models.ForeignKey(DepositRelease, on_delete=models.PROTECT, related_name="events")
    event = models.CharField(max_length=40)
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    operator = models.CharField(max_length=150)
    note = models.TextField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "deposit_release_events"
        ordering = ["id"]
        permissions = [
            ("redrive_release", "Can re-drive a deposit release that is provably not on chain"),
        ]

    def __str__(self) -> str:
        return f"{self.release_id} {self.event} by {self.operator}"


class ApTransactionEvent(models.Model):
    """Append-only audit of operator actions on an AP transaction as such (for now:
    expiring it before funds arrived), keyed by the AP transaction id because such a
    transaction may have no row of ours at all."""

    transaction_id = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=12, blank=True, default="")  # deposit | withdrawal
    event = models.CharField(max_length=40)
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    operator = models.CharField(max_length=150)
    note = models.TextField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "ap_transaction_events"
        ordering = ["id"]
        permissions = [
            ("expire_ap_transaction", "Can expire an AP transaction before any funds arrived"),
        ]

    def __str__(self) -> str:
        return f"{self.transaction_id} {self.event} by {self.operator}"
