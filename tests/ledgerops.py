"""Ledger test helpers shared by tests/test_ledger.py and tests/test_hot_accounts.py: a
two-line post and concurrent callers on their own connections."""

from __future__ import annotations

import threading
from decimal import Decimal

from django.db import connections

from ledger import services as ledger
from ledger.services import Line

D = Decimal


def move(key: str, src: str, dst: str, amount: str, ccy: str = "USDC", **kwargs):
    a = D(amount)
    return ledger.post(idempotency_key=key, kind="test.move",
                       lines=[Line(src, ccy, -a), Line(dst, ccy, a)], **kwargs)


def in_threads(n: int, fn) -> list:
    """Run ``fn(i)`` in ``n`` threads released together, each on its own connection;
    return what each returned or raised."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def body(i):
        try:
            connections["default"].ensure_connection()  # connected before the release
            barrier.wait(10)
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results
