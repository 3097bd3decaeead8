"""Corridor settings: everything from environment variables (django-environ), with
working local defaults that point at the embedded dev services and the sandbox.
Every variable is documented in ``.env.example``. Secrets below default to values that
are only valid against the sandbox."""

from decimal import Decimal
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

_DEV_PG = "postgresql://postgres@127.0.0.1:54329"

SECRET_KEY = env("DJANGO_SECRET_KEY", default="dev-only-not-secret-corridor-django-key-000000")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["*"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_prometheus",
    "drf_spectacular",
    "corridor",
    "django_celery_beat",
    "ledger",
    "anchor",
    "payouts",
    "sagas",
    "sandbox",
    "sandbox.control",
    "sandbox.horizon",
    "sandbox.ap",
    "sandbox.razorpay",
    "sandbox.anchor31",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "corridor.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = env("DJANGO_ROOT_URLCONF", default="corridor.urls")
WSGI_APPLICATION = "corridor.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"{_DEV_PG}/corridor"),
    # The sandbox's own world (ledger, AP transactions, orders, payouts). Only the
    # sandbox apps are routed here (sandbox/router.py); Corridor never reads it.
    "sandbox": env.db("SANDBOX_DATABASE_URL", default=f"{_DEV_PG}/corridor_sandbox"),
}
for _db in DATABASES.values():
    _db.setdefault("CONN_MAX_AGE", 0)
# TEST_DB_SUFFIX lets several test runs share one PostgreSQL server side by side.
_suffix = env("TEST_DB_SUFFIX", default="")
DATABASES["default"]["TEST"] = {"NAME": "test_" + DATABASES["default"]["NAME"] + _suffix}
DATABASES["sandbox"]["TEST"] = {"NAME": DATABASES["sandbox"]["NAME"] + "_test" + _suffix}
DATABASE_ROUTERS = ["sandbox.router.SandboxRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / ".staticfiles"

# JSON lines through structlog for every logger (corridor/logging.py: fields, context
# ids, redaction). Django's own loggers propagate to the root handler instead of their
# plain-text defaults.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "corridor.logging.json_formatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": [], "level": "INFO", "propagate": True},
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}

# --- Celery -----------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="redis://127.0.0.1:63799/0")
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"

# --- External systems (the sandbox by default; real services by configuration) ---
SANDBOX_URL = env("SANDBOX_URL", default="http://127.0.0.1:8100")
CORRIDOR_URL = env("CORRIDOR_URL", default="http://127.0.0.1:8000")
HTTP_TIMEOUT_S = env.float("HTTP_TIMEOUT_S", default=10.0)

HORIZON_URL = env("HORIZON_URL", default=f"{SANDBOX_URL}/horizon")
STELLAR_NETWORK_PASSPHRASE = env(
    "STELLAR_NETWORK_PASSPHRASE", default="Test SDF Network ; September 2015"
)
# Sandbox-only defaults, derived from fixed seeds (sandbox/keys.py documents them).
STELLAR_USDC_CODE = env("STELLAR_USDC_CODE", default="USDC")
STELLAR_USDC_ISSUER = env(
    "STELLAR_USDC_ISSUER", default="GBRJQ2TQDQ2MNW7NHYI7CLJVZ45CJA3KRXDUGERNVHWUWUFPNTRSXQXL"
)
STELLAR_DISTRIBUTION_SECRET = env(
    "STELLAR_DISTRIBUTION_SECRET",
    default="SD5OLL3DQ5W4JM3BYCKEMDM6P62RQCCLHZPMSTAOONOL72HYLUS6I2W7",
)
# Channel accounts: the source of each release transaction (one in flight per
# channel). Empty -> the distribution account is its own single channel.
STELLAR_CHANNEL_SECRETS = env.list("STELLAR_CHANNEL_SECRETS", default=[])
STELLAR_BASE_FEE = env.int("STELLAR_BASE_FEE", default=100)
# One POST /transactions may wait this long (Horizon's own limit is 30 s).
STELLAR_SUBMIT_TIMEOUT_S = env.float("STELLAR_SUBMIT_TIMEOUT_S", default=35.0)

