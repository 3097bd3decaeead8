"""Fault switches shared by the sandbox's stand-ins.

Names in use (each stand-in documents its own in its module docstring), e.g.
``horizon.submit_504_after_apply``, ``ap.rpc_32603_unindexed_hash``,
``ap.event_duplicate``, ``ap.event_reorder``, ``ap.event_lose``,
``razorpay.webhook_replay``, ``razorpay.webhook_lose``.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from sandbox.control.models import FaultSwitch

DB = "sandbox"


def set_fault(name: str, *, times: int | None = None, params: dict | None = None) -> None:
    FaultSwitch.objects.using(DB).update_or_create(
        name=name, defaults={"times": times, "params": params or {}, "fired": 0}
    )


def clear_faults() -> None:
    FaultSwitch.objects.using(DB).all().delete()


def take(name: str) -> dict | None:
    """Fire fault ``name`` once if it is on: return its params, else None. Atomic."""
    with transaction.atomic(using=DB):
        switch = (
            FaultSwitch.objects.using(DB).select_for_update().filter(name=name).first()
        )
        if switch is None:
            return None
        if switch.times is not None and switch.fired >= switch.times:
            return None
        FaultSwitch.objects.using(DB).filter(pk=switch.pk).update(fired=F("fired") + 1)
        return switch.params


def peek(name: str) -> dict | None:
    """Params of fault ``name`` if it is on (without firing it), else None."""
    switch = FaultSwitch.objects.using(DB).filter(name=name).first()
    if switch is None or (switch.times is not None and switch.fired >= switch.times):
        return None
    return switch.params


def listing() -> list[dict]:
    return [
        {"name": s.name, "params": s.params, "times": s.times, "fired": s.fired}
        for s in FaultSwitch.objects.using(DB).order_by("name")
    ]
