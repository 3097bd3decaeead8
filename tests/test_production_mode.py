"""Production mode (issue 9, part 1): Corridor refuses to start on unsafe configuration.

Most tests run ``manage.py check --deploy`` (and the wsgi / celery entry points) in a
subprocess with a controlled environment: nothing inherited but ``PATH``, and
``CORRIDOR_ENV_FILE=/dev/null`` so a developer's ``.env`` cannot change the outcome.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.test import override_settings
from stellar_sdk import Keypair

from corridor import checks

ROOT = Path(__file__).resolve().parent.parent
SECRET_NAME = re.compile(r"(_SECRET|_SECRETS|_TOKEN|_KEY|_PASSWORD)$|^SECRET_KEY$")


def _token(n: int = 48) -> str:
    return secrets.token_urlsafe(n)


def good_production_env() -> dict[str, str]:
    """A correct production environment: random strong secrets, real-looking hosts and
    https URLs, random Stellar seeds."""
    return {
        "CORRIDOR_ENV": "production",
        "DJANGO_SECRET_KEY": _token(),
        "DJANGO_ALLOWED_HOSTS": "corridor.example.com",
        "DJANGO_CSRF_TRUSTED_ORIGINS": "https://corridor.example.com",
        "DATABASE_URL": "postgresql://corridor:pw@db.internal:5432/corridor",
        "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
        "CORRIDOR_URL": "https://corridor.example.com",
        "HORIZON_URL": "https://horizon-testnet.stellar.org",
        "AP_PLATFORM_URL": "https://ap-platform.example.com",
        "RAZORPAY_API_URL": "https://api.razorpay.com",
        "RAZORPAY_CHECKOUT_URL": "https://corridor.example.com/pay",
        "ANCHOR31_URL": "https://anchor.example.org/sep31",
        "AP_PLATFORM_AUTH_SECRET": _token(),
        "AP_CALLBACK_AUTH_SECRET": _token(),
        "AP_INTERACTIVE_JWT_SECRET": _token(),
        "AP_MORE_INFO_JWT_SECRET": _token(),
        "RAZORPAY_KEY_ID": "rzp_live_ABCDEFGHIJKLMN",
        "RAZORPAY_KEY_SECRET": _token(18),
        "RAZORPAY_WEBHOOK_SECRET": _token(),
        "ANCHOR31_AUTH_TOKEN": _token(64),
        "METRICS_TOKEN": _token(),
        "STELLAR_DISTRIBUTION_SECRET": Keypair.random().secret,
        "STELLAR_HUB_SECRET": Keypair.random().secret,
        "STELLAR_CHANNEL_SECRETS": f"{Keypair.random().secret},{Keypair.random().secret}",
        "CORRIDOR_PII_KEYS": f"{Fernet.generate_key().decode()},{Fernet.generate_key().decode()}",
        "CORRIDOR_IDENTITY_KEY": _token(),
    }


def env_example() -> dict[str, str]:
    return checks.env_example_values(ROOT / ".env.example")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ["PATH"], "CORRIDOR_ENV_FILE": os.devnull,
            "LOG_LEVEL": "WARNING", **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=120)


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return run(env, "manage.py", "check", "--deploy")


def corridor_errors(output: str) -> list[str]:
    return re.findall(r"\(corridor\.(E\d{3})\) (.*)", output)


def assert_refused_with(result, expected: set[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert {code for code, _ in corridor_errors(output)} == expected, output


# --- manage.py check --deploy -------------------------------------------------------

def test_a_correct_production_environment_passes_clean():
    result = check_deploy(good_production_env())

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout
    assert "corridor.E" not in result.stdout + result.stderr


def test_the_env_example_values_are_refused_listing_every_problem():
    # given .env.example as it is (the sandbox's values), in production mode
    env = {**env_example(), "CORRIDOR_ENV": "production"}

    result = check_deploy(env)

    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    errors = corridor_errors(output)
    for code, text in [
        ("E002", "DJANGO_SECRET_KEY (Django signing key) is 9 characters"),
        ("E004", "DJANGO_SECRET_KEY (Django signing key) is the value of DJANGO_SECRET_KEY"),
        ("E003", "AP_PLATFORM_AUTH_SECRET (AP platform API) is a sandbox default"),
        ("E003", "AP_CALLBACK_AUTH_SECRET (AP callback API) is a sandbox default"),
        ("E003", "RAZORPAY_WEBHOOK_SECRET (Razorpay webhook) is a sandbox default"),
        ("E003", "ANCHOR31_AUTH_TOKEN (SEP-31 anchor token) is a sandbox default"),
        ("E007", "STELLAR_DISTRIBUTION_SECRET (Stellar distribution account) is the seed "
                 "of the sandbox account 'distribution'"),
        ("E007", "STELLAR_HUB_SECRET (Stellar hub account) is the seed of the sandbox "
                 "account 'hub'"),
        ("E001", "METRICS_TOKEN (metrics scrape token) is missing"),
        ("E008", "DJANGO_ALLOWED_HOSTS contains '*'"),
        ("E010", "DEBUG is on"),
        ("E011", "HORIZON_URL=http://127.0.0.1:8100/horizon is under SANDBOX_URL"),
        ("E011", "AP_PLATFORM_URL=http://127.0.0.1:8100/ap/platform is under SANDBOX_URL"),
        ("E011", "RAZORPAY_CHECKOUT_URL is empty"),
    ]:
        assert any(c == code and t.startswith(text) for c, t in errors), (code, text, output)


def _seed_of(name: str) -> str:
    raw = hashlib.sha256(f"corridor-sandbox:{name}".encode()).digest()
    return Keypair.from_raw_ed25519_seed(raw).secret


@pytest.mark.parametrize("change, expected, fragment", [
    ({"AP_CALLBACK_AUTH_SECRET": ""}, {"E001"}, "AP_CALLBACK_AUTH_SECRET (AP callback API) "
                                                "is missing"),
    ({"AP_PLATFORM_AUTH_SECRET": "x" * 31}, {"E002"},
     "AP_PLATFORM_AUTH_SECRET (AP platform API) is 31 characters, shorter than the "
     "required 32"),
    ({"AP_MORE_INFO_JWT_SECRET": "same-" + "y" * 40, "AP_INTERACTIVE_JWT_SECRET":
      "same-" + "y" * 40}, {"E005"}, "AP_MORE_INFO_JWT_SECRET (AP SEP-24 more-info JWT) "
                                     "reuses the value of AP_INTERACTIVE_JWT_SECRET"),
    ({"STELLAR_HUB_SECRET": _seed_of("hub")}, {"E003", "E007"},
     "STELLAR_HUB_SECRET (Stellar hub account) is the seed of the sandbox account 'hub'"),
    ({"STELLAR_DISTRIBUTION_SECRET": "SNOTASEED"}, {"E002", "E006"},
     "is not a valid Stellar secret seed"),
    ({"DJANGO_ALLOWED_HOSTS": "corridor.example.com,*"}, {"E008"}, "contains '*'"),
    ({"DJANGO_ALLOWED_HOSTS": ""}, {"E009"}, "DJANGO_ALLOWED_HOSTS is empty"),
    ({"DJANGO_DEBUG": "true"}, {"E010"}, "DEBUG is on"),
    ({"HORIZON_URL": "http://127.0.0.1:8100/horizon"}, {"E011"}, "HORIZON_URL="),
    ({"AP_PLATFORM_URL": "https://ap.example.com/ap/platform"}, {"E011"},
     "has the sandbox's path prefix /ap/platform"),
])
def test_each_single_problem_is_refused(change, expected, fragment):
    result = check_deploy({**good_production_env(), **change})

    assert_refused_with(result, expected)
    assert fragment in result.stdout + result.stderr


@pytest.mark.parametrize("name", ["DATABASE_URL", "CELERY_BROKER_URL", "CORRIDOR_URL"])
def test_a_development_default_left_unset_is_refused(name):
    env = good_production_env()
    del env[name]

    result = check_deploy(env)

    assert_refused_with(result, {"E013"})
    assert f"{name} is not set" in result.stdout + result.stderr


@pytest.mark.parametrize("change, fragment", [
    ({"CORRIDOR_URL": "http://corridor.example.com"}, "CORRIDOR_URL must be the public https"),
    ({"CORRIDOR_URL": "https://127.0.0.1:8000"}, "CORRIDOR_URL must be the public https"),
    ({"ADMIN_OTP_REQUIRED": "false"}, "ADMIN_OTP_REQUIRED is off"),
    ({"DJANGO_SECURE_SSL_REDIRECT": "false"}, "DJANGO_SECURE_SSL_REDIRECT is off"),
    ({"DJANGO_SECURE_HSTS_SECONDS": "0"}, "DJANGO_SECURE_HSTS_SECONDS is under a day"),
])
def test_a_weakened_deployment_is_refused(change, fragment):
    """Found by the fresh-clone trial: each of these passed check --deploy."""
    result = check_deploy({**good_production_env(), **change})

    assert_refused_with(result, {"E014"})
    assert fragment in result.stdout + result.stderr


def test_a_seed_reused_across_roles_is_refused():
    env = good_production_env()
    env["STELLAR_CHANNEL_SECRETS"] = env["STELLAR_HUB_SECRET"]

    result = check_deploy(env)

    assert_refused_with(result, {"E005"})
    assert ("STELLAR_CHANNEL_SECRETS (Stellar channel account) reuses the value of "
            "STELLAR_HUB_SECRET") in result.stdout + result.stderr


def test_production_settings_have_no_sandbox_and_no_sandbox_secrets():
    # given production mode and no secret in the environment
    code = ("import corridor.settings.production as p; "
            "print(p.CORRIDOR_ENV, [a for a in p.INSTALLED_APPS if 'sandbox' in a], "
            "sorted(p.DATABASES), p.DATABASE_ROUTERS, p.SESSION_EXPIRE_AT_BROWSER_CLOSE, "
            "p.ADMIN_OTP_REQUIRED, p.SECURE_SSL_REDIRECT, p.SESSION_COOKIE_SECURE, "
            "repr(p.AP_PLATFORM_AUTH_SECRET), repr(p.STELLAR_HUB_SECRET), repr(p.SECRET_KEY), "
            "p.STELLAR_CHANNEL_SECRETS, repr(p.ANCHOR31_AUTH_TOKEN))")
    result = run({"CORRIDOR_ENV": "production"}, "-c", code)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("production [] ['default'] [] True True True True "
                                     "'' '' '' [] ''")


# --- entry points that run no system checks ---------------------------------------------

def test_gunicorn_wsgi_import_refuses_in_production_with_the_bad_environment():
    env = {**env_example(), "CORRIDOR_ENV": "production"}

    result = run(env, "-c", "import corridor.wsgi")

    assert result.returncode == 1
    assert "ImproperlyConfigured: Corridor refuses to start:" in result.stderr
    for fragment in ["corridor.E003 AP_PLATFORM_AUTH_SECRET", "corridor.E008",
                     "corridor.E010", "corridor.E001 METRICS_TOKEN"]:
        assert fragment in result.stderr, result.stderr


def test_celery_app_refuses_in_production_with_the_bad_environment():
    env = {**env_example(), "CORRIDOR_ENV": "production"}

    result = run(env, "-c", "from corridor.celery import app; import django; django.setup()")

    assert result.returncode == 1
    assert "Corridor refuses to start:" in result.stderr
    assert "corridor.E007 STELLAR_HUB_SECRET" in result.stderr


def test_wsgi_and_celery_start_with_a_correct_production_environment():
    result = run(good_production_env(), "-c",
                 "import corridor.wsgi; from corridor.celery import app; "
                 "print(app.main, corridor.wsgi.application.__class__.__name__)")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "corridor WSGIHandler"


def test_migrate_refuses_at_startup_in_production_too():
    env = {**good_production_env(), "DJANGO_DEBUG": "true"}

    result = run(env, "manage.py", "migrate", "--plan")

    assert result.returncode == 1
    assert "Corridor refuses to start: 1 problem(s)" in result.stderr
    assert "corridor.E010 DEBUG is on" in result.stderr


# --- DJANGO_DEBUG=false outside production: the secrets part ----------------------------

def test_debug_false_in_development_applies_the_secrets_part():
    # given development mode (no CORRIDOR_ENV) with DJANGO_DEBUG=false and no secrets set
    result = check_deploy({"DJANGO_DEBUG": "false"})

    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    codes = {code for code, _ in corridor_errors(output)}
    # the sandbox defaults are refused, METRICS_TOKEN is missing ...
    assert codes == {"E001", "E002", "E003", "E007"}, output
    assert "AP_PLATFORM_AUTH_SECRET (AP platform API) is a sandbox default" in output
    # ... but not the rest of production mode: '*' hosts, sandbox URLs, the sandbox app
    assert "E008" not in output and "E011" not in output and "E012" not in output


def test_debug_false_in_development_with_good_secrets_passes():
    env = {k: v for k, v in good_production_env().items() if k != "CORRIDOR_ENV"}

    result = run({**env, "DJANGO_DEBUG": "false"}, "manage.py", "check")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "corridor.E" not in result.stdout + result.stderr


def test_development_without_debug_false_is_not_checked():
    result = run({}, "manage.py", "check")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_nothing_in_make_test_or_make_demo_sets_django_debug_false():
    files = [ROOT / "Makefile", ROOT / "Procfile", ROOT / "Procfile.dev",
             ROOT / "tests" / "conftest.py", ROOT / "tests" / "flows.py",
             *(ROOT / "scripts").glob("*.py"), *(ROOT / "bench").glob("*.py"),
             *(ROOT / "corridor" / "management" / "commands").glob("*.py"),
             *(ROOT / "corridor").glob("devservices.py")]
    offenders = [str(f) for f in files
                 if re.search(r"DJANGO_DEBUG\W+(false|0|no|off)\b", f.read_text(), re.I)]

    assert offenders == []


# --- the registry and the data the check relies on --------------------------------------

def unregistered_secret_names(namespace: dict, registry, sandbox_only) -> list[str]:
    registered = {entry["setting"] for entry in registry} | set(sandbox_only)
    return sorted(name for name in namespace
                  if name.isupper() and SECRET_NAME.search(name) and name not in registered)


def test_every_setting_named_like_a_secret_is_in_the_registry():
    from corridor.settings import base

    names: dict = {}
    for module in ("corridor.settings.base", "corridor.settings.development",
                   "corridor.settings.production"):
        names.update(vars(importlib.import_module(module)))

    assert unregistered_secret_names(names, base.SECRET_SETTINGS,
                                     base.SANDBOX_ONLY_SECRET_SETTINGS) == []
    # and the same look-up does catch a key added later without registering it
    assert unregistered_secret_names({**names, "PAYOUT_WEBHOOK_TOKEN": "x", "FOO_KEY": "y"},
                                     base.SECRET_SETTINGS,
                                     base.SANDBOX_ONLY_SECRET_SETTINGS) == [
        "FOO_KEY", "PAYOUT_WEBHOOK_TOKEN"]


def test_every_registered_secret_is_documented_in_env_example():
    from corridor.settings import base

    documented = set(env_example())
    assert [e["env"] for e in base.SECRET_SETTINGS if e["env"] not in documented] == []


def test_the_check_knows_every_sandbox_account_seed():
    from sandbox import keys
    from sandbox.horizon import service

    known = checks.sandbox_seeds()
    for keypair in (keys.USDC_ISSUER, keys.DISTRIBUTION, keys.HUB, keys.PARTNER,
                    keys.ANCHOR31, *(keys.sandbox_keypair(n) for n in service.CHANNELS),
                    *(keys.sandbox_keypair(n) for n in service.MINIONS)):
        assert keypair.secret in known


def test_sandbox_defaults_of_base_are_all_refused():
    from corridor.settings import base

    assert base.SECRET_KEY in base.SANDBOX_SECRET_VALUES
    assert base.STELLAR_HUB_SECRET in checks.sandbox_seeds()
    assert base.STELLAR_DISTRIBUTION_SECRET in checks.sandbox_seeds()


@override_settings(CORRIDOR_ENV="production", DEBUG=False, ALLOWED_HOSTS=["a.example"],
                   HORIZON_URL="https://horizon.stellar.org", AP_PLATFORM_URL="https://ap.example",
                   RAZORPAY_API_URL="https://api.razorpay.com",
                   ANCHOR31_URL="https://anchor.example",
                   RAZORPAY_CHECKOUT_URL="https://a.example/pay")
def test_the_sandbox_installed_is_refused():
    # the test process runs development settings: the sandbox app, database and router
    problems = [p for p in checks.deployment_problems() if p.id == "corridor.E012"]

    assert [p.message.split(":")[0] for p in problems] == [
        "the sandbox is installed", "the sandbox database is in DATABASES",
        "the sandbox router is in DATABASE_ROUTERS"]


@pytest.mark.parametrize("url, refused", [
    ("https://horizon-testnet.stellar.org", False),
    ("https://api.razorpay.com", False),
    ("http://10.0.0.5:8085", False),
    ("http://127.0.0.1:8085", True),
    ("http://[::1]:8085", True),
    ("http://localhost/horizon", True),
    ("http://127.1:8000/x", True),
    ("http://0.0.0.0:8000/x", True),
    ("http://0x7f.1/x", True),
    ("https://sandbox.example.com/razorpay", True),
    ("https://sandbox.example.com/sandbox/faults", True),
    ("", True),
])
@override_settings(SANDBOX_URL="https://sandbox.test")
def test_url_problem(url, refused):
    assert (checks.url_problem("HORIZON_URL", url) is not None) is refused


# --- issue 25 §4: every key derivable from this repository is refused -------------------

def test_production_refuses_every_seed_derivable_from_the_repository():
    """The seeds come from the derivation the sandbox itself uses (common/devkeys.py),
    not from a copy: each sandbox account, each network root, each development channel
    of a seed secret written in the repository. One check with every one of them as a
    channel seed must refuse each (E007)."""
    from django.conf import settings

    from common import devkeys

    derivable = devkeys.derivable_seeds(settings.STELLAR_NETWORK_PASSPHRASE)
    assert len(derivable) >= len(devkeys.SANDBOX_ACCOUNT_NAMES) + 2 + \
        len(devkeys.DEV_CHANNEL_SECRETS) * devkeys.DEV_CHANNELS_PER_SECRET

    with override_settings(STELLAR_CHANNEL_SECRETS=list(derivable)):
        problems = checks.secret_problems()

    refused = [p.message for p in problems
               if p.id == "corridor.E007" and p.message.startswith("STELLAR_CHANNEL_SECRETS")]
    assert len(refused) == len(derivable), \
        f"{len(derivable) - len(refused)} of {len(derivable)} derivable seeds pass"
    assert any(m.endswith("is the seed of the sandbox account 'sender31'") for m in refused)
    assert any(m.endswith("development channel my-dev-secret:20") for m in refused)


def test_every_key_the_sandbox_derives_is_in_the_derivable_list():
    """The sandbox's keys are made by devkeys.sandbox_keypair, which refuses a name it
    does not list: a new sandbox account cannot escape the production check."""
    from django.conf import settings

    from common import devkeys
    from sandbox import keys
    from sandbox.ap import sep10
    from sandbox.horizon import core, service

    derivable = devkeys.derivable_seeds(settings.STELLAR_NETWORK_PASSPHRASE)
    sandbox_keys = [keys.USDC_ISSUER, keys.DISTRIBUTION, keys.HUB, keys.PARTNER,
                    keys.ANCHOR31, keys.SENDER31, sep10.SIGNING_KEY,
                    core.root_keypair(settings.STELLAR_NETWORK_PASSPHRASE),
                    *(keys.sandbox_keypair(n) for n in service.CHANNELS),
                    *(keys.sandbox_keypair(n) for n in service.MINIONS)]
    assert [k.public_key for k in sandbox_keys if k.secret not in derivable] == []
    with pytest.raises(ValueError, match="not in SANDBOX_ACCOUNT_NAMES"):
        keys.sandbox_keypair("a-new-account")


def test_every_channel_seed_secret_written_in_the_repository_is_listed():
    from common import devkeys

    # a Python assignment or keyword with a quoted value, or a shell or .env line
    literal = re.compile(r"""SEED_SECRET\s*=\s*["']([^"'\s]+)["']|SEED_SECRET=([\w.-]+)""")
    found = set()
    for path in [*ROOT.glob("*.md"), ROOT / ".env.example", ROOT / "Makefile",
                 *(p for p in ROOT.rglob("*.py") if not {".venv", "node_modules"} &
                   set(p.relative_to(ROOT).parts))]:
        for match in literal.finditer(path.read_text(errors="replace")):
            value = match.group(1) or match.group(2)
            if not value.isupper() and value != "...":  # a name, or an elided value
                found.add(value)
    assert found - set(devkeys.DEV_CHANNEL_SECRETS) == set()


def test_a_sandbox_anchor31_token_is_refused():
    with override_settings(ANCHOR31_AUTH_TOKEN="sandbox-sep31:" + Keypair.random().public_key):
        problems = checks.secret_problems()

    assert any(p.id == "corridor.E003" and "ANCHOR31_AUTH_TOKEN" in p.message
               for p in problems), problems
