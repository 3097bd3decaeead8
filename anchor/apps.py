from django.apps import AppConfig


class Config(AppConfig):
    name = "anchor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from anchor import sep24  # noqa: F401 - registers its system check
