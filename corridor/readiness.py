"""Readiness of this instance's dependencies (``GET /health/ready``).

Five checks -- the database, the broker (a Redis ``PING``), Horizon (its root
resource), the Anchor Platform (the platform server's ``GET /health``) and Razorpay
(``GET /v1/orders?count=1`` with our key: reachable and the key accepted) -- run at the
same time, each with a timeout of ``READINESS_TIMEOUT_S`` seconds, and the whole check
waits at most that long plus a small margin: a dependency that has not answered by then
is ``fail``. A check answers only ``ok`` or ``fail``; what went wrong (the exception,
hosts, URLs, the dependency's own error text) goes to the log, never into the answer,
which a load balancer or a stranger may read.

The three third parties (:data:`EXTERNAL`) cost them a call and us a Razorpay rate
limit, and the endpoint is anonymous: their results are kept for
``READINESS_CACHE_S`` seconds per process (keyed by the URLs and key they were made
with), so a probe every second, or a stranger's thousand requests, make at most one
call to each per period and per process (issue 25 §4); one refresh at a time, the
others answer with the last results meanwhile. The database and the broker (ours, on
the internal network) are checked on every request.

Liveness (``GET /health/``) is separate and calls none of these."""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable

import httpx
import psycopg
import redis
from django.conf import settings
from django.db import connection

from common.http import tls_context

log = logging.getLogger(__name__)

OK, FAIL = "ok", "fail"
# Thread start-up and scheduling on top of the per-check timeout.
_MARGIN_S = 0.5


def _timeout() -> float:
    return float(settings.READINESS_TIMEOUT_S)


def check_database() -> None:
    """A new connection (never the request thread's) and ``SELECT 1``. libpq's
    ``connect_timeout`` is whole seconds, at least 2 (PostgreSQL docs, "Parameter Key
    Words"); ``statement_timeout`` bounds the query."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["connect_timeout"] = max(2, math.ceil(_timeout()))
    params["options"] = " ".join(filter(None, [
        params.get("options"), f"-c statement_timeout={int(_timeout() * 1000)}"]))
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()


def check_broker() -> None:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=_timeout(),
                                  socket_connect_timeout=_timeout())
    try:
        if not client.ping():
            raise redis.RedisError("PING not answered")
    finally:
        client.close()


def _http_get(url: str, **kwargs) -> None:
    response = httpx.get(url, timeout=_timeout(), follow_redirects=False,
                         verify=tls_context(), **kwargs)
    response.raise_for_status()


def check_horizon() -> None:
    _http_get(settings.HORIZON_URL.rstrip("/") + "/")


def check_anchor_platform() -> None:
    _http_get(settings.AP_PLATFORM_URL.rstrip("/") + "/health")


def check_razorpay() -> None:
    _http_get(settings.RAZORPAY_API_URL.rstrip("/") + "/v1/orders", params={"count": 1},
              auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET))


CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "broker": check_broker,
    "horizon": check_horizon,
    "anchor_platform": check_anchor_platform,
    "razorpay": check_razorpay,
}
# Checks of the outside world, whose results are cached (module docstring).
EXTERNAL = ("horizon", "anchor_platform", "razorpay")

_cache_lock = threading.Lock()
_cache: dict = {"key": None, "at": -math.inf, "report": {}, "refreshing": False}


def _cache_key() -> tuple:
    """What the external results depend on: a changed URL or key is a new check."""
    return (settings.HORIZON_URL, settings.AP_PLATFORM_URL, settings.RAZORPAY_API_URL,
            settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET, _timeout())


def _cached_external() -> dict[str, str] | None:
    """The external results to answer with, or None when this request must refresh
    them (then it is marked as the one refreshing)."""
    key, now = _cache_key(), time.monotonic()
    with _cache_lock:
        same = _cache["key"] == key
        if same and now - _cache["at"] < settings.READINESS_CACHE_S:
            return dict(_cache["report"])
        if same and _cache["refreshing"] and _cache["report"]:
            return dict(_cache["report"])  # another request is refreshing them
        _cache.update(key=key, refreshing=True)
        return None


def _store_external(report: dict[str, str]) -> None:
    with _cache_lock:
        _cache.update(at=time.monotonic(), report=dict(report), refreshing=False)


def _run(name: str, check: Callable[[], None]) -> str:
    try:
        check()
    except Exception as exc:  # a failing dependency is reported, never raised
        log.warning("readiness: %s failed: %s: %s", name, type(exc).__name__, exc,
                    extra={"check": name, "outcome": FAIL})
        return FAIL
    return OK


def readiness() -> dict[str, str]:
    """``{name: "ok" | "fail"}`` for each of :data:`CHECKS`, run concurrently; bounded
    by ``READINESS_TIMEOUT_S`` (+0.5 s) in total. A check still running then is
    ``fail`` (its thread ends by its own timeout). The :data:`EXTERNAL` ones come from
    the cache while it is fresh (``READINESS_CACHE_S``)."""
    cached = _cached_external()
    due = {name: check for name, check in CHECKS.items()
           if cached is None or name not in EXTERNAL}
    report = _run_all(due)
    if cached is None:
        _store_external({name: report[name] for name in EXTERNAL})
    else:
        report.update(cached)
    return {name: report[name] for name in CHECKS}


def _run_all(checks: dict[str, Callable[[], None]]) -> dict[str, str]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(checks),
                                                 thread_name_prefix="readiness")
    try:
        futures = {name: pool.submit(_run, name, check) for name, check in checks.items()}
        concurrent.futures.wait(futures.values(), timeout=_timeout() + _MARGIN_S)
        report = {}
        for name, future in futures.items():
            if future.done():
                report[name] = future.result()
            else:
                log.warning("readiness: %s timed out", name,
                            extra={"check": name, "outcome": FAIL})
                report[name] = FAIL
        return report
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
