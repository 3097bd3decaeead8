"""State of the Horizon stand-in, in the ``sandbox`` database (router: app label
``sandbox_horizon``).

Two halves, as on the real network:

- *ledger state* (what stellar-core keeps): ``Account`` and ``Trustline`` rows, the
  current balances and sequence numbers;
- *history* (what Horizon ingests): ``Ledger``, ``Transaction``, ``Operation`` and the
  participant tables that answer ``/accounts/{id}/payments`` and
  ``/accounts/{id}/transactions``.

``Submission`` is stellar-core's transaction queue (at most one queued transaction per
source account, enforced by a partial unique constraint).

Amounts are ``Decimal`` with 7 decimal places (Stellar's stroop precision); fees are
integers in stroops, as on the wire. Ids of transactions and operations are SEP-35 TOIDs
(``ledger << 32 | application_order << 12 | operation_index``), which are also their
paging tokens.
"""

from django.db import models

AMOUNT = {"max_digits": 20, "decimal_places": 7}


class Ledger(models.Model):
    """One closed ledger. ``paging_token`` = ``sequence << 32`` (SEP-35 TOID)."""

    sequence = models.IntegerField(primary_key=True)
    paging_token = models.BigIntegerField(unique=True)
    hash = models.CharField(max_length=64, unique=True)
    prev_hash = models.CharField(max_length=64)
    close_time = models.BigIntegerField(help_text="unix seconds (XDR TimePoint)")
    closed_at = models.DateTimeField()
    successful_transaction_count = models.IntegerField(default=0)
    failed_transaction_count = models.IntegerField(default=0)
    operation_count = models.IntegerField(default=0)
    tx_set_operation_count = models.IntegerField(default=0)
    total_coins = models.DecimalField(**AMOUNT)
    fee_pool = models.DecimalField(**AMOUNT)
    base_fee = models.IntegerField(help_text="stroops per operation")
    base_reserve = models.IntegerField(help_text="stroops")
    max_tx_set_size = models.IntegerField()
    protocol_version = models.IntegerField()
    header_xdr = models.TextField()

    class Meta:
        db_table = "sandbox_horizon_ledgers"


class Account(models.Model):
    """A ledger-state account entry. Signers: the master key only (weight 1)."""

    account_id = models.CharField(max_length=56, primary_key=True)
    balance = models.DecimalField(**AMOUNT, help_text="XLM")
    sequence = models.BigIntegerField()
    sequence_ledger = models.IntegerField(null=True)
    sequence_time = models.BigIntegerField(null=True)
    subentry_count = models.IntegerField(default=0)
    flags = models.IntegerField(default=0)
    home_domain = models.CharField(max_length=32, blank=True, default="")
    master_weight = models.IntegerField(default=1)
    low_threshold = models.IntegerField(default=0)
    med_threshold = models.IntegerField(default=0)
    high_threshold = models.IntegerField(default=0)
    data = models.JSONField(default=dict, help_text="name -> base64 value")
    last_modified_ledger = models.IntegerField()
    last_modified_time = models.BigIntegerField(help_text="unix seconds")

    class Meta:
        db_table = "sandbox_horizon_accounts"


class Trustline(models.Model):
    """A credit-asset trustline of ``account_id``. ``flags`` bit 1 = authorized."""

    account_id = models.CharField(max_length=56)
    asset_code = models.CharField(max_length=12)
    asset_issuer = models.CharField(max_length=56)
    balance = models.DecimalField(**AMOUNT)
    limit = models.DecimalField(**AMOUNT)
    flags = models.IntegerField(default=1)
    last_modified_ledger = models.IntegerField()

    class Meta:
        db_table = "sandbox_horizon_trustlines"
        constraints = [
            models.UniqueConstraint(
                fields=["account_id", "asset_code", "asset_issuer"],
                name="sandbox_horizon_trustline_unique",
            )
        ]


