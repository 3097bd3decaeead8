"""Issue 13 §3, deposit refunds through Razorpay (anchor/refunds.py): a deposit refund
Razorpay failed (the rupees are still ours) or that waits for a person
(``manual_review``: AP cannot be moved because it expired the deposit before the INR
was captured, the outcome stayed unknown, Razorpay refused it) joins the operators'
review queue as kind ``refund`` (``reference`` the AP transaction id, ``amount`` the
rupees, ``reason`` why, with the refund id and Razorpay's status). A confirmed payment
whose INR is being refunded leaves the ``notify`` kind (AP is told by the refund).
The operators group gets ``anchor.refund_deposit`` (0004's ``sync_groups``)."""

import importlib

from django.db import migrations

OLD_VIEW = importlib.import_module("sagas.migrations.0006_review_queue_stranded").NEW_VIEW
GROUPS = importlib.import_module("sagas.migrations.0004_operator_groups")

NOTIFY_WHERE = """ WHERE p.confirmation = 'confirmed' AND p.ap_notified_at IS NULL
   AND p.notify_review_at IS NOT NULL"""
assert NOTIFY_WHERE in OLD_VIEW

REFUNDS = r"""
UNION ALL
SELECT 'refund:' || f.id, 'refund', f.status, f.id, f.transaction_id,
       f.amount_paise::numeric / 100, f.currency,
       f.last_error || '; refund ' || COALESCE(f.refund_id, '(none)') || ' '
       || COALESCE(NULLIF(f.provider_status, ''), 'not created') || ', payment '
       || f.payment_id || ', ' || f.trigger || ': ' || f.reason,
       f.updated_at
  FROM deposit_refunds f
 WHERE f.status IN ('manual_review', 'failed')
"""

NEW_VIEW = OLD_VIEW.replace(NOTIFY_WHERE, NOTIFY_WHERE + """
   AND NOT EXISTS (SELECT 1 FROM deposit_refunds f WHERE f.transaction_id = p.transaction_id)"""
                            ).rstrip() + "\n" + REFUNDS
DROP = "DROP VIEW IF EXISTS operator_review_queue"


def sync_groups(apps, schema_editor):
    saved = GROUPS.ACTIONS
    GROUPS.ACTIONS = {**saved, "payouts": (*saved["payouts"], "refund_receipt"),
                      "anchor": (*saved["anchor"], "review_customer", "refund_deposit")}
    try:
        GROUPS.sync_groups(apps, schema_editor)
    finally:
        GROUPS.ACTIONS = saved


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0007_customer_review_permission"),
        ("anchor", "0014_deposit_refunds"),
    ]

    operations = [
        migrations.RunSQL([DROP, NEW_VIEW], [DROP, OLD_VIEW]),
        migrations.RunPython(sync_groups, migrations.RunPython.noop),
    ]
