"""Structured JSON logs: one JSON object per line, for every logger in the process.

``settings.LOGGING`` names :func:`json_formatter` as the root handler's formatter, so
the existing ``logging.getLogger(__name__)`` calls, Django's, Celery's and gunicorn's
all come out as JSON through ``structlog.stdlib.ProcessorFormatter``; ``extra={...}``
fields become keys. gunicorn's master and workers get the same formatter from
``logconfig_dict`` in gunicorn.conf.py (access lines: :func:`_gunicorn_access`); the
Celery worker and beat from the signals at the end of this module. Each line carries:

- ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``, ``event`` (the message);
- the context bound with ``structlog.contextvars`` where the line was logged:
  ``request_id`` (corridor.middleware, from ``X-Request-Id`` or new), ``transaction_id``
  (the AP transaction id: SEP-24 views, the deposit and withdrawal services),
  ``saga_id`` (``sagas.engine.run``), ``task_id`` / ``task_name`` (every Celery task,
  plus ``transaction_id`` / ``saga_id`` when the task takes one: signals below);
- ``exception`` (the formatted traceback) when there is one.

Redaction (:func:`redact`, the last step before rendering) runs over every key and
every string, including the message:

- values of Corridor's secret settings (names with SECRET, PASSWORD, TOKEN or ending
  in ``_KEY``, RazorpayX's ``ACCOUNT_NUMBER``, database and broker passwords)
  wherever they appear -> ``[REDACTED]``;
- Stellar secret seeds (``S`` + 55 base32 characters) and JWTs (the SEP-24 interactive
  and more-info tokens ride in URLs) -> ``[REDACTED]``; ``token=`` / ``secret=`` /
  ``signature=`` query parameters -> ``[REDACTED]``;
- bank details: a key named like ``account_number``, ``vpa``, ``upi`` -> masked to the
  last 4 characters (``****6789``, ``****@okhdfc``); digits after "account number",
  "a/c", "acct" in free text, ``"account_number": "..."`` inside logged JSON, and
  UPI handles (``name@bank``, except Celery's ``celery@host`` node names) -> masked the
  same way.

A bare digit string in free text is not recognisable as an account number: code never
logs beneficiary details (tests/test_observability.py checks a full flow's lines).
"""

from __future__ import annotations

import logging
import logging.config
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import structlog

REDACTED = "[REDACTED]"

# Keys whose values are secrets whatever they look like.
_SECRET_KEYS = re.compile(r"(secret|password|passwd|token|authorization|signature|api_key"
                          r"|cookie|sessionid|csrf)", re.I)
# Keys whose values are bank details (masked to the last 4 characters).
_BANK_KEYS = re.compile(r"^(account_number|bank_account|beneficiary_account|vpa|upi|upi_id"
                        r"|ifsc_account)$", re.I)
_SETTING_NAMES = re.compile(r"(SECRET|PASSWORD|TOKEN|_KEY$|ACCOUNT_NUMBER)")

_PATTERNS: list[tuple[re.Pattern, Any]] = [
    # JWTs (SEP-24 interactive / more-info tokens, callback and SEP-10 tokens).
    (re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), REDACTED),
    # Stellar secret seeds.
    (re.compile(r"\bS[A-Z2-7]{55}\b"), REDACTED),
    # Credentials in query strings and key=value text.
    (re.compile(r"(?i)\b((?:[a-z_]*token|secret|password|signature|api_key|key_secret)=)"
                r"[^&\s\"']+"), rf"\1{REDACTED}"),
    # Account numbers in logged JSON / repr / key=value text.
    (re.compile(r"(?i)([\"']?(?:account_number|bank_account)[\"']?\s*[:=]\s*[\"']?)"
                r"([0-9A-Za-z]{1,31})([0-9A-Za-z]{4})\b"), r"\1****\3"),
    # Account numbers in prose: "account number 50100123456789", "a/c 5010...".
    (re.compile(r"(?i)\b((?:account\s*(?:number|no\.?|#)?|a/c|acct)\s*[:#=]?\s*)"
                r"(\d[\d -]{1,30})(\d{4})\b"), r"\1****\3"),
    # UPI handles (VPA): name@bank, the bank part without a dot (e-mail domains have one);
    # Celery's own node names (celery@host) are left readable.
    (re.compile(r"(?<![\w.-])(?!celery@)[A-Za-z0-9._-]{2,256}@([A-Za-z][A-Za-z0-9]{1,63})\b"
                r"(?![\w-])(?!\.\w)"), r"****@\1"),
]


