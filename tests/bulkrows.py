"""Bulk-load finished ("terminal") rows into every table a periodic query reads, fast:
one ``INSERT ... SELECT ... FROM generate_series`` per table, every NOT NULL column and
check constraint satisfied, unique keys made from ``tag`` and the row number (so a
database can be loaded more than once). Used by tests/test_periodic_queries.py (20K
rows) and bench/periodic.py (1K and 1M rows); never by production code.

Terminal means what a healthy system leaves behind and no sweep should ever read:
releases ``completed``, payments confirmed + notified + released, orders ``paid``,
submissions ``done``, requests ``funds_verified``, payouts ``completed`` with AP told,
refunds ``completed``, receipts settled, sagas ``completed``, inbound events dispatched,
customers live.
``open_rows`` adds that many rows in each open state a sweep does read (the same count at
every table size).
"""

from __future__ import annotations

TABLES = ("deposit_releases", "deposit_payments", "deposit_orders", "interactive_submissions",
          "withdrawal_requests", "withdrawal_payouts", "withdrawal_refunds", "stellar_receipts",
          "sagas", "inbound_events", "customers", "deposit_refunds", "saga_hub_payments")

# %(n)s rows numbered i = 1..n; %(tag)s keeps keys unique across loads; %(ts)s the age
# of the rows (terminal rows: long finished; open rows: stuck past every sweep's cutoff).
_ROWS = "FROM generate_series(1, %(n)s) AS i"
_TS = "(now() - %(age)s::interval - i * interval '1 second')"

