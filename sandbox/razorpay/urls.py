"""Served under ``/razorpay/`` by ``manage.py sandbox`` (sandbox/urls.py)."""

from django.urls import path, re_path

from sandbox.razorpay import views

urlpatterns = [
    path("v1/orders", views.orders),
    path("v1/orders/<str:order_id>", views.order),
    path("v1/orders/<str:order_id>/payments", views.order_payments),
    path("v1/payments/<str:payment_id>", views.payment),
    path("v1/payments/<str:payment_id>/refund", views.payment_refund),
    path("v1/payments/<str:payment_id>/refunds", views.payment_refunds),
    path("v1/payments/<str:payment_id>/refunds/<str:refund_id>", views.payment_refund_one),
    path("v1/refunds/<str:refund_id>", views.refund),
    path("v1/contacts", views.contacts),
    path("v1/contacts/<str:contact_id>", views.contact),
    path("v1/fund_accounts", views.fund_accounts),
    path("v1/fund_accounts/validations", views.fund_account_validations),
    path("v1/fund_accounts/validations/<str:validation_id>", views.fund_account_validation),
    path("v1/fund_accounts/<str:fund_account_id>", views.fund_account),
    path("v1/payouts", views.payouts_view),
    path("v1/payouts/<str:payout_id>", views.payout),
    path("v1/settlements", views.settlements_view),
    path("v1/settlements/recon/combined", views.settlement_recon),
    path("v1/settlements/<str:settlement_id>", views.settlement),
    path("v1/banking_balances", views.banking_balances),
    path("v1/transactions", views.transactions),
    path("v1/transactions/<str:transaction_id>", views.transaction_view),
    re_path(r"^v1/(?P<rest>.*)$", views.v1_not_found),
    path("sandbox/checkout/<str:order_id>", views.checkout),
    path("sandbox/orders/<str:order_id>/pay", views.pay),
    path("sandbox/webhooks", views.webhook_deliveries),
    path("sandbox/webhooks/redeliver", views.webhook_redeliver),
    path("sandbox/fund_accounts/validations/accounts", views.sandbox_validation_account),
    path("sandbox/refunds", views.sandbox_refunds),
    path("sandbox/banking_balances/topup", views.sandbox_topup),
    path("sandbox/payouts", views.sandbox_payouts),
    path("sandbox/payouts/reset", views.sandbox_payouts_reset),
    path("sandbox/payouts/<str:payout_id>/settle", views.sandbox_payout_settle),
]
