from django.urls import path

from payouts import views

app_name = "payouts"

urlpatterns = [
    path("sep24/withdraw/<str:transaction_id>", views.withdraw, name="withdraw"),
    path("webhooks/razorpay/payouts", views.razorpayx_webhook, name="razorpayx_webhook"),
]
