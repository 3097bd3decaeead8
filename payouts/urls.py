from django.urls import path

import corridor.converters  # noqa: F401  (registers the path converters)
from payouts import views

app_name = "payouts"

urlpatterns = [
    path("sep24/withdraw/<withdrawal_id:transaction_id>", views.withdraw, name="withdraw"),
    path("webhooks/razorpay/payouts", views.razorpayx_webhook, name="razorpayx_webhook"),
]
