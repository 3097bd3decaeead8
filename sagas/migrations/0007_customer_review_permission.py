"""The operators group gets ``anchor.review_customer`` (accept, reject or ask a SEP-12
customer for more information: anchor/customers.py), through 0004's ``sync_groups``;
the auditors see customers (``anchor.view_customer``) and their audit rows."""

import importlib

from django.db import migrations

GROUPS = importlib.import_module("sagas.migrations.0004_operator_groups")


def sync_groups(apps, schema_editor):
    saved = GROUPS.ACTIONS
    GROUPS.ACTIONS = {**saved, "payouts": (*saved["payouts"], "refund_receipt"),
                      "anchor": (*saved["anchor"], "review_customer")}
    try:
        GROUPS.sync_groups(apps, schema_editor)
    finally:
        GROUPS.ACTIONS = saved


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0006_review_queue_stranded"),
        ("anchor", "0011_customers"),
    ]

    operations = [migrations.RunPython(sync_groups, migrations.RunPython.noop)]
