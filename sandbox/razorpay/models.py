"""State of the Razorpay stand-in (``sandbox`` database, router in sandbox/router.py).

Amounts are integer paise everywhere, as in Razorpay (NOTES §0.1). Unix timestamps
(``created_at``) are integer seconds, as the API shows them; ``*_ts`` columns are
timezone-aware datetimes used for ordering and scheduling.

The webhook outbox (``WebhookEvent`` + ``WebhookDelivery``) is shared by pay-in events
(target ``payments``) and RazorpayX payout events (target ``payouts``).

RazorpayX (NOTES §2): ``Contact`` -> ``FundAccount`` -> ``Payout``; ``PayoutIdempotencyKey``
records each ``X-Payout-Idempotency`` key and the request it was first used with;
``FundAccountValidation`` validates a fund account (TREASURY §6), answered as the test's
``ValidationAccount`` row for that beneficiary account says.
"""

from django.db import models


class Order(models.Model):
    """A Razorpay order (docs: ``api/orders/create``; NOTES §1.1).

    status: ``created`` (no attempt yet) -> ``attempted`` (a payment was tried) ->
    ``paid`` (a payment was captured; final).
    """

    id = models.CharField(primary_key=True, max_length=40)  # order_ + 14 base62
    amount = models.BigIntegerField()  # paise
    amount_paid = models.BigIntegerField(default=0)  # paise
    currency = models.CharField(max_length=3)
    receipt = models.CharField(max_length=40, null=True)
    status = models.CharField(max_length=10, default="created")
    attempts = models.IntegerField(default=0)
    notes = models.JSONField(default=list)  # [] when empty, an object otherwise (PHP-style)
    partial_payment = models.BooleanField(default=False)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpay_orders"
        constraints = [
            models.UniqueConstraint(
                fields=["receipt"], condition=models.Q(receipt__isnull=False),
                name="sandbox_razorpay_order_receipt_unique",
            )
        ]


class Payment(models.Model):
    """A payment on an order (docs: ``payments/payments``; NOTES §1.3).

    status: ``captured`` or ``failed`` here (orders auto-capture; ``created`` and
    ``authorized`` are passed through inside one pay call). A ``failed`` payment with
    ``late_capture_ts`` set turns ``captured`` at that time (NOTES §5.8).
    """

    id = models.CharField(primary_key=True, max_length=40)  # pay_ + 14 base62
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="payments")
    amount = models.BigIntegerField()  # paise
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=12)
    method = models.CharField(max_length=12)
    vpa = models.CharField(max_length=100, null=True)
    bank = models.CharField(max_length=20, null=True)
    card_id = models.CharField(max_length=40, null=True)
    email = models.CharField(max_length=200)
    contact = models.CharField(max_length=20)
    description = models.CharField(max_length=255, null=True)
    notes = models.JSONField(default=list)
    fee = models.BigIntegerField(null=True)  # paise, tax included; null until captured
    tax = models.BigIntegerField(null=True)  # paise
    error_code = models.CharField(max_length=40, null=True)
    error_description = models.CharField(max_length=255, null=True)
    error_source = models.CharField(max_length=40, null=True)
    error_step = models.CharField(max_length=40, null=True)
    error_reason = models.CharField(max_length=60, null=True)
    acquirer_data = models.JSONField(default=dict)
    upi = models.JSONField(null=True)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()
    late_capture_ts = models.DateTimeField(null=True)  # fault payment_failed_then_captured
    # Fault decisions taken once per payment at pay time, applied to every event of it:
    # {"lose": bool, "replay": {...} | null, "reorder": bool}.
    webhook_faults = models.JSONField(default=dict)

    class Meta:
        db_table = "sandbox_razorpay_payments"
        indexes = [models.Index(fields=["late_capture_ts"])]


