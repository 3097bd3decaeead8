"""Production mode: Corridor refuses to start on a configuration that is unsafe to serve
(issue 9, part 1).

``production_problems()`` lists every problem of the loaded settings; it is used twice:

- as a Django system check (``corridor.E001`` ..., one ``Error`` per problem), so
  ``manage.py check --deploy`` (and every command that runs the system checks: migrate,
  runserver, ...) fails with the full list;
- by ``refuse_unsafe_start()``, called from ``CorridorConfig.ready()``, which raises
  ``ImproperlyConfigured`` with one message listing every problem: gunicorn and Celery
  run no system checks, and must not start either.

When it applies: ``CORRIDOR_ENV=production`` -> everything below;
``DJANGO_DEBUG=false`` set explicitly in any other mode -> the secrets part only
(``DEBUG_EXPLICITLY_OFF`` in base.py); otherwise (``make run``, ``make test``) nothing.

What it refuses:

- secrets (the registry ``SECRET_SETTINGS`` in settings/base.py): a required one missing
  (E001), shorter than its minimum (E002), equal to a sandbox value or a sandbox
  SEP-31 token (E003) or to a value of the repository's ``.env.example`` (E004; parsed
  at check time, skipped when the file is absent), the same value in two roles (E005);
  a Stellar seed that is not a valid secret seed (E006) or that anyone can derive from
  this repository (E007: a sandbox account, a network root, a development channel of a
  seed secret the repository writes; common/devkeys.py);
- ``ALLOWED_HOSTS`` containing ``*`` (E008) or empty (E009); ``DEBUG`` on (E010);
- an external base URL pointing at the sandbox (E011): under ``SANDBOX_URL``, with one
  of the sandbox's path prefixes, or plain ``http`` to a loopback host; an empty
  ``RAZORPAY_CHECKOUT_URL`` (it means the sandbox's checkout page);
- the sandbox installed (E012): an app, a ``sandbox`` database or its router;
- ``DATABASE_URL``, ``CELERY_BROKER_URL`` or ``CORRIDOR_URL`` not set in the environment
  (E013): their defaults are the embedded dev services on loopback and the local port;
- ``CORRIDOR_URL`` not public https, the admin's second factor off, the https redirect
  off or HSTS under a day (E014);
- a ``CORRIDOR_PII_KEYS`` entry that is not a Fernet key (E016);
- ``STELLAR_CHANNEL_SEED_SECRET`` set (E015): channel seeds derived from a development
  secret (``manage.py channels``) are sandbox seeds; production takes
  ``STELLAR_CHANNEL_SECRETS`` from its secret store.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from common import devkeys

# Every seed derivable from this repository (the sandbox's accounts, the network roots,
# the development channels of the seed secrets the repository writes) comes from
# common/devkeys.py, the derivation the sandbox itself uses (plain code on the ground
# floor: production imports no sandbox code). tests/test_production_mode.py enumerates
# them and asserts each is refused.
SANDBOX_ACCOUNT_NAMES = devkeys.SANDBOX_ACCOUNT_NAMES
# The sandbox's URL prefixes (sandbox/urls.py), as they appear in a base URL.
SANDBOX_PATH_PREFIXES = ("/horizon", "/ap/platform", "/ap/sep", "/razorpay", "/anchor31",
                         "/sandbox/")
# External base URLs (settings) that must point at the real systems in production.
EXTERNAL_URL_SETTINGS = ("HORIZON_URL", "AP_PLATFORM_URL", "RAZORPAY_API_URL",
                         "ANCHOR31_URL", "RAZORPAY_CHECKOUT_URL")
# False only in `manage.py check` (manage.py sets it), which reports the problems as
# system-check errors instead.
REFUSE_AT_STARTUP = True


@dataclass(frozen=True)
class Problem:
    """One reason not to start: ``id`` is the system check id (``corridor.E001``)."""

    id: str
    message: str

    def __str__(self) -> str:
        return f"{self.id} {self.message}"


def sandbox_seeds() -> dict[str, str]:
    """Secret seed (``S...``) -> what it is (``sandbox account hub``, ``network
    root``, ``development channel <secret>:<n>``), for every seed anyone can derive
    from this repository (common/devkeys.py ``derivable_seeds``)."""
    return devkeys.derivable_seeds(settings.STELLAR_NETWORK_PASSPHRASE)


def _seed_is(what: str) -> str:
    """The words of E007 for a derivable seed: ``the sandbox account 'hub'``."""
    if what.startswith("sandbox account "):
        return f"the sandbox account {what.removeprefix('sandbox account ')!r}"
    return f"the {what}"


def env_example_values(path: Path | None = None) -> dict[str, str]:
    """``NAME=value`` lines of ``.env.example`` (comments and blanks skipped); ``{}``
    when the file is absent."""
    path = path or Path(settings.BASE_DIR) / ".env.example"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        values[name.strip()] = value.strip().strip("'\"")
    return values


def _mode() -> str | None:
    """"production", "secrets" (DJANGO_DEBUG=false outside production) or None."""
    if getattr(settings, "CORRIDOR_ENV", "") == "production":
        return "production"
    if getattr(settings, "DEBUG_EXPLICITLY_OFF", False):
        return "secrets"
    return None


def _secret_values(entry: dict) -> list[str]:
    try:
        value = getattr(settings, entry["setting"], "")
    except ImproperlyConfigured:  # Django refuses to read an empty SECRET_KEY
        value = ""
    if entry["kind"] in ("seeds", "keys"):
        return [str(v).strip() for v in (value or []) if str(v).strip()]
    return [str(value).strip()] if value and str(value).strip() else []


def _fernet_key(value: str) -> bool:
    from anchor import pii

    return pii.valid_key(value)


def secret_problems() -> list[Problem]:
    """Problems of the secret settings in ``settings.SECRET_SETTINGS`` (E001-E007)."""
    from stellar_sdk import StrKey

    problems: list[Problem] = []
    sandbox_values = set(getattr(settings, "SANDBOX_SECRET_VALUES", ()))
    example = env_example_values()
    example_values = {v: k for k, v in example.items() if v}
    seeds = sandbox_seeds()
    seen: dict[str, dict] = {}
    for entry in settings.SECRET_SETTINGS:
        name, env_var, role = entry["setting"], entry["env"], entry["role"]
        label = f"{env_var} ({role})"
        values = _secret_values(entry)
        if not values:
            if entry["required"]:
                problems.append(Problem("corridor.E001", f"{label} is missing"))
            continue
        for value in values:
            if len(value) < entry["min_length"]:
                problems.append(Problem(
                    "corridor.E002",
                    f"{label} is {len(value)} characters, shorter than the required "
                    f"{entry['min_length']}"))
            if value in sandbox_values or value.startswith(
                    devkeys.SANDBOX_ANCHOR31_TOKEN_PREFIX):
                problems.append(Problem("corridor.E003", f"{label} is a sandbox default"))
            elif value in example_values:
                problems.append(Problem(
                    "corridor.E004",
                    f"{label} is the value of {example_values[value]} in .env.example"))
            if entry["kind"] in ("seed", "seeds"):
                if not StrKey.is_valid_ed25519_secret_seed(value):
                    problems.append(Problem(
                        "corridor.E006", f"{label} is not a valid Stellar secret seed"))
                elif value in seeds:
                    problems.append(Problem(
                        "corridor.E007", f"{label} is the seed of {_seed_is(seeds[value])}"))
            if entry["kind"] == "keys" and not _fernet_key(value):
                problems.append(Problem(
                    "corridor.E016", f"{label} is not a Fernet key (manage.py pii_key)"))
            other = seen.get(value)
            if other is not None and other["setting"] != name:
                problems.append(Problem(
                    "corridor.E005",
                    f"{label} reuses the value of {other['env']} ({other['role']})"))
            elif other is not None:
                problems.append(Problem("corridor.E005", f"{label} lists one seed twice"))
            seen.setdefault(value, entry)
    return problems


def _is_loopback(host: str) -> bool:
    """Loopback or unspecified, in every spelling the resolver accepts (``127.1``,
    ``0x7f.1``, ``0.0.0.0``, ``[::1]``, ``localhost``)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:  # inet_aton's short and hex forms, which ip_address refuses
            address = ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return False
    return address.is_loopback or address.is_unspecified


