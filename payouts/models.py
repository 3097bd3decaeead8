"""Withdrawal-side tables (DESIGN.md §3, §5). ``withdrawal_payouts`` and
``payout_attempts`` are the only record of whether a payout ran: AP's statuses can be
stale, lost or duplicated."""

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from anchor.transitions import StatusMachine

# Payouts the withdrawal poller resumes (payouts/poller.py ``poll_open_payouts``): still
# ``processing``, or ``completed`` with AP not told yet. The condition of the partial
# index ``withdrawal_payouts_poll_idx`` and the poller's filter are this one Q, so the
# planner can prove the index serves the query (issue 11 §2).
PAYOUT_POLL_OPEN = Q(status="processing") | Q(status="completed", ap_completed_at__isnull=True)


class WithdrawalRequest(models.Model):
    """One INR payout owed for USDC we expect on Stellar (memo, destination), the INR to
    pay, and where (the provider's fund account): a SEP-24 withdrawal as the customer
    submitted it (``kind`` ``withdrawal``), or a SEP-31 transaction a sending anchor
    created and Corridor accepted (``receive``: payouts/receive.py; ``quote_id`` the
    firm quote it used, ``customer_id`` the receiver). Both follow the same receipt
    checks, payout guard and refunds. Bank details are never stored in full: only a
    masked form for people and the holder's name sealed."""

    class Status(models.TextChoices):
        AWAITING_FUNDS = "awaiting_funds"
        FUNDS_VERIFIED = "funds_verified"
        MANUAL_REVIEW = "manual_review"
        # A receive whose firm quote expired before any USDC arrived: AP was told
        # (notify_transaction_expired); a payment arriving later is raised for a refund.
        EXPIRED = "expired"

    class Kind(models.TextChoices):
        WITHDRAWAL = "withdrawal"
        RECEIVE = "receive"

    transaction_id = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.WITHDRAWAL)
    quote_id = models.CharField(max_length=64, blank=True, default="")
    customer_id = models.CharField(max_length=40, blank=True, default="")
    status = models.CharField(max_length=20, choices=Status.choices,
                              default=Status.AWAITING_FUNDS)
    amount_in = models.DecimalField(max_digits=20, decimal_places=7)  # USDC expected
    fee = models.DecimalField(max_digits=20, decimal_places=7)  # USDC
    amount_out = models.DecimalField(max_digits=14, decimal_places=2)  # INR
    amount_out_paise = models.BigIntegerField()
    rate = models.DecimalField(max_digits=14, decimal_places=4)
    beneficiary_type = models.CharField(max_length=12)  # bank_account | vpa
    beneficiary_display = models.CharField(max_length=80)  # masked
    # The account holder's name as the customer gave it, sealed (anchor/pii.py): what
    # the bank's registered name must match before the first payout
    # (payouts/beneficiaries.py). NULL for requests made before it was kept.
    beneficiary_name = models.BinaryField(null=True, blank=True)
    contact_id = models.CharField(max_length=40)
    fund_account_id = models.CharField(max_length=40)
    # What the wallet must pay: AP's withdraw account and memo (memo ids are strings:
    # uint64 goes past 2^63).
    destination = models.CharField(max_length=56, blank=True, default="")
    memo = models.CharField(max_length=128, blank=True, default="")
    memo_type = models.CharField(max_length=8, blank=True, default="")
    source_account = models.CharField(max_length=69, blank=True, default="")
    funds_requested_at = models.DateTimeField(null=True, blank=True)
    first_receipt_at = models.DateTimeField(null=True, blank=True)
    received_amount = models.DecimalField(max_digits=20, decimal_places=7, null=True,
                                          blank=True)
    review_reason = models.TextField(blank=True, default="")
    chain_evidence = models.JSONField(default=list, blank=True)
    # Whether this withdrawal can still own the receipts under its memo: no payout yet,
    # or only a failed one (no ``withdrawal_payouts`` row for its transaction_id with
    # status <> 'failed'). Kept by PostgreSQL, not by Python (payouts/migrations/0006):
    # triggers on both tables recompute it from the payouts whenever a payout is
    # written or deleted and whenever a request row is inserted or this column is
    # written, so a stale value a ``save()`` sends is replaced by the true one. Read it;
    # never rely on a value you wrote. Serves ``withdrawal_requests_owning_idx``.
    awaits_payout = models.BooleanField(default=True, db_default=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "withdrawal_requests"
        indexes = [
            models.Index(fields=["memo"], name="withdrawal_requests_memo_idx"),
            # The stranded count's probe for a receipt's owning withdrawal
            # (corridor/stranded.py): only the withdrawals that can still own one, so
            # its size follows the open withdrawals, not the table (issue 11 §2).
            models.Index(fields=["memo"], name="withdrawal_requests_owning_idx",
                         condition=Q(awaits_payout=True)),
        ]

    def __str__(self) -> str:
        return f"withdrawal {self.transaction_id} {self.status}"


class WithdrawalPayout(StatusMachine, models.Model):
    """At most one fiat payout per AP withdrawal (DEC-009): the claim is the insert
    (``processing``).

    ``status`` changes only through ``WithdrawalPayout.transition``
    (anchor/transitions.py), along ``TRANSITIONS``; what moves each edge
    (payouts/guard.py unless named):

    - ``processing -> completed``: the provider says ``processed`` (the UTR).
    - ``processing -> failed``: the provider says failed/cancelled/rejected, or refused
      the create call.
    - ``processing | completed -> reversed``: the bank sent it back (DESIGN.md §5).
    - ``processing -> manual_review``: outcome unknown too long, past the settlement
      window, several provider payouts under one reference.
    - ``completed | failed | reversed | processing -> manual_review``: an earlier
      attempt says money moved while a later one is current.
    - ``manual_review | reversed -> completed``: an operator confirms it paid with a
      UTR (payouts/operations.py ``payout_confirm_paid``).
    - ``manual_review -> failed``: an operator marks it failed once the provider holds
      nothing that could pay (``payout_mark_failed``).
    - ``failed -> processing``: an operator mints a new attempt (``payout_new_attempt``);
      ``clock_started_at`` restarts then, ``created_at`` never changes.

    ``clock_started_at`` is when the current attempt started: the guard's clocks
    (PAYOUT_UNKNOWN_REVIEW_S, PAYOUT_SETTLEMENT_WINDOW_S) run from it."""

    class Status(models.TextChoices):
        PROCESSING = "processing"
        COMPLETED = "completed"
        FAILED = "failed"
        MANUAL_REVIEW = "manual_review"
        REVERSED = "reversed"

    # Failed and reversed payouts are in the operators' queue too (sagas.ReviewItem).
    REASON_STATUSES = frozenset({Status.FAILED, Status.REVERSED, Status.MANUAL_REVIEW})
    TRANSITIONS = {
        Status.PROCESSING: frozenset({Status.COMPLETED, Status.FAILED, Status.REVERSED,
                                      Status.MANUAL_REVIEW}),
        Status.COMPLETED: frozenset({Status.REVERSED, Status.MANUAL_REVIEW}),
        Status.FAILED: frozenset({Status.PROCESSING, Status.MANUAL_REVIEW}),
        Status.REVERSED: frozenset({Status.COMPLETED, Status.MANUAL_REVIEW}),
        Status.MANUAL_REVIEW: frozenset({Status.COMPLETED, Status.FAILED}),
    }

    transaction_id = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices,
                              default=Status.PROCESSING)
    amount_paise = models.BigIntegerField()
    currency = models.CharField(max_length=3, default="INR")
    fund_account_id = models.CharField(max_length=40)
    mode = models.CharField(max_length=8, default="IMPS")  # IMPS for banks, UPI for VPAs
    provider = models.CharField(max_length=20, default="razorpayx")
    provider_payout_id = models.CharField(max_length=40, blank=True, default="")
    reference = models.CharField(max_length=64, blank=True, default="")  # the UTR
    attempts = models.PositiveIntegerField(default=1)
    # RazorpayX's charge for the payout that paid, integer paise, as its entity reports
    # it when the payout is processed (``fees`` includes ``tax``); NULL when unknown.
    # The books (ledger/chart.py rules 4 and 5) debit them to the expense accounts.
    fees_paise = models.BigIntegerField(null=True, blank=True)
    tax_paise = models.BigIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    ap_completed_at = models.DateTimeField(null=True, blank=True)
    clock_started_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "withdrawal_payouts"
        indexes = [
            models.Index(fields=["updated_at"], name="withdrawal_payouts_open_idx",
                         condition=Q(status="processing")),
            # The poller's resume query: cost follows the open payouts, not the table.
            models.Index(fields=["updated_at"], name="withdrawal_payouts_poll_idx",
                         condition=PAYOUT_POLL_OPEN),
        ]

    def __str__(self) -> str:
        return f"payout {self.transaction_id} {self.status}"


