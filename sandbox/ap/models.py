"""State of the Anchor Platform stand-in, in the ``sandbox`` database.

``ApTransaction`` mirrors AP-4.3.0 ``JdbcSep24Transaction`` and, with ``sep = "31"``,
``JdbcSep31Transaction`` (kind ``receive``: ``funding_method``, ``sender_id``,
``receiver_id``; the SA's SEP-10 account and memo are the creator);
``ApEvent`` is the outbox of events for the callback API, delivered one at a time by
``sandbox.ap.events``. Amounts are kept as the decimal strings the caller sent (AP keeps
``String`` amounts and echoes them unchanged: ``"100"`` stays ``"100"``).
"""

import uuid

from django.db import models


class ApTransaction(models.Model):
    """One SEP-24 or SEP-31 transaction as AP stores it.

    ``version`` is the optimistic-lock column (AP 4.2.0+, PR #1896): every RPC reads the
    row, validates, and writes back only ``WHERE version = <read version>``.
    ``transfer_received_at`` is the hidden "funds received" flag (not exposed for SEP-24).
    """

    id = models.CharField(primary_key=True, max_length=64)
    sep = models.CharField(max_length=4, default="24")  # 24 | 31
    kind = models.CharField(max_length=16)  # deposit | withdrawal | receive
    status = models.CharField(max_length=40)
    version = models.IntegerField(default=0)

    request_asset_code = models.CharField(max_length=12)
    request_asset_issuer = models.CharField(max_length=56, null=True)

    amount_expected = models.CharField(max_length=64, null=True)
    amount_in = models.CharField(max_length=64, null=True)
    amount_in_asset = models.CharField(max_length=128, null=True)
    amount_out = models.CharField(max_length=64, null=True)
    amount_out_asset = models.CharField(max_length=128, null=True)
    amount_fee = models.CharField(max_length=64, null=True)
    amount_fee_asset = models.CharField(max_length=128, null=True)
    fee_details_list = models.JSONField(null=True)  # [{name, description?, amount}]
    quote_id = models.CharField(max_length=64, null=True)

    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True)
    user_action_required_by = models.DateTimeField(null=True)
    transfer_received_at = models.DateTimeField(null=True)

    message = models.TextField(null=True)
    # {"amount_refunded": str, "amount_fee": str, "payments": [{id, id_type, amount, fee}]}
    refunds = models.JSONField(null=True)
    stellar_transactions = models.JSONField(default=list)
    stellar_transaction_id = models.CharField(max_length=64, null=True)

    from_account = models.CharField(max_length=128, null=True)
    to_account = models.CharField(max_length=128, null=True)
    withdraw_anchor_account = models.CharField(max_length=56, null=True)
    external_transaction_id = models.CharField(max_length=255, null=True)
    memo = models.CharField(max_length=128, null=True)
    memo_type = models.CharField(max_length=8, null=True)
    refund_memo = models.CharField(max_length=128, null=True)
    refund_memo_type = models.CharField(max_length=8, null=True)

    web_auth_account = models.CharField(max_length=128)
    web_auth_account_memo = models.CharField(max_length=32, null=True)
    client_domain = models.CharField(max_length=255, null=True)
    client_name = models.CharField(max_length=255, null=True)
    request_client_ip_address = models.CharField(max_length=64, null=True)
    lang = models.CharField(max_length=16, null=True)

    # SEP-31 only (Sep31Transaction): stored unverified, AP 4.x does no KYC check.
    funding_method = models.CharField(max_length=40, null=True)
    sender_id = models.CharField(max_length=128, null=True)
    receiver_id = models.CharField(max_length=128, null=True)
    fields = models.JSONField(null=True)  # the deprecated ``fields.transaction`` map

    class Meta:
        db_table = "sandbox_ap_transactions"
        indexes = [models.Index(fields=["status"]), models.Index(fields=["started_at"])]