class WebhookEvent(models.Model):
    """One webhook event: its id (``X-Razorpay-Event-Id``) and the exact body bytes.

    The body is serialised once, at creation, and every delivery sends those bytes, so a
    redelivery is byte-identical (NOTES §1.5).
    """

    id = models.CharField(primary_key=True, max_length=40)
    event = models.CharField(max_length=60)  # "payment.captured", "order.paid", ...
    # "payments" | "payouts": delivered to {SANDBOX_WEBHOOK_URL}/{target}
    target = models.CharField(max_length=20)
    entity_id = models.CharField(max_length=40, db_index=True)  # pay_... / pout_...
    order_id = models.CharField(max_length=40, null=True, db_index=True)
    body = models.BinaryField()
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpay_webhook_events"


class WebhookDelivery(models.Model):
    """One delivery chain of an event to the merchant URL, retried until a 2xx or the
    retry window ends.

    kind: ``original``; ``duplicate`` (fault ``razorpay.webhook_replay``: the same event
    sent again with the same id and bytes); ``replay`` (dashboard replay, signed with the
    secret current at replay time). A ``lost`` delivery is never sent.
    ``after``: this delivery's first attempt waits until that delivery made its first
    attempt (arrival order of related events and of sequential duplicates); retries are
    independent.
    """

    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE, related_name="deliveries")
    kind = models.CharField(max_length=10, default="original")
    copy = models.IntegerField(default=0)
    signature = models.CharField(max_length=64)  # hex HMAC-SHA256 of event.body
    after = models.ForeignKey("self", null=True, on_delete=models.SET_NULL, related_name="+")
    lost = models.BooleanField(default=False)
    attempts = models.IntegerField(default=0)
    delivered = models.BooleanField(default=False)
    gave_up = models.BooleanField(default=False)
    last_status = models.IntegerField(null=True)  # HTTP status of the last attempt; null: none
    last_error = models.TextField(default="")
    next_attempt_ts = models.DateTimeField(null=True)  # null: delivered, given up or lost
    created_ts = models.DateTimeField()
    first_sent_ts = models.DateTimeField(null=True)
    last_sent_ts = models.DateTimeField(null=True)
    delivered_ts = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_razorpay_webhook_deliveries"
        indexes = [models.Index(fields=["next_attempt_ts"])]


class Contact(models.Model):
    """A RazorpayX contact (docs ``api/x/contacts/create``; NOTES §2.2).

    ``details_key`` = sha256 of (name, email, contact, type, reference_id): unique, so a
    create with all five equal returns the existing contact, also under concurrency.
    """

    id = models.CharField(primary_key=True, max_length=40)  # cont_ + 14 base62
    name = models.CharField(max_length=50)
    email = models.CharField(max_length=200, null=True)
    contact = models.CharField(max_length=20, null=True)
    type = models.CharField(max_length=20, null=True)
    reference_id = models.CharField(max_length=40, null=True)
    notes = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    details_key = models.CharField(max_length=64, unique=True)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpayx_contacts"


class FundAccount(models.Model):
    """A fund account of a contact (docs ``api/x/fund-accounts/create/*``; NOTES §2.3).

    ``details``: ``{"name", "ifsc", "account_number"}`` for ``bank_account``,
    ``{"address"}`` for ``vpa``. ``details_key`` = sha256 of (contact, type, details): unique,
    so identical details under one contact return the existing fund account.
    """

    id = models.CharField(primary_key=True, max_length=40)  # fa_ + 14 base62
    contact = models.ForeignKey(Contact, on_delete=models.PROTECT, related_name="fund_accounts")
    account_type = models.CharField(max_length=20)  # "bank_account" | "vpa"
    details = models.JSONField()
    active = models.BooleanField(default=True)
    details_key = models.CharField(max_length=64, unique=True)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpayx_fund_accounts"


