"""Request context for the logs (corridor/logging.py).

Every request gets a ``request_id``: the caller's ``X-Request-Id`` when it is a sane
token (a proxy or AP may set one), else a new UUID. It is bound with
``structlog.contextvars`` for every line logged while the request is handled, echoed in
the response's ``X-Request-Id`` header, and the request ends with one ``request`` line
(method, path without the query string -- SEP-24 tokens ride there --, status,
duration_ms). Views bind more (``transaction_id``) with ``bind_contextvars``. The
context is cleared when a request starts and when it is finished (``request_finished``,
after Django's own ``django.request`` / ``django.server`` lines, which so carry the ids
too), so nothing leaks into the next request a thread serves."""

from __future__ import annotations

import logging
import re
import time
import uuid

import structlog
from django.conf import settings
from django.core.signals import request_finished

log = logging.getLogger("corridor.request")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# Scrapes and probes would drown the request lines.
QUIET_PATHS = ("/metrics", "/health/", "/static/")


def request_id_from(header: str | None) -> str:
    if header and _REQUEST_ID.match(header):
        return header
    return uuid.uuid4().hex


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request_id_from(request.headers.get("X-Request-Id"))
        request.request_id = request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.monotonic()
        response = self.get_response(request)
        response["X-Request-Id"] = request_id
        if not request.path.startswith(QUIET_PATHS):
            # Successful polls under REQUEST_LOG_DEBUG_GETS (the sandbox's Horizon, which
            # its AP observer reads several times a second) go at DEBUG.
            level = (logging.DEBUG if request.method == "GET" and response.status_code < 400
                     and request.path.startswith(getattr(settings, "REQUEST_LOG_DEBUG_GETS",
                                                         ())) else logging.INFO)
            log.log(level, "request", extra={
                "method": request.method, "path": request.path,
                "status": response.status_code,
                "duration_ms": round((time.monotonic() - started) * 1000, 1)})
        return response


def _clear_context(**_kwargs) -> None:
    structlog.contextvars.clear_contextvars()


request_finished.connect(_clear_context, dispatch_uid="corridor.middleware.clear_context")


def liveness_middleware(get_response):
    """Lets ``GET /health/`` through the host check: a liveness probe by pod IP or
    ``localhost`` sends a Host header that is not in ``ALLOWED_HOSTS`` (and would get a
    400). For this one path (no I/O, nothing but ``{"status": "ok"}``) a Host that is
    not allowed is replaced by the first allowed name before Django validates it; the
    https redirect already exempts it (SECURE_REDIRECT_EXEMPT). ``/health/ready`` and
    ``/metrics`` keep the host check: add the internal name the scraper uses to
    ``DJANGO_ALLOWED_HOSTS``."""
    from django.conf import settings
    from django.http.request import split_domain_port, validate_host

    def middleware(request):
        if request.path_info == "/health/" and request.method in ("GET", "HEAD"):
            host, _port = split_domain_port(request.META.get("HTTP_HOST", ""))
            allowed = [h.lstrip(".") for h in settings.ALLOWED_HOSTS if h.lstrip(".")]
            if allowed and "*" not in allowed and not validate_host(host, settings.ALLOWED_HOSTS):
                request.META["HTTP_HOST"] = allowed[0]
        return get_response(request)

    return middleware
