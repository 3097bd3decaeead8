"""gunicorn configuration for Corridor's web process (``Procfile``, ``Procfile.dev``;
gunicorn also loads it by itself when started from this folder).

- **Bind**: ``0.0.0.0:$PORT`` (corridor/ports.py); ``Procfile.dev`` binds
  loopback with ``--bind 127.0.0.1:${PORT}`` (the command line wins over this file).
- **Metrics across workers**: ``/metrics`` must add up every worker's counters
  (prometheus_client multiprocess mode). The master sets ``PROMETHEUS_MULTIPROC_DIR``
  before any worker imports prometheus_client -- to a fresh private temporary directory
  when unset, removed again at exit -- and :func:`on_starting` empties it, as
  prometheus_client requires between runs; :func:`child_exit` calls
  ``multiprocess.mark_process_dead`` for each worker that exits (``max_requests``
  restarts included). A dead worker's counters stay counted.
- **Logs**: gunicorn's error log and access log go through the root handler and
  ``corridor.logging``'s JSON formatter (one JSON object per line on stderr), like
  every other line of the process; access lines carry ``method``, ``path`` (no query
  string), ``status``, ``duration_ms``.
"""

import os
import shutil
import tempfile
from pathlib import Path

from corridor import ports

bind = [f"0.0.0.0:{ports.port()}"]
# gunicorn's runtime control socket (one fixed path per user) is not used; several
# servers on one machine would fight over it.
control_socket_disable = True

_OWN_METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR" not in os.environ
if _OWN_METRICS_DIR:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="corridor-prometheus-")

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "INFO").lower()
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "corridor.logging.json_formatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json",
                             "stream": "ext://sys.stderr"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # No handlers of their own: both propagate to the JSON root handler.
    "loggers": {
        "gunicorn.error": {"handlers": [], "level": "INFO", "propagate": True},
        "gunicorn.access": {"handlers": [], "level": "INFO", "propagate": True},
    },
}


def on_starting(server):
    """Master, before the first worker: an empty multiprocess directory."""
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()


def child_exit(server, worker):
    """Master, after a worker exited: its live gauges no longer count."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _OWN_METRICS_DIR:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
