"""Deposit-side tables (DESIGN.md §3). Table names are fixed by the design."""

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from anchor.transitions import StatusMachine


class DepositRelease(StatusMachine, models.Model):
    """One USDC release per AP deposit: the transfer-after-commit outbox (DESIGN.md §4).

    The row, its signed envelope and its hash are committed before anything is sent,
    so a payment can never exist on chain without its hash stored here.

    ``status`` changes only through ``DepositRelease.transition`` (anchor/transitions.py),
    along ``TRANSITIONS``; what moves each edge (anchor/releases.py unless named):

    - ``submitting -> submitting``, ``failed -> submitting``: ``_rebuild`` (the stored
      envelope is provably dead, or the trustline a failed payment lacked is set).
    - ``submitting | failed -> submitted``: ``_mark_submitted`` (Horizon applied our
      envelope, or a re-drive found its hash on chain).
    - ``submitting | failed -> failed``: core refused the envelope and the rule could
      not prove it dead, or it landed failing ``op_no_trust`` (``failure_code``).
    - ``submitted -> completed``: AP accepted ``notify_onchain_funds_sent``.
    - ``submitting | submitted | failed -> manual_review``: attempts exhausted, a fate
      unknown past max_time, included but failed, AP refused the notify.
    - ``manual_review -> submitting``: an operator's re-drive
      (``release_prepare_redrive``, anchor/operations.py).
    - ``completed``: final.

    Claims insert the row as ``submitting`` (or ``manual_review`` with the reason when
    it can never be paid); ``failure_code`` says why a row is ``failed`` in a form code
    may branch on (``last_error`` is for people only) and is cleared by every other
    transition."""

    class Status(models.TextChoices):
        SUBMITTING = "submitting"
        SUBMITTED = "submitted"
        FAILED = "failed"
        COMPLETED = "completed"
        MANUAL_REVIEW = "manual_review"

    class FailureCode(models.TextChoices):
        NONE = "", "none"
        NO_TRUST = "op_no_trust", "destination has no trustline"

    OPEN_STATUSES = (Status.SUBMITTING, Status.SUBMITTED, Status.FAILED)
    REASON_STATUSES = frozenset({Status.MANUAL_REVIEW})
    TRANSITIONS = {
        Status.SUBMITTING: frozenset({Status.SUBMITTING, Status.SUBMITTED, Status.FAILED,
                                      Status.MANUAL_REVIEW}),
        Status.FAILED: frozenset({Status.SUBMITTING, Status.SUBMITTED, Status.FAILED,
                                  Status.MANUAL_REVIEW}),
        Status.SUBMITTED: frozenset({Status.COMPLETED, Status.MANUAL_REVIEW}),
        Status.MANUAL_REVIEW: frozenset({Status.SUBMITTING}),
        Status.COMPLETED: frozenset(),
    }
    RESET_ON_TRANSITION = {"failure_code": FailureCode.NONE}

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
    failure_code = models.CharField(max_length=20, choices=FailureCode.choices, blank=True,
                                    default=FailureCode.NONE)
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


class DepositPaymentQuerySet(models.QuerySet):
    def live(self):
        """Rows that still count: unconfirmed or confirmed, never rejected."""
        return self.exclude(confirmation=DepositPayment.Confirmation.REJECTED)


