import importlib

from django.urls import include, path

from sandbox import fx
from sandbox.ap.views import stellar_toml_view
from sandbox.control import views
from sandbox.registry import STANDINS

urlpatterns = [
    path("sandbox/faults", views.faults_view),
    path("sandbox/reset", views.reset_view),
    path("fx/rates", fx.rates_view),
    path(".well-known/stellar.toml", stellar_toml_view),  # SEP-1 (sandbox/ap/sep10.py)
]

# Each stand-in serves under its own prefix once it has a urls.py.
_PREFIXES = {"sandbox.horizon": "horizon/", "sandbox.ap": "ap/", "sandbox.razorpay": "razorpay/",
             "sandbox.anchor31": "anchor31/"}
for _package in STANDINS:
    try:
        importlib.import_module(f"{_package}.urls")
    except ModuleNotFoundError as exc:
        if exc.name != f"{_package}.urls":
            raise
        continue
    urlpatterns.append(path(_PREFIXES[_package], include(f"{_package}.urls")))
