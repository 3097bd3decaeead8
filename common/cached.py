"""A Decimal read from the outside (a balance), cached per process (Django's cache)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from django.core.cache import cache


def cached_decimal(key: str, read: Callable[[], Decimal | None], ttl_s: float
                   ) -> Decimal | None:
    """``read()``'s value, kept ``ttl_s`` seconds under ``key``; None (unreadable) is
    never cached, so the next call asks again."""
    value = cache.get(key)
    if value is not None:
        return Decimal(value)
    fresh = read()
    if fresh is not None:
        cache.set(key, str(fresh), ttl_s)
    return fresh
