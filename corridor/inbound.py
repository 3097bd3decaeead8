"""One gate for everything that comes in: request bodies, their fields and path
parameters (issue 9). Every value is checked before it reaches a query, so hostile
input gets a 4xx with a message, never a 500 from the database driver.

What the gate refuses, and why:

- **Bodies that are not strict JSON** (:func:`loads`): not UTF-8; lone surrogates
  (``"\\ud800"``: Python's ``json`` accepts the escape, and the failure only shows when
  psycopg encodes the string); NUL characters (PostgreSQL ``text`` and ``jsonb`` cannot
  store U+0000); ``NaN``/``Infinity`` and numbers that overflow a float (not JSON, RFC
  8259 §6; ``jsonb`` refuses them); nesting deeper than :data:`MAX_DEPTH`; bodies over
  :data:`MAX_BODY_BYTES`.
- **Text that cannot land in its column** (:func:`field_text`): the same character
  rules, and a length within the ``max_length`` of the model field the value is stored
  in, read from the model (``Model._meta.get_field(name).max_length``) so the limit is
  written once, on the model.
- **Numbers out of their column's range**: integers (:func:`field_int`: paise, Unix
  seconds) within the field's database range (bigint: -2^63..2^63-1), never bool, and
  non-negative where asked; decimal strings (:func:`field_decimal`) within the field's
  ``max_digits``/``decimal_places``.
- **Path parameters** (:func:`path_text`, used by corridor/converters.py): the text
  rules and the column's length; a refused parameter is "no such page" (404).

Everything raises :class:`InboundError`, whose message names the field (``where``) and
says what is wrong; callers map it to their 4xx (or, for a correctly signed provider
event, to a stored ``rejected`` outcome: anchor/callbacks.py ``event_reject``)."""

from __future__ import annotations

import json
import math
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import connection, models
from django.http import JsonResponse

MAX_BODY_BYTES = 1_000_000
MAX_DEPTH = 32


class InboundError(ValueError):
    """A value Corridor cannot take; the message says which field and why."""


def _bad_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InboundError(f"the number {text[:20]} is out of range")
    return value


def _bad_constant(name: str):
    raise InboundError(f"{name} is not JSON")


def method_not_allowed(*allowed: str) -> JsonResponse:
    """405 for an endpoint called with another method: JSON like every other answer of
    the callback and webhook endpoints, with the ``Allow`` header (RFC 9110 §15.5.6)."""
    response = JsonResponse({"error": f"method not allowed; use {', '.join(allowed)}"},
                            status=405)
    response["Allow"] = ", ".join(allowed)
    return response