AP_PLATFORM_URL = env("AP_PLATFORM_URL", default=f"{SANDBOX_URL}/ap/platform")
AP_PLATFORM_AUTH_SECRET = env(
    "AP_PLATFORM_AUTH_SECRET", default="sandbox-platform-secret-0123456789abcdef0123"
)
AP_CALLBACK_AUTH_SECRET = env(
    "AP_CALLBACK_AUTH_SECRET", default="sandbox-callback-secret-0123456789abcdef0123"
)
AP_INTERACTIVE_JWT_SECRET = env(
    "AP_INTERACTIVE_JWT_SECRET", default="sandbox-interactive-secret-0123456789abcdef0"
)
AP_MORE_INFO_JWT_SECRET = env(
    "AP_MORE_INFO_JWT_SECRET", default="sandbox-moreinfo-secret-0123456789abcdef0123"
)
AP_JWT_LEEWAY_S = env.int("AP_JWT_LEEWAY_S", default=5)
AP_FIAT_ASSET = env("AP_FIAT_ASSET", default="iso4217:INR")

RAZORPAY_API_URL = env("RAZORPAY_API_URL", default=f"{SANDBOX_URL}/razorpay")
RAZORPAY_KEY_ID = env("RAZORPAY_KEY_ID", default="rzp_test_sandbox")
RAZORPAY_KEY_SECRET = env("RAZORPAY_KEY_SECRET", default="sandbox-razorpay-key-secret")
RAZORPAY_WEBHOOK_SECRET = env("RAZORPAY_WEBHOOK_SECRET", default="sandbox-razorpay-webhook-secret")
RAZORPAY_WEBHOOK_PREVIOUS_SECRET = env("RAZORPAY_WEBHOOK_PREVIOUS_SECRET", default="")
RAZORPAY_CHECKOUT_URL = env("RAZORPAY_CHECKOUT_URL", default="")
# Our RazorpayX account number (the debit side of every payout, NOTES §2.1).
RAZORPAYX_ACCOUNT_NUMBER = env("RAZORPAYX_ACCOUNT_NUMBER", default="2323230041626905")

# --- Withdrawal pricing: USDC in, INR out ---
WITHDRAW_RATE_INR_PER_USDC = Decimal(env.str("WITHDRAW_RATE_INR_PER_USDC", default="84.00"))
WITHDRAW_FEE_USDC = Decimal(env.str("WITHDRAW_FEE_USDC", default="0.50"))
WITHDRAW_MIN_USDC = Decimal(env.str("WITHDRAW_MIN_USDC", default="2"))
WITHDRAW_MAX_USDC = Decimal(env.str("WITHDRAW_MAX_USDC", default="5000"))
# Significant decimals AP is configured with for the withdrawal asset; a receipt with
# more is never paid out (AP NOTES §4.4).
WITHDRAW_ASSET_DECIMALS = env.int("WITHDRAW_ASSET_DECIMALS", default=7)

# --- Deposit pricing (INR per USDC and fee); the sandbox uses these fixed values ---
DEPOSIT_RATE_INR_PER_USDC = Decimal(env.str("DEPOSIT_RATE_INR_PER_USDC", default="85.00"))
DEPOSIT_FEE_PERCENT = Decimal(env.str("DEPOSIT_FEE_PERCENT", default="1.0"))
DEPOSIT_FEE_FIXED_INR = Decimal(env.str("DEPOSIT_FEE_FIXED_INR", default="10.00"))
DEPOSIT_MIN_INR = Decimal(env.str("DEPOSIT_MIN_INR", default="100.00"))
DEPOSIT_MAX_INR = Decimal(env.str("DEPOSIT_MAX_INR", default="500000.00"))

# Test-only switch: False makes a re-drive rebuild without looking for the stored hash
# on chain (shows that the chain check is what prevents a second payment).
RELEASE_CHAIN_CHECK = True

# How often the SEP-24 status page refreshes itself, in seconds.
SEP24_STATUS_REFRESH_S = env.int("SEP24_STATUS_REFRESH_S", default=5)

