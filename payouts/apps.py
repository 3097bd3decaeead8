from django.apps import AppConfig


class Config(AppConfig):
    name = "payouts"
    default_auto_field = "django.db.models.BigAutoField"
