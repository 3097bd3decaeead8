"""``GET /health/``: one line per dependency, 200 when all are up, 503 otherwise, and
``oldest_stuck``: the age in seconds of the oldest stuck release, payout and saga (None
when there is none; corridor.metrics.stuck_ages says what counts as stuck). Stuck rows
do not make the instance unhealthy -- another instance would not unstick them -- so
they never change the status code; alert on them (or on the matching Prometheus
gauges) instead."""

import logging

import httpx
from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from corridor import metrics

log = logging.getLogger(__name__)


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return "ok"


def _check_broker() -> str:
    from corridor.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
    return "ok"


def _check_http(url: str) -> str:
    response = httpx.get(url, timeout=min(settings.HTTP_TIMEOUT_S, 3.0))
    response.raise_for_status()
    return "ok"


def health(request):
    checks = {
        "database": _check_database,
        "broker": _check_broker,
        "horizon": lambda: _check_http(settings.HORIZON_URL + "/"),
        "anchor_platform": lambda: _check_http(settings.AP_PLATFORM_URL + "/health"),
    }
    report, healthy = {}, True
    for name, check in checks.items():
        try:
            report[name] = check()
        except Exception as exc:  # any failure of a dependency is reported, not raised
            report[name] = f"down: {type(exc).__name__}: {exc}"[:300]
            healthy = False
    try:
        oldest_stuck = metrics.stuck_ages() if report["database"] == "ok" else None
    except Exception as exc:  # the dependency checks above say what is down
        log.warning("health: stuck ages not readable: %s", type(exc).__name__)
        oldest_stuck = None
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": report,
                         "oldest_stuck": oldest_stuck},
                        status=200 if healthy else 503)