class Payout(models.Model):
    """A RazorpayX payout (docs ``api/x/payouts/*``; NOTES §2.4-2.7).

    status: ``processing`` at create -> ``processed`` (UTR set) | ``failed``; ``processed``
    -> ``reversed`` (NOTES §2.6). The background loop applies ``next_step`` (``settle`` or
    ``reverse``) at ``next_step_ts``. ``faults``: the fault switches taken once at create
    and applied to the whole life of the payout. ``held_events``: webhook events kept back
    by ``razorpayx.webhook_reorder`` until the reversal is queued.
    """

    id = models.CharField(primary_key=True, max_length=40)  # pout_ + 14 base62
    fund_account = models.ForeignKey(FundAccount, on_delete=models.PROTECT,
                                     related_name="payouts")
    idempotency_key = models.CharField(max_length=36, unique=True)
    amount = models.BigIntegerField()  # paise, fees and tax excluded
    currency = models.CharField(max_length=3)
    mode = models.CharField(max_length=10)
    purpose = models.CharField(max_length=40)
    reference_id = models.CharField(max_length=40, null=True, db_index=True)
    narration = models.CharField(max_length=30, null=True)
    notes = models.JSONField(default=list)
    queue_if_low_balance = models.BooleanField(default=False)
    status = models.CharField(max_length=12)
    utr = models.CharField(max_length=40, null=True)
    fees = models.BigIntegerField(default=0)  # paise, tax included
    tax = models.BigIntegerField(default=0)  # paise
    status_reason = models.CharField(max_length=60, null=True)
    status_description = models.CharField(max_length=255, null=True)
    status_source = models.CharField(max_length=30, null=True)
    debit_account_number = models.CharField(max_length=40)
    faults = models.JSONField(default=dict)
    next_step = models.CharField(max_length=10, default="")
    next_step_ts = models.DateTimeField(null=True)
    held_events = models.JSONField(default=list)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()
    processed_ts = models.DateTimeField(null=True)
    failed_ts = models.DateTimeField(null=True)
    reversed_ts = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_razorpayx_payouts"
        indexes = [models.Index(fields=["next_step_ts"])]


class PayoutIdempotencyKey(models.Model):
    """One ``X-Payout-Idempotency`` key (NOTES §2.5): the canonical hash of the first body
    sent with it and, once created, its payout. ``in_flight`` while the first request has
    not answered yet (a concurrent duplicate then gets 409)."""

    key = models.CharField(primary_key=True, max_length=36)
    request_hash = models.CharField(max_length=64)
    payout = models.OneToOneField(Payout, null=True, on_delete=models.CASCADE,
                                  related_name="idempotency")
    in_flight = models.BooleanField(default=True)
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpayx_idempotency_keys"


class FundAccountValidation(models.Model):
    """A RazorpayX fund account validation (TREASURY §6; docs
    ``api/x/account-validation/bank-account``, ``api/x/composite-account-validation``).

    status: ``created`` -> ``completed`` (the check ran: read ``account_status``) |
    ``failed`` (technical failure; charge reversed). ``form``: ``fund_account`` (shape 1,
    an existing ``fa_`` id; answered with ``results``) or ``composite`` (shape 2, contact
    and fund account created from the body; answered with ``validation_results``,
    ``status_details`` and ``reference_id``). ``outcome``: the sandbox account's
    behaviour (``ValidationAccount``) taken at create; the background loop completes a
    ``created`` one at ``complete_ts``.
    """

    id = models.CharField(primary_key=True, max_length=40)  # fav_ + 14 base62
    fund_account = models.ForeignKey(FundAccount, on_delete=models.PROTECT,
                                     related_name="validations")
    form = models.CharField(max_length=12)  # "fund_account" | "composite"
    account_number = models.CharField(max_length=40)  # ours (customer identifier)
    amount = models.BigIntegerField()  # paise, fees excluded
    currency = models.CharField(max_length=3)
    notes = models.JSONField(default=list)
    reference_id = models.CharField(max_length=40, null=True)  # composite form only
    status = models.CharField(max_length=10)
    account_status = models.CharField(max_length=10, null=True)
    registered_name = models.CharField(max_length=120, null=True)
    details = models.CharField(max_length=255, null=True)
    name_match_score = models.IntegerField(null=True)  # 0-100
    utr = models.CharField(max_length=40, null=True)
    outcome = models.JSONField(default=dict)
    complete_ts = models.DateTimeField(null=True)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()
    completed_ts = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_razorpayx_fund_account_validations"
        indexes = [models.Index(fields=["complete_ts"])]


