from django.apps import AppConfig


class Config(AppConfig):
    name = "sagas"
    default_auto_field = "django.db.models.BigAutoField"