_TERMINAL = [
    f"""INSERT INTO deposit_releases (transaction_id, status, attempts, destination, asset_code,
        asset_issuer, amount, memo, memo_type, source_account, sequence, envelope_xdr, tx_hash,
        max_time, last_error, failure_code, created_at, updated_at)
    SELECT 'dr-' || %(tag)s || '-' || i, 'completed', 1, 'GDESTINATION', 'USDC', 'GISSUER',
        10.5, '', 'none', 'GSOURCE', i, 'AAAA', md5('dr' || %(tag)s || i), {_TS}, '', '',
        {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO deposit_payments (payment_id, order_id, transaction_id, amount_paise, currency,
        method, captured_at, confirmation, confirmed_at, confirmation_error, ap_notified_at,
        notify_attempts, notify_error, release_claimed_at, created_at)
    SELECT 'pay_' || %(tag)s || i, 'order_' || %(tag)s || i, 'dr-' || %(tag)s || '-' || i,
        100000, 'INR', 'upi', {_TS}, 'confirmed', {_TS}, '', {_TS}, 0, '', {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO deposit_orders (transaction_id, order_id, status, amount_in, amount_in_paise,
        fee, amount_out, rate, currency, funds_requested_at, created_at, updated_at)
    SELECT 'dr-' || %(tag)s || '-' || i, 'order_' || %(tag)s || i, 'paid', 1000.00, 100000,
        10.00, 11.0000000, 90.0000, 'INR', {_TS}, {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO interactive_submissions (transaction_id, kind, status, step, fence,
        lease_until, attempts, amount_in, last_error, created_at, updated_at)
    SELECT 'dr-' || %(tag)s || '-' || i, 'deposit', 'done', 'done', 1, {_TS}, 1, 1000, '',
        {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO withdrawal_requests (transaction_id, status, amount_in, fee, amount_out,
        amount_out_paise, rate, beneficiary_type, beneficiary_display, contact_id,
        fund_account_id, destination, memo, memo_type, source_account, funds_requested_at,
        first_receipt_at, received_amount, review_reason, chain_evidence, awaits_payout,
        kind, quote_id, customer_id, created_at, updated_at)
    SELECT 'wr-' || %(tag)s || '-' || i, 'funds_verified', 10, 0.1, 891.00, 89100, 90.0000,
        'bank_account', 'XXXXXX1234', 'cont_x', 'fa_x', %(account)s, %(tag)s || i, 'id',
        'GCUSTOMER', {_TS}, {_TS}, 10, '', '[]'::jsonb, false, 'withdrawal', '', '',
        {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO withdrawal_payouts (transaction_id, status, amount_paise, currency,
        fund_account_id, mode, provider, provider_payout_id, reference, attempts, last_error,
        ap_completed_at, clock_started_at, created_at, updated_at)
    SELECT 'wr-' || %(tag)s || '-' || i, 'completed', 89100, 'INR', 'fa_x', 'IMPS',
        'razorpayx', 'pout_' || %(tag)s || i, 'UTR' || i, 1, '', {_TS}, {_TS}, {_TS}, {_TS}
    {_ROWS}""",
    f"""INSERT INTO withdrawal_refunds (transaction_id, status, destination, amount, memo,
        memo_type, source_account, sequence, envelope_xdr, tx_hash, max_time, attempts,
        last_error, request_id, created_at, updated_at)
    SELECT r.transaction_id, 'completed', 'GCUSTOMER', 10, '', 'none', 'GSOURCE', i, 'AAAA',
        md5('wf' || %(tag)s || i), {_TS}, 1, '', r.id, {_TS}, {_TS}
    {_ROWS} JOIN withdrawal_requests r ON r.transaction_id = 'wr-' || %(tag)s || '-' || i""",
    f"""INSERT INTO deposit_refunds (transaction_id, status, payment_id, amount_paise,
        currency, receipt, idempotency_key, refund_id, provider_status, arn, attempts,
        trigger, reason, operator, ap_status_at_claim, ap_refunded_at, last_error,
        processed_at, created_at, updated_at)
    SELECT 'df-' || %(tag)s || '-' || i, 'completed', 'payf_' || %(tag)s || i, 100000,
        'INR', 'df-' || %(tag)s || '-' || i, 'dr-' || md5('df' || %(tag)s || i),
        'rfnd_' || %(tag)s || i, 'processed', '', 1, 'operator', 'bulk', 'bulk',
        'pending_anchor', {_TS}, '', {_TS}, {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO stellar_receipts (paging_token, tx_hash, from_account, to_account, asset,
        amount, memo_type, memo, transaction_id, created_at, consumed_amount, review_reason,
        settled_at)
    SELECT %(tag)s || '-' || i, md5('sr' || %(tag)s || i), 'GCUSTOMER', %(account)s,
        %(usdc)s, 10, 'id', %(tag)s || i, 'wr-' || %(tag)s || '-' || i, {_TS}, 10, '', {_TS}
    {_ROWS}""",
    f"""INSERT INTO sagas (kind, reference, status, input, lease_owner, fence, recoveries,
        stellar_cursor, error, created_at, updated_at)
    SELECT 'remittance', 'sg-' || %(tag)s || '-' || i, 'completed', '{{}}'::jsonb, '', 1, 0,
        '', '', {_TS}, {_TS} {_ROWS}""",
    # One hub payment per finished saga (its anchor's funding, an id memo).
    f"""INSERT INTO saga_hub_payments (key, saga_id, destination, amount, memo_type, memo,
        sequence, max_time, envelope_xdr, tx_hash, rebuilds, last_result, created_at,
        updated_at)
    SELECT s.id || ':2', s.id, 'GANCHOR', 10, 'id', %(tag)s || i, i, 0, '',
        md5('hp' || %(tag)s || i), 0, '', {_TS}, {_TS}
    {_ROWS} JOIN sagas s ON s.reference = 'sg-' || %(tag)s || '-' || i""",
    f"""INSERT INTO inbound_events (source, event_id, event_type, received_at, outcome,
        reason, follow_ups, processed_at)
    SELECT 'ap', 'ev-' || %(tag)s || '-' || i, 'transaction_status_changed', {_TS},
        'recorded', '', '[["anchor.tasks.noop", []]]'::jsonb, {_TS} {_ROWS}""",
    f"""INSERT INTO customers (id, account, memo, memo_type, type, data, provided,
        field_updated, review, message, requested_fields, identities, created_at, updated_at)
    SELECT 'cus_' || %(tag)s || i, 'GSENDINGANCHOR', %(tag)s || i, 'text', 'sep31-receiver',
        '\\x00'::bytea, '[]'::jsonb, '{{}}'::jsonb, 'auto', '', '[]'::jsonb, '[]'::jsonb,
        {_TS}, {_TS} {_ROWS}""",
]

