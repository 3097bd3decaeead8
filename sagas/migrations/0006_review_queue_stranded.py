"""Issue 10 part 2, nothing owed is left without an owner: two more kinds join the
operators' review queue, and operators may refund an unconsumed receipt.

- ``notify``: a confirmed INR payment (``deposit_payments``) AP still has not accepted
  ``notify_offchain_funds_received`` for, AP_NOTIFY_REVIEW_S after its confirmation
  (``notify_review_at``, set by anchor/reconciler.py ``sweep_unnotified``, which keeps
  retrying); ``reason`` has the attempts and AP's last refusal.
- ``receipt``: a USDC receipt (``stellar_receipts``) no withdrawal consumed, raised by
  payouts/receipts.py ``classify_receipts``: ``reference`` is the Stellar hash,
  ``amount`` the unconsumed USDC, ``reason`` why plus the on-chain evidence (hash,
  from, amount, memo, ledger time) and its refund's state; it leaves the queue once the
  receipt is settled (its refund on chain done).

The view is dropped and created again with 0005's text plus two branches; the
operators group gets ``payouts.refund_receipt`` (0004's ``sync_groups``)."""

from importlib import import_module

from django.db import migrations

OLD_VIEW = import_module("sagas.migrations.0005_review_queue_rejected_events").NEW_VIEW
GROUPS = import_module("sagas.migrations.0004_operator_groups")

STRANDED = r"""
UNION ALL
SELECT 'notify:' || p.id, 'notify', 'unnotified', p.id, p.transaction_id,
       p.amount_paise::numeric / 100, p.currency,
       'captured INR, AP refused notify_offchain_funds_received ' || p.notify_attempts
       || ' times (still retrying); last: ' || p.notify_error,
       p.notify_review_at
  FROM deposit_payments p
 WHERE p.confirmation = 'confirmed' AND p.ap_notified_at IS NULL
   AND p.notify_review_at IS NOT NULL
UNION ALL
SELECT 'receipt:' || r.id, 'receipt', COALESCE('refund ' || f.status, 'unconsumed'), r.id,
       r.tx_hash, r.amount - r.consumed_amount, 'USDC',
       r.review_reason || '; hash ' || r.tx_hash || ' from ' || r.from_account || ', '
       || r.amount || ' USDC (' || r.consumed_amount || ' consumed), memo '
       || r.memo_type || ' ' || r.memo || ', ledger time ' || r.created_at
       || CASE WHEN f.id IS NULL THEN ''
               ELSE '; refund ' || f.status || ' ' || f.tx_hash || ': ' || f.last_error END,
       COALESCE(r.reviewed_at, r.created_at)
  FROM stellar_receipts r
  LEFT JOIN withdrawal_refunds f ON f.receipt_id = r.id
 WHERE r.settled_at IS NULL AND r.review_reason <> ''
"""

NEW_VIEW = OLD_VIEW.rstrip() + "\n" + STRANDED
DROP = "DROP VIEW IF EXISTS operator_review_queue"


def sync_groups(apps, schema_editor):
    saved = GROUPS.ACTIONS
    GROUPS.ACTIONS = {**saved, "payouts": (*saved["payouts"], "refund_receipt")}
    try:
        GROUPS.sync_groups(apps, schema_editor)
    finally:
        GROUPS.ACTIONS = saved


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0005_review_queue_rejected_events"),
        ("anchor", "0005_notify_sweeper"),
        ("payouts", "0003_unconsumed_receipts"),
    ]

    operations = [
        migrations.RunSQL([DROP, NEW_VIEW], [DROP, OLD_VIEW]),
        migrations.RunPython(sync_groups, migrations.RunPython.noop),
    ]
