"""Celery application. Tasks are acks_late with task_reject_on_worker_lost; recovery
never depends on redelivery (the beat sweeps find stuck rows)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "corridor.settings")

app = Celery("corridor")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