class ApEvent(models.Model):
    """One event of the callback API (``POST {callback}/event``), AP NOTES §3.

    ``position`` orders delivery (the ``ap.event_reorder`` fault swaps two positions);
    ``attempt_log`` keeps one entry per HTTP attempt for the inspection endpoint.
    """

    seq = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True)
    type = models.CharField(max_length=40)
    transaction_id = models.CharField(max_length=64)
    payload = models.JSONField()
    position = models.BigIntegerField(default=0, db_index=True)
    created_at = models.DateTimeField()

    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True)
    delivered_at = models.DateTimeField(null=True)
    lost_at = models.DateTimeField(null=True)
    copies = models.IntegerField(default=1)
    reordered = models.BooleanField(default=False)
    last_status = models.IntegerField(null=True)
    last_error = models.TextField(null=True)
    attempt_log = models.JSONField(default=list)

    class Meta:
        db_table = "sandbox_ap_events"


class ApObserverState(models.Model):
    """The payment observer's stored cursor (AP-4.3.0 ``JdbcStellarPaymentStreamerCursorStore``,
    one row): the Horizon paging token of the last payment it handled.

    ``epoch`` is bumped by every reset (``sandbox.ap.service.reset``); the observer writes
    the cursor only ``WHERE epoch = <the epoch it read>``, so a loop that was mid-page
    during a reset cannot bring back a cursor from the world before it.
    """

    id = models.IntegerField(primary_key=True, default=1)
    cursor = models.CharField(max_length=32, null=True)
    epoch = models.IntegerField(default=0)
    updated_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sandbox_ap_observer_state"


class ApObservedPayment(models.Model):
    """One payment the observer handled, and what came of it (sandbox-only inspection,
    ``GET /ap/sandbox/observer``; AP itself only logs this).

    ``outcome``: ``ignored`` (``DefaultPaymentListener.validate`` refused it, e.g. an empty
    text memo), ``no_match`` (no withdrawal in ``pending_user_transfer_start`` for this
    destination and memo), ``lookup_error`` (the lookup threw, e.g. several rows matched),
    ``missed`` (fault ``ap.observer_miss``), ``notified`` (the RPC succeeded) or
    ``refused`` (the RPC answered an error, which AP never reads).
    """

    seq = models.BigAutoField(primary_key=True)
    paging_token = models.CharField(max_length=32)
    operation_id = models.CharField(max_length=32)
    operation_type = models.CharField(max_length=40)
    stellar_transaction_id = models.CharField(max_length=64)
    from_account = models.CharField(max_length=56, null=True)
    to_account = models.CharField(max_length=56, null=True)
    to_muxed = models.CharField(max_length=69, null=True)
    amount = models.CharField(max_length=32, null=True)
    asset = models.CharField(max_length=128, null=True)  # SEP-11: CODE:ISSUER | native
    memo_type = models.CharField(max_length=8, null=True)
    memo = models.CharField(max_length=128, null=True)  # as AP's MemoHelper.memoAsString
    outcome = models.CharField(max_length=16)
    transaction_id = models.CharField(max_length=64, null=True)
    detail = models.TextField(null=True)
    rpc_request = models.JSONField(null=True)
    rpc_reply = models.JSONField(null=True)
    observed_at = models.DateTimeField()

    class Meta:
        db_table = "sandbox_ap_observed_payments"
        indexes = [models.Index(fields=["transaction_id"])]


class ApQuote(models.Model):
    """A firm SEP-38 quote as AP stores it from the anchor's ``GET /rate`` answer (AP
    table ``exchange_quote``, SEP31-RECEIVE.md §6.4): the anchor's ``id``, the amounts
    re-formatted to the assets' decimals, ``expires_at``, the fee, and the creator's
    SEP-10 account and memo. ``transaction_id`` stays empty (AP 4.3.0 links none)."""

    id = models.CharField(max_length=64, primary_key=True)
    context = models.CharField(max_length=8)
    sell_asset = models.CharField(max_length=100)
    sell_amount = models.CharField(max_length=40)
    sell_delivery_method = models.CharField(max_length=40, blank=True, default="")
    buy_asset = models.CharField(max_length=100)
    buy_amount = models.CharField(max_length=40)
    buy_delivery_method = models.CharField(max_length=40, blank=True, default="")
    price = models.CharField(max_length=60)
    total_price = models.CharField(max_length=60)
    fee = models.JSONField()
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField()
    creator_account = models.CharField(max_length=69)
    creator_memo = models.CharField(max_length=64, blank=True, default="")
    transaction_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        db_table = "sandbox_ap_quotes"
