"""Corridor settings: everything from environment variables (django-environ), with
working local defaults that point at the embedded dev services and the sandbox.
Every variable is documented in ``.env.example``. Secrets below default to values that
are only valid against the sandbox."""

from decimal import Decimal
from pathlib import Path

import environ

from corridor import ports

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()
# Variables already in the environment win over the file; CORRIDOR_ENV_FILE names
# another file (tests use os.devnull to keep a developer's .env out).
environ.Env.read_env(env.str("CORRIDOR_ENV_FILE", default=str(BASE_DIR / ".env")),
                     overwrite=False)

_DEV_PG = "postgresql://postgres@127.0.0.1:54329"

# The secrets' sandbox values: public and fake, valid only against the sandbox, so that
# `make run` needs no configuration. corridor/checks.py refuses every one of them in
# production; corridor/settings/production.py never uses them as defaults.
_SANDBOX_SECRET_DEFAULTS = {
    "SECRET_KEY": "dev-only-not-secret-corridor-django-key-000000",
    "STELLAR_DISTRIBUTION_SECRET": "SD5OLL3DQ5W4JM3BYCKEMDM6P62RQCCLHZPMSTAOONOL72HYLUS6I2W7",
    "AP_PLATFORM_AUTH_SECRET": "sandbox-platform-secret-0123456789abcdef0123",
    "AP_CALLBACK_AUTH_SECRET": "sandbox-callback-secret-0123456789abcdef0123",
    "AP_INTERACTIVE_JWT_SECRET": "sandbox-interactive-secret-0123456789abcdef0",
    "AP_MORE_INFO_JWT_SECRET": "sandbox-moreinfo-secret-0123456789abcdef0123",
    "RAZORPAY_KEY_SECRET": "sandbox-razorpay-key-secret",
    "RAZORPAY_WEBHOOK_SECRET": "sandbox-razorpay-webhook-secret",
    "STELLAR_HUB_SECRET": "SDNXGSEZZMSHL7VIWQDHRW66UWZNPOGKWJA6DVWDLSVVS3TYBVXR53K6",
    "ANCHOR31_AUTH_TOKEN": "sandbox-sep31:GANBGMMVHZ5CFXCQWUZYPAQJ4IUOH27V33I6F46KLRJB3HKL6LVQ2IMB",
    "SANDBOX_AP_SEP10_JWT_SECRET": "sandbox-sep10-secret-0123456789abcdef012345",
    # urlsafe_b64encode(sha256(b"corridor-sandbox:pii")): a Fernet key anyone can derive.
    "PII_KEY": "fmNKjC27EQlCXeXuUvFLg9mI32UAEhGx1LF7i9cD1aY=",
    "IDENTITY_KEY": "sandbox-identity-key-0123456789abcdef012345",
}
SANDBOX_SECRET_VALUES = tuple(_SANDBOX_SECRET_DEFAULTS.values())

SECRET_KEY = env("DJANGO_SECRET_KEY", default=_SANDBOX_SECRET_DEFAULTS["SECRET_KEY"])
# Off unless asked for: `make run` sets DJANGO_DEBUG=true; tests run with it off.
DEBUG = env.bool("DJANGO_DEBUG", default=False)
# DJANGO_DEBUG=false said out loud means "this is a deployment" even without
# CORRIDOR_ENV=production: the secrets part of corridor/checks.py then applies.
DEBUG_EXPLICITLY_OFF = "DJANGO_DEBUG" in env.ENVIRON and not DEBUG
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
    "django_otp",
    "django_otp.plugins.otp_totp",
    "axes",
    "ledger",
    "anchor",
    "payouts",
    "sagas",
    "treasury",
]

MIDDLEWARE = [
    # Liveness probes by IP pass the host check (corridor/middleware.py).
    "corridor.middleware.liveness_middleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "corridor.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (SEP-24 pages, admin) from the app server itself in every mode.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last of Django's, as django-axes documents: it turns a lockout into its response.
    "axes.middleware.AxesMiddleware",
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
}
# Persistent connections (issue 11 §3): a request reuses its thread's connection for
# DB_CONN_MAX_AGE seconds instead of opening one per request (gunicorn's gthread
# workers keep one per thread; Celery's Django fixup closes stale ones around tasks).
# CONN_HEALTH_CHECKS checks a reused connection once per request first, so a server
# restart costs one reconnect, not an error (corridor/db/base.py: without a round
# trip). DB_CONN_MAX_AGE=0 restores one connection per request.
DB_CONN_MAX_AGE = env.int("DB_CONN_MAX_AGE", default=60)
DB_CONN_HEALTH_CHECKS = env.bool("DB_CONN_HEALTH_CHECKS", default=True)
for _db in DATABASES.values():
    _db.setdefault("CONN_MAX_AGE", DB_CONN_MAX_AGE)
    _db.setdefault("CONN_HEALTH_CHECKS", DB_CONN_HEALTH_CHECKS)
    if _db.get("ENGINE") == "django.db.backends.postgresql":
        _db["ENGINE"] = "corridor.db"  # the same backend, a health check with no round trip
# TEST_DB_SUFFIX lets several test runs share one PostgreSQL server side by side.
_suffix = env("TEST_DB_SUFFIX", default="")
DATABASES["default"]["TEST"] = {"NAME": "test_" + DATABASES["default"]["NAME"] + _suffix}
DATABASE_ROUTERS: list[str] = []
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Operators: the admin's login (issue 9 part 4) ---
# django-axes first (it refuses a locked-out login before any password is checked),
# then Django's model backend (django-axes docs, "Configuration").
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
_PV = "django.contrib.auth.password_validation"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"{_PV}.UserAttributeSimilarityValidator"},
    {"NAME": f"{_PV}.MinimumLengthValidator",
     "OPTIONS": {"min_length": env.int("PASSWORD_MIN_LENGTH", default=12)}},
    {"NAME": f"{_PV}.CommonPasswordValidator"},
    {"NAME": f"{_PV}.NumericPasswordValidator"},
]
# Lockout (django-axes): after AXES_FAILURE_LIMIT wrong passwords for one username, or
# from one client IP (AXES_LOCKOUT_PARAMETERS), every login of it is refused (429), the
# right password included, until AXES_COOLOFF_TIME hours pass without another attempt
# or an operator runs `manage.py axes_reset_username NAME` / `axes_reset_ip IP`.
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = env.float("AXES_COOLOFF_TIME", default=1.0)
AXES_LOCKOUT_PARAMETERS = env.list("AXES_LOCKOUT_PARAMETERS",
                                   default=["username", "ip_address"])