class Transaction(models.Model):
    """An ingested transaction (successful or included-but-failed).

    ``id`` is its TOID / paging token. ``memo`` is Horizon's rendering (text cleaned to
    UTF-8, id as decimal, hash/return as base64); ``memo_bytes`` is base64 of the raw text
    memo bytes. Time and ledger bounds are kept as posted (``max_time`` 0 = unbounded).
    """

    id = models.BigIntegerField(primary_key=True)
    hash = models.CharField(max_length=64, unique=True)
    ledger = models.IntegerField(db_index=True)
    application_order = models.IntegerField()
    created_at = models.DateTimeField()
    source_account = models.CharField(max_length=56)
    account_muxed = models.CharField(max_length=69, null=True)
    account_muxed_id = models.CharField(max_length=20, null=True)
    source_account_sequence = models.BigIntegerField()
    fee_account = models.CharField(max_length=56)
    fee_charged = models.BigIntegerField(help_text="stroops")
    max_fee = models.BigIntegerField(help_text="stroops")
    operation_count = models.IntegerField()
    successful = models.BooleanField()
    envelope_xdr = models.TextField()
    result_xdr = models.TextField()
    result_meta_xdr = models.TextField()
    fee_meta_xdr = models.TextField()
    memo_type = models.CharField(max_length=6)
    memo = models.TextField(null=True)
    memo_bytes = models.TextField(null=True)
    signatures = models.JSONField(default=list)
    has_time_bounds = models.BooleanField(default=False)
    min_time = models.BigIntegerField(null=True)
    max_time = models.BigIntegerField(null=True)
    min_ledger = models.BigIntegerField(null=True)
    max_ledger = models.BigIntegerField(null=True)
    min_account_sequence = models.BigIntegerField(null=True)
    min_account_sequence_age = models.BigIntegerField(null=True)
    min_account_sequence_ledger_gap = models.BigIntegerField(null=True)

    class Meta:
        db_table = "sandbox_horizon_transactions"


class Operation(models.Model):
    """An ingested operation. ``details`` holds the type-specific fields of Horizon's
    record (``from``/``to``/``amount``/asset fields for a payment, ...), already in wire
    form (amounts as 7-decimal strings, muxed ids as strings)."""

    id = models.BigIntegerField(primary_key=True)
    transaction = models.ForeignKey(Transaction, on_delete=models.CASCADE,
                                    related_name="operations")
    index = models.IntegerField(help_text="1-based position in its transaction")
    type = models.CharField(max_length=40)
    type_i = models.IntegerField()
    source_account = models.CharField(max_length=56)
    source_account_muxed = models.CharField(max_length=69, null=True)
    source_account_muxed_id = models.CharField(max_length=20, null=True)
    details = models.JSONField(default=dict)
    is_payment = models.BooleanField()
    successful = models.BooleanField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "sandbox_horizon_operations"


class TransactionParticipant(models.Model):
    """``account_id`` took part in ``transaction`` (source, op source, destination)."""

    account_id = models.CharField(max_length=56)
    transaction = models.ForeignKey(Transaction, on_delete=models.CASCADE,
                                    related_name="participants")

    class Meta:
        db_table = "sandbox_horizon_tx_participants"
        constraints = [
            models.UniqueConstraint(fields=["account_id", "transaction"],
                                    name="sandbox_horizon_tx_participant_unique")
        ]


class OperationParticipant(models.Model):
    """``account_id`` took part in ``operation`` (its source or its destination)."""

    account_id = models.CharField(max_length=56)
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE,
                                  related_name="participants")

    class Meta:
        db_table = "sandbox_horizon_op_participants"
        constraints = [
            models.UniqueConstraint(fields=["account_id", "operation"],
                                    name="sandbox_horizon_op_participant_unique")
        ]


class Submission(models.Model):
    """stellar-core's transaction queue: an accepted envelope waiting for the next
    ledger close. ``status``: ``queued`` -> ``applied`` | ``dropped`` (invalid at close
    time, e.g. its time bounds passed; a dropped envelope may be posted again)."""

    QUEUED, APPLIED, DROPPED = "queued", "applied", "dropped"

    hash = models.CharField(max_length=64, unique=True)
    envelope_xdr = models.TextField()
    source_account = models.CharField(max_length=56)
    sequence = models.BigIntegerField()
    status = models.CharField(max_length=10, default=QUEUED)
    reason = models.CharField(max_length=40, blank=True, default="")
    submitted_at = models.DateTimeField(help_text="first POST; starts Horizon's timeout")
    queued_ledger = models.IntegerField(help_text="last closed ledger when queued")

    class Meta:
        db_table = "sandbox_horizon_submissions"
        constraints = [
            # stellar-core >= 19.13 / 20.0: one queued transaction per source account.
            models.UniqueConstraint(fields=["source_account"],
                                    condition=models.Q(status="queued"),
                                    name="sandbox_horizon_one_queued_per_source")
        ]


class AccountSnapshot(models.Model):
    """An account's ledger state (entry and trustlines) as it stood after ledger
    ``ledger`` closed, written for every account that ledger changed. A Horizon node
    whose ingestion is behind (the lag faults of ``service``) answers
    ``GET /accounts/{id}`` from the latest snapshot at or below its own height.
    ``data``: ``{"account": {field: value}, "trustlines": [{field: value}]}`` with
    amounts as 7-decimal strings."""

    ledger = models.IntegerField()
    account_id = models.CharField(max_length=56)
    data = models.JSONField()

    class Meta:
        db_table = "sandbox_horizon_account_snapshots"
        constraints = [
            models.UniqueConstraint(fields=["account_id", "ledger"],
                                    name="sandbox_horizon_snapshot_unique")
        ]
