from django.apps import AppConfig


class TreasuryConfig(AppConfig):
    """Treasury (issue 13): the books compared with the outside (Horizon, RazorpayX,
    Razorpay), the breaks an operator explains, the daily report and the treasury page.
    The top of the import arrow: ``treasury -> sagas -> payouts -> anchor -> ledger``."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "treasury"