class DepositPayment(models.Model):
    """Corridor's own record of captured INR: the only thing that makes a deposit
    releasable (DESIGN.md §4). One live row per Razorpay payment and one per AP
    transaction (``rejected`` rows are kept for the operators and do not count).

    A webhook or the order reconciler writes the row ``unconfirmed`` with what it was
    told; it becomes releasable only once Corridor itself fetched the payment from
    Razorpay (``GET /v1/payments/{id}``) and found it ``captured`` on this order with
    the order's paise and currency (``confirmed``, ``confirmed_at``). A payment that
    Razorpay contradicts is ``rejected`` with the reason in ``confirmation_error``,
    which also holds the last reason a confirmation could not be made yet (provider
    unreachable) while the row stays ``unconfirmed``."""

    class Confirmation(models.TextChoices):
        UNCONFIRMED = "unconfirmed"
        CONFIRMED = "confirmed"
        REJECTED = "rejected"

    payment_id = models.CharField(max_length=40)
    order_id = models.CharField(max_length=40)
    transaction_id = models.CharField(max_length=64)
    amount_paise = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    method = models.CharField(max_length=20, blank=True, default="")
    captured_at = models.DateTimeField()
    confirmation = models.CharField(max_length=12, choices=Confirmation.choices,
                                    default=Confirmation.UNCONFIRMED)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    confirmation_error = models.TextField(blank=True, default="")
    ap_notified_at = models.DateTimeField(null=True, blank=True)
    # The AP notify sweeper's state (anchor/reconciler.py sweep_unnotified): attempts it
    # made, when it tries next, AP's last refusal, and when it raised the payment in
    # the operators' queue (it keeps retrying after that).
    notify_attempts = models.PositiveIntegerField(default=0)
    notify_next_at = models.DateTimeField(null=True, blank=True)
    notify_error = models.TextField(blank=True, default="")
    notify_review_at = models.DateTimeField(null=True, blank=True)
    # When this deposit's release row was claimed (anchor/releases.py, in the claim's
    # own transaction): a confirmed, notified payment without it is owed USDC.
    release_claimed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = DepositPaymentQuerySet.as_manager()

    class Meta:
        db_table = "deposit_payments"
        constraints = [
            models.UniqueConstraint(fields=["payment_id"], name="deposit_payments_payment_live",
                                    condition=~Q(confirmation="rejected")),
            models.UniqueConstraint(fields=["transaction_id"],
                                    name="deposit_payments_transaction_live",
                                    condition=~Q(confirmation="rejected")),
        ]
        indexes = [
            models.Index(fields=["created_at"], name="deposit_payments_unconf_idx",
                         condition=Q(confirmation="unconfirmed")),
            # The notify sweeper and the stranded count read only the confirmed
            # payments AP was not told about: cost flat in the table's size.
            models.Index(fields=["confirmed_at"], name="deposit_payments_unnot_idx",
                         condition=Q(confirmation="confirmed", ap_notified_at__isnull=True)),
            models.Index(fields=["ap_notified_at"], name="deposit_payments_unrel_idx",
                         condition=Q(confirmation="confirmed", ap_notified_at__isnull=False,
                                     release_claimed_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.payment_id} for {self.transaction_id} ({self.confirmation})"


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
    """Dedupe of at-least-once deliveries: (source, event_id) is unique.

    ``outcome`` is what handling the event did; ``rejected`` marks a correctly signed
    event that can never be stored or applied (anchor/callbacks.py ``event_reject``),
    acknowledged so the sender stops retrying, with ``reason`` saying why; those rows
    are in the operators' review queue (kind ``inbound``)."""

    REJECTED = "rejected"

    class Source(models.TextChoices):
        AP = "ap"
        RAZORPAY = "razorpay"
        RAZORPAYX = "razorpayx"

    source = models.CharField(max_length=12, choices=Source.choices)
    event_id = models.CharField(max_length=100)
    event_type = models.CharField(max_length=60, blank=True, default="")
    received_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    # The row is the queue (anchor/inbox.py): the follow-up tasks the delivery's
    # effect asked for, as [[task name, [args...]], ...], written in the same
    # transaction as the effect; NULL when there are none. processed_at: when a drain
    # dispatched them (NULL while they wait).
    follow_ups = models.JSONField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    # A provider webhook is stored as it was verified (its raw body, checked to be
    # strict JSON of the right shape) and applied by the drain (anchor/inbox.py
    # ``store``); NULL for a delivery applied in its request (AP events, rejections).
    body = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "inbound_events"
        constraints = [
            models.UniqueConstraint(fields=["source", "event_id"], name="inbound_events_unique")
        ]
        indexes = [
            # The review queue reads the rejected few, not the whole dedupe table.
            models.Index(fields=["received_at"], name="inbound_events_rejected_idx",
                         condition=Q(outcome="rejected")),
            # The drain reads the waiting few, not the whole dedupe table.
            models.Index(fields=["id"], name="inbound_events_waiting_idx",
                         condition=Q(follow_ups__isnull=False, processed_at__isnull=True)),
        ]


def new_customer_id() -> str:
    """A customer id Corridor assigns (SEP-12 ``id``): ``cus_`` and 24 hex digits."""
    import secrets

    return f"cus_{secrets.token_hex(12)}"


class Customer(models.Model):
    """A SEP-12 customer of one ``type`` (``sep31-sender``, ``sep31-receiver``,
    ``sep24-customer``), identified towards AP by ``id`` and by (``account``, ``memo``,
    ``memo_type``, ``type``): the SEP-10 account that registered it (a sending anchor's,
    or a wallet user's) and the memo naming the person under that account.

    Personal data never sits in the clear: ``data`` is a Fernet token of the SEP-9
    fields as a JSON object (anchor/pii.py); ``provided`` lists their names and
    ``field_updated`` when each was last given (names and times are not personal).
    ``review`` is the decision (anchor/customers.py computes the SEP-12 status from it
    and from the fields the type needs): ``auto`` (accepted by the automatic checks),
    ``pending`` (waits for a person), ``accepted``, ``rejected`` (``message`` says why),
    ``needs_info`` (an operator asked for ``requested_fields``, at ``requested_at``).

    SEP-12 ``DELETE`` sets ``deleted_at`` (the customer is gone for AP); the personal
    data is erased (``data`` NULL, files deleted, ``erased_at``) at once, or at
    ``erase_after`` when the customer moved money (``used_at``) and the law keeps the
    records (settings.KYC_RETENTION_DAYS). What survives erasure: the id, type,
    account, memo and memo type (the sending anchor's reference, not the person's
    data), the field names and times, the decisions and the audit rows."""

    class Review(models.TextChoices):
        AUTO = "auto"
        PENDING = "pending"
        ACCEPTED = "accepted"
        REJECTED = "rejected"
        NEEDS_INFO = "needs_info"

    id = models.CharField(primary_key=True, max_length=40, default=new_customer_id)
    account = models.CharField(max_length=69)
    memo = models.CharField(max_length=64, blank=True, default="")
    memo_type = models.CharField(max_length=8, blank=True, default="")
    type = models.CharField(max_length=40)
    data = models.BinaryField(null=True, blank=True)
    provided = models.JSONField(default=list)
    field_updated = models.JSONField(default=dict)
    review = models.CharField(max_length=12, choices=Review.choices, default=Review.AUTO)
    message = models.TextField(blank=True, default="")
    requested_fields = models.JSONField(default=list)
    requested_at = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)
    info_wanted_at = models.DateTimeField(null=True, blank=True)
    # Keyed hashes (HMAC-SHA256) of who this is, across customer rows: the PAN, the
    # bank account or UPI ID, the wallet's SEP-10 account and memo (anchor/customers.py
    # ``identities``). Limits and rejections follow them, not the row.
    identities = models.JSONField(default=list)
    deleted_at = models.DateTimeField(null=True, blank=True)
    erase_after = models.DateTimeField(null=True, blank=True)
    erased_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "customers"
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(fields=["account", "memo", "memo_type", "type"],
                                    condition=Q(deleted_at__isnull=True),
                                    name="customers_live_unique"),
        ]
        indexes = [
            models.Index(fields=["erase_after"], name="customers_erase_due_idx",
                         condition=Q(erased_at__isnull=True, erase_after__isnull=False)),
            models.Index(fields=["info_wanted_at"], name="customers_info_wanted_idx",
                         condition=Q(info_wanted_at__isnull=False)),
        ]
        permissions = [
            ("review_customer", "Can accept, reject or ask a customer for more information"),
        ]

    def __str__(self) -> str:
        return f"customer {self.id} {self.type}"


