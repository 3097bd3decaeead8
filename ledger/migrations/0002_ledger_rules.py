"""The ledger's rules, enforced by PostgreSQL itself (ledger-and-sagas.md §4, §7 rule 6):

1. ``ledger_postings_balanced``: a DEFERRABLE INITIALLY DEFERRED constraint trigger
   that, at commit, refuses any entry whose postings do not sum to zero per currency
   (django-hordak's ``check_leg``, migrations 0052/0054). It runs for every posting
   row, however it was written.
2. ``ledger_postings_balance``: a statement-level trigger that adds the inserted
   postings to ``ledger_accounts.balance`` (pgledger's stored balance), so balances
   equal the sum of postings by construction.
3. ``ledger_*_append_only``: postings and entries cannot be updated or deleted;
   corrections are new entries (TigerBeetle, §2.4). TRUNCATE (test teardown) is allowed.
"""

from django.db import migrations

FORWARD = r"""
CREATE FUNCTION ledger_check_entry_balanced() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT a.currency, SUM(p.amount) AS total INTO bad
      FROM ledger_postings p JOIN ledger_accounts a ON a.id = p.account_id
     WHERE p.entry_id = NEW.entry_id
     GROUP BY a.currency
    HAVING SUM(p.amount) <> 0
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger entry % does not sum to zero in %: %',
            NEW.entry_id, bad.currency, bad.total
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_postings_balanced';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER ledger_postings_balanced
    AFTER INSERT ON ledger_postings
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_check_entry_balanced();

CREATE FUNCTION ledger_apply_postings() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ledger_accounts a SET balance = a.balance + d.delta
      FROM (SELECT account_id, SUM(amount) AS delta FROM new_postings GROUP BY account_id) d
     WHERE a.id = d.account_id;
    RETURN NULL;
END $$;

CREATE TRIGGER ledger_postings_balance
    AFTER INSERT ON ledger_postings
    REFERENCING NEW TABLE AS new_postings
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_apply_postings();

CREATE FUNCTION ledger_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: post a correcting entry instead', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END $$;

CREATE TRIGGER ledger_postings_append_only
    BEFORE UPDATE OR DELETE ON ledger_postings
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();

CREATE TRIGGER ledger_entries_append_only
    BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
"""

BACKWARD = r"""
DROP TRIGGER ledger_entries_append_only ON ledger_entries;
DROP TRIGGER ledger_postings_append_only ON ledger_postings;
DROP FUNCTION ledger_refuse_change();
DROP TRIGGER ledger_postings_balance ON ledger_postings;
DROP FUNCTION ledger_apply_postings();
DROP TRIGGER ledger_postings_balanced ON ledger_postings;
DROP FUNCTION ledger_check_entry_balanced();
"""


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
