import math

from django.conf import settings
from django.core.management import BaseCommand
from django.db import transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from corridor.schedules import periodic_tasks


class Command(BaseCommand):
    help = "Create or update the beat schedules from corridor/schedules.py (idempotent)."

    @transaction.atomic
    def handle(self, *args, **options):
        names = []
        for name, task, every in periodic_tasks():
            # django-celery-beat intervals are whole units: at least one second.
            every = max(1, round(every))
            schedule, _ = IntervalSchedule.objects.get_or_create(
                every=every, period=IntervalSchedule.SECONDS)
            PeriodicTask.objects.update_or_create(
                name=name, defaults={"task": task, "interval": schedule, "enabled": True,
                                     "expire_seconds": expire_seconds(every)})
            names.append(name)
        self.stdout.write(f"periodic tasks: {len(names)} ({', '.join(names)})")


def expire_seconds(every: int) -> int | None:
    """Seconds after which a sweep's message is dropped unrun (Celery ``expires``): a
    later one of the same sweep is on its way, so a backlog of stale sweeps never holds
    the work queued behind it (``make chaos`` on a loaded machine: sagas waited minutes
    behind hundreds of them). None when PERIODIC_EXPIRY_PERIODS is 0 (never)."""
    periods = settings.PERIODIC_EXPIRY_PERIODS
    return max(1, math.ceil(every * periods)) if periods > 0 else None