class CustomerFile(models.Model):
    """A binary SEP-9 field (``photo_id_front``...): the bytes as a Fernet token, the
    kind found in its first bytes, its size and SHA-256 (of the plaintext). One row per
    customer and field: a new upload replaces it."""

    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="files")
    field = models.CharField(max_length=40)
    content_type = models.CharField(max_length=40)
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    data = models.BinaryField()
    uploaded_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "customer_files"
        constraints = [
            models.UniqueConstraint(fields=["customer", "field"], name="customer_files_unique"),
        ]


class CustomerEvent(models.Model):
    """Append-only audit of a customer: created, updated (field names only), each
    operator decision (with the operator and the note), deleted, erased. Never holds
    personal data, so it survives erasure."""

    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="events")
    event = models.CharField(max_length=40)
    detail = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    operator = models.CharField(max_length=150, blank=True, default="")
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "customer_events"
        ordering = ["id"]


class CustomerDenial(models.Model):
    """A person an operator rejected, by identity hash (``Customer.identities``): a
    customer registered again with the same PAN, bank account or wallet account starts
    rejected. Holds no personal data (a keyed hash), so it outlives erasure."""

    identity = models.CharField(max_length=64, unique=True)
    customer_id = models.CharField(max_length=40)
    reason = models.TextField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "customer_denials"


