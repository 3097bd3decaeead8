"""Plan registry: saga kind -> ``Plan`` (its legs in order).

Plan modules call ``register`` at import; ``PLAN_MODULES`` lists the ones that ship and
is imported on first lookup. Tests may register their own plans (and unregister them)."""

from __future__ import annotations

from importlib import import_module

from sagas.legs import Plan

PLAN_MODULES = ("sagas.plans.testing", "sagas.plans.remittance", "sagas.plans.hubreturn")
_PLANS: dict[str, Plan] = {}
_loaded = False


def register(plan: Plan) -> Plan:
    if not plan.legs:
        raise ValueError(f"plan {plan.kind} has no legs")
    _PLANS[plan.kind] = plan
    return plan


def unregister(kind: str) -> None:
    _PLANS.pop(kind, None)


def get(kind: str) -> Plan:
    """The plan of saga kind ``kind``; KeyError if none is registered."""
    global _loaded
    if not _loaded:
        for module in PLAN_MODULES:
            import_module(module)
        _loaded = True
    return _PLANS[kind]