class PayoutAttempt(models.Model):
    """One provider call chain under one idempotency key. A new attempt (new key) only
    after the provider said ``failed`` for the previous one, by an operator."""

    payout = models.ForeignKey(WithdrawalPayout, on_delete=models.PROTECT,
                               related_name="attempt_rows")
    number = models.PositiveIntegerField()
    idempotency_key = models.UUIDField(unique=True)
    provider_payout_id = models.CharField(max_length=40, blank=True, default="")
    provider_status = models.CharField(max_length=20, blank=True, default="")
    # RazorpayX's ``status_details.reason`` with that status (``bank_account_invalid``,
    # ``beneficiary_bank_offline``...): what payouts/receive.py ``failed_for_good`` reads,
    # never the text of ``last_error``.
    provider_reason = models.CharField(max_length=60, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "payout_attempts"
        constraints = [models.UniqueConstraint(fields=["payout", "number"],
                                               name="payout_attempts_number_unique")]


class StellarReceipt(models.Model):
    """A payment into our withdrawal account, as read from Horizon by Corridor itself
    (AP's observer misses and mis-records payments, AP NOTES §4.4)."""

    paging_token = models.CharField(max_length=32, unique=True)
    tx_hash = models.CharField(max_length=64)
    from_account = models.CharField(max_length=69)
    to_account = models.CharField(max_length=69)
    asset = models.CharField(max_length=80)  # "USDC:G..." or "native"
    amount = models.DecimalField(max_digits=20, decimal_places=7)
    memo_type = models.CharField(max_length=8)
    memo = models.CharField(max_length=128, blank=True, default="")
    transaction_id = models.CharField(max_length=64, blank=True, default="")  # matched
    created_at = models.DateTimeField()
    # Consumed = counted towards a withdrawal's payout amount (payouts/receipts.py
    # ``classify_receipts``): ``consumed_amount`` of ``amount``, for withdrawal
    # ``transaction_id``. ``settled_at`` is set once every unit of the receipt is
    # accounted for: consumed in full, or sent back on chain (a withdrawal's refund, or
    # this receipt's own). An unsettled receipt with a ``review_reason`` waits in the
    # operators' queue (kind ``receipt``) for its refund of ``amount - consumed_amount``.
    consumed_amount = models.DecimalField(max_digits=20, decimal_places=7, default=0)
    settled_at = models.DateTimeField(null=True, blank=True)
    review_reason = models.TextField(blank=True, default="")
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "stellar_receipts"
        indexes = [
            models.Index(fields=["memo_type", "memo"], name="stellar_receipts_memo_idx"),
            # The classifier, the queue and the stranded count read the unsettled few.
            models.Index(fields=["created_at"], name="stellar_receipts_open_idx",
                         condition=Q(settled_at__isnull=True)),
        ]

    @property
    def unconsumed(self):
        """USDC of this receipt no withdrawal consumed (Decimal, 7 dp)."""
        return self.amount - self.consumed_amount


class ChainCursor(models.Model):
    """Where the receipt scanner stopped, per watched account (a Horizon paging token)."""

    account = models.CharField(max_length=56, unique=True)
    cursor = models.CharField(max_length=32, default="0")

    class Meta:
        db_table = "stellar_cursors"


class PayoutEvent(models.Model):
    """Append-only audit of operator actions on a withdrawal: its payout (confirm paid,
    mark failed, new attempt) or its request (accept a short amount, refund on chain).
    Written in the same transaction as the change, naming the operator and their note.
    ``transaction_id`` is the AP id (one withdrawal = one request = at most one payout)."""

    transaction_id = models.CharField(max_length=64, db_index=True)
    payout = models.ForeignKey(WithdrawalPayout, on_delete=models.PROTECT, null=True,
                               blank=True, related_name="events")
    request = models.ForeignKey(WithdrawalRequest, on_delete=models.PROTECT, null=True,
                                blank=True, related_name="events")
    event = models.CharField(max_length=40)
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    operator = models.CharField(max_length=150)
    note = models.TextField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "withdrawal_payout_events"
        ordering = ["id"]
        permissions = [
            ("confirm_payout_paid", "Can confirm a payout paid with its UTR"),
            ("mark_payout_failed", "Can mark a payout failed"),
            ("new_payout_attempt", "Can start a new payout attempt after the provider failed"),
            ("accept_short_withdrawal", "Can accept a short withdrawal amount"),
            ("refund_withdrawal", "Can refund a withdrawal's USDC on chain to its sender"),
            ("refund_receipt", "Can refund an unconsumed USDC receipt on chain to its sender"),
        ]

    def __str__(self) -> str:
        return f"{self.transaction_id} {self.event} by {self.operator}"


class WithdrawalRefund(StatusMachine, models.Model):
    """The USDC of one withdrawal sent back on chain to its sender: an outbox like
    ``deposit_releases`` (DESIGN.md §4 step 1). The envelope and its hash are committed
    before anything is submitted, and ``transaction_id`` is unique, so a repeat of the
    operator's action drives the same payment and never makes a second one.

    Statuses: ``submitting`` (envelope stored, may or may not be on chain),
    ``submitted`` (on chain, AP not told yet), ``completed`` (AP ``notify_refund_sent``
    accepted), ``manual_review`` (included but failed, or AP refused the refund)."""

    class Status(models.TextChoices):
        SUBMITTING = "submitting"
        SUBMITTED = "submitted"
        COMPLETED = "completed"
        MANUAL_REVIEW = "manual_review"

    # Changed only through ``WithdrawalRefund.transition`` (payouts/refunds.py):
    # submitting -> submitted (landed) | manual_review (attempts exhausted, included but
    # failed, refused, fate unknown too long); submitted -> completed (AP accepted, or a
    # receipt's refund) | manual_review (AP refused). A rebuilt envelope stays
    # ``submitting`` (no status change).
    REASON_STATUSES = frozenset({Status.MANUAL_REVIEW})
    TRANSITIONS = {
        Status.SUBMITTING: frozenset({Status.SUBMITTED, Status.MANUAL_REVIEW}),
        Status.SUBMITTED: frozenset({Status.COMPLETED, Status.MANUAL_REVIEW}),
        Status.COMPLETED: frozenset(),
        Status.MANUAL_REVIEW: frozenset(),
    }

    # A withdrawal's refund has ``request``; an unconsumed receipt's refund has
    # ``receipt`` instead (one per receipt, never two) and ``transaction_id``
    # ``receipt:<receipt id>``; AP is not told of those (no AP transaction holds them).
    request = models.OneToOneField(WithdrawalRequest, on_delete=models.PROTECT,
                                   related_name="refund", null=True, blank=True)
    receipt = models.OneToOneField(StellarReceipt, on_delete=models.PROTECT,
                                   related_name="refund", null=True, blank=True)
    transaction_id = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices,
                              default=Status.SUBMITTING)
    destination = models.CharField(max_length=69)
    amount = models.DecimalField(max_digits=20, decimal_places=7)  # USDC
    memo = models.CharField(max_length=128, blank=True, default="")
    memo_type = models.CharField(max_length=8, default="none")
    source_account = models.CharField(max_length=56)
    sequence = models.BigIntegerField()
    envelope_xdr = models.TextField()
    tx_hash = models.CharField(max_length=64, unique=True)
    max_time = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=1)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "withdrawal_refunds"
        indexes = [
            models.Index(fields=["created_at"], name="withdrawal_refunds_open_idx",
                         condition=Q(status__in=["submitting", "submitted"])),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(request__isnull=True) ^ Q(receipt__isnull=True),
                name="withdrawal_refunds_one_owner"),
        ]

    def __str__(self) -> str:
        return f"refund {self.transaction_id} {self.status}"


