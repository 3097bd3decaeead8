"""Every periodic query, in one registry (issue 11 §2: periodic work flat in table size).

Each entry names a query that a beat task (corridor/schedules.py) or a periodic reader
(``/health/ready`` and ``/metrics`` through ``corridor.stranded``) really runs, the
table it must never scan in full, and the index that serves it. ``build`` is the very
function the task code calls (``anchor.reconciler.stuck_releases``, ...), so what
``tests/test_periodic_queries.py`` asserts about the plan and what ``bench/periodic.py``
measures at 1K and 1M finished rows is production's query, not a copy.

Two kinds:

- ``sweep``: a scan for open rows (stuck, due, unsettled). Served by a partial index
  whose condition excludes every terminal row, so its cost follows the open rows and
  is flat in the table's size (the bench's ``periodic_1m_vs_1k_max``).
- ``lookup``: one row by a unique key, per item a sweep handles (the AP sweep's and the
  poller's per-transaction reads). A B-tree descent: logarithmic in the table, one or
  two more pages at 1M than at 1K; the bench prints these apart.

``stranded.receipt_unconsumed`` leaves out the receipts a withdrawal still owns (one
with no payout, or only a failed one) by memo. Through the full-table memo index a probe
per open receipt cost the index's depth (3 pages at 1M) where at 1K the planner hashed
the whole small table: x3.1 in buffers. The condition is now a column,
``withdrawal_requests.awaits_payout``, kept in step with the payouts by PostgreSQL
triggers (payouts/migrations/0006: no code path can forget it), served by the partial
index ``withdrawal_requests_owning_idx`` over the rows where it is true, whose size
follows the open withdrawals. As a correlated NOT EXISTS the planner still flipped,
from one ANALYZE to the next, between a hash anti join (5 buffers) and one probe of
that index per open receipt (64 at 60 receipts: x12.8 in one bench run, flat in time);
two NOT IN over the owning memos (a hashed SubPlan each, read once) make one plan.
Such an index on another table than the entry's is named in ``probes``: the plan must
use every one of them.

Imports point one way (sagas -> payouts -> anchor -> ledger): this module, in
``corridor``, wires them, and imports them only when asked (``registry()``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection

SWEEP = "sweep"
LOOKUP = "lookup"
# Any AP transaction id: the lookups' plans do not depend on the value.
SAMPLE_ID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class PeriodicQuery:
    """``build()`` returns the QuerySet the task evaluates (sliced as the task slices it)
    or ``(sql, params)``; ``wrap`` says how the task evaluates it: ``rows`` (iterates),
    ``exists`` (``.exists()``), ``first`` (``.first()``), ``count`` (``.count()``).
    ``indexes``: the index that serves it (for a unique key, its constraint's index and
    Django's ``_like`` twin, either of which the planner may pick); ``also``: other
    indexes whose condition covers the query's too (the test drops them with
    ``indexes`` to switch the protection off). ``probes``: indexes on the other tables
    the query's subqueries read, each of which the plan must use (without one, the
    probe goes through a bigger index or a scan). ``runs_in``: the task that runs it."""

    name: str
    kind: str
    table: str
    indexes: tuple[str, ...]
    build: Callable[[], Any]
    wrap: str = "rows"
    runs_in: str = ""
    also: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()


def sql_of(query: PeriodicQuery) -> tuple[str, list]:
    """(sql, params) of the statement the task sends for ``query`` (Django's compiler,
    %s placeholders, the connection's quoting)."""
    built = query.build()
    if isinstance(built, tuple):
        return built[0], list(built[1])
    if query.wrap == "exists":
        inner = built.query.exists(limit=True)
    elif query.wrap == "first":
        inner = (built if built.ordered else built.order_by("pk"))[:1].query
    else:
        inner = built.query
    sql, params = inner.get_compiler(using=built.db).as_sql()
    if query.wrap == "count":
        # QuerySet.count() runs SELECT COUNT(*) over the same FROM / WHERE; the planner
        # flattens this subquery into the same scan.
        sql = f"SELECT COUNT(*) FROM ({sql}) AS counted"  # noqa: S608 - compiled SQL
    return sql, list(params)


def explain(query: PeriodicQuery, *, options: str = "FORMAT JSON", cursor=None) -> dict:
    """The top of ``EXPLAIN (options)`` for ``query`` as a dict (``Plan``, and with
    ANALYZE ``Execution Time``). ANALYZE runs the statement: callers roll back."""
    sql, params = sql_of(query)
    if cursor is None:
        with connection.cursor() as own:
            return explain(query, options=options, cursor=own)
    cursor.execute(f"EXPLAIN ({options}) {sql}", params)
    document = cursor.fetchone()[0]
    if isinstance(document, str):
        import json

        document = json.loads(document)
    return document[0]


def indexes_serving(query: PeriodicQuery) -> tuple[str, ...]:
    """Every index that could serve ``query``: without them, a scan of its table."""
    return (*query.indexes, *query.also, *query.probes)


def drop_index(cursor, name: str) -> None:
    """Drop index ``name``, or the unique constraint that owns it (tests only: inside a
    transaction that rolls back)."""
    cursor.execute("SELECT conrelid::regclass::text FROM pg_constraint WHERE conname = %s",
                   [name])
    owner = cursor.fetchone()
    if owner:
        cursor.execute(f'ALTER TABLE {owner[0]} DROP CONSTRAINT "{name}"')
    else:
        cursor.execute(f'DROP INDEX "{name}"')


def plan_nodes(plan: dict):
    """Every node of a plan (``explain(...)["Plan"]``), depth first, subplans included."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


# Beat tasks whose reads follow a day's volume by design, not the tables' size: listed
# here with why, outside the flatness registry (and its bench).
VOLUME_BOUND = {
    "treasury.tasks.reconcile_today": "reads the day's settlements, statement and the "
                                      "payments and payouts of the look-back days "
                                      "(treasury/reconcile.py): a daily job",
}


def registry() -> dict[str, PeriodicQuery]:
    """name -> PeriodicQuery, for every periodic query Corridor runs."""
    from anchor import customers, inbox, reconciler, submissions
    from anchor import refunds as deposit_refunds
    from corridor import stranded
    from ledger import services as ledger
    from payouts import poller, receipts, receive, refunds
    from sagas import engine, latemoney

    def strand(kind: str) -> Callable[[], Any]:
        return lambda: stranded.stranded_queries()[kind]

    q = PeriodicQuery
    release_key = ("deposit_releases_transaction_id_key",
                   "deposit_releases_transaction_id_247d9bff_like")
    request_key = ("withdrawal_requests_transaction_id_key",
                   "withdrawal_requests_transaction_id_b3d0aab5_like")
    payout_key = ("withdrawal_payouts_transaction_id_key",
                  "withdrawal_payouts_transaction_id_32d82d14_like")
    entries = [
        q("customers.erase_due", SWEEP, "customers", ("customers_erase_due_idx",),
          customers.erase_candidates, runs_in="anchor.tasks.erase_customers"),
        q("reconciler", SWEEP, "deposit_releases", ("deposit_releases_open_idx",),
          reconciler.stuck_releases, runs_in="anchor.tasks.reconcile_releases"),
        q("ap_sweep.release", LOOKUP, "deposit_releases", release_key,
          lambda: reconciler.release_of(SAMPLE_ID), "exists",
          runs_in="anchor.tasks.sweep_ap_deposits"),
        q("ap_sweep.payment", LOOKUP, "deposit_payments", ("deposit_payments_transaction_live",),
          lambda: reconciler.live_payment_of(SAMPLE_ID), "exists",
          runs_in="anchor.tasks.sweep_ap_deposits"),
        q("orders.open", SWEEP, "deposit_orders", ("deposit_orders_open_idx",),
          reconciler.stale_orders, runs_in="anchor.tasks.reconcile_orders"),
        q("orders.unconfirmed", SWEEP, "deposit_payments", ("deposit_payments_unconf_idx",),
          reconciler.unconfirmed_payments, runs_in="anchor.tasks.reconcile_orders"),
        q("notify_sweep", SWEEP, "deposit_payments", ("deposit_payments_unnot_idx",),
          reconciler.due_unnotified, runs_in="anchor.tasks.sweep_unnotified"),
        q("expiry", SWEEP, "deposit_orders", ("deposit_orders_open_idx",),
          reconciler.expirable_orders, runs_in="anchor.tasks.expire_abandoned_deposits"),
        q("submissions", SWEEP, "interactive_submissions", ("interactive_subm_open_idx",),
          submissions.stuck_submissions, runs_in="anchor.tasks.sweep_submissions"),
        q("poller", SWEEP, "withdrawal_payouts", ("withdrawal_payouts_poll_idx",),
          lambda: poller.open_payouts(seen=[SAMPLE_ID]),
          runs_in="payouts.tasks.poll_withdrawals"),
        q("poller.request", LOOKUP, "withdrawal_requests", request_key,
          lambda: poller.request_of(SAMPLE_ID), "first",
          runs_in="payouts.tasks.poll_withdrawals"),
        q("poller.payout", LOOKUP, "withdrawal_payouts", payout_key,
          lambda: poller.payout_of(SAMPLE_ID), "first",
          runs_in="payouts.tasks.poll_withdrawals"),
        q("poller.lost_receives", LOOKUP, "withdrawal_requests", request_key,
          lambda: receive.requests_of([SAMPLE_ID]),
          runs_in="payouts.tasks.poll_withdrawals"),
        q("receipts.treasury", SWEEP, "stellar_receipts", ("stellar_receipts_open_idx",),
          receipts.unsettled_treasury, runs_in="payouts.tasks.poll_withdrawals"),
        q("receipts.classify", SWEEP, "stellar_receipts", ("stellar_receipts_open_idx",),
          receipts.classifiable_receipts, runs_in="payouts.tasks.poll_withdrawals"),
        q("receipts.rematch", SWEEP, "stellar_receipts", ("stellar_receipts_open_idx",),
          receipts.raised_unknown, runs_in="payouts.tasks.poll_withdrawals"),
        q("refund_sweep", SWEEP, "withdrawal_refunds", ("withdrawal_refunds_open_idx",),
          refunds.stuck_refunds, runs_in="payouts.tasks.sweep_refunds"),
        # Raised receipts a lost commit may have left refunded on chain with no row.
        q("refund_sweep.receipts", SWEEP, "stellar_receipts", ("stellar_receipts_open_idx",),
          refunds.unrefunded_receipts, runs_in="payouts.tasks.sweep_refunds"),
        q("deposit_refund_sweep", SWEEP, "deposit_refunds", ("deposit_refunds_open_idx",),
          deposit_refunds.stuck_refunds, runs_in="anchor.tasks.sweep_deposit_refunds"),
        q("saga_resume", SWEEP, "sagas", ("sagas_due_idx",), engine.due_sql,
          runs_in="sagas.tasks.resume_sagas"),
        q("late_money", SWEEP, "sagas", ("sagas_review_idx",), latemoney.awaiting_sql,
          runs_in="sagas.tasks.sweep_late_money"),
        q("late_money.expired", SWEEP, "sagas", ("sagas_compensated_idx",),
          latemoney.expired_sql, runs_in="sagas.tasks.sweep_late_money",
          also=("sagas_settled_idx",)),
        q("late_money.settled", SWEEP, "sagas", ("sagas_settled_idx",),
          latemoney.settled_sql, runs_in="sagas.tasks.sweep_late_money"),
        # Per page of the hub's payments (sagas/latemoney.py unmatched_check): who owns
        # each memo, a saga by its reference or a hub payment it refunds.
        q("late_money.unmatched.saga", LOOKUP, "sagas",
          ("sagas_reference_key", "sagas_reference_473fab47_like"),
          lambda: latemoney.owning_sagas([SAMPLE_ID]),
          runs_in="sagas.tasks.sweep_late_money"),
        q("late_money.unmatched.hub_payment", LOOKUP, "saga_hub_payments",
          ("saga_hub_payments_memo_idx",),
          lambda: latemoney.refunded_hub_payments([SAMPLE_ID]),
          runs_in="sagas.tasks.sweep_late_money"),
        q("late_money.unmatched.fund_intent", LOOKUP, "saga_steps",
          ("saga_steps_fund_memo_idx",),
          lambda: latemoney.funded_anchor_intents([SAMPLE_ID]),
          runs_in="sagas.tasks.sweep_late_money"),
        q("inbound_drain", SWEEP, "inbound_events", ("inbound_events_waiting_idx",),
          inbox.waiting_events, runs_in="anchor.tasks.inbound_drain"),
        # A queue: folded deltas are deleted, so it never holds finished rows.
        q("ledger.rollup", SWEEP, "ledger_balance_deltas", ("ledger_balance_deltas_pkey",),
          ledger.rollup_claim_sql, runs_in="ledger.tasks.rollup_balances"),
    ]
    # kind -> (table, its index, other indexes whose condition covers the query's,
    # indexes the query probes on other tables).
    stranded_indexes = {
        # A payment being refunded is its refund's: an anti-join on deposit_refunds'
        # unique transaction_id, probed per open payment (either of its two indexes).
        "captured_not_notified": ("deposit_payments", "deposit_payments_unnot_idx", (), ()),
        "confirmed_not_released": ("deposit_payments", "deposit_payments_unrel_idx", (), ()),
        "release_open": ("deposit_releases", "deposit_releases_open_idx", (), ()),
        # status = 'processing' implies the poller index's condition too.
        "payout_processing": ("withdrawal_payouts", "withdrawal_payouts_open_idx",
                              ("withdrawal_payouts_poll_idx",), ()),
        "refund_open": ("withdrawal_refunds", "withdrawal_refunds_open_idx", (), ()),
        "deposit_refund_open": ("deposit_refunds", "deposit_refunds_open_idx", (), ()),
        "saga_unleased": ("sagas", "sagas_due_idx", (), ()),
        # The owning withdrawal, probed per open receipt (module docstring).
        "receipt_unconsumed": ("stellar_receipts", "stellar_receipts_open_idx", (),
                               ("withdrawal_requests_owning_idx",)),
        "receive_info_unread": ("customers", "customers_info_wanted_idx", (), ()),
    }
    for kind in stranded.KINDS:
        table, index, also, probes = stranded_indexes[kind]
        entries.append(q(f"stranded.{kind}", SWEEP, table, (index,), strand(kind), "count",
                         runs_in="corridor.stranded.stranded_counts (/health/ready, /metrics)",
                         also=also, probes=probes))
    return {entry.name: entry for entry in entries}
