"""Each pytest-xdist worker has its own Redis database for Celery (tests/conftest.py),
so a Celery worker one test starts never runs another worker's tasks against its own
test database. Stop 24 found every worker on database 1: the controller's import of
conftest set /1 and the workers inherited it (two tests failed together, each worker
consuming the other's release and confirmation tasks). Stop 24's CI then found gw1's
settings still on /1 while its subprocesses used /2: conftest ran after Django's settings
were read; the rewrite is now the early plugin tests/xdist_redis.py, and conftest's
pytest_sessionstart checks every worker, not only the one this file lands on."""

from __future__ import annotations

import os

from django.conf import settings

from tests.flows import subprocess_env
from tests.xdist_redis import broker_database_for


def test_this_workers_celery_database_is_its_own():
    wanted = broker_database_for(os.environ.get("PYTEST_XDIST_WORKER", ""))
    assert settings.CELERY_BROKER_URL.endswith(f"/{wanted}"), settings.CELERY_BROKER_URL
    assert subprocess_env()["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