def read_body(request, *, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The raw body of a Django ``request``, at most ``max_bytes`` + 1 bytes of it: a
    longer one is cut there (never read further, never held whole), so ``too_large``
    tells it and :func:`loads` refuses it by size. Django's own
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` check (``RequestDataTooBig``: a bare 400, or under
    DEBUG a page of settings) is never reached. Read once; a repeat returns the same
    bytes."""
    cached = getattr(request, "_corridor_body", None)
    if cached is None:
        cached = request.read(max_bytes + 1)
        request._corridor_body = cached
    return cached


def too_large(raw: bytes, *, max_bytes: int = MAX_BODY_BYTES) -> bool:
    """Whether a body from :func:`read_body` was over ``max_bytes``."""
    return len(raw) > max_bytes


def loads(raw: bytes | str, *, max_bytes: int = MAX_BODY_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """Decode a JSON document strictly (module docstring). ``raw``: the body, bytes
    (must be UTF-8) or str. Returns the value (dict, list, str, int, float, bool, None;
    strings all storable). Raises InboundError."""
    if len(raw) > max_bytes:
        raise InboundError(f"the body is larger than {max_bytes} bytes")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InboundError("the body is not UTF-8") from None
    try:
        value = json.loads(raw, parse_float=_bad_float, parse_constant=_bad_constant)
    except RecursionError:
        raise InboundError("the body is nested too deeply") from None
    except InboundError:
        raise
    except ValueError:  # JSONDecodeError, and ints past Python's digit limit
        raise InboundError("the body is not JSON") from None
    _check_tree(value, max_depth)
    return value


def _check_tree(value: Any, max_depth: int) -> None:
    stack = [(value, 0, "body")]
    while stack:
        node, depth, where = stack.pop()
        if depth > max_depth:
            raise InboundError(f"the body is nested deeper than {max_depth} levels")
        if isinstance(node, str):
            check_chars(node, where)
        elif isinstance(node, dict):
            for key, item in node.items():
                check_chars(key, f"{where} key")
                stack.append((item, depth + 1, f"{where}.{key[:40]}"))
        elif isinstance(node, list):
            stack.extend((item, depth + 1, f"{where}[]") for item in node)


def json_object(raw: bytes | str) -> dict:
    """:func:`loads`, and the document must be a JSON object. Raises InboundError."""
    body = loads(raw)
    if not isinstance(body, dict):
        raise InboundError("the body must be a JSON object")
    return body


def check_chars(value: str, where: str) -> str:
    """``value`` unchanged when PostgreSQL can store it: valid Unicode (no lone
    surrogates) and no NUL. Raises InboundError."""
    if "\x00" in value:
        raise InboundError(f"{where} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InboundError(f"{where} is not valid Unicode (lone surrogate)") from None
    return value


def max_length(model: type[models.Model], name: str) -> int | None:
    """The ``max_length`` of ``model``'s field ``name`` (None for unbounded text)."""
    return model._meta.get_field(name).max_length


def field_text(model: type[models.Model], name: str, value: Any, where: str, *,
               required: bool = True) -> str:
    """``value`` as the text stored in ``model.name``: a string, storable
    (:func:`check_chars`), at most the field's ``max_length``; ``None``/missing is ""
    unless ``required`` (then, like "", refused). Raises InboundError."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InboundError(f"{where} must be a string")
    if required and not value:
        raise InboundError(f"{where} must not be empty")
    return text(value, where, max_length=max_length(model, name))


def text(value: str, where: str, *, max_length: int | None) -> str:
    """A storable string of at most ``max_length`` characters. Raises InboundError."""
    check_chars(value, where)
    if max_length is not None and len(value) > max_length:
        raise InboundError(f"{where} is longer than {max_length} characters")
    return value


def _int_range(field: models.Field) -> tuple[int, int]:
    low, high = connection.ops.integer_field_range(field.get_internal_type())
    return (-(2**63) if low is None else low, 2**63 - 1 if high is None else high)


def field_int(model: type[models.Model], name: str, value: Any, where: str, *,
              minimum: int | None = 0, maximum: int | None = None,
              required: bool = True) -> int | None:
    """``value`` as the integer stored in ``model.name`` (paise, Unix seconds): a JSON
    integer (not bool, not float, not string) within the column's range (bigint
    -2^63..2^63-1), at least ``minimum`` and at most ``maximum`` when given. None is
    returned for a missing value unless ``required``. Raises InboundError."""
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InboundError(f"{where} must be an integer")
    low, high = _int_range(model._meta.get_field(name))
    if minimum is not None:
        low = max(low, minimum)
    if maximum is not None:
        high = min(high, maximum)
    if not low <= value <= high:
        raise InboundError(f"{where} must be between {low} and {high}")
    return value


# 9999-12-31T23:59:59Z: the last second a Python datetime (and a timestamptz) holds.
MAX_UNIX_SECONDS = 253402300799


def unix_seconds(value: Any, where: str) -> int:
    """A timestamp as Unix seconds (Razorpay's ``created_at``): a JSON integer from 0
    to :data:`MAX_UNIX_SECONDS`, so ``datetime.fromtimestamp`` cannot overflow. Raises
    InboundError."""
    if not isinstance(value, int) or isinstance(value, bool) or \
            not 0 <= value <= MAX_UNIX_SECONDS:
        raise InboundError(f"{where} must be Unix seconds (0..{MAX_UNIX_SECONDS})")
    return value


def field_decimal(model: type[models.Model], name: str, value: Any, where: str, *,
                  minimum: Decimal | None = Decimal(0)) -> Decimal:
    """``value`` (a decimal string such as "25.50": money never travels as a JSON
    number) as the Decimal stored in ``model.name``: plain digits, at most the field's
    ``decimal_places`` and ``max_digits``, at least ``minimum``. Raises InboundError."""
    field = model._meta.get_field(name)
    if not isinstance(value, str) or not value or len(value) > 64:
        raise InboundError(f"{where} must be a decimal string")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InboundError(f"{where} must be a decimal string") from None
    if not amount.is_finite():
        raise InboundError(f"{where} must be a decimal string")
    _, digits, exponent = amount.as_tuple()
    places = max(0, -exponent)
    if places > field.decimal_places:
        raise InboundError(f"{where} has more than {field.decimal_places} decimal places")
    whole = len(digits) + exponent  # digits before the point
    if max(whole, 0) > field.max_digits - field.decimal_places:
        raise InboundError(f"{where} has more than {field.max_digits - field.decimal_places}"
                           " digits before the point")
    if minimum is not None and amount < minimum:
        raise InboundError(f"{where} must be at least {minimum}")
    return amount


def path_text(value: str, *, max_length: int | None) -> str:
    """A path parameter: storable text of at most ``max_length`` characters, not
    empty. Raises InboundError (the URL converters turn it into "no such page")."""
    if not value:
        raise InboundError("empty path parameter")
    return text(value, "path parameter", max_length=max_length)


def sanitize(value: Any, limit: int) -> str:
    """Text that can always be stored (for logs and ``rejected`` rows, never for
    business data): the string, or ``repr`` of anything else ("" for None), cut to
    ``limit`` characters, with NUL and lone surrogates replaced by U+FFFD."""
    if not isinstance(value, str):
        value = "" if value is None else repr(value)
    return "".join("\ufffd" if c == "\x00" or "\ud800" <= c <= "\udfff" else c
                   for c in value[:limit])
