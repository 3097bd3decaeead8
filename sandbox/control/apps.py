from django.apps import AppConfig


class Config(AppConfig):
    name = "sandbox.control"
    label = "sandbox_control"
    default_auto_field = "django.db.models.BigAutoField"