class FundAccountValidation(models.Model):
    """RazorpayX fund account validation of one beneficiary (payouts/beneficiaries.py):
    one row per fund account, made before its first payout and then reused.

    ``status`` is RazorpayX's (``created``, ``completed``, ``failed``) and
    ``account_status`` the bank's answer (``active``, ``invalid``); ``registered_name``
    the bank's name, sealed (anchor/pii.py); ``name_score`` its match with the name we
    were given (payouts/fav.py, in [0, 1]); ``decision``: ``pending`` (ask again),
    ``verified`` (may be paid), ``refused`` (never paid without a person; ``reason``).
    ``fee_paise``: RazorpayX's charge when it reports one (for the books)."""

    class Decision(models.TextChoices):
        PENDING = "pending"
        VERIFIED = "verified"
        REFUSED = "refused"

    fund_account_id = models.CharField(max_length=40, unique=True)
    reference = models.CharField(max_length=40)
    validation_id = models.CharField(max_length=40, blank=True, default="")
    status = models.CharField(max_length=12, blank=True, default="")
    account_status = models.CharField(max_length=12, blank=True, default="")
    registered_name = models.BinaryField(null=True, blank=True)
    name_score = models.DecimalField(max_digits=5, decimal_places=4, null=True, blank=True)
    decision = models.CharField(max_length=10, choices=Decision.choices,
                                default=Decision.PENDING)
    reason = models.TextField(blank=True, default="")
    fee_paise = models.BigIntegerField(null=True, blank=True)
    utr = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "fund_account_validations"
