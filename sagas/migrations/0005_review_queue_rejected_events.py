"""Rejected inbound events join the operators' review queue (issue 9): a correctly
signed Razorpay/RazorpayX webhook or authenticated AP event that could never be stored
is acknowledged (so the sender stops retrying) and recorded in ``inbound_events`` with
outcome ``rejected`` and its reason; it waits here, kind ``inbound``, for a person.

The view is dropped and created again (not ``CREATE OR REPLACE``, which refuses any
change in a column's type), with 0003's text plus one branch."""

from importlib import import_module

from django.db import migrations

OLD_VIEW = import_module("sagas.migrations.0003_operator_review_queue").VIEW

INBOUND = r"""
UNION ALL
SELECT 'inbound:' || e.id, 'inbound', e.outcome, e.id, e.source || ':' || e.event_id,
       NULL::numeric, '',
       CASE WHEN e.event_type = '' THEN e.reason ELSE e.event_type || ': ' || e.reason END,
       e.received_at
  FROM inbound_events e
 WHERE e.outcome = 'rejected'
"""

NEW_VIEW = OLD_VIEW.rstrip() + "\n" + INBOUND
DROP = "DROP VIEW IF EXISTS operator_review_queue"


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0004_operator_groups"),
        ("anchor", "0003_inbound_event_reason"),
    ]

    operations = [
        migrations.RunSQL([DROP, NEW_VIEW], [DROP, OLD_VIEW]),
    ]
