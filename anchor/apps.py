from django.apps import AppConfig


class Config(AppConfig):
    name = "anchor"
    default_auto_field = "django.db.models.BigAutoField"
