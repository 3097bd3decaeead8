"""Treasury tasks (issue 13 §2)."""

from __future__ import annotations

from celery import shared_task

from common.sweeps import Sweep


@shared_task(base=Sweep)
def reconcile_today() -> dict:
    """The beat job: ``treasury.reconcile.reconcile`` for today (UTC). A rerun is
    harmless (breaks are kept by key). Returns the run's id, status and break count."""
    from treasury.reconcile import reconcile

    run = reconcile(trigger="beat")
    return {"run": run.pk, "status": run.status, "breaks": run.counts.get("breaks", 0)}