class CustomerVolume(models.Model):
    """What one customer moved or asked to move, for the daily and monthly limits
    (anchor/limits.py): one row per AP transaction (deposit, withdrawal, inbound
    payout), its INR value, written under a lock of the customer's row before any
    outbound call, so two tabs cannot both pass a limit that one of them would reach.
    ``released_at``: the transaction ended without moving money (an expired deposit);
    it no longer counts."""

    transaction_id = models.CharField(max_length=64, unique=True)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="volumes")
    # Whose limit it counts against: an identity hash of the customer (the wallet
    # account for SEP-24, the bank account or UPI ID for a SEP-31 receiver).
    identity = models.CharField(max_length=64, default="")
    kind = models.CharField(max_length=12)
    amount_inr = models.DecimalField(max_digits=14, decimal_places=2)
    created_at = models.DateTimeField(db_default=Now())
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "customer_volumes"
        indexes = [models.Index(fields=["identity", "created_at"],
                                name="customer_volumes_window_idx")]


class SourceAccount(models.Model):
    """A channel account: the source of release transactions, one in flight at a time.

    ``sequence`` is the last sequence number handed out (None = read it from Horizon
    on next use). ``leased_by`` holds the release whose envelope may still land; the
    lease ends when that envelope landed, or is provably dead after ``leased_until``."""

    address = models.CharField(max_length=56, unique=True)
    sequence = models.BigIntegerField(null=True, blank=True)
    leased_by = models.CharField(max_length=64, null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    # ``manage.py channels``: when it was created on chain by Corridor (None: configured
    # only, e.g. the distribution account), retired (no new leases), and its XLM (the
    # fees it pays) as Horizon last showed it.
    created_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    xlm_balance = models.DecimalField(max_digits=20, decimal_places=7, null=True, blank=True)
    balance_checked_at = models.DateTimeField(null=True, blank=True)

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
            ("refund_deposit", "Can refund a deposit's captured INR through Razorpay"),
        ]

    def __str__(self) -> str:
        return f"{self.transaction_id} {self.event} by {self.operator}"


