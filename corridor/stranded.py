"""What is *stranded*: money Corridor holds, or owes a customer, that nobody is moving.

Issue 10 part 2: every state in which Corridor holds a customer's money or owes them
something is either driven forward by a sweeper or raised to the operators' review
queue (``operator_review_queue``) within a bounded time. A row that is owed, is older
than its kind's threshold, and is not in the review queue has no owner: it is
stranded. After the system settles with its faults off, every count here is 0.

One query per kind (:func:`stranded_queries`), each served by a partial index over
the open rows, so the cost follows the open rows, not the table:

- ``captured_not_notified``: captured INR Corridor confirmed with Razorpay, AP never
  accepted ``notify_offchain_funds_received`` for it, confirmed more than
  STRANDED_NOTIFY_S ago, not raised yet, and not being refunded (a payment captured
  after AP expired its deposit is owned by its refund, ``anchor/refunds.py``, and then
  by the queue; found by ``make chaos``) (``deposit_payments_unnot_idx``; owner: the
  notify sweeper, ``anchor.reconciler.sweep_unnotified``);
- ``confirmed_not_released``: confirmed and AP told (AP ``pending_anchor``) more than
  STRANDED_RELEASE_S ago, no release claimed, and no INR refund of it (a refund in any
  state owns the deposit: open, ``deposit_refund_open``; failed or in review, the queue;
  completed, settled: issue 25 §4) (``deposit_payments_unrel_idx``; owner: the AP
  sweep; a customer who never adds the USDC trustline is counted too);
- ``release_open``: a release ``submitting`` / ``submitted`` / ``failed`` claimed more
  than STRANDED_RELEASE_S ago (``deposit_releases_open_idx``; owner: the reconciler);
- ``payout_processing``: a payout ``processing`` past the provider's settlement window
  PAYOUT_SETTLEMENT_WINDOW_S plus two WITHDRAW_POLL_PERIOD_S (the poller raises it at
  the window; found by ``make chaos``, which caught one between the two)
  (``withdrawal_payouts_open_idx``; owner: the poller);
- ``refund_open``: a refund on chain (a withdrawal's or a receipt's) ``submitting`` /
  ``submitted`` for more than STRANDED_REFUND_S (``withdrawal_refunds_open_idx``;
  owner: the refund sweep);
- ``deposit_refund_open``: a deposit's INR refund through Razorpay ``requested`` /
  ``pending`` / ``processed`` and untouched for more than STRANDED_REFUND_S
  (``deposit_refunds_open_idx``; owner: the deposit refund sweep,
  ``anchor.refunds.sweep_refunds``; found by ``make chaos``: a refund whose create
  answered 5xx sat ``requested`` while its sweep ran once a minute);
- ``saga_unleased``: a saga ``running`` / ``compensating``, due for more than
  STRANDED_SAGA_S, with no live lease (``sagas_due_idx``; owner: the resume sweep);
- ``receipt_unconsumed``: a USDC receipt not settled, not raised for review, older
  than STRANDED_RECEIPT_S, and not under the memo of a withdrawal that has no payout
  yet or only a failed one (that withdrawal's flow owns it: ``awaits_payout``)
  (``stellar_receipts_open_idx``, and ``withdrawal_requests_owning_idx`` for the
  owning withdrawal; owner: the receipt classifier, ``payouts.receipts.classify_receipts``);
- ``receive_info_unread``: a SEP-31 customer a transaction waits on (``info_wanted_at``,
  stamped by each decision that finds it NEEDS_INFO or PROCESSING, cleared once the
  transaction was asked for its funds or refused) that changed after that look, more
  than STRANDED_RECEIVE_INFO_S ago, and was not looked at since: a transaction waiting
  for information it already has (issue 25 §3: found by ``make demo``)
  (``customers_info_wanted_idx``; owner: the poller's SEP-31 pass, and the
  ``customer_updated`` event's task, ``payouts.receive.decide``).

Rows in ``manual_review`` (and the queue's ``notify`` and ``receipt`` kinds) have an
owner, a person, and are not counted. Imports point one way (sagas -> payouts ->
anchor -> ledger): this module, in ``corridor``, wires them; ``/health/ready`` and
``/metrics`` (``corridor_stranded{kind}``) read it, ``manage.py stranded`` prints it.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import CharField, Exists, F, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Concat
from django.utils import timezone

KINDS = ("captured_not_notified", "confirmed_not_released", "release_open",
         "payout_processing", "refund_open", "deposit_refund_open", "saga_unleased",
         "receipt_unconsumed", "receive_info_unread")


def stranded_thresholds() -> dict[str, float]:
    """Seconds after which an owed, unowned row of each kind counts as stranded."""
    return {
        "captured_not_notified": settings.STRANDED_NOTIFY_S,
        "confirmed_not_released": settings.STRANDED_RELEASE_S,
        "release_open": settings.STRANDED_RELEASE_S,
        # The poller raises it once the window passed: two of its periods after that.
        "payout_processing": settings.PAYOUT_SETTLEMENT_WINDOW_S
        + 2 * settings.WITHDRAW_POLL_PERIOD_S,
        "refund_open": settings.STRANDED_REFUND_S,
        "deposit_refund_open": settings.STRANDED_REFUND_S,
        "saga_unleased": settings.STRANDED_SAGA_S,
        "receipt_unconsumed": settings.STRANDED_RECEIPT_S,
        "receive_info_unread": settings.STRANDED_RECEIVE_INFO_S,
    }


def stranded_queries() -> dict[str, QuerySet]:
    """kind -> the queryset of its stranded rows, now (one SQL query each)."""
    from anchor.models import Customer, DepositPayment, DepositRefund, DepositRelease
    from anchor.reconciler import unnotified_payments
    from payouts import receipts, refunds
    from payouts.models import WithdrawalPayout, WithdrawalRefund, WithdrawalRequest
    from sagas.models import Saga

    now = timezone.now()
    limit = {kind: now - timedelta(seconds=s) for kind, s in stranded_thresholds().items()}
    # A withdrawal without a payout, or whose payout failed, owns the receipts under its
    # memo (``classify_receipts`` waits on them; ``verify``'s match): same memo, and the
    # same memo_type or none (AP's default "id"). ``awaits_payout`` is exactly that
    # condition, kept by the database (payouts/migrations/0006), and
    # ``withdrawal_requests_owning_idx`` holds those withdrawals only. Two NOT IN over
    # their (few) memos: PostgreSQL reads each list once through that index and hashes
    # it (a hashed SubPlan) whatever the table sizes. A correlated NOT EXISTS let the
    # planner flip, from one ANALYZE to the next, between a hash anti join and one
    # index probe per open receipt (the bench saw 5 and 64 buffers).
    owning = WithdrawalRequest.objects.filter(awaits_payout=True)
    owned_any_type = owning.filter(memo_type="").values("memo")
    owned_same_type = owning.values(key=_memo_key())
    return {
        "captured_not_notified": unnotified_payments().filter(
            confirmed_at__lt=limit["captured_not_notified"], notify_review_at__isnull=True
        ).exclude(Exists(DepositRefund.objects.filter(transaction_id=OuterRef(
            "transaction_id")))),
        "confirmed_not_released": DepositPayment.objects.filter(
            confirmation=DepositPayment.Confirmation.CONFIRMED, ap_notified_at__isnull=False,
            release_claimed_at__isnull=True,
            ap_notified_at__lt=limit["confirmed_not_released"]
        ).exclude(Exists(DepositRefund.objects.filter(transaction_id=OuterRef(
            "transaction_id")))),
        "release_open": DepositRelease.objects.filter(
            status__in=DepositRelease.OPEN_STATUSES, created_at__lt=limit["release_open"]),
        "payout_processing": WithdrawalPayout.objects.filter(
            # Counted from the current attempt's start (an operator's new attempt
            # restarts it; created_at is the first claim's time).
            status=WithdrawalPayout.Status.PROCESSING,
            clock_started_at__lt=limit["payout_processing"]),
        "refund_open": WithdrawalRefund.objects.filter(
            status__in=refunds.OPEN, created_at__lt=limit["refund_open"]),
        "deposit_refund_open": DepositRefund.objects.filter(
            status__in=DepositRefund.OPEN_STATUSES, updated_at__lt=limit["deposit_refund_open"]),
        "saga_unleased": Saga.objects.filter(
            status__in=["running", "compensating"], wake_at__lt=limit["saga_unleased"]
        ).filter(Q(lease_owner="") | Q(lease_until__lte=now)),
        "receipt_unconsumed": receipts.open_receipts().filter(
            review_reason="", created_at__lt=limit["receipt_unconsumed"]
        ).alias(key=_memo_key()).exclude(memo__in=owned_any_type).exclude(
            key__in=owned_same_type),
        "receive_info_unread": Customer.objects.filter(
            info_wanted_at__isnull=False, updated_at__gt=F("info_wanted_at"),
            updated_at__lt=limit["receive_info_unread"]),
    }


def _memo_key() -> Concat:
    """``memo`` and ``memo_type`` as one value (the separator occurs in neither)."""
    return Concat("memo", Value("\x1f"), "memo_type", output_field=CharField())


def stranded_counts() -> dict[str, int]:
    """kind -> how many rows are stranded now (0 for every kind once the system has
    settled). Raises the database's errors."""
    return {kind: query.count() for kind, query in stranded_queries().items()}