class ValidationAccount(models.Model):
    """What the sandbox's "bank" answers when a beneficiary account is validated, set by
    tests (``POST /razorpay/sandbox/fund_accounts/validations/accounts``). ``key``: the
    bank account number or the VPA address. Without a row: ``active``, ``completed`` at
    once, registered name = the fund account's holder name (bank) or contact name (VPA).

    ``registered_name`` null: derived as above. ``status``: ``completed`` | ``failed``.
    ``pending_s``: seconds the validation stays ``created`` before it ends.
    ``payout_failure``: a status_details reason (``payouts.REASONS``) with which every
    payout to this account fails at settle time (an account that validates but then
    refuses credits, e.g. frozen after the penny drop); null: payouts settle normally.
    """

    key = models.CharField(primary_key=True, max_length=256)
    registered_name = models.CharField(max_length=120, null=True)
    account_status = models.CharField(max_length=10, default="active")
    status = models.CharField(max_length=10, default="completed")
    pending_s = models.FloatField(default=0.0)
    payout_failure = models.CharField(max_length=40, null=True)
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpayx_validation_accounts"


class Refund(models.Model):
    """A refund of a captured payment (TREASURY §2; docs ``api/refunds/entity``,
    ``webhook_refund_processed.json``).

    status: ``pending`` at create -> ``processed`` (final) | ``failed`` (final) at
    ``next_step_ts`` (the settle delay). ``faults``: the fault switches taken once at
    create and applied to the refund's whole life. ``held_events``: webhook events kept
    back by ``razorpay.refund_webhook_reorder`` until the refund settles.
    """

    id = models.CharField(primary_key=True, max_length=40)  # rfnd_ + 14 base62
    payment = models.ForeignKey(Payment, on_delete=models.CASCADE, related_name="refunds")
    amount = models.BigIntegerField()  # paise
    currency = models.CharField(max_length=3)
    receipt = models.CharField(max_length=40, null=True, db_index=True)
    notes = models.JSONField(default=list)
    speed_requested = models.CharField(max_length=10)
    speed_processed = models.CharField(max_length=10, null=True)
    status = models.CharField(max_length=10)
    acquirer_data = models.JSONField(default=dict)  # {"arn": ...}; null arn until settled
    idempotency_key = models.CharField(max_length=100, null=True)
    faults = models.JSONField(default=dict)
    next_step_ts = models.DateTimeField(null=True)
    held_events = models.JSONField(default=list)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()
    processed_ts = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_razorpay_refunds"
        indexes = [models.Index(fields=["next_step_ts"])]


class RefundIdempotencyKey(models.Model):
    """One ``X-Refund-Idempotency`` key (TREASURY §2.1, §0 rule 4): the canonical hash of
    the first request (payment id + body) and, once created, its refund. ``in_flight``
    while the first request has not answered (a concurrent duplicate gets 409)."""

    key = models.CharField(primary_key=True, max_length=100)
    request_hash = models.CharField(max_length=64)
    refund = models.OneToOneField(Refund, null=True, on_delete=models.CASCADE,
                                  related_name="idempotency")
    in_flight = models.BooleanField(default=True)
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpay_refund_idempotency_keys"


class Settlement(models.Model):
    """A settlement of the pay-in balance to our bank account (TREASURY §3.1; docs
    ``api/settlements/entity``): ``amount`` = the net credits of its items (paise), ``fees``
    and ``tax`` 0 (a normal settlement; per-payment fees were already deducted), ``status``
    ``processed`` at creation (the sandbox transfers at once), ``utr`` the bank reference."""

    id = models.CharField(primary_key=True, max_length=40)  # setl_ + 14 base62
    amount = models.BigIntegerField()  # paise
    fees = models.BigIntegerField(default=0)  # paise
    tax = models.BigIntegerField(default=0)  # paise
    status = models.CharField(max_length=10, default="processed")
    utr = models.CharField(max_length=40)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "sandbox_razorpay_settlements"


