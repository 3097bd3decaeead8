"""``withdrawal_requests.awaits_payout``: whether a withdrawal can still own the receipts
under its memo (no payout, or only a failed one), kept by PostgreSQL, and a partial index
over the withdrawals for which it is true (issue 11 §2: ``stranded.receipt_unconsumed``
probed the whole memo index once per open receipt, x3.1 in buffers at 1M rows).

The flag is the anti-join the stranded count used to run, stored:

    awaits_payout = NOT EXISTS (SELECT 1 FROM withdrawal_payouts
                                 WHERE transaction_id = <the request's> AND status <> 'failed')

Two row triggers keep it exact whatever writes the rows (the guard's claim, a webhook, an
operator's new attempt or mark-failed, a reversal, factories, raw SQL):

1. ``withdrawal_payouts_awaits_payout``: AFTER INSERT OR UPDATE OF status, transaction_id
   OR DELETE on ``withdrawal_payouts`` recomputes the flag of the request(s) of the old
   and new transaction_id. It writes the request row only when the flag changes (a
   claim, processing -> failed, failed -> processing, a delete), so the other status
   changes take no lock on the request.
2. ``withdrawal_requests_awaits_payout``: BEFORE INSERT OR UPDATE OF transaction_id,
   awaits_payout on ``withdrawal_requests`` sets NEW.awaits_payout from the payouts: a
   request inserted after its payout is right from the start, and a Django ``save()``
   that writes back a stale copy of the flag writes the true value instead.

Both recompute with the statement's own fresh snapshot (PL/pgSQL, VOLATILE, READ
COMMITTED), so a payout committed while a request update waited for its row lock is
seen. A flip writes the request row after the payout's: the code paths that move a
payout to ``failed`` lock the request first (``payouts.guard.lock_request``), as
``payout_new_attempt`` and the withdrawal refund do, so the lock order stays the
request, then the payout. A claim (the INSERT) takes the request's lock after its new
payout row, which no other transaction can see or wait for before it commits.

Built without blocking writes for long, as 0005: ``atomic = False``; the column is added
with a constant default (no table rewrite), the triggers are installed before the
backfill so that no write during the backfill is missed, the backfill touches only rows
whose flag is wrong (itself recomputed by trigger 2), and the index is built
concurrently.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

FORWARD = r"""
CREATE FUNCTION withdrawal_request_sync_awaits(tx varchar) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    awaits boolean;
BEGIN
    awaits := NOT EXISTS (SELECT 1 FROM withdrawal_payouts
                           WHERE transaction_id = tx AND status <> 'failed');
    UPDATE withdrawal_requests SET awaits_payout = awaits
     WHERE transaction_id = tx AND awaits_payout <> awaits;
END $$;

CREATE FUNCTION withdrawal_payouts_awaits_payout() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM withdrawal_request_sync_awaits(OLD.transaction_id);
    END IF;
    IF TG_OP = 'INSERT' THEN
        PERFORM withdrawal_request_sync_awaits(NEW.transaction_id);
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.transaction_id <> OLD.transaction_id THEN
            PERFORM withdrawal_request_sync_awaits(NEW.transaction_id);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER withdrawal_payouts_awaits_payout
    AFTER INSERT OR UPDATE OF status, transaction_id OR DELETE ON withdrawal_payouts
    FOR EACH ROW EXECUTE FUNCTION withdrawal_payouts_awaits_payout();

CREATE FUNCTION withdrawal_requests_awaits_payout() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.awaits_payout := NOT EXISTS (SELECT 1 FROM withdrawal_payouts
                                      WHERE transaction_id = NEW.transaction_id
                                        AND status <> 'failed');
    RETURN NEW;
END $$;

CREATE TRIGGER withdrawal_requests_awaits_payout
    BEFORE INSERT OR UPDATE OF transaction_id, awaits_payout ON withdrawal_requests
    FOR EACH ROW EXECUTE FUNCTION withdrawal_requests_awaits_payout();
"""

BACKWARD = r"""
DROP TRIGGER withdrawal_requests_awaits_payout ON withdrawal_requests;
DROP FUNCTION withdrawal_requests_awaits_payout();
DROP TRIGGER withdrawal_payouts_awaits_payout ON withdrawal_payouts;
DROP FUNCTION withdrawal_payouts_awaits_payout();
DROP FUNCTION withdrawal_request_sync_awaits(varchar);
"""

# Rows that existed before the triggers: only those with a live payout are wrong (the
# column's default is true); trigger 2 recomputes each row the UPDATE writes.
BACKFILL = r"""
UPDATE withdrawal_requests r SET awaits_payout = false
 WHERE r.awaits_payout AND EXISTS (SELECT 1 FROM withdrawal_payouts p
                                    WHERE p.transaction_id = r.transaction_id
                                      AND p.status <> 'failed');
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('payouts', '0005_payout_poll_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='withdrawalrequest',
            name='awaits_payout',
            field=models.BooleanField(db_default=True, default=True, editable=False),
        ),
        migrations.RunSQL(FORWARD, BACKWARD),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        AddIndexConcurrently(
            model_name='withdrawalrequest',
            index=models.Index(condition=models.Q(awaits_payout=True), fields=['memo'],
                               name='withdrawal_requests_owning_idx'),
        ),
    ]
