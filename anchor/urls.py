from django.urls import path

import corridor.converters  # noqa: F401  (registers the path converters)
from anchor import views

app_name = "anchor"

urlpatterns = [
    path("sep24/interactive", views.interactive, name="interactive"),
    path("sep24/deposit/<deposit_id:transaction_id>", views.deposit, name="deposit"),
    path("sep24/checkout/<razorpay_order_id:order_id>", views.checkout, name="checkout"),
    path("sep24/more_info", views.more_info, name="more_info"),
    path("sep24/transaction/<ap_transaction_id:transaction_id>", views.transaction_status,
         name="transaction"),
    path("callbacks/event", views.ap_event, name="ap_event"),
    path("callbacks/customer", views.ap_customer, name="ap_customer"),
    path("callbacks/customer/<str:customer_id>", views.ap_customer_delete,
         name="ap_customer_delete"),
    path("callbacks/rate", views.ap_rate, name="ap_rate"),
    path("webhooks/razorpay/payments", views.razorpay_payments_webhook,
         name="razorpay_payments_webhook"),
]
