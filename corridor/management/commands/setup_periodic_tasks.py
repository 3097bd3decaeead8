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
            schedule, _ = IntervalSchedule.objects.get_or_create(
                every=max(1, round(every)), period=IntervalSchedule.SECONDS)
            PeriodicTask.objects.update_or_create(
                name=name, defaults={"task": task, "interval": schedule, "enabled": True,
                                     # never dropped by age, served after every other
                                     # task (common/sweeps.py says why)
                                     "expires": None, "expire_seconds": None,
                                     "priority": settings.SWEEP_PRIORITY})
            names.append(name)
        self.stdout.write(f"periodic tasks: {len(names)} ({', '.join(names)})")
