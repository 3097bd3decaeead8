"""The one list of periodic tasks (django-celery-beat rows, made by
``manage.py setup_periodic_tasks``). Periods are settings (DESIGN.md §7)."""

from django.conf import settings


def periodic_tasks() -> list[tuple[str, str, float]]:
    """(name, task, every seconds)."""
    return [
        ("deposit release reconciler", "anchor.tasks.reconcile_releases",
         settings.RECONCILER_PERIOD_S),
        ("AP pending_anchor deposit sweep", "anchor.tasks.sweep_ap_deposits",
         settings.AP_SWEEP_PERIOD_S),
        ("Razorpay order reconciler", "anchor.tasks.reconcile_orders",
         settings.ORDER_RECONCILER_PERIOD_S),
        ("AP notify sweeper (paid deposits AP was not told about)",
         "anchor.tasks.sweep_unnotified", settings.AP_NOTIFY_SWEEP_PERIOD_S),
        ("expire abandoned deposits", "anchor.tasks.expire_abandoned_deposits",
         settings.DEPOSIT_EXPIRY_PERIOD_S),
        ("resume interactive submissions", "anchor.tasks.sweep_submissions",
         settings.INTERACTIVE_SUBMIT_SWEEP_PERIOD_S),
        ("withdrawal poller", "payouts.tasks.poll_withdrawals", settings.WITHDRAW_POLL_PERIOD_S),
        ("withdrawal refund sweep", "payouts.tasks.sweep_refunds",
         settings.REFUND_SWEEP_PERIOD_S),
        ("deposit refund sweep (INR back through Razorpay)",
         "anchor.tasks.sweep_deposit_refunds", settings.DEPOSIT_REFUND_SWEEP_PERIOD_S),
        ("resume due sagas", "sagas.tasks.resume_sagas", settings.SAGA_RESUME_PERIOD_S),
        ("late money (sagas in review whose anchor's refund arrived later)",
         "sagas.tasks.sweep_late_money", settings.LATE_MONEY_SWEEP_PERIOD_S),
        ("ledger rollup of hot-account deltas", "ledger.tasks.rollup_balances",
         settings.LEDGER_ROLLUP_PERIOD_S),
        ("inbound follow-up sweep (lost wake-ups)", "anchor.tasks.inbound_drain",
         settings.INBOUND_SWEEP_PERIOD_S),
        ("erase deleted customers whose retention ended", "anchor.tasks.erase_customers",
         settings.KYC_ERASE_PERIOD_S),
        ("treasury reconciliation (books vs Horizon, RazorpayX, Razorpay)",
         "treasury.tasks.reconcile_today", settings.TREASURY_RECON_PERIOD_S),
    ]
