from django.apps import AppConfig


class Config(AppConfig):
    """Holds the ``sandbox`` management command; no models."""

    name = "sandbox"
    label = "sandbox"
