"""The request line's level (corridor/middleware.py): INFO, except a successful GET under
``REQUEST_LOG_DEBUG_GETS`` (the sandbox's Horizon, polled several times a second by its
AP observer, filled three lines in five of ``make run``'s output)."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.django_db


def _levels(caplog, path: str) -> list[int]:
    return [r.levelno for r in caplog.records
            if r.name == "corridor.request" and getattr(r, "path", "") == path]


def test_a_successful_get_under_a_debug_prefix_is_logged_at_debug(client, caplog, settings):
    settings.REQUEST_LOG_DEBUG_GETS = ("/admin/login/",)
    caplog.set_level(logging.DEBUG, logger="corridor.request")

    assert client.get("/admin/login/").status_code == 200
    assert client.post("/admin/login/", {}).status_code == 200  # not a GET: INFO

    assert _levels(caplog, "/admin/login/") == [logging.DEBUG, logging.INFO]


def test_without_the_setting_every_request_line_is_info(client, caplog, settings):
    settings.REQUEST_LOG_DEBUG_GETS = ()
    caplog.set_level(logging.DEBUG, logger="corridor.request")

    client.get("/admin/login/")

    assert _levels(caplog, "/admin/login/") == [logging.INFO]
