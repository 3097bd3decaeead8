"""Production settings: the base settings, no sandbox, and the security settings a
deployment behind a TLS-terminating proxy needs. ``corridor/checks.py`` refuses to start
on unsafe configuration (see its docstring): every secret comes from the environment
only, so a missing one is reported instead of silently falling back to a sandbox value.

The sandbox is in neither ``INSTALLED_APPS`` (base.py lists Corridor's apps only) nor
``DATABASES`` nor ``DATABASE_ROUTERS``: only development.py adds them."""

from .base import *  # noqa: F403
from .base import SECRET_SETTINGS, STORAGES, env

CORRIDOR_ENV = "production"
# The ingest bench's trivial view never exists in production (base.py).
CORRIDOR_BENCH_NOOP = False
DEBUG = env.bool("DJANGO_DEBUG", default=False)
# No default: an empty list is refused by the deploy check, "*" too.
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=[])

# Secrets without the sandbox defaults base.py gives them (the registry is in base.py).
for _secret in SECRET_SETTINGS:
    if _secret["kind"] in ("seeds", "keys"):
        globals()[_secret["setting"]] = env.list(_secret["env"], default=[])
    else:
        globals()[_secret["setting"]] = env(_secret["env"], default="")
del _secret

# --- HTTPS behind a proxy (Django's deployment checklist; `manage.py check --deploy`) ---
# The proxy terminates TLS and says so in X-Forwarded-Proto (set it there, and strip it
# from clients' requests).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
# Load balancer probes and Prometheus scrape over plain HTTP on the internal network.
SECURE_REDIRECT_EXEMPT = [r"^health/$", r"^health/ready$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS",
                                          default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True

# --- Operators ---
# The proxy above appends the client's address to X-Forwarded-For (base.py explains).
AXES_IPWARE_PROXY_COUNT = env.int("AXES_IPWARE_PROXY_COUNT", default=1) or None
AXES_IPWARE_META_PRECEDENCE_ORDER = (["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
                                     if AXES_IPWARE_PROXY_COUNT else ["REMOTE_ADDR"])
ADMIN_OTP_REQUIRED = env.bool("ADMIN_OTP_REQUIRED", default=True)
SESSION_EXPIRE_AT_BROWSER_CLOSE = env.bool("SESSION_EXPIRE_AT_BROWSER_CLOSE", default=True)

# --- Static files ---
# collectstatic (the Procfile's release step) writes name.<hash>.ext files plus .gz
# copies (.br ones too where the brotli package is installed); WhiteNoise serves them
# with far-future cache headers.
STORAGES = {**STORAGES, "staticfiles": {
    "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"}}