def url_problem(name: str, url: str) -> Problem | None:
    """Why the external base URL ``url`` (setting ``name``) points at the sandbox, or
    ``None``."""
    if not url:
        if name == "RAZORPAY_CHECKOUT_URL":
            return Problem("corridor.E011",
                           f"{name} is empty, which serves the sandbox's checkout page")
        return Problem("corridor.E011", f"{name} is empty")
    sandbox = (getattr(settings, "SANDBOX_URL", "") or "").rstrip("/")
    if sandbox and (url == sandbox or url.startswith(sandbox + "/")):
        return Problem("corridor.E011", f"{name}={url} is under SANDBOX_URL ({sandbox})")
    parts = urlsplit(url)
    path = parts.path.rstrip("/") + "/"
    for prefix in SANDBOX_PATH_PREFIXES:
        if (prefix.rstrip("/") + "/") in path:
            return Problem("corridor.E011",
                           f"{name}={url} has the sandbox's path prefix {prefix}")
    if parts.scheme == "http" and _is_loopback(parts.hostname or ""):
        return Problem("corridor.E011", f"{name}={url} is plain http to a loopback host")
    return None


# Settings whose defaults only make sense on a developer's machine (embedded PostgreSQL
# and Redis on loopback, CORRIDOR_URL from the local PORT).
REQUIRED_ENV = ("DATABASE_URL", "CELERY_BROKER_URL", "CORRIDOR_URL")


