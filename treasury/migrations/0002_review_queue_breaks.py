"""Issue 13 §2: an open reconciliation break (``recon_breaks``) joins the operators'
review queue as kind ``break`` (``reference`` the payment, payout, settlement or
account it is about, ``amount`` the difference, ``reason`` the source, the kind and
what each side says). The queue's ``refund`` kind reads without a leading "; " when the
refund has no error yet. The operators group gets ``treasury.resolve_break`` and the
auditors can view the treasury tables (0004's ``sync_groups``)."""

import importlib

from django.db import migrations

OLD_VIEW = importlib.import_module(
    "sagas.migrations.0008_review_queue_deposit_refunds").NEW_VIEW
GROUPS = importlib.import_module("sagas.migrations.0004_operator_groups")

REFUND_REASON = "       f.last_error || '; refund ' || COALESCE(f.refund_id, '(none)') || ' '"
assert REFUND_REASON in OLD_VIEW
BREAKS = r"""
UNION ALL
SELECT 'break:' || b.id, 'break', b.status, b.id, b.reference,
       b.difference, b.currency,
       b.source || ' ' || b.kind || ' on ' || b.account || ': ' || b.key
       || ' (books ' || b.books::text || '; outside ' || b.outside::text || ')',
       b.updated_at
  FROM recon_breaks b
 WHERE b.status = 'open'
"""
NEW_VIEW = OLD_VIEW.replace(REFUND_REASON, "       CONCAT_WS('; ', NULLIF(f.last_error, ''), "
                            "'refund ' || COALESCE(f.refund_id, '(none)')) || ' '"
                            ).rstrip() + "\n" + BREAKS
DROP = "DROP VIEW IF EXISTS operator_review_queue"


def sync_groups(apps, schema_editor):
    saved_actions, saved_apps = GROUPS.ACTIONS, GROUPS.APPS
    previous = importlib.import_module("sagas.migrations.0008_review_queue_deposit_refunds")
    GROUPS.APPS = (*saved_apps, "treasury")
    GROUPS.ACTIONS = {**saved_actions, "treasury": ("resolve_break",)}
    try:
        previous.sync_groups(apps, schema_editor)
    finally:
        GROUPS.ACTIONS, GROUPS.APPS = saved_actions, saved_apps


class Migration(migrations.Migration):

    dependencies = [
        ("treasury", "0001_initial"),
        ("sagas", "0008_review_queue_deposit_refunds"),
    ]

    operations = [
        migrations.RunSQL([DROP, NEW_VIEW], [DROP, OLD_VIEW]),
        migrations.RunPython(sync_groups, migrations.RunPython.noop),
    ]