class InteractiveSubmission(models.Model):
    """The intent of one interactive form submission (deposit or withdrawal), one row
    per AP transaction: claimed in a short transaction *before* any outbound call, so
    that of any number of simultaneous POSTs exactly one (the holder of the live
    claim) talks to Razorpay and AP (anchor/submissions.py).

    ``fence`` grows on every takeover (a claim whose lease lapsed: a dead or stalled
    worker, or a released attempt); every write of a step's outcome checks it, so a
    stalled holder can never store over its successor. ``step`` is the last step whose
    intent was committed: ``claimed`` (nothing sent yet), ``order_requested`` (a
    Razorpay order may exist: recovery looks it up by receipt before creating one),
    ``order_stored`` / ``request_stored`` (our DepositOrder / WithdrawalRequest row
    exists; only the AP call is left), ``done``. The deposit amounts are kept so the
    sweeper can complete a deposit whose worker died; bank details never are."""

    class Status(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    class Kind(models.TextChoices):
        DEPOSIT = "deposit"
        WITHDRAWAL = "withdrawal"

    transaction_id = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.IN_FLIGHT)
    step = models.CharField(max_length=20, default="claimed")
    fence = models.BigIntegerField(default=1)
    lease_until = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=1)
    amount_in = models.DecimalField(max_digits=20, decimal_places=7)  # INR or USDC
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "interactive_submissions"
        indexes = [
            # The sweeper reads the in-flight few, not the table.
            models.Index(fields=["lease_until"], name="interactive_subm_open_idx",
                         condition=Q(status="in_flight")),
        ]

    def __str__(self) -> str:
        return f"{self.kind} submission {self.transaction_id} {self.status}/{self.step}"


class FirmQuote(models.Model):
    """A firm SEP-38 quote Corridor gave through AP's ``GET /rate?type=firm``
    (anchor/quotes.py): honoured exactly, once, and only before ``expires_at``.

    ``quote_id`` is ours and becomes AP's SEP-38 ``quote_id`` (globally unique);
    assets in SEP-38 Asset Identification Format; amounts in each asset's units with
    its significant decimals; ``price`` sell-asset units per one buy-asset unit, fees
    excluded (SEP-38 "Price Formulas": ``sell_amount - fee = price * buy_amount`` with
    the fee in the sell asset); ``fee_details`` the answer's ``fee.details``.
    ``transaction_id`` and ``used_at`` are set by the one flow that used it."""

    quote_id = models.CharField(max_length=64, unique=True)
    client_id = models.CharField(max_length=100)
    sell_asset = models.CharField(max_length=100)
    buy_asset = models.CharField(max_length=100)
    sell_amount = models.DecimalField(max_digits=24, decimal_places=7)
    buy_amount = models.DecimalField(max_digits=24, decimal_places=7)
    price = models.DecimalField(max_digits=40, decimal_places=24)
    fee_total = models.DecimalField(max_digits=24, decimal_places=7)
    fee_asset = models.CharField(max_length=100)
    fee_details = models.JSONField(default=list)
    sell_delivery_method = models.CharField(max_length=40, blank=True, default="")
    buy_delivery_method = models.CharField(max_length=40, blank=True, default="")
    country_code = models.CharField(max_length=2, blank=True, default="")
    mid_rate = models.DecimalField(max_digits=20, decimal_places=8)  # INR per USDC
    expires_at = models.DateTimeField()
    transaction_id = models.CharField(max_length=64, blank=True, default="")
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "firm_quotes"

    def __str__(self) -> str:
        return f"quote {self.quote_id} {self.sell_amount} {self.sell_asset} -> " \
               f"{self.buy_amount} {self.buy_asset}"


