"""Each pytest-xdist worker's own Redis database for Celery, set before Django's settings.

Loaded with ``-p tests.xdist_redis`` (pyproject's ``addopts``), so this module runs while
pytest parses its arguments: before pytest-django's ``pytest_load_initial_conftests``
evaluates ``corridor.settings``, which reads ``CELERY_BROKER_URL`` once. Set from
``tests/conftest.py`` instead (as it was until stop 25) the environment changed after the
settings had been read: worker gw1's subprocesses used database 2 while its own process
(the Celery publisher of every ``on_commit`` enqueue, and ``purge_broker``) still used 1,
gw0's database.

Tests use database 1 so a ``make run`` on the same machine keeps database 0; worker gwN
uses 1 + N. The number is replaced whatever it is: the xdist controller runs this first
(setting /1) and its workers inherit that environment.
"""

from __future__ import annotations

import os
import re


def broker_database_for(worker: str) -> int:
    """Redis database number for an xdist worker id ('gw0', 'gw1', …; '' when not xdist)."""
    return 1 + (int(worker[2:]) if worker.startswith("gw") else 0)


_broker = re.match(r"^(redis://.+)/(\d+)$", os.environ.get("CELERY_BROKER_URL", ""))
if _broker:
    os.environ["CELERY_BROKER_URL"] = (
        f"{_broker.group(1)}/{broker_database_for(os.environ.get('PYTEST_XDIST_WORKER', ''))}")