# --- Timing settings (production values are the seeds'; tests run them at ~1 s) ---
RECONCILER_PERIOD_S = env.float("RECONCILER_PERIOD_S", default=30.0)
RECONCILER_AGE_S = env.float("RECONCILER_AGE_S", default=25.0)
RELEASE_MAX_ATTEMPTS = env.int("RELEASE_MAX_ATTEMPTS", default=5)
# Time bounds of a release envelope: shorter than the reconciler age, so a stuck
# release is provably dead or landed by the time the reconciler looks at it.
STELLAR_TX_TIMEOUT_S = env.float("STELLAR_TX_TIMEOUT_S", default=20.0)
# Grace on top of max_time before a channel whose holder vanished is resynced.
STELLAR_CHANNEL_GRACE_S = env.float("STELLAR_CHANNEL_GRACE_S", default=5.0)
RELEASE_RETRY_DELAY_S = env.float("RELEASE_RETRY_DELAY_S", default=2.0)
AP_NOTIFY_RETRY_DELAY_S = env.float("AP_NOTIFY_RETRY_DELAY_S", default=5.0)
AP_SWEEP_PERIOD_S = env.float("AP_SWEEP_PERIOD_S", default=30.0)
ORDER_RECONCILER_PERIOD_S = env.float("ORDER_RECONCILER_PERIOD_S", default=60.0)
ORDER_RECONCILER_AGE_S = env.float("ORDER_RECONCILER_AGE_S", default=30.0)
DEPOSIT_EXPIRY_S = env.float("DEPOSIT_EXPIRY_S", default=3600.0)
DEPOSIT_EXPIRY_PERIOD_S = env.float("DEPOSIT_EXPIRY_PERIOD_S", default=300.0)
TRUSTLINE_WAIT_S = env.float("TRUSTLINE_WAIT_S", default=86400.0)
WITHDRAW_POLL_PERIOD_S = env.float("WITHDRAW_POLL_PERIOD_S", default=30.0)
# A short receipt waits this long for more payments under its memo before review.
WITHDRAW_SHORT_GRACE_S = env.float("WITHDRAW_SHORT_GRACE_S", default=3600.0)
# A payout whose create call's outcome stays unknown this long goes to manual review
# (never "failed" by timeout).
PAYOUT_UNKNOWN_REVIEW_S = env.float("PAYOUT_UNKNOWN_REVIEW_S", default=3600.0)
# The provider's settlement window: an acknowledged payout is not sent to review for
# age before this (IMPS/UPI deemed success: T+3 working days, RazorpayX NOTES §2.6).
PAYOUT_SETTLEMENT_WINDOW_S = env.float("PAYOUT_SETTLEMENT_WINDOW_S", default=5 * 86400.0)
# Test-only switch: False makes the poller pay without the withdrawal_payouts claim,
# as code that trusts AP's status would (shows that the guard is what stops a second
# payout).
PAYOUT_GUARD = True

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
    "SANDBOX_AP_SEP10_JWT_SECRET", default="sandbox-sep10-secret-0123456789abcdef012345"
)
# AP's sep24.deposit_info_generator_type: self (AP picks the withdrawal memo) or none.
SANDBOX_AP_DEPOSIT_INFO_GENERATOR = env("SANDBOX_AP_DEPOSIT_INFO_GENERATOR", default="self")
SANDBOX_PAYOUT_SETTLE_S = env.float("SANDBOX_PAYOUT_SETTLE_S", default=1.0)
SANDBOX_ANCHOR31_STEP_S = env.float("SANDBOX_ANCHOR31_STEP_S", default=0.5)
SANDBOX_ANCHOR31_EXPIRY_S = env.float("SANDBOX_ANCHOR31_EXPIRY_S", default=86400.0)
SANDBOX_ANCHOR31_POLL_S = env.float("SANDBOX_ANCHOR31_POLL_S", default=0.2)
SANDBOX_ANCHOR31_WORKER_POLL_S = env.float("SANDBOX_ANCHOR31_WORKER_POLL_S", default=0.1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PARSER_CLASSES": ["corridor.parsers.SafeJSONParser"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Corridor partner API",
    "DESCRIPTION": "Cross-border remittances over the Stellar hub (POST/GET /api/remittances).",
    "VERSION": "1.0.0",
}

