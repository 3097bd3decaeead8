"""Routes of the AP stand-in, served under ``/ap/`` by ``sandbox.urls``."""

from django.urls import path

from sandbox.ap import views

urlpatterns = [
    # Platform server (AP platform_server, context path "/").
    path("platform/", views.rpc_view),
    path("platform", views.rpc_view),
    path("platform/health", views.health_view),
    path("platform/transactions", views.transactions_view),
    path("platform/transactions/<str:transaction_id>", views.transaction_view),
    # SEP server (wallet-facing).
    path("sep/auth", views.sep10_view),  # SEP-10
    path("sep/sandbox-token", views.auth_view),  # NOT SEP-10: the drivers' shortcut
    path("sep/transactions/deposit/interactive", views.deposit_interactive_view),
    path("sep/transactions/withdraw/interactive", views.withdraw_interactive_view),
    path("sep/transaction", views.sep_transaction_view),
    path("sep/info", views.sep24_info_view),
    path("sep/transactions", views.sep24_transactions_view),
    path("sep/sep38/info", views.sep38_info_view),
    path("sep/sep38/prices", views.sep38_prices_view),
    path("sep/sep38/price", views.sep38_price_view),
    path("sep/sep38/quote", views.sep38_quote_view),
    path("sep/sep38/quote/<str:quote_id>", views.sep38_quote_get_view),
    path("sep/sep12/customer", views.sep12_customer_view),
    path("sep/sep12/customer/<str:account>", views.sep12_customer_delete_view),
    path("sep/sep31/info", views.sep31_info_view),
    path("sep/sep31/transactions", views.sep31_transactions_view),
    path("sep/sep31/transactions/<str:transaction_id>", views.sep31_transaction_view),
    # Sandbox-only inspection.
    path("sandbox/events", views.events_view),
    path("sandbox/observer", views.observer_view),
    path("sandbox/reset", views.sandbox_reset_view),
    path("sandbox/transactions/<str:transaction_id>", views.sandbox_transaction_view),
    path("sandbox/sender31/send", views.sender31_send_view),
    path("sandbox/sender31/runs/<str:transaction_id>", views.sender31_run_view),
]