def deployment_problems() -> list[Problem]:
    """Problems outside the secrets (E008-E012): hosts, DEBUG, URLs, the sandbox."""
    problems: list[Problem] = []
    hosts = list(settings.ALLOWED_HOSTS)
    if "*" in hosts:
        problems.append(Problem("corridor.E008", "DJANGO_ALLOWED_HOSTS contains '*'"))
    elif not hosts:
        problems.append(Problem("corridor.E009", "DJANGO_ALLOWED_HOSTS is empty"))
    if settings.DEBUG:
        problems.append(Problem("corridor.E010", "DEBUG is on (DJANGO_DEBUG=true)"))
    for name in EXTERNAL_URL_SETTINGS:
        problem = url_problem(name, str(getattr(settings, name, "") or ""))
        if problem:
            problems.append(problem)
    apps = [app for app in settings.INSTALLED_APPS
            if app == "sandbox" or app.startswith("sandbox.")]
    if apps:
        problems.append(Problem("corridor.E012",
                                f"the sandbox is installed: INSTALLED_APPS has {apps}"))
    if "sandbox" in settings.DATABASES:
        problems.append(Problem("corridor.E012", "the sandbox database is in DATABASES"))
    routers = [r for r in settings.DATABASE_ROUTERS if str(r).startswith("sandbox")]
    if routers:
        problems.append(Problem("corridor.E012",
                                f"the sandbox router is in DATABASE_ROUTERS: {routers}"))
    corridor_url = urlsplit(str(getattr(settings, "CORRIDOR_URL", "") or ""))
    if os.environ.get("CORRIDOR_URL") and (corridor_url.scheme != "https"
                                           or _is_loopback(corridor_url.hostname or "")):
        problems.append(Problem("corridor.E014", "CORRIDOR_URL must be the public https URL "
                                                 "(AP and Razorpay call back to it)"))
    if not getattr(settings, "ADMIN_OTP_REQUIRED", False):
        problems.append(Problem("corridor.E014", "ADMIN_OTP_REQUIRED is off: staff would log "
                                                 "in with a password alone"))
    if not settings.SECURE_SSL_REDIRECT:
        problems.append(Problem("corridor.E014", "DJANGO_SECURE_SSL_REDIRECT is off"))
    if settings.SECURE_HSTS_SECONDS < 86400:
        problems.append(Problem("corridor.E014", "DJANGO_SECURE_HSTS_SECONDS is under a day"))
    if getattr(settings, "STELLAR_CHANNEL_SEED_SECRET", ""):
        problems.append(Problem("corridor.E015", "STELLAR_CHANNEL_SEED_SECRET is set: channel "
                                                 "seeds derived from a dev secret are sandbox "
                                                 "seeds; set STELLAR_CHANNEL_SECRETS from the "
                                                 "secret store"))
    for name in REQUIRED_ENV:
        if not os.environ.get(name, "").strip():
            problems.append(Problem("corridor.E013", f"{name} is not set: its default is "
                                                     "a development value"))
    return problems


def production_problems() -> list[Problem]:
    """Every problem that stops this configuration from starting, in the order of the
    module docstring; ``[]`` when it may start (always ``[]`` in development without
    ``DJANGO_DEBUG=false``)."""
    mode = _mode()
    if mode is None:
        return []
    problems = secret_problems()
    if mode == "production":
        problems += deployment_problems()
    return problems


@checks.register(checks.Tags.security)
def beneficiary_check(app_configs=None, **kwargs) -> list[checks.Warning]:
    """Production with FAV_REQUIRED off pays bank accounts nobody verified
    (payouts/beneficiaries.py): allowed, where RazorpayX offers no FAV, but said."""
    if _mode() == "production" and not settings.FAV_REQUIRED:
        return [checks.Warning(
            "FAV_REQUIRED is off: withdrawals pay bank accounts whose holder nobody "
            "verified", id="corridor.W001",
            hint="Turn it on where RazorpayX offers fund account validation.")]
    return []


@checks.register(checks.Tags.security)
def production_check(app_configs=None, **kwargs) -> list[checks.Error]:
    """System check: one ``Error`` per problem of ``production_problems()``."""
    return [checks.Error(p.message, id=p.id, hint=_HINT) for p in production_problems()]


_HINT = "See README.md, 'Production mode', and .env.example."


def refuse_unsafe_start() -> None:
    """Raise ``ImproperlyConfigured`` listing every problem, if there is one."""
    problems = production_problems()
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ImproperlyConfigured(
            f"Corridor refuses to start: {len(problems)} problem(s) with the "
            f"configuration ({_mode()} mode):\n{lines}\n{_HINT}")