# --- Sagas and ledger ---
# Lease of a saga run (DESIGN.md §6, the seed's 120 s); every fenced commit renews it.
SAGA_LEASE_S = env.float("SAGA_LEASE_S", default=120.0)
# Beat sweep: resumes open sagas whose lease lapsed or whose retry/pending is due.
SAGA_RESUME_PERIOD_S = env.float("SAGA_RESUME_PERIOD_S", default=30.0)
SAGA_RESUME_BATCH = env.int("SAGA_RESUME_BATCH", default=500)
# Legs that do not set their own: attempts per step, first retry delay (doubling).
SAGA_DEFAULT_MAX_ATTEMPTS = env.int("SAGA_DEFAULT_MAX_ATTEMPTS", default=5)
SAGA_DEFAULT_BACKOFF_MS = env.int("SAGA_DEFAULT_BACKOFF_MS", default=1000)
SAGA_BACKOFF_MAX_S = env.float("SAGA_BACKOFF_MAX_S", default=300.0)
# Takeovers of an unreleased lease before a saga stops in manual_review.
SAGA_MAX_RECOVERIES = env.int("SAGA_MAX_RECOVERIES", default=20)
# Test-only switches (never from the environment): False shows what each protection
# prevents. Fencing: commits ignore the fence. Reverse: compensate first-to-last.
# Step keys: bookings keyed per attempt instead of per step.
SAGA_FENCING = True
SAGA_COMPENSATE_IN_REVERSE = True
SAGA_STEP_KEYS = True

# --- Remittances ---
# The hub: Corridor's USDC account on Stellar that partners fund and that pays the
# receiving anchors (the default is the sandbox hub, public and fake).
STELLAR_HUB_SECRET = env(
    "STELLAR_HUB_SECRET", default="SDNXGSEZZMSHL7VIWQDHRW66UWZNPOGKWJA6DVWDLSVVS3TYBVXR53K6"
)
# The SEP-31 receiving anchor of the USDC-INR corridor and Corridor's token there
# (a SEP-10 JWT against a real anchor; the sandbox accepts "sandbox-sep31:<account>").
ANCHOR31_URL = env("ANCHOR31_URL", default=f"{SANDBOX_URL}/anchor31")
ANCHOR31_AUTH_TOKEN = env(
    "ANCHOR31_AUTH_TOKEN",
    default="sandbox-sep31:GANBGMMVHZ5CFXCQWUZYPAQJ4IUOH27V33I6F46KLRJB3HKL6LVQ2IMB",
)
ANCHOR31_TIMEOUT_S = env.float("ANCHOR31_TIMEOUT_S", default=10.0)
# The quote (INR per USDC) locked into a remittance when it is created, and its limits.
REMITTANCE_RATE_INR_PER_USDC = Decimal(env.str("REMITTANCE_RATE_INR_PER_USDC", default="83.50"))
REMITTANCE_MIN_USDC = Decimal(env.str("REMITTANCE_MIN_USDC", default="1"))
REMITTANCE_MAX_USDC = Decimal(env.str("REMITTANCE_MAX_USDC", default="10000"))
# The partner must pay the hub within this long of the creation, or the remittance
# expires (nothing to undo).
REMITTANCE_FUNDING_DEADLINE_S = env.float("REMITTANCE_FUNDING_DEADLINE_S", default=3600.0)
# How long the anchor.fund compensation waits for the anchor's refund on chain before
# it stops for a person.
REMITTANCE_REFUND_DEADLINE_S = env.float("REMITTANCE_REFUND_DEADLINE_S", default=86400.0)
# How long a funded anchor may take to pay out before the saga stops for a person.
REMITTANCE_PAYOUT_DEADLINE_S = env.float("REMITTANCE_PAYOUT_DEADLINE_S", default=3 * 86400.0)
# An anchor that reports ``error`` after it was funded is given this long (from the
# funding) to start a refund before the saga stops for a person.
REMITTANCE_ERROR_REFUND_GRACE_S = env.float("REMITTANCE_ERROR_REFUND_GRACE_S", default=600.0)
# Polls: the hub for the partner's payment, the anchor for its status and refunds.
REMITTANCE_FUNDING_POLL_S = env.float("REMITTANCE_FUNDING_POLL_S", default=10.0)
REMITTANCE_ANCHOR_POLL_S = env.float("REMITTANCE_ANCHOR_POLL_S", default=30.0)
# Hub payments are submitted one at a time (Stellar core queues one transaction per
# source account); a leg waits this long for its turn before it tries again later.
REMITTANCE_HUB_LOCK_WAIT_S = env.float("REMITTANCE_HUB_LOCK_WAIT_S", default=30.0)
# Test-only switch (never from the environment): False makes the hub's payments skip
# the look-up on chain (by memo, and by the stored envelope) before paying, which shows
# that the look-up is what stops a second payment after a crash.
REMITTANCE_CHAIN_LOOKUP = True
