"""The operators' manual-review queue: the unmanaged model ``ReviewItem`` and the SQL view
``operator_review_queue`` it reads (sagas/models.py documents the columns).

A view keeps the queue a read of the tables that own each state, with no copy to keep
in step. Columns of the underlying tables that it reads cannot change type while it
exists: a later migration doing so drops and recreates the view around the change."""

from django.db import migrations, models

VIEW = r"""
CREATE VIEW operator_review_queue AS
SELECT 'saga:' || s.id AS key, 'saga'::text AS kind, s.status, s.id AS object_id,
       s.reference::text AS reference,
       CASE WHEN s.input->>'amount' ~ '^-?[0-9]+(\.[0-9]+)?$'
            THEN (s.input->>'amount')::numeric END AS amount,
       COALESCE(s.input->>'currency', s.input->>'asset_code', '') AS currency,
       s.error AS reason, s.updated_at AS since
  FROM sagas s
 WHERE s.status = 'manual_review'
UNION ALL
SELECT 'release:' || r.id, 'release', r.status, r.id, r.transaction_id, r.amount,
       r.asset_code, r.last_error, r.updated_at
  FROM deposit_releases r
 WHERE r.status = 'manual_review'
UNION ALL
SELECT 'payout:' || p.id, 'payout', p.status, p.id, p.transaction_id,
       p.amount_paise::numeric / 100, p.currency,
       CASE WHEN f.id IS NULL THEN p.last_error
            ELSE 'refund ' || f.status || ': ' || f.last_error END,
       GREATEST(p.updated_at, f.updated_at)
  FROM withdrawal_payouts p
  LEFT JOIN withdrawal_refunds f ON f.transaction_id = p.transaction_id
 WHERE p.status IN ('manual_review', 'failed', 'reversed')
   AND (f.id IS NULL OR f.status <> 'completed')
UNION ALL
SELECT 'withdrawal:' || w.id, 'withdrawal', w.status, w.id, w.transaction_id,
       COALESCE(w.received_amount, w.amount_in), 'USDC',
       CASE WHEN f.id IS NULL THEN w.review_reason
            ELSE 'refund ' || f.status || ': ' || f.last_error END,
       GREATEST(w.updated_at, f.updated_at)
  FROM withdrawal_requests w
  LEFT JOIN withdrawal_refunds f ON f.request_id = w.id
 WHERE w.status = 'manual_review'
   AND (f.id IS NULL OR f.status <> 'completed')
"""


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0002_partners_hub_payments"),
        ("anchor", "0002_operator_events"),
        ("payouts", "0002_operator_events_refunds"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReviewItem",
            fields=[
                ("key", models.CharField(max_length=80, primary_key=True, serialize=False)),
                ("kind", models.CharField(max_length=20)),
                ("status", models.CharField(max_length=20)),
                ("object_id", models.BigIntegerField()),
                ("reference", models.CharField(max_length=128)),
                ("amount", models.DecimalField(decimal_places=7, max_digits=30, null=True)),
                ("currency", models.CharField(max_length=12)),
                ("reason", models.TextField()),
                ("since", models.DateTimeField()),
            ],
            options={
                "verbose_name": "manual-review item",
                "verbose_name_plural": "manual-review queue",
                "db_table": "operator_review_queue",
                "ordering": ["since", "key"],
                "permissions": [
                    ("resume_saga", "Can resume a saga in manual review"),
                    ("retry_saga_step", "Can retry the step a saga stopped at"),
                    ("compensate_saga", "Can compensate a saga in manual review"),
                    ("resolve_saga", "Can close a saga in manual review as resolved"),
                ],
                "managed": False,
            },
        ),
        migrations.RunSQL(VIEW, "DROP VIEW IF EXISTS operator_review_queue"),
    ]
