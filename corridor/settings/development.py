"""Development and test settings: the base settings plus the sandbox (local stand-ins
of Horizon, the Anchor Platform, Razorpay/RazorpayX and a SEP-31 anchor), its own
database and its router. Production (``CORRIDOR_ENV=production``) never loads this
module, so the sandbox is in neither ``INSTALLED_APPS`` nor ``DATABASES`` there."""

from .base import *  # noqa: F403
from .base import (
    _DEV_PG,
    _SANDBOX_SECRET_DEFAULTS,
    CORRIDOR_URL,
    DATABASES,
    INSTALLED_APPS,
    SANDBOX_URL,
    _suffix,
    env,
)

CORRIDOR_ENV = "development"

# WhiteNoise serves static/ and the apps' static files straight from the finders, so
# make run and the tests need no collectstatic; with DEBUG (make run) it re-reads
# edited files on each request.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = env.bool("DJANGO_DEBUG", default=False)
# No collected copy to serve (WhiteNoise would warn that the folder is missing).
STATIC_ROOT = env("STATIC_ROOT", default=None)

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "sandbox",
    "sandbox.control",
    "sandbox.horizon",
    "sandbox.ap",
    "sandbox.razorpay",
    "sandbox.anchor31",
]

# The sandbox's own world (ledger, AP transactions, orders, payouts). Only the
# sandbox apps are routed here (sandbox/router.py); Corridor never reads it.
DATABASES = {
    **DATABASES,
    "sandbox": env.db("SANDBOX_DATABASE_URL", default=f"{_DEV_PG}/corridor_sandbox"),
}
DATABASES["sandbox"].setdefault("CONN_MAX_AGE", 0)
DATABASES["sandbox"]["TEST"] = {"NAME": DATABASES["sandbox"]["NAME"] + "_test" + _suffix}
DATABASE_ROUTERS = ["sandbox.router.SandboxRouter"]

# Quotes read the sandbox's moving USDC/INR feed unless told otherwise.
QUOTE_RATE_URL = env("QUOTE_RATE_URL", default=f"{SANDBOX_URL}/fx/rates?pair=USDC-INR")

# --- Sandbox (python manage.py sandbox) ---
SANDBOX_LEDGER_CLOSE_S = env.float("SANDBOX_LEDGER_CLOSE_S", default=5.0)
SANDBOX_EVENT_BACKOFF_START_S = env.float("SANDBOX_EVENT_BACKOFF_START_S", default=1.0)
SANDBOX_EVENT_BACKOFF_MAX_S = env.float("SANDBOX_EVENT_BACKOFF_MAX_S", default=300.0)
SANDBOX_WEBHOOK_BACKOFF_S = env.float("SANDBOX_WEBHOOK_BACKOFF_S", default=5.0)
SANDBOX_WEBHOOK_BACKOFF_MAX_S = env.float("SANDBOX_WEBHOOK_BACKOFF_MAX_S", default=300.0)
SANDBOX_WEBHOOK_RETRY_WINDOW_S = env.float("SANDBOX_WEBHOOK_RETRY_WINDOW_S", default=86400.0)
# random | payment_first | order_first: the order of payment.captured and order.paid.
SANDBOX_RAZORPAY_EVENT_ORDER = env("SANDBOX_RAZORPAY_EVENT_ORDER", default="random")
SANDBOX_SUBMISSION_TIMEOUT_S = env.float("SANDBOX_SUBMISSION_TIMEOUT_S", default=30.0)
SANDBOX_CALLBACK_URL = env("SANDBOX_CALLBACK_URL", default=f"{CORRIDOR_URL}/callbacks")
SANDBOX_INTERACTIVE_URL = env(
    "SANDBOX_INTERACTIVE_URL", default=f"{CORRIDOR_URL}/sep24/interactive"
)
SANDBOX_WEBHOOK_URL = env("SANDBOX_WEBHOOK_URL", default=f"{CORRIDOR_URL}/webhooks/razorpay")
SANDBOX_MORE_INFO_URL = env("SANDBOX_MORE_INFO_URL", default=f"{CORRIDOR_URL}/sep24/more_info")
SANDBOX_INTERACTIVE_JWT_LIFETIME_S = env.int("SANDBOX_INTERACTIVE_JWT_LIFETIME_S", default=600)
SANDBOX_MORE_INFO_JWT_LIFETIME_S = env.int("SANDBOX_MORE_INFO_JWT_LIFETIME_S", default=600)
SANDBOX_EVENT_TIMEOUT_S = env.float("SANDBOX_EVENT_TIMEOUT_S", default=5.0)
SANDBOX_AP_SEP10_JWT_SECRET = env(
    "SANDBOX_AP_SEP10_JWT_SECRET", default=_SANDBOX_SECRET_DEFAULTS["SANDBOX_AP_SEP10_JWT_SECRET"]
)
# AP's sep24.deposit_info_generator_type: self (AP picks the withdrawal memo) or none.
SANDBOX_AP_DEPOSIT_INFO_GENERATOR = env("SANDBOX_AP_DEPOSIT_INFO_GENERATOR", default="self")
SANDBOX_PAYOUT_SETTLE_S = env.float("SANDBOX_PAYOUT_SETTLE_S", default=1.0)
# The sandbox's settlement "day": captured payments settle two of them later (T+2).
SANDBOX_SETTLEMENT_CYCLE_S = env.float("SANDBOX_SETTLEMENT_CYCLE_S", default=10.0)
SANDBOX_ANCHOR31_STEP_S = env.float("SANDBOX_ANCHOR31_STEP_S", default=0.5)
SANDBOX_ANCHOR31_EXPIRY_S = env.float("SANDBOX_ANCHOR31_EXPIRY_S", default=86400.0)
SANDBOX_ANCHOR31_LATE_REFUND_S = env.float("SANDBOX_ANCHOR31_LATE_REFUND_S", default=10.0)
SANDBOX_ANCHOR31_POLL_S = env.float("SANDBOX_ANCHOR31_POLL_S", default=0.2)
SANDBOX_ANCHOR31_WORKER_POLL_S = env.float("SANDBOX_ANCHOR31_WORKER_POLL_S", default=0.1)
# The sandbox's wallets and sending anchor (sandbox/drivers.py, sandbox/sender31.py):
# how often, and how far apart, a transient answer (no answer, a 5xx) is tried again.
SANDBOX_DRIVER_RETRIES = env.int("SANDBOX_DRIVER_RETRIES", default=6)
SANDBOX_DRIVER_RETRY_WAIT_S = env.float("SANDBOX_DRIVER_RETRY_WAIT_S", default=2.0)


