import os
import socket
import time

from django.core.management import BaseCommand

from sagas import engine
from sagas.models import Saga


class Command(BaseCommand):
    help = ("Drive one saga in this process until it stops (completed, compensated, "
            "manual_review): a worker outside Celery, used by the crash tests. Waits for "
            "retries and pendings here instead of scheduling them through Celery.")

    def add_arguments(self, parser):
        parser.add_argument("saga_id", type=int)
        parser.add_argument("--worker", default="")
        parser.add_argument("--timeout", type=float, default=60.0)

    def handle(self, *args, saga_id, worker, timeout, **options):
        worker = worker or f"cmd:{socket.gethostname()}:{os.getpid()}"
        deadline = time.monotonic() + timeout
        result = engine.run(saga_id, worker, dispatch=False)
        while result.status in Saga.OPEN_STATUSES and time.monotonic() < deadline:
            time.sleep(0.05)
            result = engine.run(saga_id, worker, dispatch=False)
        self.stdout.write(f"saga {saga_id}: {result.status}")