class SettlementItem(models.Model):
    """One settleable entity, a row of ``GET /v1/settlements/recon/combined`` once settled
    (TREASURY §3.2; ``api_settlement_recon_combined.json``). Made when a payment is
    captured (``type`` payment) or a refund is processed (``type`` refund: ``debit`` =
    ``amount``, ``credit``, ``fee`` and ``tax`` 0, deducted from the next settlement);
    ``settle_due_ts`` is the cycle boundary it settles at, null when it never settles
    (fault ``razorpay.settlement_omit_payment``, unlisted). ``captured_ts``: when it became
    settleable (a refund's processing).

    ``fee`` and ``tax``: what the settlement charged (paise; ``fee`` includes ``tax``), the
    payment's own unless fault ``razorpay.settlement_fee_mismatch``; ``credit`` = ``amount``
    - ``fee`` for a payment. ``unpaid``: listed under its settlement but left out of the
    settlement's amount (fault ``razorpay.settlement_omit_payment`` with ``listed``).
    """

    entity_id = models.CharField(primary_key=True, max_length=40)  # pay_... | rfnd_...
    type = models.CharField(max_length=12, default="payment")  # payment | refund
    # the payment itself, or the refunded payment of a refund row
    payment = models.ForeignKey(Payment, null=True, on_delete=models.CASCADE,
                                related_name="settlement_items")
    amount = models.BigIntegerField()  # paise
    credit = models.BigIntegerField()  # paise
    debit = models.BigIntegerField(default=0)  # paise
    fee = models.BigIntegerField()  # paise, tax included
    tax = models.BigIntegerField()  # paise
    currency = models.CharField(max_length=3)
    unpaid = models.BooleanField(default=False)
    captured_ts = models.DateTimeField()
    settle_due_ts = models.DateTimeField(null=True)
    settlement = models.ForeignKey(Settlement, null=True, on_delete=models.PROTECT,
                                   related_name="items")
    settled_at = models.BigIntegerField(null=True)  # unix seconds
    created_at = models.BigIntegerField()  # unix seconds, the entity's own

    class Meta:
        db_table = "sandbox_razorpay_settlement_items"
        indexes = [models.Index(fields=["settle_due_ts"]),
                   models.Index(fields=["settled_at"])]


class BankingAccount(models.Model):
    """Our RazorpayX account (a Lite account: FAV runs on it, TREASURY §6.1): the balance
    after its last statement row. Rows are appended under this row's lock, so ``balance``
    and the rows' running ``balance`` never disagree."""

    account_number = models.CharField(primary_key=True, max_length=40)
    balance = models.BigIntegerField(default=0)  # paise
    last_seq = models.IntegerField(default=0)
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpayx_banking_accounts"


class AccountTransaction(models.Model):
    """One row of the RazorpayX account statement (TREASURY §5; docs
    ``api/x/transactions/entity``): a payout debit, a reversal credit (a reversed or failed
    payout, amount + fees back) or a bank transfer credit (funds added).

    ``amount`` excludes fees; ``fees``/``tax``: what this row charged (payout debits only;
    the payout's own unless fault ``razorpayx.statement_fee_mismatch``). ``balance``: after
    this row = previous balance + ``credit`` - ``debit`` - ``fees``. ``seq``: its place in
    the account's statement (unique per account). ``details``: the static part of
    ``source`` (reversal and bank transfer ids and payer fields).
    """

    id = models.CharField(primary_key=True, max_length=40)  # txn_ + 14 base62
    account = models.ForeignKey(BankingAccount, on_delete=models.CASCADE,
                                related_name="transactions")
    seq = models.IntegerField()
    kind = models.CharField(max_length=16)  # "payout" | "reversal" | "bank_transfer"
    payout = models.ForeignKey(Payout, null=True, on_delete=models.CASCADE,
                               related_name="statement_rows")
    amount = models.BigIntegerField()  # paise
    credit = models.BigIntegerField(default=0)  # paise
    debit = models.BigIntegerField(default=0)  # paise
    fees = models.BigIntegerField(default=0)  # paise, tax included
    tax = models.BigIntegerField(default=0)  # paise
    balance = models.BigIntegerField()  # paise, after this row
    currency = models.CharField(max_length=3, default="INR")
    details = models.JSONField(default=dict)
    created_at = models.BigIntegerField()  # unix seconds
    created_ts = models.DateTimeField()

    class Meta:
        db_table = "sandbox_razorpayx_transactions"
        constraints = [models.UniqueConstraint(fields=["account", "seq"],
                                               name="sandbox_razorpayx_txn_seq_unique")]
        indexes = [models.Index(fields=["account", "created_at"])]
