from django.apps import AppConfig


class Config(AppConfig):
    name = "payouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from payouts import withdrawals  # noqa: F401 - registers its submission resumer