AXES_RESET_ON_SUCCESS = True
# The client's IP (django-ipware): AXES_IPWARE_PROXY_COUNT is the number of proxies in
# front of Corridor that append to X-Forwarded-For. 0 (development): REMOTE_ADDR only,
# never a header a client can forge; production.py defaults to 1. Behind proxies the
# right-most entries are the ones the proxies wrote (a client can prepend anything).
AXES_IPWARE_PROXY_COUNT = env.int("AXES_IPWARE_PROXY_COUNT", default=0) or None
AXES_IPWARE_PROXY_ORDER = "right-most"
AXES_IPWARE_META_PRECEDENCE_ORDER = (["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
                                     if AXES_IPWARE_PROXY_COUNT else ["REMOTE_ADDR"])
# A TOTP second factor (django-otp) for every staff login to /admin/ (corridor/admin_site.py):
# on by default in production, off in development so tests can force_login.
ADMIN_OTP_REQUIRED = env.bool("ADMIN_OTP_REQUIRED", default=False)
OTP_TOTP_ISSUER = env("OTP_TOTP_ISSUER", default="Corridor")
# Sessions: an operator's session lasts this long (seconds, default 8 hours); production
# also ends it when the browser closes.
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=8 * 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = env.bool("SESSION_EXPIRE_AT_BROWSER_CLOSE", default=False)
LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where collectstatic writes (production's release step); WhiteNoise serves it.
STATIC_ROOT = env("STATIC_ROOT", default=str(BASE_DIR / ".staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

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
# Standard Celery routing, from the environment (JSON); empty in production. The
# ingest bench routes the follow-up tasks to a queue nobody consumes, to count them.
CELERY_TASK_ROUTES = env.json("CELERY_TASK_ROUTES", default={})

# --- Inbound events: the stored row is the queue (anchor/inbox.py, issue 11 §3) ---
# A delivery's follow-up tasks are stored on its inbound_events row in the request's
# own INSERT/UPDATE; a worker's drain dispatches them, woken by a publish made off the
# request's path, and the beat sweep drains every INBOUND_SWEEP_PERIOD_S in case a
# wake-up was lost. INBOUND_DRAIN_BATCH rows are claimed per transaction.
INBOUND_SWEEP_PERIOD_S = env.float("INBOUND_SWEEP_PERIOD_S", default=5.0)
INBOUND_DRAIN_BATCH = env.int("INBOUND_DRAIN_BATCH", default=200)
# A web process publishes at most one wake-up per this many seconds (the follow-ups
# of every request meanwhile ride on it). Each wake-up is a drain task run by a worker
# (a claim transaction and a batch publish): 0.25 s rather than 0.1 s halves the
# worker's CPU per AP event under load (bench.ingest: 0.73 -> 0.35 ms), for at most
# a quarter second more before a follow-up is published.
INBOUND_WAKE_MIN_INTERVAL_S = env.float("INBOUND_WAKE_MIN_INTERVAL_S", default=0.25)
# Test-only switch (never from the environment): False makes the drain read waiting
# rows without claiming them (no FOR UPDATE SKIP LOCKED), which shows that the claim
# is what keeps two concurrent drains from dispatching one follow-up twice.
INBOUND_DRAIN_CLAIM = True
# Bench/test-only: a trivial view at /bench/noop, the ingest bench's baseline on the
# same gunicorn configuration. Never set in production (corridor/urls.py).
CORRIDOR_BENCH_NOOP = env.bool("CORRIDOR_BENCH_NOOP", default=False)

# --- External systems (the sandbox by default; real services by configuration) ---
# Ports from one place (corridor/ports.py): PORT and SANDBOX_PORT; every local URL
# default below derives from these two URLs.
PORT = ports.port()
SANDBOX_PORT = ports.sandbox_port()
SANDBOX_URL = env("SANDBOX_URL", default=ports.local_url(SANDBOX_PORT))
CORRIDOR_URL = env("CORRIDOR_URL", default=ports.local_url(PORT))
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
    default=_SANDBOX_SECRET_DEFAULTS["STELLAR_DISTRIBUTION_SECRET"],
)
# Channel accounts: the source of each release transaction (one in flight per
# channel). Empty -> the distribution account is its own single channel.
STELLAR_CHANNEL_SECRETS = env.list("STELLAR_CHANNEL_SECRETS", default=[])
# Sandbox / development only (production refuses it, corridor/checks.py): channel seeds
# derived as sha256("corridor-channel:" + secret + ":" + n) for n = 1..POOL_SIZE, so
# ``manage.py channels create N`` and every process agree without storing a seed.
STELLAR_CHANNEL_SEED_SECRET = env("STELLAR_CHANNEL_SEED_SECRET", default="")
# How many channels the pool uses: 0 = every seed in STELLAR_CHANNEL_SECRETS (none: the
# distribution account is its own single channel); N = the first N seeds.
STELLAR_CHANNEL_POOL_SIZE = env.int("STELLAR_CHANNEL_POOL_SIZE", default=0)
# XLM each new channel account receives from the distribution account (fees + reserve).
STELLAR_CHANNEL_FUNDING_XLM = Decimal(env("STELLAR_CHANNEL_FUNDING_XLM", default="20"))
# ``sync``: POST /transactions (blocks for a ledger); ``async``: POST
# /transactions_async, then the release is followed by its stored hash
# (RELEASE_FOLLOW_DELAY_S between looks) until it lands or is provably dead.
STELLAR_SUBMIT_MODE = env("STELLAR_SUBMIT_MODE", default="sync")
RELEASE_FOLLOW_DELAY_S = env.float("RELEASE_FOLLOW_DELAY_S", default=1.0)
RELEASE_FOLLOW_MAX = env.int("RELEASE_FOLLOW_MAX", default=600)
# The network's ledger close period (Stellar: ~5 s): the first look at a fresh async post
# is timed RELEASE_FOLLOW_MARGIN_S after the next expected close (0: no timing).
STELLAR_LEDGER_CLOSE_S = env.float("STELLAR_LEDGER_CLOSE_S", default=5.0)
RELEASE_FOLLOW_MARGIN_S = env.float("RELEASE_FOLLOW_MARGIN_S", default=0.5)
# A release refused a channel retries this far apart (0: RELEASE_RETRY_DELAY_S); in async
# mode the next freed channel wakes the oldest waiter first.
CHANNEL_WAIT_RETRY_S = env.float("CHANNEL_WAIT_RETRY_S", default=0.0)
STELLAR_BASE_FEE = env.int("STELLAR_BASE_FEE", default=100)
# One POST /transactions may wait this long (Horizon's own limit is 30 s).
STELLAR_SUBMIT_TIMEOUT_S = env.float("STELLAR_SUBMIT_TIMEOUT_S", default=35.0)

AP_PLATFORM_URL = env("AP_PLATFORM_URL", default=f"{SANDBOX_URL}/ap/platform")
AP_PLATFORM_AUTH_SECRET = env(
    "AP_PLATFORM_AUTH_SECRET", default=_SANDBOX_SECRET_DEFAULTS["AP_PLATFORM_AUTH_SECRET"]
)
AP_CALLBACK_AUTH_SECRET = env(
    "AP_CALLBACK_AUTH_SECRET", default=_SANDBOX_SECRET_DEFAULTS["AP_CALLBACK_AUTH_SECRET"]
)
AP_INTERACTIVE_JWT_SECRET = env(
    "AP_INTERACTIVE_JWT_SECRET", default=_SANDBOX_SECRET_DEFAULTS["AP_INTERACTIVE_JWT_SECRET"]
)
AP_MORE_INFO_JWT_SECRET = env(
    "AP_MORE_INFO_JWT_SECRET", default=_SANDBOX_SECRET_DEFAULTS["AP_MORE_INFO_JWT_SECRET"]
)
AP_JWT_LEEWAY_S = env.int("AP_JWT_LEEWAY_S", default=5)
AP_FIAT_ASSET = env("AP_FIAT_ASSET", default="iso4217:INR")

RAZORPAY_API_URL = env("RAZORPAY_API_URL", default=f"{SANDBOX_URL}/razorpay")
RAZORPAY_KEY_ID = env("RAZORPAY_KEY_ID", default="rzp_test_sandbox")
RAZORPAY_KEY_SECRET = env(
    "RAZORPAY_KEY_SECRET", default=_SANDBOX_SECRET_DEFAULTS["RAZORPAY_KEY_SECRET"]
)
RAZORPAY_WEBHOOK_SECRET = env(
    "RAZORPAY_WEBHOOK_SECRET", default=_SANDBOX_SECRET_DEFAULTS["RAZORPAY_WEBHOOK_SECRET"]
)
RAZORPAY_WEBHOOK_PREVIOUS_SECRET = env("RAZORPAY_WEBHOOK_PREVIOUS_SECRET", default="")
RAZORPAY_CHECKOUT_URL = env("RAZORPAY_CHECKOUT_URL", default="")
# Our RazorpayX account number (the debit side of every payout, NOTES §2.1).
RAZORPAYX_ACCOUNT_NUMBER = env("RAZORPAYX_ACCOUNT_NUMBER", default="2323230041626905")
# Fund Account Validation (TREASURY §6.4): the least payouts.fav.name_match score, in
# [0, 1], at which the bank's registered name counts as our KYC name.
FAV_NAME_MATCH_THRESHOLD = env.float("FAV_NAME_MATCH_THRESHOLD", default=0.8)
# Validate a beneficiary's fund account before its first payout (payouts/beneficiaries.py).
# Off only where RazorpayX offers no FAV (current accounts, test mode: TREASURY §0.6).
FAV_REQUIRED = env.bool("FAV_REQUIRED", default=True)
# A validation the bank has not answered (or RazorpayX unreachable) this long goes to a
# person instead of waiting.
FAV_PENDING_REVIEW_S = env.float("FAV_PENDING_REVIEW_S", default=3600.0)

# --- Withdrawal pricing: USDC in, INR out ---
# A SEP-24 withdrawal whose payout can never succeed (the payee's bank refuses the
# account: payouts/receive.py ACCOUNT_REFUSES, or fund account validation finds it
# invalid) has its USDC refunded on chain by Corridor itself (issue 13 §3); off: it waits
# for an operator in the review queue. SEP-31 receives are always refunded so.
WITHDRAWAL_REFUND_FOR_GOOD = env.bool("WITHDRAWAL_REFUND_FOR_GOOD", default=True)
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

# --- SEP-38 quotes (AP callback GET /rate, anchor/quotes.py) ---
# The rate source: a URL answering {"mid": "<INR per USDC>"} (the sandbox's moving feed
# in development: GET <SANDBOX_URL>/fx/rates?pair=USDC-INR), or empty for the fixed
# QUOTE_MID_INR_PER_USDC. The spread moves the price against the customer on each
# side of the mid; the fee is charged in the sell asset (AP NOTES SEP31-RECEIVE §6.2).
QUOTE_RATE_URL = env("QUOTE_RATE_URL", default="")
QUOTE_MID_INR_PER_USDC = Decimal(env.str("QUOTE_MID_INR_PER_USDC", default="84.50"))
QUOTE_SPREAD_BPS = Decimal(env.str("QUOTE_SPREAD_BPS", default="50"))
QUOTE_FEE_PERCENT = Decimal(env.str("QUOTE_FEE_PERCENT", default="0.5"))
QUOTE_FEE_FIXED_USDC = Decimal(env.str("QUOTE_FEE_FIXED_USDC", default="0.50"))
QUOTE_FEE_FIXED_INR = Decimal(env.str("QUOTE_FEE_FIXED_INR", default="40.00"))
# A firm quote lives QUOTE_FIRM_TTL_S, longer on request (expire_after) up to
# QUOTE_FIRM_MAX_TTL_S.
QUOTE_FIRM_TTL_S = env.float("QUOTE_FIRM_TTL_S", default=600.0)
QUOTE_FIRM_MAX_TTL_S = env.float("QUOTE_FIRM_MAX_TTL_S", default=3600.0)

# Test-only switch: False makes a re-drive rebuild without looking for the stored hash
# on chain (shows that the chain check is what prevents a second payment).
RELEASE_CHAIN_CHECK = True
# Before a dead envelope is replaced, the chain is asked for this deposit's payment under
# a hash the row does not hold (a successor whose commit a failover lost), on a Horizon
# whose history ends at most this many seconds ago (anchor/releases.py _rebuild).
RELEASE_LOST_SUCCESSOR_CHECK = True  # test-only switch, never from the environment
RELEASE_REBUILD_HORIZON_LAG_S = env.float("RELEASE_REBUILD_HORIZON_LAG_S", default=10.0)

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
# An interactive form submission's claim (anchor/submissions.py): longer than the
# holder's slowest step (two outbound calls of HTTP_TIMEOUT_S each); renewed per step.
INTERACTIVE_SUBMIT_LEASE_S = env.float("INTERACTIVE_SUBMIT_LEASE_S", default=60.0)
# The sweeper completes a submission whose claim lapsed this long ago (its worker
# died; the customer's own retry usually comes first), every ..._PERIOD_S.
INTERACTIVE_SUBMIT_SWEEP_AGE_S = env.float("INTERACTIVE_SUBMIT_SWEEP_AGE_S", default=30.0)
INTERACTIVE_SUBMIT_SWEEP_PERIOD_S = env.float("INTERACTIVE_SUBMIT_SWEEP_PERIOD_S",
                                              default=30.0)
DEPOSIT_EXPIRY_PERIOD_S = env.float("DEPOSIT_EXPIRY_PERIOD_S", default=300.0)
TRUSTLINE_WAIT_S = env.float("TRUSTLINE_WAIT_S", default=86400.0)
# A deposit's destination account Horizon answers 404 for is asked again (a node behind
# its creation proves nothing) until this long after the payment was confirmed; then
# the release goes to manual review.
DESTINATION_MISSING_REVIEW_S = env.float("DESTINATION_MISSING_REVIEW_S", default=900.0)
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

# --- Deposit refunds through Razorpay (anchor/refunds.py, issue 13 §3) ---
# Razorpay refund speed: normal (free) or optimum (instant where possible, for a fee).
DEPOSIT_REFUND_SPEED = env("DEPOSIT_REFUND_SPEED", default="normal")
# Create calls whose answer was lost before the refund goes to manual review (each
# retry lists the payment's refunds by our receipt first, then replays the same key).
DEPOSIT_REFUND_MAX_ATTEMPTS = env.int("DEPOSIT_REFUND_MAX_ATTEMPTS", default=5)
# The drive task's retry delay after an unanswered call (Razorpay or AP).
DEPOSIT_REFUND_RETRY_S = env.float("DEPOSIT_REFUND_RETRY_S", default=30.0)
# The beat sweep re-drives refunds left open this long, every ..._PERIOD_S.
DEPOSIT_REFUND_SWEEP_AGE_S = env.float("DEPOSIT_REFUND_SWEEP_AGE_S", default=60.0)
DEPOSIT_REFUND_SWEEP_PERIOD_S = env.float("DEPOSIT_REFUND_SWEEP_PERIOD_S", default=60.0)
# Treasury reconciliation (treasury/reconcile.py, issue 13 §2): the beat job runs every
# TREASURY_RECON_PERIOD_S over the day and the LOOKBACK days before it; a captured
# payment is a break only once no settlement carried it for TREASURY_SETTLEMENT_WINDOW_S
# (Razorpay's T+2, plus a day of margin); a payout booked paid, once the statement has
# not shown it for TREASURY_STATEMENT_GRACE_S.
TREASURY_RECON_PERIOD_S = env.float("TREASURY_RECON_PERIOD_S", default=86400.0)
TREASURY_RECON_LOOKBACK_DAYS = env.int("TREASURY_RECON_LOOKBACK_DAYS", default=3)
TREASURY_SETTLEMENT_WINDOW_S = env.float("TREASURY_SETTLEMENT_WINDOW_S", default=3 * 86400.0)
TREASURY_STATEMENT_GRACE_S = env.float("TREASURY_STATEMENT_GRACE_S", default=600.0)
# The float (issue 13 §4): the SEP-24 pages read the distribution account's USDC and
# RazorpayX's balance at most every TREASURY_BALANCE_CACHE_S per process and refuse,
# before the customer pays, a transaction they cannot cover; the treasury page and
# /metrics raise an alert when a balance is below its floor.
TREASURY_BALANCE_CACHE_S = env.float("TREASURY_BALANCE_CACHE_S", default=15.0)
TREASURY_FLOOR_DISTRIBUTION_USDC = Decimal(env.str("TREASURY_FLOOR_DISTRIBUTION_USDC",
                                                   default="10000"))
TREASURY_FLOOR_RAZORPAYX_INR = Decimal(env.str("TREASURY_FLOOR_RAZORPAYX_INR",
                                               default="500000"))
# Test-only switch: False makes a retry after a lost refund answer mint a new key
# without listing the payment's refunds, as code without the guard would (shows that
# the guard is what stops a second refund).
DEPOSIT_REFUND_GUARD = True

# --- Operations endpoints (corridor/views.py, corridor/metrics.py) ---
# Per-dependency timeout of GET /health/ready (the checks run concurrently).
READINESS_TIMEOUT_S = env.float("READINESS_TIMEOUT_S", default=2.0)
# Seconds a process keeps the results of readiness's third-party checks (Horizon, AP,
# Razorpay): an anonymous GET /health/ready calls each at most once per period.
READINESS_CACHE_S = env.float("READINESS_CACHE_S", default=30.0)
# Bearer token of GET /metrics ("Authorization: Bearer <token>"). Empty: open in
# development; in production an empty token refuses every scrape.
METRICS_TOKEN = env("METRICS_TOKEN", default="")

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
# Periodic sweeps (common/sweeps.py): beat sends them at this Redis priority (9: served
# after every other task); a worker runs a copy only if none is running (a running copy
# holds the others off SWEEP_MAX_RUN_S at most: a worker killed mid-sweep) or ended less
# than SWEEP_MIN_GAP_S ago; the rest are acknowledged unrun. 0 gap and 0 run: every copy.
SWEEP_PRIORITY = env.int("SWEEP_PRIORITY", default=9)
SWEEP_MIN_GAP_S = env.float("SWEEP_MIN_GAP_S", default=5.0)
SWEEP_MAX_RUN_S = env.float("SWEEP_MAX_RUN_S", default=300.0)
# The saga sweep sends one run per due saga, then none for that saga for this long
# unless a run started (sagas/tasks.py): a saga due for minutes has one run queued,
# not one per sweep; a run lost with its worker is sent again after it. 0: every sweep.
SAGA_RESUME_REQUEUE_S = env.float("SAGA_RESUME_REQUEUE_S", default=60.0)
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

# Hot accounts (issue 11 §4; ledger.services): fnmatch patterns of account codes whose
# posts neither lock nor update the account row; their postings become
# ledger_balance_deltas rows, folded into the balance by ledger.tasks.rollup_balances
# every LEDGER_ROLLUP_PERIOD_S, at most LEDGER_ROLLUP_BATCH deltas per transaction.
# Default: the accounts every remittance books to and that have no balance rule (the
# fx and payable clearing accounts, the receiving anchors), the testing plan's, and the
# chart of the deposit and withdrawal paths (ledger/chart.py): every deposit, payout and
# refund books to the same few accounts, inside the transaction of its status change,
# which must not queue behind every other one's.
LEDGER_HOT_ACCOUNTS = env.list("LEDGER_HOT_ACCOUNTS",
                               default=["test:*", "fx:*", "payable:*", "anchor:*", "fx",
                                        "owed:*", "revenue:*", "expense:*", "razorpay:*",
                                        "razorpayx:*", "stellar:*"])
# Accounts whose balance must never go below zero (Overdraft): they are locked by
# every post that touches them and are never hot, whatever LEDGER_HOT_ACCOUNTS says.
# Default: none, as before (``hub``, which mirrors a Stellar account, is the candidate;
# its balance follows the chain, so a refusal there would stop a saga, not money).
LEDGER_NON_NEGATIVE_ACCOUNTS = env.list("LEDGER_NON_NEGATIVE_ACCOUNTS", default=[])
LEDGER_ROLLUP_PERIOD_S = env.float("LEDGER_ROLLUP_PERIOD_S", default=5.0)
LEDGER_ROLLUP_BATCH = env.int("LEDGER_ROLLUP_BATCH", default=10000)
# Test-only switches (never from the environment): False makes posts read non-negative
# accounts without locking them, which shows that the lock is what stops an overdraft.
LEDGER_LOCK_NON_NEGATIVE = True
# False makes the rollup read its batch without claiming it (no FOR
# UPDATE SKIP LOCKED), which shows that the claim is what stops a double fold.
LEDGER_ROLLUP_SKIP_LOCKED = True

# --- Remittances ---
# The hub: Corridor's USDC account on Stellar that partners fund and that pays the
# receiving anchors (the default is the sandbox hub, public and fake).
STELLAR_HUB_SECRET = env(
    "STELLAR_HUB_SECRET", default=_SANDBOX_SECRET_DEFAULTS["STELLAR_HUB_SECRET"]
)
# The SEP-31 receiving anchor of the USDC-INR corridor and Corridor's token there
# (a SEP-10 JWT against a real anchor; the sandbox accepts "sandbox-sep31:<account>").
ANCHOR31_URL = env("ANCHOR31_URL", default=f"{SANDBOX_URL}/anchor31")
ANCHOR31_AUTH_TOKEN = env(
    "ANCHOR31_AUTH_TOKEN",
    default=_SANDBOX_SECRET_DEFAULTS["ANCHOR31_AUTH_TOKEN"],
)
ANCHOR31_TIMEOUT_S = env.float("ANCHOR31_TIMEOUT_S", default=10.0)
# The quote (INR per USDC) locked into a remittance when it is created, and its limits.
REMITTANCE_RATE_INR_PER_USDC = Decimal(env.str("REMITTANCE_RATE_INR_PER_USDC", default="83.50"))
REMITTANCE_MIN_USDC = Decimal(env.str("REMITTANCE_MIN_USDC", default="1"))
REMITTANCE_MAX_USDC = Decimal(env.str("REMITTANCE_MAX_USDC", default="10000"))
# The partner must pay the hub within this long of the creation, or the remittance
# expires (nothing to undo).
REMITTANCE_FUNDING_DEADLINE_S = env.float("REMITTANCE_FUNDING_DEADLINE_S", default=3600.0)
# Horizon's history can lag behind the ledger: "no payment under the reference" is taken
# as "not funded by fund_by" only this long after fund_by (a payment read within it is
# taken, as one read before fund_by is).
REMITTANCE_FUNDING_GRACE_S = env.float("REMITTANCE_FUNDING_GRACE_S", default=120.0)
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
# Money that arrives after a saga stopped waiting for it (issue 25 §1): the beat sweep
# ``sagas.tasks.sweep_late_money`` looks, every this long, at the sagas in manual_review
# for "no refund" and compensates each whose refund is now confirmed (on chain and in the
# anchor's record), at most LATE_MONEY_BATCH per run.
LATE_MONEY_SWEEP_PERIOD_S = env.float("LATE_MONEY_SWEEP_PERIOD_S", default=60.0)
LATE_MONEY_BATCH = env.int("LATE_MONEY_BATCH", default=100)
# The same sweep returns a partner's payment that arrived after its remittance expired
# unfunded, for remittances that expired within this long (30 days).
# ... and, for remittances that settled within the same window, returns any payment
# under the reference beside the one booked as the fill (a partner who paid twice).
LATE_MONEY_FUNDING_WINDOW_S = env.float("LATE_MONEY_FUNDING_WINDOW_S", default=30 * 86400.0)
# Each settled remittance's look for payments beside its fill reads the hub's payments
# from where its previous look stopped (a stellar_cursors row per saga), at most this
# many Horizon pages (200 payments each) a run; the next run goes on from there.
LATE_MONEY_SCAN_PAGES = env.int("LATE_MONEY_SCAN_PAGES", default=5)
# Test-only switch (never from the environment): False reads from the saga's start
# every run (the cost grew with the hub's history: stop 34's campaign, seed 15).
LATE_MONEY_SCAN_CURSOR = True
# Test-only switch (never from the environment): False makes the order reconciler skip
# payments Razorpay shows refunded (anchor/reconciler.py), as it did before stop 34.
DEPOSIT_REFUNDED_PAYMENT_RECORD = True
# ... and returns USDC that arrived at the hub under a memo no saga owns (a remittance
# whose creation a failover lost after its 202): a payment is judged once Horizon's
# history reaches this long past it (longer than a lost hub envelope can still land:
# FAILOVER_LOSS_S-like losses plus STELLAR_TX_TIMEOUT_S), HUB_UNMATCHED_BATCH payments
# (at most 200, one Horizon page) per run.
HUB_UNMATCHED_GRACE_S = env.float("HUB_UNMATCHED_GRACE_S", default=300.0)
HUB_UNMATCHED_BATCH = env.int("HUB_UNMATCHED_BATCH", default=200)
# Test-only switch (never from the environment): False turns the late-money sweep off,
# which shows that it is what books and returns money that arrives anyway.
LATE_MONEY_SWEEP = True
# Test-only switch (sagas/hub.py): False builds a leg's first hub envelope without
# waiting for Horizon's history to show the hub's sequence (chaos --protection-off
# envelope_rule turns it off too).
HUB_HISTORY_COVERAGE_CHECK = True
# Test-only switch (never from the environment): False makes the hub's payments skip
# the look-up on chain (by memo, and by the stored envelope) before paying, which shows
# that the look-up is what stops a second payment after a crash.
REMITTANCE_CHAIN_LOOKUP = True

# Bearer token Prometheus sends to GET /metrics (required in production).
METRICS_TOKEN = env("METRICS_TOKEN", default="")


# --- The secrets registry ---
# Every secret setting, in one place. corridor/checks.py refuses production (and any
# start with DJANGO_DEBUG=false) when one is missing, shorter than min_length characters,
# a sandbox value or a value of .env.example, or equal to another role's; production.py
# reads each from its env var with no default. tests/test_production_mode.py fails when
# a setting named like a secret (*_SECRET, *_SECRETS, *_TOKEN, *_KEY, *_PASSWORD) is
# missing here. kind: "text" (a shared secret or token), "seed" (a Stellar secret seed,
# never one of the sandbox's accounts), "seeds" (a comma-separated list of seeds).
def _secret(setting, env_var, role, min_length, *, kind="text", required=True):
    return {"setting": setting, "env": env_var, "role": role, "min_length": min_length,
            "kind": kind, "required": required}


SECRET_SETTINGS = (
    # Django's own deploy check wants 50 characters (security.W009).
    _secret("SECRET_KEY", "DJANGO_SECRET_KEY", "Django signing key", 50),
    # AP refuses HMAC secrets under 256 bits at startup and they must be distinct
    # (anchor-platform NOTES.md §1 auth: KeyUtil.java, PR #1965).
    _secret("AP_PLATFORM_AUTH_SECRET", "AP_PLATFORM_AUTH_SECRET", "AP platform API", 32),
    _secret("AP_CALLBACK_AUTH_SECRET", "AP_CALLBACK_AUTH_SECRET", "AP callback API", 32),
    _secret("AP_INTERACTIVE_JWT_SECRET", "AP_INTERACTIVE_JWT_SECRET",
            "AP SEP-24 interactive JWT", 32),
    _secret("AP_MORE_INFO_JWT_SECRET", "AP_MORE_INFO_JWT_SECRET",
            "AP SEP-24 more-info JWT", 32),
    # Razorpay's API key secrets are 24 characters; the webhook secret is ours to pick.
    _secret("RAZORPAY_KEY_SECRET", "RAZORPAY_KEY_SECRET", "Razorpay API key secret", 20),
    _secret("RAZORPAY_WEBHOOK_SECRET", "RAZORPAY_WEBHOOK_SECRET", "Razorpay webhook", 20),
    _secret("RAZORPAY_WEBHOOK_PREVIOUS_SECRET", "RAZORPAY_WEBHOOK_PREVIOUS_SECRET",
            "Razorpay webhook (rotation)", 20, required=False),
    # SEP-31: Corridor's SEP-10 JWT at the receiving anchor.
    _secret("ANCHOR31_AUTH_TOKEN", "ANCHOR31_AUTH_TOKEN", "SEP-31 anchor token", 32),
    _secret("METRICS_TOKEN", "METRICS_TOKEN", "metrics scrape token", 32),
    _secret("STELLAR_DISTRIBUTION_SECRET", "STELLAR_DISTRIBUTION_SECRET",
            "Stellar distribution account", 56, kind="seed"),
    _secret("STELLAR_HUB_SECRET", "STELLAR_HUB_SECRET", "Stellar hub account", 56,
            kind="seed"),
    _secret("STELLAR_CHANNEL_SECRETS", "STELLAR_CHANNEL_SECRETS",
            "Stellar channel account", 56, kind="seeds", required=False),
    # Fernet keys of the customers' personal data (anchor/pii.py): 44 characters each.
    _secret("PII_KEYS", "CORRIDOR_PII_KEYS", "personal data encryption", 44, kind="keys"),
    # HMAC key of the customers' identity hashes (anchor/customers.py: limits and
    # rejections follow a person across customer rows); its own, so rotating the Django
    # key does not reset every limit and rejection.
    _secret("IDENTITY_KEY", "CORRIDOR_IDENTITY_KEY", "customer identity hashes", 32),
)
# Sandbox-only secrets (development.py); production never defines them.
SANDBOX_ONLY_SECRET_SETTINGS = ("SANDBOX_AP_SEP10_JWT_SECRET", "STELLAR_CHANNEL_SEED_SECRET")

# --- Customers and KYC (SEP-12; anchor/customers.py) ---
# Fernet keys of the personal data, first one encrypts (anchor/pii.py).
PII_KEYS = env.list("CORRIDOR_PII_KEYS", default=[_SANDBOX_SECRET_DEFAULTS["PII_KEY"]])
# Keyed hashes of PAN, payout destination and wallet account (anchor/customers.py
# identities). Changing it makes every stored hash unknown: limits and rejections start
# over, so it is set once per deployment.
IDENTITY_KEY = env.str("CORRIDOR_IDENTITY_KEY", default=_SANDBOX_SECRET_DEFAULTS["IDENTITY_KEY"])
# One uploaded file (ID photo, proof of address...): at most this many bytes; JPEG, PNG
# or PDF by their first bytes. A whole PUT /customer body: at most CUSTOMER_BODY_MAX_BYTES.
CUSTOMER_FILE_MAX_BYTES = env.int("CUSTOMER_FILE_MAX_BYTES", default=5 * 1024 * 1024)
CUSTOMER_BODY_MAX_BYTES = env.int("CUSTOMER_BODY_MAX_BYTES", default=16 * 1024 * 1024)
# SEP-12 types whose complete customers wait for a person (PROCESSING until accepted);
# the others are ACCEPTED once their fields pass the automatic checks.
KYC_REVIEW_TYPES = env.list("KYC_REVIEW_TYPES", default=[])
# A deleted customer who moved money keeps the personal data this long after the last
# movement (PMLA 2002 s.12(1)(a) and the PML Rules 2005: records of identity kept for
# five years after the business relationship ended), then it is erased.
KYC_RETENTION_DAYS = env.int("KYC_RETENTION_DAYS", default=5 * 366)
# SEP-24 pages: above this INR value a deposit or withdrawal needs the KYC fields
# (anchor/limits.py); per-customer limits over the calendar day and month of
# LIMITS_TIME_ZONE.
KYC_SEP24_THRESHOLD_INR = Decimal(env("KYC_SEP24_THRESHOLD_INR", default="50000"))
LIMIT_DAILY_INR = Decimal(env("LIMIT_DAILY_INR", default="200000"))
LIMIT_MONTHLY_INR = Decimal(env("LIMIT_MONTHLY_INR", default="1000000"))
LIMITS_TIME_ZONE = env("LIMITS_TIME_ZONE", default="Asia/Kolkata")
# How often the beat task erases deleted customers whose retention ended.
KYC_ERASE_PERIOD_S = env.float("KYC_ERASE_PERIOD_S", default=3600.0)

# --- Stored Stellar envelopes: one rule for every outbox (anchor/envelopes.py) ---
# An envelope whose fate Horizon cannot prove (landed, alive or dead) this long after
# its max_time goes to manual_review with the evidence, never to a rebuild.
ENVELOPE_UNKNOWN_REVIEW_S = env.float("ENVELOPE_UNKNOWN_REVIEW_S", default=900.0)
# The reconciler asks the rule again about releases in review for an unknown fate, this
# many a pass, taking turns (anchor/releases.py unknown_fate_reviews).
RELEASE_REVIEW_RECHECK_BATCH = env.int("RELEASE_REVIEW_RECHECK_BATCH", default=50)
# Withdrawal refunds (payouts/refunds.py): the beat sweep re-drives refunds left open
# this long, every REFUND_SWEEP_PERIOD_S.
REFUND_SWEEP_AGE_S = env.float("REFUND_SWEEP_AGE_S", default=25.0)
REFUND_SWEEP_PERIOD_S = env.float("REFUND_SWEEP_PERIOD_S", default=30.0)

# --- Nothing owed is left without an owner (issue 10 part 2, corridor/stranded.py) ---
# The AP notify sweeper (anchor/reconciler.py sweep_unnotified): every
# AP_NOTIFY_SWEEP_PERIOD_S, confirmed payments AP was not told about for
# AP_NOTIFY_SWEEP_AGE_S are re-notified, with backoff (doubling from
# AP_NOTIFY_SWEEP_AGE_S up to AP_NOTIFY_BACKOFF_MAX_S) and forever; one still refused
# AP_NOTIFY_REVIEW_S after its confirmation is also raised in the review queue.
AP_NOTIFY_SWEEP_PERIOD_S = env.float("AP_NOTIFY_SWEEP_PERIOD_S", default=30.0)
AP_NOTIFY_SWEEP_AGE_S = env.float("AP_NOTIFY_SWEEP_AGE_S", default=60.0)
AP_NOTIFY_BACKOFF_MAX_S = env.float("AP_NOTIFY_BACKOFF_MAX_S", default=600.0)
AP_NOTIFY_REVIEW_S = env.float("AP_NOTIFY_REVIEW_S", default=3600.0)
# A USDC receipt no withdrawal consumed (payouts/receipts.py classify_receipts) is
# raised in the review queue once it is this old.
RECEIPT_GRACE_S = env.float("RECEIPT_GRACE_S", default=300.0)
# Stranded thresholds (corridor/stranded.py): a state owed to a customer, with no
# owner (not in the review queue), older than its threshold, is stranded.
STRANDED_NOTIFY_S = env.float("STRANDED_NOTIFY_S", default=300.0)
STRANDED_RELEASE_S = env.float("STRANDED_RELEASE_S", default=600.0)
STRANDED_REFUND_S = env.float("STRANDED_REFUND_S", default=600.0)
STRANDED_SAGA_S = env.float("STRANDED_SAGA_S", default=600.0)
STRANDED_RECEIPT_S = env.float("STRANDED_RECEIPT_S", default=900.0)
# A SEP-31 customer changed after the last decision that waited on it, not looked at
# since: the poller looks every WITHDRAW_POLL_PERIOD_S.
STRANDED_RECEIVE_INFO_S = env.float("STRANDED_RECEIVE_INFO_S", default=300.0)
# The campaign's failover fault (corridor/failover.py, manage.py chaos): the standby
# replays FAILOVER_APPLY_DELAY_S behind the primary; its WAL receipt is cut
# FAILOVER_LOSS_S before the primary dies (the commits lost); the fault waits at most
# FAILOVER_IN_FLIGHT_WAIT_S for money in flight before it cuts.
FAILOVER_APPLY_DELAY_S = env.float("FAILOVER_APPLY_DELAY_S", default=3.0)
FAILOVER_LOSS_S = env.float("FAILOVER_LOSS_S", default=3.0)
FAILOVER_IN_FLIGHT_WAIT_S = env.float("FAILOVER_IN_FLIGHT_WAIT_S", default=8.0)
# The campaign's mop-up (manage.py chaos): a fault still armed after the traffic gets an
# item of its kind and up to this many seconds to meet it, per round (two rounds). A
# remittance reaches the receiving anchor's payout only after the partner's payment,
# the hub's funding and the anchor's own poll: 5 s was too short with two CPU burners
# (seed 2: anchor31.fail_payout_then_refund never fired).
CHAOS_MOP_UP_WAIT_S = env.float("CHAOS_MOP_UP_WAIT_S", default=30.0)
# Test-only switch (never from the environment): False stops the order reconciler from
# rebuilding orders a failover lost (anchor/reconciler.py rebuild_lost_orders): the
# test session's one sandbox keeps every earlier test's AP deposits, whose orders each
# test's database flush removed, and the suite turns it off (tests/conftest.py).
DEPOSIT_ORDER_REBUILD = True
# Test-only switch (never from the environment): False stops the withdrawal poller from
# rebuilding requests and payouts a failover lost (payouts/poller.py, issue 25 §2): the
# test session's one sandbox keeps every earlier test's AP withdrawals while each
# test's flush drops their rows; the suite turns it off (tests/conftest.py).
WITHDRAWAL_REQUEST_REBUILD = True
# How far back the withdrawal poller looks for AP withdrawals completed with no payout
# here (payouts/poller.py rebuild_completed): those AP started in the last this many
# seconds, one AP listing per pass, newest first.
WITHDRAWAL_REBUILD_WINDOW_S = env.float("WITHDRAWAL_REBUILD_WINDOW_S", default=86400.0)
# Test-only switch (never from the environment): False stops the withdrawal poller from
# rebuilding the request row of a SEP-31 receive a failover lost (payouts/receive.py
# receive_rebuild): the session's one sandbox keeps every earlier test's receives, whose
# rows each test's flush removed; the suite turns it off (tests/conftest.py).
RECEIVE_REBUILD = True
# How far back the withdrawal poller looks for SEP-31 receives AP closed (completed,
# refunded, expired) whose rows a failover lost: AP receives started in the last this many
# seconds, listed once per pass (its open ones it lists anyway).
RECEIVE_REBUILD_WINDOW_S = env.float("RECEIVE_REBUILD_WINDOW_S", default=86400.0)
# How far back the order reconciler looks for deposits AP expired whose order a
# failover lost (a customer can still pay a Razorpay order after the expiry; that INR
# is found and refunded): AP deposits started in the last this many seconds.
DEPOSIT_ORDER_REBUILD_EXPIRED_S = env.float("DEPOSIT_ORDER_REBUILD_EXPIRED_S",
                                            default=7 * 86400.0)
# ... and deposits AP completed within this many seconds (the USDC left while the
# order, payment and release rows were lost: their booking is rebuilt; a failover loses
# seconds of commits, so an hour covers a reconciler that was down for a while).
DEPOSIT_ORDER_REBUILD_COMPLETED_S = env.float("DEPOSIT_ORDER_REBUILD_COMPLETED_S",
                                              default=3600.0)
# Test-only switch (never from the environment): False turns the notify sweeper and
# the receipt classifier off, which shows that they are what unstrands the money.
STRANDED_SWEEPERS = True
# Test-only switch (never from the environment): False makes the receipt classifier
# leave a USDC receipt no withdrawal consumed where it is (allocation goes on, nothing
# is raised), which shows that raising it is what gives that money an owner.
RECEIPT_CLASSIFIER_RAISES = True
# Test-only switch (never from the environment): False takes AP's -32600 refusal of
# notify_onchain_funds_sent as final even when the read that decides shows
# pending_anchor (anchor/releases.py _refusal_contradicted), which shows that the
# contradiction check is what keeps a paid deposit behind a stale read out of review.
RELEASE_NOTIFY_CONTRADICTION = True
# Test-only switch (never from the environment): "naive" decides with the old, wrong
# rule (hash looked up first; "sequence moved past ours" or "latest ledger after
# max_time" taken as dead), which shows that the strict rule is what stops a second
# payment behind a lagging Horizon.
ENVELOPE_RULE = "strict"
