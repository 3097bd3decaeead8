"""Every periodic query is served by its index and never scans its big table (issue 11
§2). The queries are the registry's (corridor/periodic.py), built by the functions the
tasks call.

20K finished rows per table (tests/bulkrows.py, loaded once for the module and removed
after) plus a few open ones, then ANALYZE. ``enable_seqscan`` stays on: with real
statistics, a table of 20K rows and no index for the query's condition, PostgreSQL
picks a Seq Scan by itself (the protection-off tests below show it does), so passing
means the planner *chooses* the index on its own, as it will in production, where the
tables are larger still and the choice only gets clearer. Switching seq scans off
would make the test pass for an index that the planner would not pick.

Protection off: each entry's index is dropped inside the test's transaction (rolled
back after) and the same assertion must fail, with a Seq Scan on the table; and each
index an entry probes on another table (``probes``) is dropped alone: the same
assertion must fail too (the probe falls back to a bigger index or a scan).
"""

from __future__ import annotations

import pytest
from django.db import connection

from corridor import periodic
from tests import bulkrows

TERMINAL_ROWS = 20_000
REGISTRY = periodic.registry()


@pytest.fixture(scope="module")
def big_tables(django_db_setup, django_db_blocker):
    """20K finished rows in every table the periodic queries read, committed once for
    this module (each test's own transaction rolls back its DROP INDEX)."""
    from payouts import receipts

    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            bulkrows.load(cursor, terminal=TERMINAL_ROWS, tag="pq",
                          account=receipts.withdraw_account(), usdc=receipts.usdc_asset())
        yield
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE " + ", ".join(bulkrows.TABLES) + " CASCADE")


def assert_served(query: periodic.PeriodicQuery) -> None:
    """The plan of ``query`` uses one of its indexes and has no Seq Scan on any of the
    bulk-loaded tables (the subqueries' tables included)."""
    nodes = list(periodic.plan_nodes(periodic.explain(query)["Plan"]))
    scans = [n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"]
    big = sorted(set(scans) & {*bulkrows.TABLES, query.table})
    assert not big, f"{query.name}: Seq Scan on {big}"
    used = {n.get("Index Name") for n in nodes}
    assert used & set(query.indexes), f"{query.name}: none of {query.indexes} in {used}"
    missing = sorted(set(query.probes) - used)
    assert not missing, f"{query.name}: probes not through {missing} (plan used {used})"


def test_the_registry_covers_every_beat_task():
    """Every task on beat (corridor/schedules.py) has its queries in the registry."""
    from corridor.schedules import periodic_tasks

    covered = {q.runs_in for q in REGISTRY.values()}
    beat = {task for _, task, _ in periodic_tasks()}
    assert beat - covered == set(periodic.VOLUME_BOUND)
    assert {q.kind for q in REGISTRY.values()} == {periodic.SWEEP, periodic.LOOKUP}


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_periodic_query_uses_its_index(big_tables, name):
    assert_served(REGISTRY[name])


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_protection_off_the_same_check_fails(big_tables, name):
    query = REGISTRY[name]
    with connection.cursor() as cursor:
        for index in periodic.indexes_serving(query):
            periodic.drop_index(cursor, index)

    with pytest.raises(AssertionError, match=f"Seq Scan on .*{query.table}"):
        assert_served(query)


PROBES = sorted((name, probe) for name, q in REGISTRY.items() for probe in q.probes)


def test_the_owning_withdrawal_probe_is_checked():
    assert ("stranded.receipt_unconsumed", "withdrawal_requests_owning_idx") in PROBES


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "probe"), PROBES)
def test_protection_off_without_a_probed_index_the_check_fails(big_tables, name, probe):
    query = REGISTRY[name]
    with connection.cursor() as cursor:
        periodic.drop_index(cursor, probe)

    with pytest.raises(AssertionError, match=f"probes not through .*{probe}|Seq Scan on"):
        assert_served(query)
