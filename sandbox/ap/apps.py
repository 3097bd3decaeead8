from django.apps import AppConfig


class Config(AppConfig):
    name = "sandbox.ap"
    label = "sandbox_ap"
    default_auto_field = "django.db.models.BigAutoField"