# --- Test-only: one protection off, for manage.py chaos --protection-off NAME ---
# The chaos harness sets CORRIDOR_PROTECTION_OFF for its own child processes only, to
# show that the campaign finds what each protection prevents. Production never reads
# it (production.py does not import this module). For "sweepers" the harness also
# disables the sweepers' beat rows.
CORRIDOR_PROTECTION_OFF = env("CORRIDOR_PROTECTION_OFF", default="")
if CORRIDOR_PROTECTION_OFF == "envelope_rule":
    ENVELOPE_RULE = "naive"
    RELEASE_CHAIN_CHECK = False
    RELEASE_LOST_SUCCESSOR_CHECK = False
    HUB_HISTORY_COVERAGE_CHECK = False
elif CORRIDOR_PROTECTION_OFF == "payout_guard":
    PAYOUT_GUARD = False
elif CORRIDOR_PROTECTION_OFF == "fencing":
    SAGA_FENCING = False
elif CORRIDOR_PROTECTION_OFF == "step_keys":
    # Step keys are the second line behind the fence: with the fence on, a stale
    # commit never reaches the ledger. So this switch takes both off, and what the
    # campaign must then find is a step booked twice (with the fence alone off, the
    # keys keep the booking single and the stale write shows as a fence regression).
    SAGA_STEP_KEYS = False
    SAGA_FENCING = False
elif CORRIDOR_PROTECTION_OFF == "sweepers":
    STRANDED_SWEEPERS = False
elif CORRIDOR_PROTECTION_OFF == "receipt_classifier":
    RECEIPT_CLASSIFIER_RAISES = False
elif CORRIDOR_PROTECTION_OFF == "notify_contradiction":
    RELEASE_NOTIFY_CONTRADICTION = False
elif CORRIDOR_PROTECTION_OFF == "refund_guard":
    # A retry after a lost answer from Razorpay's refund create mints a new key.
    DEPOSIT_REFUND_GUARD = False
elif CORRIDOR_PROTECTION_OFF == "hub_chain_lookup":
    # The hub pays an anchor again after a crash without looking on chain first.
    REMITTANCE_CHAIN_LOOKUP = False
elif CORRIDOR_PROTECTION_OFF == "late_money":
    # Money that arrives anyway (late, or a second payment) stays on the hub unbooked.
    LATE_MONEY_SWEEP = False
elif CORRIDOR_PROTECTION_OFF == "compensate_order":
    # A saga compensates first step first.
    SAGA_COMPENSATE_IN_REVERSE = False
