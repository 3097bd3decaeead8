"""``GET /health/``: one line per dependency, 200 when all are up, 503 otherwise."""

import httpx
from django.conf import settings
from django.db import connection
from django.http import JsonResponse


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
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": report},
                        status=200 if healthy else 503)
