"""The persistent connection's health check (corridor/db/base.py): a connection the
server ended is replaced before a request uses it, and a healthy one is kept without
a round trip. Protection off (``CONN_HEALTH_CHECKS`` false): the same request's query
fails on the dead connection."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import OperationalError, connection

pytestmark = pytest.mark.django_db(transaction=True)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _terminate(pid: int) -> None:
    """End backend ``pid`` from another connection, as a server restart or an idle
    timeout would, and wait until it is gone."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and other.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            time.sleep(0.05)
    time.sleep(0.1)  # the termination notice reaches the client's socket


def _new_request() -> None:
    """What Django does when a request starts (``close_old_connections``): the next
    query runs the health check once."""
    connection.health_check_done = False


@pytest.fixture
def checks(request):
    """Persistent connection with CONN_HEALTH_CHECKS on or off (``request.param``)."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["CONN_HEALTH_CHECKS"] = request.param
    connection.settings_dict["CONN_MAX_AGE"] = 60
    yield request.param
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(saved)


@pytest.mark.parametrize("checks", [True], indirect=True)
def test_a_healthy_connection_is_kept_and_not_pinged(checks, monkeypatch):
    pid = _backend_pid()
    sent = []
    real = connection.connection.execute
    monkeypatch.setattr(connection.connection, "execute",
                        lambda *a, **k: sent.append(a) or real(*a, **k))
    monkeypatch.setattr(connection.connection, "cursor",
                        lambda *a, **k: sent.append("cursor") or None)

    _new_request()
    connection.close_if_health_check_failed()

    assert sent == []  # no SELECT 1, no cursor: nothing went to the server
    monkeypatch.undo()
    assert _backend_pid() == pid


@pytest.mark.parametrize("checks", [True, False], indirect=True)
def test_a_connection_the_server_ended_is_replaced_before_the_request_uses_it(checks):
    pid = _backend_pid()
    _terminate(pid)

    _new_request()
    if not checks:  # protection off: the request's first query hits the dead socket
        with pytest.raises(OperationalError):
            _backend_pid()
        return
    assert _backend_pid() != pid  # reconnected, the request's query succeeded