# The open rows each sweep reads: stuck, due or unsettled, older than any cutoff.
_OPEN = [
    f"""INSERT INTO deposit_releases (transaction_id, status, attempts, destination, asset_code,
        asset_issuer, amount, memo, memo_type, source_account, sequence, envelope_xdr, tx_hash,
        max_time, last_error, failure_code, created_at, updated_at)
    SELECT 'dro-' || %(tag)s || '-' || i, 'submitting', 1, 'GDESTINATION', 'USDC', 'GISSUER',
        10.5, '', 'none', 'GSOURCE', i, 'AAAA', md5('dro' || %(tag)s || i), {_TS}, '', '',
        {_TS}, {_TS} {_ROWS}""",
    # unconfirmed / confirmed, AP not told / told, no release claimed: one third each.
    f"""INSERT INTO deposit_payments (payment_id, order_id, transaction_id, amount_paise, currency,
        method, captured_at, confirmation, confirmed_at, confirmation_error, ap_notified_at,
        notify_attempts, notify_error, created_at)
    SELECT 'payo_' || %(tag)s || i, 'ordero_' || %(tag)s || i, 'dpo-' || %(tag)s || '-' || i,
        100000, 'INR', 'upi', {_TS},
        CASE WHEN i %% 3 = 0 THEN 'unconfirmed' ELSE 'confirmed' END,
        CASE WHEN i %% 3 = 0 THEN NULL ELSE {_TS} END, '',
        CASE WHEN i %% 3 = 2 THEN {_TS} END, 0, '', {_TS} {_ROWS}""",
    f"""INSERT INTO deposit_orders (transaction_id, order_id, status, amount_in, amount_in_paise,
        fee, amount_out, rate, currency, created_at, updated_at)
    SELECT 'dpo-' || %(tag)s || '-' || i, 'ordero_' || %(tag)s || i, 'awaiting_payment',
        1000.00, 100000, 10.00, 11.0000000, 90.0000, 'INR', {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO interactive_submissions (transaction_id, kind, status, step, fence,
        lease_until, attempts, amount_in, last_error, created_at, updated_at)
    SELECT 'dpo-' || %(tag)s || '-' || i, 'deposit', 'in_flight', 'claimed', 1, {_TS}, 1,
        1000, '', {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO withdrawal_requests (transaction_id, status, amount_in, fee, amount_out,
        amount_out_paise, rate, beneficiary_type, beneficiary_display, contact_id,
        fund_account_id, destination, memo, memo_type, source_account, funds_requested_at,
        review_reason, chain_evidence, awaits_payout, kind, quote_id, customer_id, created_at,
        updated_at)
    SELECT 'wro-' || %(tag)s || '-' || i, 'awaiting_funds', 10, 0.1, 891.00, 89100, 90.0000,
        'bank_account', 'XXXXXX1234', 'cont_x', 'fa_x', %(account)s, 'o' || %(tag)s || i,
        'id', 'GCUSTOMER', {_TS}, '', '[]'::jsonb, false, 'withdrawal', '', '', {_TS}, {_TS}
    {_ROWS}""",
    # processing / completed with AP not told: half each.
    f"""INSERT INTO withdrawal_payouts (transaction_id, status, amount_paise, currency,
        fund_account_id, mode, provider, provider_payout_id, reference, attempts, last_error,
        clock_started_at, created_at, updated_at)
    SELECT 'wro-' || %(tag)s || '-' || i,
        CASE WHEN i %% 2 = 0 THEN 'processing' ELSE 'completed' END, 89100, 'INR', 'fa_x',
        'IMPS', 'razorpayx', 'pouto_' || %(tag)s || i, '', 1, '', {_TS}, {_TS}, {_TS}
    {_ROWS}""",
    f"""INSERT INTO withdrawal_refunds (transaction_id, status, destination, amount, memo,
        memo_type, source_account, sequence, envelope_xdr, tx_hash, max_time, attempts,
        last_error, request_id, created_at, updated_at)
    SELECT r.transaction_id, 'submitting', 'GCUSTOMER', 10, '', 'none', 'GSOURCE', i, 'AAAA',
        md5('wfo' || %(tag)s || i), {_TS}, 1, '', r.id, {_TS}, {_TS}
    {_ROWS} JOIN withdrawal_requests r ON r.transaction_id = 'wro-' || %(tag)s || '-' || i""",
    f"""INSERT INTO deposit_refunds (transaction_id, status, payment_id, amount_paise,
        currency, receipt, idempotency_key, provider_status, arn, attempts, trigger,
        reason, operator, ap_status_at_claim, last_error, created_at, updated_at)
    SELECT 'dfo-' || %(tag)s || '-' || i, 'requested', 'payfo_' || %(tag)s || i, 100000,
        'INR', 'dfo-' || %(tag)s || '-' || i, 'dr-' || md5('dfo' || %(tag)s || i), '', '',
        1, 'operator', 'bulk', 'bulk', 'pending_anchor', '', {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO stellar_receipts (paging_token, tx_hash, from_account, to_account, asset,
        amount, memo_type, memo, transaction_id, created_at, consumed_amount, review_reason)
    SELECT 'o' || %(tag)s || '-' || i, md5('sro' || %(tag)s || i), 'GCUSTOMER', %(account)s,
        %(usdc)s, 10, 'id', 'x' || %(tag)s || i, '', {_TS}, 0, '' {_ROWS}""",
    f"""INSERT INTO sagas (kind, reference, status, input, lease_owner, fence, recoveries,
        wake_at, stellar_cursor, error, created_at, updated_at)
    SELECT 'remittance', 'sgo-' || %(tag)s || '-' || i, 'running', '{{}}'::jsonb, '', 1, 0,
        {_TS}, '', '', {_TS}, {_TS} {_ROWS}""",
    f"""INSERT INTO inbound_events (source, event_id, event_type, received_at, outcome,
        reason, follow_ups)
    SELECT 'ap', 'evo-' || %(tag)s || '-' || i, 'transaction_status_changed', {_TS},
        'recorded', '', '[["anchor.tasks.noop", []]]'::jsonb {_ROWS}""",
    # deleted after moving money, retention over, data not yet erased.
    f"""INSERT INTO customers (id, account, memo, memo_type, type, data, provided,
        field_updated, review, message, requested_fields, identities, used_at, deleted_at,
        erase_after, created_at, updated_at)
    SELECT 'cuso_' || %(tag)s || i, 'GSENDINGANCHOR', 'o' || %(tag)s || i, 'text',
        'sep31-receiver', '\\x00'::bytea, '[]'::jsonb, '{{}}'::jsonb, 'auto', '',
        '[]'::jsonb, '[]'::jsonb, {_TS}, {_TS}, {_TS}, {_TS}, {_TS} {_ROWS}""",
]


