"""Each pytest-xdist worker has its own Redis database for Celery (tests/conftest.py),
so a Celery worker one test starts never runs another worker's tasks against its own
test database. Stop 24 found every worker on database 1: the controller's import of
conftest set /1 and the workers inherited it (two tests failed together, each worker
consuming the other's release and confirmation tasks)."""

from __future__ import annotations

import os

from django.conf import settings

from tests.flows import subprocess_env


def test_this_workers_celery_database_is_its_own():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") else 0
    assert settings.CELERY_BROKER_URL.endswith(f"/{1 + index}"), settings.CELERY_BROKER_URL
    assert subprocess_env()["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
