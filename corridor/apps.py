from django.apps import AppConfig


class Config(AppConfig):
    """The wiring app: management commands that span the other apps, the production
    checks (corridor/checks.py) and the admin's second factor (corridor/admin_site.py)."""

    name = "corridor"

    def ready(self) -> None:
        from corridor import admin_site, checks

        # gunicorn and Celery run no system checks: refuse here, with every problem.
        if checks.REFUSE_AT_STARTUP:
            checks.refuse_unsafe_start()
        admin_site.install()