_secret_cache: tuple[str, ...] | None = None


def _secret_values() -> tuple[str, ...]:
    """The values of Corridor's secret settings (longest first), read once settings
    are configured; dropped when a test changes settings. Never cached before that:
    a gunicorn master logs before Django is set up, and its workers fork from it (a
    cached empty tuple would leave every worker unredacted)."""
    global _secret_cache
    if _secret_cache is not None:
        return _secret_cache
    from django.conf import settings

    if not settings.configured:
        return ()
    values: set[str] = set()
    for name in dir(settings):
        if not name.isupper() or not _SETTING_NAMES.search(name):
            continue
        value = getattr(settings, name, None)
        items = value if isinstance(value, list | tuple) else [value]
        values.update(v for v in items if isinstance(v, str))
    for db in getattr(settings, "DATABASES", {}).values():
        values.add(db.get("PASSWORD") or "")
    for url_name in ("CELERY_BROKER_URL", "DATABASE_URL"):
        url = getattr(settings, url_name, None)
        if isinstance(url, str):
            try:
                values.add(urlsplit(url).password or "")
            except ValueError:
                pass
    # Short values ("", "changeme") would mangle ordinary words; real secrets are long.
    _secret_cache = tuple(sorted((v for v in values if len(v) >= 8), key=len, reverse=True))
    return _secret_cache


def _reset_secret_values(**_kwargs) -> None:
    global _secret_cache
    _secret_cache = None


def _mask(value: Any) -> str:
    text = str(value)
    if "@" in text:
        return "****@" + text.rsplit("@", 1)[1]
    return "****" + text[-4:] if len(text) > 4 else "****"


def _could_match(text: str, lowered: str) -> tuple[bool, ...]:
    """For each of ``_PATTERNS``, in order: False when the text lacks something every
    match of that pattern contains (so the pattern is skipped: a log line has a dozen
    short strings, and six regex passes over each was a tenth of a webhook's time)."""
    return ("eyJ" in text,
            len(text) >= 56,
            "=" in text,
            "account" in lowered,
            "account" in lowered or "a/c" in lowered or "acct" in lowered,
            "@" in text)


def redact_text(text: str) -> str:
    """``text`` with secrets and bank details masked (rules in the module docstring)."""
    for secret in _secret_values():
        if secret in text:
            text = text.replace(secret, REDACTED)
    for (pattern, replacement), possible in zip(_PATTERNS, _could_match(text, text.lower()),
                                                strict=True):
        if possible:
            text = pattern.sub(replacement, text)
    return text


def _redact_value(key: str, value: Any, depth: int = 0) -> Any:
    if depth > 6:
        return value
    if key and _BANK_KEYS.match(key) and value not in (None, ""):
        return _mask(value)
    if key and _SECRET_KEYS.search(key) and value not in (None, "", False, True) and \
            not isinstance(value, int | float):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: _redact_value(str(k), v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_redact_value("", v, depth + 1) for v in value]
    return value


def redact(_logger, _method: str, event_dict: dict) -> dict:
    """structlog processor: mask secrets and bank details in every key and string;
    ``timestamp``, ``level``, ``logger``, ``event`` lead each line."""
    ordered = {key: event_dict[key] for key in _LEADING if key in event_dict}
    ordered.update(event_dict)
    return {key: (redact_text(value) if key in ("event", "exception") and
                  isinstance(value, str) else _redact_value(key, value))
            for key, value in ordered.items()}


_LEADING = ("timestamp", "level", "logger", "event")


def _drop_objects(_logger, _method: str, event_dict: dict) -> dict:
    """Django passes the request / socket object as ``extra``; keep its repr out (it
    would carry the query string) and keep only JSON-friendly values."""
    for key in ("request", "server_time"):
        if key in event_dict and not isinstance(event_dict[key], str | int | float):
            event_dict.pop(key)
    return event_dict


