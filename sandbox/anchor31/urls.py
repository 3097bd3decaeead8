"""SEP-31 receiving-anchor stand-in routes, included by ``sandbox/urls.py`` under
``/anchor31/``. No trailing slashes (SEP-31 paths are ``/info``, ``/transactions``,
``/transactions/:id`` under ``DIRECT_PAYMENT_SERVER``)."""

from django.urls import path, re_path

from sandbox.anchor31 import views

app_name = "sandbox_anchor31"

urlpatterns = [
    path("info", views.info, name="info"),
    path("transactions", views.transactions, name="transactions"),
    path("transactions/<str:transaction_id>", views.transaction, name="transaction"),
    path("sandbox/partner", views.partner, name="partner"),
    path("sandbox/partner/pay", views.partner_pay, name="partner_pay"),
    path("sandbox/transactions", views.inspection, name="inspection"),
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
