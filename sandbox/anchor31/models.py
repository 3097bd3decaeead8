"""Tables of the SEP-31 receiving-anchor stand-in (sandbox database only).

Amounts are ``Decimal`` with 7 decimal places (Stellar's precision); memos are strings
(an ``id`` memo is the decimal of a uint64). Times are timezone-aware UTC.
"""

from django.db import models
from django.db.models import Q


class Sep31Transaction(models.Model):
    """A SEP-31 transaction as the receiving anchor keeps it ("GET Transaction" schema).

    Status machine (SEP-31 "Detailed Receiving Anchor Flow" and the ``status`` list):
    ``pending_sender`` -> ``pending_stellar`` -> ``pending_receiver`` -> ``completed``;
    ``error`` (rejected, bad payment, failed payout); ``refunded`` (the payment went
    back on Stellar); ``expired`` (never paid). ``due_at`` is when the worker takes the
    next step (None: nothing to do until a payment arrives, or final). ``reject`` /
    ``fate`` / ``slow_s`` record the fault switches this transaction drew
    (``sandbox.anchor31.machine``). ``history`` is
    the list of ``{"status", "at"}`` it went through (sandbox-only inspection).
    """

    PENDING_SENDER = "pending_sender"
    PENDING_STELLAR = "pending_stellar"
    PENDING_RECEIVER = "pending_receiver"
    COMPLETED = "completed"
    ERROR = "error"
    REFUNDED = "refunded"
    EXPIRED = "expired"

    FATE_REFUND = "refund"
    FATE_FAIL_PAYOUT = "fail_payout"
    FATE_FAIL_THEN_REFUND = "fail_then_refund"

    id = models.CharField(primary_key=True, max_length=36)
    status = models.CharField(max_length=32)
    status_message = models.TextField(default="")
    client_account = models.CharField(max_length=69)
    amount_in = models.DecimalField(max_digits=20, decimal_places=7)
    amount_fee = models.DecimalField(max_digits=20, decimal_places=7)
    asset_code = models.CharField(max_length=12)
    asset_issuer = models.CharField(max_length=56)
    sender_id = models.CharField(max_length=128)
    receiver_id = models.CharField(max_length=128)
    fields = models.JSONField(default=dict)
    stellar_account_id = models.CharField(max_length=56)
    memo_type = models.CharField(max_length=8)
    memo = models.CharField(max_length=64)
    refund_memo_type = models.CharField(max_length=8, null=True)
    refund_memo = models.CharField(max_length=64, null=True)
    stellar_transaction_id = models.CharField(max_length=64, null=True)
    external_transaction_id = models.CharField(max_length=64, null=True)
    reject = models.BooleanField(default=False)
    fate = models.CharField(max_length=16, default="")
    slow_s = models.FloatField(null=True)
    due_at = models.DateTimeField(null=True)
    history = models.JSONField(default=list)
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_anchor31_transactions"
        constraints = [
            models.UniqueConstraint(fields=["stellar_account_id", "memo_type", "memo"],
                                    name="sandbox_anchor31_memo_unique"),
        ]
        indexes = [
            models.Index(fields=["due_at"], name="sandbox_a31_due",
                         condition=Q(due_at__isnull=False)),
        ]


class Sep31Payment(models.Model):
    """A payment to the anchor's receiving account seen on Horizon, and what came of it.

    ``outcome``: ``matched`` (it funds ``transaction``; at most one per transaction),
    ``no_match`` (no transaction has that memo), ``duplicate`` (the transaction with that
    memo already had its payment, or takes none in its status; kept, not refunded).
    """

    MATCHED = "matched"
    NO_MATCH = "no_match"
    DUPLICATE = "duplicate"

    seq = models.BigAutoField(primary_key=True)
    operation_id = models.CharField(max_length=32, unique=True)
    paging_token = models.CharField(max_length=32)
    operation_type = models.CharField(max_length=40)
    stellar_transaction_id = models.CharField(max_length=64)
    from_account = models.CharField(max_length=56)
    to_account = models.CharField(max_length=56)
    to_muxed = models.CharField(max_length=69, null=True)
    asset_type = models.CharField(max_length=20)
    asset_code = models.CharField(max_length=12, null=True)
    asset_issuer = models.CharField(max_length=56, null=True)
    amount = models.DecimalField(max_digits=20, decimal_places=7)
    memo_type = models.CharField(max_length=8)
    memo = models.CharField(max_length=128, null=True)
    outcome = models.CharField(max_length=16)
    detail = models.TextField(default="")
    transaction = models.ForeignKey(Sep31Transaction, null=True, on_delete=models.CASCADE,
                                    related_name="payments")
    observed_at = models.DateTimeField()

    class Meta:
        db_table = "sandbox_anchor31_payments"
        constraints = [
            models.UniqueConstraint(fields=["transaction"], name="sandbox_anchor31_one_funding",
                                    condition=Q(outcome="matched")),
        ]


class Sep31Refund(models.Model):
    """A refund payment from the anchor's account back to a payment's source account,
    same memo (SEP-31 "Refunds Object Schema"). The signed envelope and its hash are
    committed before the first POST, so a retry re-posts the same envelope and a refund
    is never paid twice. ``status``: ``submitting``, ``completed`` (in a ledger,
    successful), ``dead`` (provably never applied: a new envelope may replace it),
    ``failed`` (applied unsuccessfully or refused for good; the worker stops).
    """

    SUBMITTING = "submitting"
    COMPLETED = "completed"
    DEAD = "dead"
    FAILED = "failed"

    transaction = models.ForeignKey(Sep31Transaction, on_delete=models.CASCADE,
                                    related_name="refunds")
    payment = models.ForeignKey(Sep31Payment, on_delete=models.CASCADE, related_name="refunds")
    destination = models.CharField(max_length=56)
    asset_type = models.CharField(max_length=20)
    asset_code = models.CharField(max_length=12, null=True)
    asset_issuer = models.CharField(max_length=56, null=True)
    amount = models.DecimalField(max_digits=20, decimal_places=7)
    fee = models.DecimalField(max_digits=20, decimal_places=7)
    memo_type = models.CharField(max_length=8)
    memo = models.CharField(max_length=128, null=True)
    envelope_xdr = models.TextField()
    hash = models.CharField(max_length=64, unique=True)
    max_time = models.BigIntegerField()
    status = models.CharField(max_length=16)
    last_error = models.TextField(default="")
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_anchor31_refunds"
        constraints = [
            models.UniqueConstraint(fields=["payment"], name="sandbox_anchor31_one_refund",
                                    condition=~Q(status="dead")),
        ]


class Sep31ObserverState(models.Model):
    """The payment watcher's cursor (one row): the paging token of the last payment of
    the receiving account it handled. ``epoch`` is bumped by every reset; the watcher
    writes the cursor only ``WHERE epoch = <the epoch it read>``."""

    id = models.IntegerField(primary_key=True, default=1)
    cursor = models.CharField(max_length=32, null=True)
    epoch = models.IntegerField(default=0)
    updated_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_anchor31_observer_state"