def _gunicorn_access(_logger, _method: str, event_dict: dict) -> dict:
    """gunicorn's access lines (``gunicorn.access``, its atoms as the record's args):
    ``event`` "access" with ``method``, ``path`` (no query string: SEP-24 tokens ride
    there), ``status``, ``duration_ms``, ``bytes`` and the response's ``request_id``."""
    # ProcessorFormatter(pass_foreign_args=True) hands every foreign record's args here.
    atoms = event_dict.pop("positional_args", None)
    record = event_dict.get("_record")
    if record is None or record.name != "gunicorn.access" or not isinstance(atoms, Mapping):
        return event_dict
    event_dict["event"] = "access"
    event_dict["method"] = atoms.get("m")
    event_dict["path"] = atoms.get("U")
    try:
        event_dict["status"] = int(atoms.get("s"))
        event_dict["duration_ms"] = round(int(atoms.get("D")) / 1000, 1)
    except (TypeError, ValueError):
        pass
    size = atoms.get("B")
    if isinstance(size, int):
        event_dict["bytes"] = size
    request_id = atoms.get("{x-request-id}o")
    if request_id and request_id != "-":
        event_dict["request_id"] = request_id
    return event_dict


SHARED_PROCESSORS = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def json_formatter() -> structlog.stdlib.ProcessorFormatter:
    """The root handler's formatter (``settings.LOGGING``): JSON lines, redacted."""
    return structlog.stdlib.ProcessorFormatter(
        pass_foreign_args=True,
        foreign_pre_chain=[*SHARED_PROCESSORS, structlog.stdlib.ExtraAdder(),
                           _gunicorn_access],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _drop_objects,
            structlog.processors.format_exc_info,
            redact,
            structlog.processors.JSONRenderer(ensure_ascii=False),
        ],
    )


structlog.configure(
    processors=[
        structlog.stdlib.filter_by_level,
        *SHARED_PROCESSORS,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.StackInfoRenderer(),
        structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
    ],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)


# --- Celery: JSON for the worker and beat too, and ids on every task's lines ---------

_task_tokens: dict[str, Mapping] = {}


def _task_ids(task, args, kwargs) -> dict[str, Any]:
    """``transaction_id`` / ``saga_id`` from the task's own arguments, when it takes
    them (``deposit_release(transaction_id)``, ``run_saga(saga_id)``)."""
    import inspect

    try:
        bound = inspect.signature(task.run).bind_partial(*(args or ()), **(kwargs or {}))
    except (TypeError, ValueError):
        return {}
    return {k: bound.arguments[k] for k in ("transaction_id", "saga_id")
            if k in bound.arguments}


def _on_task_prerun(task_id=None, task=None, args=None, kwargs=None, **_):
    if task is None:
        return
    if not getattr(task.request, "is_eager", False):
        # A worker thread runs one task after another: start each from nothing.
        structlog.contextvars.clear_contextvars()
    _task_tokens[task_id] = structlog.contextvars.bind_contextvars(
        task_id=task_id, task_name=task.name, **_task_ids(task, args, kwargs))


def _on_task_postrun(task_id=None, task=None, **_):
    tokens = _task_tokens.pop(task_id, None)
    if tokens is None:
        return
    try:
        structlog.contextvars.reset_contextvars(**tokens)
    except ValueError:  # tokens of another context (should not happen): start clean
        structlog.contextvars.clear_contextvars()


def _on_setup_logging(**_):
    """Connected receivers stop Celery from installing its own (plain) handlers; the
    worker and beat keep Django's LOGGING, i.e. these JSON lines. Also run on
    ``celeryd_init``, which Celery sends just before its privilege check: that check's
    SecurityWarning (and any other warning) becomes a JSON line of ``py.warnings``
    instead of raw text on stderr."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    logging.captureWarnings(True)


def _connect_signals() -> None:
    from celery import signals

    signals.setup_logging.connect(_on_setup_logging, weak=False,
                                  dispatch_uid="corridor.logging.setup")
    signals.celeryd_init.connect(_on_setup_logging, weak=False,
                                 dispatch_uid="corridor.logging.celeryd_init")
    signals.task_prerun.connect(_on_task_prerun, weak=False,
                                dispatch_uid="corridor.logging.prerun")
    signals.task_postrun.connect(_on_task_postrun, weak=False,
                                 dispatch_uid="corridor.logging.postrun")
    from django.core.signals import setting_changed

    setting_changed.connect(_reset_secret_values, weak=False,
                            dispatch_uid="corridor.logging.secrets")


_connect_signals()
