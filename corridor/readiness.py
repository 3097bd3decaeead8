"""Readiness of this instance's dependencies (``GET /health/ready``).

Five checks -- the database, the broker (a Redis ``PING``), Horizon (its root
resource), the Anchor Platform (the platform server's ``GET /health``) and Razorpay
(``GET /v1/orders?count=1`` with our key: reachable and the key accepted) -- run at the
same time, each with a timeout of ``READINESS_TIMEOUT_S`` seconds, and the whole check
waits at most that long plus a small margin: a dependency that has not answered by then
is ``fail``. A check answers only ``ok`` or ``fail``; what went wrong (the exception,
hosts, URLs, the dependency's own error text) goes to the log, never into the answer,
which a load balancer or a stranger may read.

Liveness (``GET /health/``) is separate and calls none of these."""

from __future__ import annotations

import concurrent.futures
import logging
import math
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
    ``fail`` (its thread ends by its own timeout)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(CHECKS),
                                                 thread_name_prefix="readiness")
    try:
        futures = {name: pool.submit(_run, name, check) for name, check in CHECKS.items()}
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
