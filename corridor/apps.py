from django.apps import AppConfig


class Config(AppConfig):
    """The wiring app: management commands that span the other apps."""

    name = "corridor"
