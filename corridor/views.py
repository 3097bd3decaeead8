"""Operations endpoints: liveness and readiness (issue 9, part 7).

- ``GET /health/`` (``health``): liveness. Answers ``200 {"status": "ok"}`` from the
  process alone -- no database query, no Redis, no HTTP call -- so a slow or broken
  dependency never gets a healthy process restarted.
- ``GET /health/ready`` (``health-ready``): readiness (corridor/readiness.py): the
  database, the broker, Horizon, the Anchor Platform and Razorpay, concurrently, each
  bounded by ``READINESS_TIMEOUT_S`` (the last three cached for ``READINESS_CACHE_S``:
  no call to them per request). ``200`` when every check is ``ok``, ``503`` otherwise;
  the body is ``{"status": "ok" | "fail", "checks": {name: "ok" | "fail"}}`` and never
  carries a dependency's error text, host or URL. Only a caller the metrics accept
  (``Authorization: Bearer <METRICS_TOKEN>``, the rule of ``/metrics``) also gets
  ``oldest_stuck`` and ``stranded``, internal figures a stranger never sees (and
  never makes us count: issue 25 §4). ``oldest_stuck`` is the age in seconds of the
  oldest stuck release, payout and saga (None when there is none, or when the database
  is down; corridor.metrics.stuck_ages says what counts as stuck). Stuck rows never
  change the status code -- another instance would not unstick them --: alert on
  them, or on the matching gauges.
  ``stranded`` is ``corridor.stranded.stranded_counts()`` (kind -> rows owed to a
  customer with no owner past their threshold; None when the database is down), with
  the same rule: it never changes the status code; the gauge is ``corridor_stranded``.
  ``/health/`` does not carry it: counting needs the database, and liveness does no I/O.
"""

import logging

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from corridor import metrics, readiness, stranded

log = logging.getLogger(__name__)


def health(request):
    return JsonResponse({"status": "ok"})


def health_ready(request):
    checks = readiness.readiness()
    ready = all(result == readiness.OK for result in checks.values())
    body = {"status": readiness.OK if ready else readiness.FAIL, "checks": checks}
    if metrics.scrape_allowed(request):
        oldest_stuck = counts = None
        if checks["database"] == readiness.OK:
            try:
                oldest_stuck = metrics.stuck_ages()
                counts = stranded.stranded_counts()
            except Exception as exc:  # the database check above says whether it is down
                log.warning("health: stuck ages not readable: %s", type(exc).__name__)
        body.update(oldest_stuck=oldest_stuck, stranded=counts)
    return JsonResponse(body, status=200 if ready else 503)


# Prefixes whose callers are programs: their 404 is JSON.
_API_PREFIXES = ("/api/", "/callbacks/", "/webhooks/")


@csrf_exempt
def bench_noop(request):
    """``/bench/noop``: the ingest bench's baseline (bench/ingest.py), a view that does
    nothing through the same middleware and gunicorn. Routed only when
    ``CORRIDOR_BENCH_NOOP`` is set (never in production, corridor/urls.py)."""
    return JsonResponse({"outcome": "noop"})


def not_found(request, exception=None):
    """``handler404`` (only used with DEBUG off): under ``/sep24/`` the SEP-24 error
    page (a wallet's webview shows it), under the API prefixes JSON ``{"error": ...}``,
    elsewhere Django's own page. Path parameters refused by corridor/converters.py land
    here."""
    from django.views.defaults import page_not_found

    from anchor.views import sep24_error

    path = request.path_info
    if path.startswith("/sep24/"):
        return sep24_error(request, "not_found", "There is no such page or transaction.", 404)
    if path.startswith(_API_PREFIXES):
        return JsonResponse({"error": "not found"}, status=404)
    return page_not_found(request, exception)