# ``withdrawal_requests.awaits_payout`` (payouts/migrations/0006) is kept by row
# triggers. The loader writes it itself and loads with them disabled: each request it
# loads gets exactly one payout in the same load, ``completed`` (terminal) or
# ``processing`` / ``completed`` (open), so its value is false, written in the same
# INSERT as the rest of the row; with the triggers on, every payout would update its
# request once more (a second version of a million rows) and, with the indexes
# dropped for the rebuild, look it up by a scan. _AWAITS_WRONG, run after the load,
# proves the loaded rows agree with the triggers' rule.
_TRIGGERS = (("withdrawal_requests", "withdrawal_requests_awaits_payout"),
             ("withdrawal_payouts", "withdrawal_payouts_awaits_payout"))
_AWAITS_WRONG = """SELECT count(*) FROM withdrawal_requests r
WHERE r.awaits_payout = EXISTS (SELECT 1 FROM withdrawal_payouts p
                                 WHERE p.transaction_id = r.transaction_id
                                   AND p.status <> 'failed')"""

_SECONDARY = """
SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), c.conname,
       pg_get_constraintdef(c.oid)
FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.contype = 'u'
WHERE i.indrelid = %(table)s::regclass AND NOT i.indisprimary"""
_FOREIGN = """SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = %(table)s::regclass AND contype = 'f'"""


def load(cursor, *, terminal: int, open_rows: int = 6, tag: str = "b",
         account: str = "GDISTRIBUTION", usdc: str = "USDC:GISSUER",
         rebuild_indexes: bool = False) -> None:
    """Insert ``terminal`` finished rows and ``open_rows`` open rows into each of
    ``TABLES`` through ``cursor`` (a DB-API cursor with %(name)s parameters: Django's or
    psycopg's), then ANALYZE them. ``account``/``usdc``: the withdrawal account and USDC
    asset the receipt queries filter on (payouts.receipts.withdraw_account/usdc_asset).

    ``rebuild_indexes`` (for a million rows): drop every secondary index, unique and
    foreign-key constraint of the tables first and build them again, with the same names and
    definitions, after the rows are in (a sorted build instead of a million random
    inserts; the schema afterwards is the migrated one)."""
    rebuild: list[str] = []
    foreign: list[str] = []
    if rebuild_indexes:
        cursor.execute("SET LOCAL maintenance_work_mem = '256MB'")
        for table in TABLES:
            # Deferred foreign-key checks would also block the ALTER TABLEs at the end.
            cursor.execute(_FOREIGN, {"table": table})
            for constraint, constraintdef in cursor.fetchall():
                cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
                foreign.append(f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" '
                               f"{constraintdef}")
            cursor.execute(_SECONDARY, {"table": table})
            for index, indexdef, constraint, constraintdef in cursor.fetchall():
                if constraint:
                    cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
                    rebuild.append(f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" '
                                   f"{constraintdef}")
                else:
                    cursor.execute(f"DROP INDEX {index}")
                    rebuild.append(indexdef)
    for table, trigger in _TRIGGERS:
        cursor.execute(f'ALTER TABLE {table} DISABLE TRIGGER "{trigger}"')
    try:
        for sql in _TERMINAL:
            cursor.execute(sql, {"n": terminal, "tag": tag, "age": "30 days",
                                 "account": account, "usdc": usdc})
        for sql in _OPEN:
            cursor.execute(sql, {"n": open_rows, "tag": tag, "age": "10 days",
                                 "account": account, "usdc": usdc})
    finally:
        for table, trigger in _TRIGGERS:
            cursor.execute(f'ALTER TABLE {table} ENABLE TRIGGER "{trigger}"')
    for sql in rebuild + foreign:
        cursor.execute(sql)
    cursor.execute(_AWAITS_WRONG)
    wrong = cursor.fetchone()[0]
    assert wrong == 0, f"{wrong} withdrawal_requests with awaits_payout out of step"
    for table in TABLES:
        cursor.execute(f"ANALYZE {table}")  # noqa: S608 - fixed names
