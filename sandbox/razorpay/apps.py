from django.apps import AppConfig


class Config(AppConfig):
    name = "sandbox.razorpay"
    label = "sandbox_razorpay"
    default_auto_field = "django.db.models.BigAutoField"
