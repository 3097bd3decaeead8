"""Served under ``/razorpay/`` by ``manage.py sandbox`` (sandbox/urls.py)."""

from django.urls import path, re_path

from sandbox.razorpay import views

urlpatterns = [
    path("v1/orders", views.orders),
    path("v1/orders/<str:order_id>", views.order),
    path("v1/orders/<str:order_id>/payments", views.order_payments),
    path("v1/payments/<str:payment_id>", views.payment),
    re_path(r"^v1/(?P<rest>.*)$", views.v1_not_found),
    path("sandbox/checkout/<str:order_id>", views.checkout),
    path("sandbox/orders/<str:order_id>/pay", views.pay),
    path("sandbox/webhooks", views.webhook_deliveries),
    path("sandbox/webhooks/redeliver", views.webhook_redeliver),
]