class DepositRefund(StatusMachine, models.Model):
    """The at-most-once guard of a deposit's INR refund through Razorpay (issue 13 §3;
    razorpay/TREASURY.md §2): one row per AP deposit, committed (``requested``, with
    the ``receipt`` and the ``X-Refund-Idempotency`` key Corridor chose) before the
    refund call is sent, so a lost answer is recovered by listing the payment's
    refunds and matching the receipt, or by replaying the same key -- never by a
    second refund (anchor/refunds.py). The claim and the deposit's release claim lock
    the same ``deposit_payments`` row, so a deposit gets its USDC or its rupees back,
    never both.

    ``status`` changes only through ``DepositRefund.transition`` along
    ``TRANSITIONS``; what moves each edge (anchor/refunds.py):

    - ``requested -> pending | processed | failed``: Razorpay's answer to the create
      call, a refund found by receipt after a lost answer, or a refund webhook (the
      API re-read) that arrived first;
    - ``pending -> processed | failed``: a ``refund.*`` webhook (the API re-read) or the
      drive's poll of ``GET /v1/refunds/{id}``; forward only, in any arrival order;
    - ``processed -> completed``: AP shows the deposit ``refunded`` with this refund
      (``notify_refund_sent``);
    - ``requested | pending | processed -> manual_review``: the outcome stays unknown
      after DEPOSIT_REFUND_MAX_ATTEMPTS, Razorpay refused the refund, the payment shows
      a refund that is not ours, or AP cannot be moved (the deposit ``expired`` before
      the INR was captured: the refund is recorded here and waits for a person);
    - ``failed`` (Razorpay failed the refund: the rupees are still ours), ``completed``
      and ``manual_review`` are final for the automation; ``failed`` and
      ``manual_review`` are in the operators' queue (kind ``refund``).

    Money: ``amount_paise`` integer paise, the whole captured payment. ``refund_id`` is
    Razorpay's ``rfnd_...``; ``provider_status`` what Razorpay last showed."""

    class Status(models.TextChoices):
        REQUESTED = "requested"
        PENDING = "pending"
        PROCESSED = "processed"
        COMPLETED = "completed"
        FAILED = "failed"
        MANUAL_REVIEW = "manual_review"

    class Trigger(models.TextChoices):
        OPERATOR = "operator"
        EXPIRED = "expired"  # INR captured after AP expired the deposit

    OPEN_STATUSES = (Status.REQUESTED, Status.PENDING, Status.PROCESSED)
    REASON_STATUSES = frozenset({Status.MANUAL_REVIEW, Status.FAILED})
    TRANSITIONS = {
        Status.REQUESTED: frozenset({Status.PENDING, Status.PROCESSED, Status.FAILED,
                                     Status.MANUAL_REVIEW}),
        Status.PENDING: frozenset({Status.PROCESSED, Status.FAILED, Status.MANUAL_REVIEW}),
        Status.PROCESSED: frozenset({Status.COMPLETED, Status.MANUAL_REVIEW}),
        Status.FAILED: frozenset(),
        Status.MANUAL_REVIEW: frozenset(),
        Status.COMPLETED: frozenset(),
    }

    transaction_id = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.REQUESTED)
    payment_id = models.CharField(max_length=40)
    amount_paise = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    # Corridor's own references, set at the claim: the refund's ``receipt`` (matched when
    # the payment's refunds are listed) and the X-Refund-Idempotency key of every create.
    receipt = models.CharField(max_length=40, unique=True)
    idempotency_key = models.CharField(max_length=64, unique=True)
    refund_id = models.CharField(max_length=40, unique=True, null=True, blank=True)
    provider_status = models.CharField(max_length=12, blank=True, default="")
    arn = models.CharField(max_length=64, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)  # create calls sent
    trigger = models.CharField(max_length=12, choices=Trigger.choices)
    reason = models.TextField()
    operator = models.CharField(max_length=150)
    ap_status_at_claim = models.CharField(max_length=32, blank=True, default="")
    ap_refunded_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    processed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "deposit_refunds"
        indexes = [
            # The sweep's cost grows with the open rows, not the table.
            models.Index(fields=["updated_at"], name="deposit_refunds_open_idx",
                         condition=Q(status__in=["requested", "pending", "processed"])),
        ]

    def __str__(self) -> str:
        return f"refund {self.transaction_id} {self.status}"
