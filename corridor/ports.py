"""The one place the local ports are chosen (issue 9, part 6).

``PORT`` (Corridor's web server, default :data:`DEFAULT_PORT`) and ``SANDBOX_PORT``
(``manage.py sandbox``, default :data:`DEFAULT_SANDBOX_PORT`) come from the environment
(or ``.env``); the embedded PostgreSQL and Redis ports are ``DEVSERVICES_PG_PORT`` /
``DEVSERVICES_REDIS_PORT`` (corridor/devservices.py). Everything else derives from them:
the settings' URL defaults (``CORRIDOR_URL`` = ``http://127.0.0.1:$PORT``, ``SANDBOX_URL``
= ``http://127.0.0.1:$SANDBOX_PORT``, then ``HORIZON_URL``, ``AP_PLATFORM_URL``, the
sandbox's callback URLs ... from those two), ``Procfile.dev`` (``${PORT}``,
``${SANDBOX_PORT}``) and ``scripts/run_dev.py``, which puts them in the environment it
hands honcho.

Imports nothing from Django: ``scripts/run_dev.py`` and ``gunicorn.conf.py`` use it
before any settings exist."""

from __future__ import annotations

import os
from collections.abc import Mapping

DEFAULT_PORT = 8000
DEFAULT_SANDBOX_PORT = 8100
LOCALHOST = "127.0.0.1"


def port(environ: Mapping[str, str] = os.environ) -> int:
    """Corridor's port: ``PORT``, else 8000. Raises ValueError for a non-integer."""
    return int(environ.get("PORT") or DEFAULT_PORT)


def sandbox_port(environ: Mapping[str, str] = os.environ) -> int:
    """The sandbox's port: ``SANDBOX_PORT``, else 8100. Raises ValueError likewise."""
    return int(environ.get("SANDBOX_PORT") or DEFAULT_SANDBOX_PORT)


def local_url(port_number: int) -> str:
    """``http://127.0.0.1:<port>`` (no trailing slash)."""
    return f"http://{LOCALHOST}:{port_number}"
