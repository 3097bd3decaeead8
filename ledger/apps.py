from django.apps import AppConfig


class Config(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"
