"""Ports from one place (issue 9, part 6): PORT and SANDBOX_PORT choose every local URL
default, Procfile.dev and make run follow them, and no other file repeats 8000 / 8100."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from honcho.environ import expand_processes, parse_procfile

from tests.conftest import ROOT

URL_SETTINGS = ["CORRIDOR_URL", "SANDBOX_URL", "HORIZON_URL", "AP_PLATFORM_URL",
                "RAZORPAY_API_URL", "ANCHOR31_URL", "SANDBOX_CALLBACK_URL",
                "SANDBOX_INTERACTIVE_URL", "SANDBOX_WEBHOOK_URL", "SANDBOX_MORE_INFO_URL"]
PORT_VARS = ["PORT", "SANDBOX_PORT"]


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without any URL or port variable (the test session sets some)."""
    env = {k: v for k, v in os.environ.items() if k not in URL_SETTINGS + PORT_VARS}
    env.pop("CORRIDOR_ENV", None)
    env.update(extra)
    return env


def _settings_in(env: dict[str, str]) -> dict[str, str]:
    """The URL settings as a fresh process with ``env`` loads them."""
    script = ("import json, django; from django.conf import settings; django.setup(); "
              f"print(json.dumps({{n: getattr(settings, n) for n in {URL_SETTINGS!r}}}))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={
        **env, "DJANGO_SETTINGS_MODULE": "corridor.settings"}, capture_output=True,
        text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _expected(port: int, sandbox_port: int) -> dict[str, str]:
    web, box = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{sandbox_port}"
    return {"CORRIDOR_URL": web, "SANDBOX_URL": box, "HORIZON_URL": f"{box}/horizon",
            "AP_PLATFORM_URL": f"{box}/ap/platform", "RAZORPAY_API_URL": f"{box}/razorpay",
            "ANCHOR31_URL": f"{box}/anchor31", "SANDBOX_CALLBACK_URL": f"{web}/callbacks",
            "SANDBOX_INTERACTIVE_URL": f"{web}/sep24/interactive",
            "SANDBOX_WEBHOOK_URL": f"{web}/webhooks/razorpay",
            "SANDBOX_MORE_INFO_URL": f"{web}/sep24/more_info"}


@pytest.mark.parametrize(("env", "port", "sandbox_port"), [
    ({"PORT": "18123", "SANDBOX_PORT": "18124"}, 18123, 18124),
    ({}, 8000, 8100),
])
def test_every_local_url_derives_from_port_and_sandbox_port(env, port, sandbox_port):
    assert _settings_in(_clean_env(**env)) == _expected(port, sandbox_port)


def test_an_explicit_url_still_wins_over_the_ports():
    got = _settings_in(_clean_env(PORT="18123", SANDBOX_PORT="18124",
                                  HORIZON_URL="https://horizon-testnet.stellar.org"))

    assert got["HORIZON_URL"] == "https://horizon-testnet.stellar.org"
    assert got["AP_PLATFORM_URL"] == "http://127.0.0.1:18124/ap/platform"


def _run_dev():
    spec = importlib.util.spec_from_file_location("run_dev", ROOT / "scripts" / "run_dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_run_gives_every_process_the_same_ports_and_urls():
    run_dev = _run_dev()
    env = run_dev.honcho_env(_clean_env(PORT="18123", SANDBOX_PORT="18124"))
    procfile = parse_procfile((ROOT / "Procfile.dev").read_text())
    # What honcho does: it hands each process its own PORT (web first, then +100, ...).
    processes = expand_processes(procfile.processes, env=env, port=int(env["PORT"]))

    expanded = {}
    for process in processes:
        penv = {**env, **process.env}
        shell = subprocess.run(["sh", "-c", f"echo {process.cmd}"], env=penv,
                               capture_output=True, text=True, check=True)
        expanded[process.name.split(".")[0]] = (shell.stdout.strip(), penv)

    assert set(expanded) == {"web", "worker", "beat", "sandbox"}
    assert "--bind 127.0.0.1:18123 " in expanded["web"][0]
    assert expanded["sandbox"][0].endswith("--addr 127.0.0.1:18124")
    for name in ("web", "worker"):  # one web process, one that honcho gave PORT=18223
        assert _settings_in(expanded[name][1]) == _expected(18123, 18124), name
    assert "-e" in run_dev.honcho_argv() and "Procfile.dev" in run_dev.honcho_argv()


# Where 8000 / 8100 may appear: corridor/ports.py (the one place) and the documented
# PORT= / SANDBOX_PORT= lines of .env.example.
_PORT_LITERAL = re.compile(r"(?<![\d.])(8000|8100)(?!\d)")
_ALLOWED_LINE = re.compile(r"^#?\s*(PORT|SANDBOX_PORT)=(8000|8100)\s*$")


def test_no_other_file_hard_codes_the_default_ports():
    files = [ROOT / "Procfile", ROOT / "Procfile.dev", ROOT / ".env.example",
             ROOT / "gunicorn.conf.py", *sorted((ROOT / "scripts").iterdir()),
             *sorted((ROOT / "corridor" / "settings").glob("*.py"))]

    offending = [f"{path.relative_to(ROOT)}:{number}: {line}"
                 for path in files if path.is_file()
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if _PORT_LITERAL.search(line) and not _ALLOWED_LINE.match(line)]

    assert offending == []
    assert "DEFAULT_PORT = 8000" in (ROOT / "corridor" / "ports.py").read_text()
