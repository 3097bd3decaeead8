"""Periodic sweeps that a worker behind schedule does not run once per stale copy.

Beat sends every sweep once per period whether or not a worker ran the last one. On a
loaded machine the workers fall behind, and the queue fills with copies of the same
sweeps (``make chaos --cpu-burners 2``: 289 messages queued, the fifteen one-second
sweeps among them; the remittance sagas queued behind waited minutes). Dropping the
copies by age (Celery ``expires``) was tried and starved: once the queue is older than
the expiry, every copy expires and the sweep never runs.

Two rules keep a worker behind schedule from drowning in them:

- Beat sends them at Redis priority SWEEP_PRIORITY (9; django-celery-beat's ``priority``
  column), and the Redis transport serves a queue's priority 0 list (every other task:
  a saga's run, a deposit's release, a webhook's follow-up) before it, so no event
  waits behind a backlog of sweeps.
- A task made with ``base=Sweep`` and run by a worker starts only if no copy of it is
  running or ended less than SWEEP_MIN_GAP_S ago (one Redis key per task, set with
  ``NX`` for at most SWEEP_MAX_RUN_S while it runs, then kept for the gap); a copy that
  finds the key is acknowledged unrun in a millisecond and logged. So a backlog drains at
  once, copies of one slow sweep never run side by side, and the first copy a worker
  reaches after the gap runs: never starved. A worker killed mid-sweep holds the others
  off for SWEEP_MAX_RUN_S at most.

Called directly or eagerly (tests, a shell, a management command) a sweep always runs.
Redis unreachable (the broker is, too): it runs; a sweep is idempotent, so running
twice costs time, never money.
"""

from __future__ import annotations

import logging

from celery import Task
from django.conf import settings

log = logging.getLogger(__name__)

KEY = "corridor:sweep-started:{name}"


def broker_redis(timeout_s: float = 1.0):
    """A Redis client on the broker's server, for markers and counters (never data):
    ``timeout_s`` for the connection and each command."""
    import redis

    return redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=timeout_s,
                                socket_connect_timeout=timeout_s)


def start_once(key: str, seconds: float) -> bool:
    """True when ``key`` was not set in the last ``seconds`` (it is set now, with that
    expiry), or ``seconds`` <= 0, or Redis did not answer."""
    if seconds <= 0:
        return True
    try:
        return bool(broker_redis().set(key, "1", nx=True, px=max(1, int(seconds * 1000))))
    except Exception:  # noqa: BLE001 - the marker is an economy, never a condition
        log.warning("marker %s not set (Redis unreachable): running anyway", key)
        return True


class Sweep(Task):
    """Base of the periodic sweeps (module docstring)."""

    def __call__(self, *args, **kwargs):
        request = self.request
        if request.called_directly or request.is_eager:
            return super().__call__(*args, **kwargs)
        key = KEY.format(name=self.name)
        if not start_once(key, max(settings.SWEEP_MAX_RUN_S, settings.SWEEP_MIN_GAP_S)):
            log.info("sweep %s: a copy is running or ended less than %gs ago; this one "
                     "not run", self.name, settings.SWEEP_MIN_GAP_S)
            return None
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _hold(key, settings.SWEEP_MIN_GAP_S)


def _hold(key: str, seconds: float) -> None:
    """Keep ``key`` for ``seconds`` from now (none: gone)."""
    try:
        if seconds > 0:
            broker_redis().set(key, "1", px=max(1, int(seconds * 1000)))
        else:
            broker_redis().delete(key)
    except Exception:  # noqa: BLE001 - it lapses by itself after SWEEP_MAX_RUN_S
        log.warning("marker %s not renewed (Redis unreachable)", key)
