"""Hot accounts (issue 11 §4): postings to an account flagged ``hot`` do not update
its row; the balance trigger appends their sum to ``ledger_balance_deltas`` instead,
and ``ledger.services.rollup`` folds the deltas into the balance later. So concurrent
posts to the same hot accounts never wait on each other's row locks.

The trigger decides per account in ONE statement (one snapshot), so each statement's
postings to an account go either into its balance or into one delta, never both and
never neither, even while ``sync_hot_flags`` flips the flag. Balances read as
``balance + SUM(unrolled deltas)``, which is right whatever the flag says.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

FORWARD = r"""
ALTER TABLE ledger_balance_deltas
    ADD CONSTRAINT ledger_delta_nonzero CHECK (amount <> 0);

CREATE OR REPLACE FUNCTION ledger_apply_postings() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    WITH d AS (
        SELECT p.account_id, SUM(p.amount) AS delta, a.hot
          FROM new_postings p JOIN ledger_accounts a ON a.id = p.account_id
         GROUP BY p.account_id, a.hot
    ), cold AS (
        UPDATE ledger_accounts a SET balance = a.balance + d.delta
          FROM d WHERE a.id = d.account_id AND NOT d.hot
    )
    INSERT INTO ledger_balance_deltas (account_id, amount)
    SELECT account_id, delta FROM d WHERE d.hot AND d.delta <> 0;
    RETURN NULL;
END $$;
"""

BACKWARD = r"""
CREATE OR REPLACE FUNCTION ledger_apply_postings() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ledger_accounts a SET balance = a.balance + d.delta
      FROM (SELECT account_id, SUM(amount) AS delta FROM new_postings GROUP BY account_id) d
     WHERE a.id = d.account_id;
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0002_ledger_rules"),
    ]

    operations = [
        migrations.AddField(
            model_name="account",
            name="hot",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.CreateModel(
            name="BalanceDelta",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("amount", models.DecimalField(decimal_places=7, max_digits=30)),
                ("created_at", models.DateTimeField(
                    db_default=django.db.models.functions.datetime.Now())),
                ("account", models.ForeignKey(on_delete=django.db.models.deletion.PROTECT,
                                              related_name="deltas", to="ledger.account")),
            ],
            options={
                "db_table": "ledger_balance_deltas",
            },
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
