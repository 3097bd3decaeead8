from django.apps import AppConfig


class Config(AppConfig):
    name = "sandbox.horizon"
    label = "sandbox_horizon"
    default_auto_field = "django.db.models.BigAutoField"
