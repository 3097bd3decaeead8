from django.apps import AppConfig


class Config(AppConfig):
    name = "sandbox.anchor31"
    label = "sandbox_anchor31"
    default_auto_field = "django.db.models.BigAutoField"
