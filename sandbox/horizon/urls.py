"""Horizon stand-in routes, included by ``sandbox/urls.py`` under ``/horizon/``.

Paths carry no trailing slash, as Horizon's (stellar-sdk joins ``accounts/{id}`` etc. to
the base URL). Anything else answers Horizon's ``not_found`` problem."""

from django.urls import path, re_path

from sandbox.horizon import views

app_name = "sandbox_horizon"

urlpatterns = [
    path("", views.root, name="root"),
    path("friendbot", views.friendbot, name="friendbot"),
    path("fee_stats", views.fee_stats, name="fee_stats"),
    path("accounts/<str:account_id>", views.account, name="account"),
    path("accounts/<str:account_id>/transactions", views.account_transactions),
    path("accounts/<str:account_id>/payments", views.account_payments),
    path("accounts/<str:account_id>/operations", views.account_operations),
    path("transactions", views.transactions, name="transactions"),
    path("transactions_async", views.transactions_async),
    path("transactions/<str:tx_hash>", views.transaction, name="transaction"),
    path("transactions/<str:tx_hash>/payments", views.transaction_payments),
    path("transactions/<str:tx_hash>/operations", views.transaction_operations),
    path("payments", views.payments),
    path("operations", views.operations),
    path("operations/<str:op_id>", views.operation),
    path("ledgers", views.ledgers),
    path("ledgers/<int:sequence>", views.ledger),
    path("ledgers/<int:sequence>/transactions", views.ledger_transactions),
    path("ledgers/<int:sequence>/payments", views.ledger_payments),
    path("ledgers/<int:sequence>/operations", views.ledger_operations),
    path("sandbox/fund", views.sandbox_fund, name="sandbox_fund"),
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
