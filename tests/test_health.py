"""Liveness (``GET /health/``: no outbound call at all) and readiness (``GET
/health/ready``: five dependencies, concurrently, bounded, ``ok``/``fail`` only)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from django.db import connection
from django.urls import reverse

from corridor.stranded import KINDS
from tests.conftest import ROOT, free_port

CHECKS = {"database", "broker", "horizon", "anchor_platform", "razorpay"}

# Runs /health/ in a fresh process whose database, broker and sandbox are closed ports,
# with every Python-level connect recorded (redis-py and httpx use the socket module;
# libpq does not, which is why the database URL itself points nowhere).
_LIVENESS_SCRIPT = r"""
import json, socket, sys, time
attempts = []
def refuse(self, address, *a, **k):
    attempts.append(repr(address))
    raise ConnectionRefusedError(f"test: no connection to {address!r}")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
import django
django.setup()
from django.test import Client
client = Client()
first = client.get("/health/")  # the first request also imports the URLconf
started = time.monotonic()
response = client.get("/health/")
elapsed = time.monotonic() - started
assert first.status_code == response.status_code
print(json.dumps({"status": response.status_code, "body": response.json(),
                  "elapsed": elapsed, "attempts": attempts}))
"""


def test_health_is_liveness_only_and_makes_no_outbound_call():
    closed = free_port()
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "corridor.settings",
           "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{closed}/corridor",
           "SANDBOX_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{closed}/sandbox",
           "CELERY_BROKER_URL": f"redis://127.0.0.1:{closed}/0",
           "SANDBOX_URL": f"http://127.0.0.1:{closed}", "CORRIDOR_URL": "http://127.0.0.1:1"}

    done = subprocess.run([sys.executable, "-c", _LIVENESS_SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["status"], result["body"]) == (200, {"status": "ok"})
    assert result["attempts"] == []
    assert result["elapsed"] < 0.5


def test_readiness_has_its_own_url():
    assert reverse("health-ready") == "/health/ready"
    assert reverse("health") == "/health/"


@pytest.mark.django_db(transaction=True)
def test_readiness_is_ok_with_every_dependency_up(client, sandbox):
    response = client.get("/health/ready")

    assert response.status_code == 200, response.json()
    assert response.json() == {"status": "ok", "checks": dict.fromkeys(CHECKS, "ok"),
                               "oldest_stuck": {"release": None, "payout": None,
                                                "saga": None},
                               "stranded": dict.fromkeys(KINDS, 0)}


@pytest.mark.django_db(transaction=True)
def test_readiness_fails_on_a_rejected_razorpay_key(client, sandbox, settings):
    settings.RAZORPAY_KEY_SECRET = "wrong-secret-for-readiness"

    response = client.get("/health/ready")

    assert response.status_code == 503
    assert response.json()["checks"] == {**dict.fromkeys(CHECKS, "ok"), "razorpay": "fail"}


@pytest.mark.django_db
def test_readiness_fails_without_leaking_what_the_dependencies_said(client, settings,
                                                                     monkeypatch):
    closed = free_port()
    settings.HORIZON_URL = f"http://127.0.0.1:{closed}/horizon-private-path"
    settings.AP_PLATFORM_URL = f"http://127.0.0.1:{closed}/ap-private-path"
    settings.RAZORPAY_API_URL = f"http://127.0.0.1:{closed}/rzp-private-path"
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{closed}/0"
    monkeypatch.setitem(connection.settings_dict, "PORT", closed)

    response = client.get("/health/ready")

    assert response.status_code == 503
    assert response.json() == {"status": "fail", "checks": dict.fromkeys(CHECKS, "fail"),
                               "oldest_stuck": None, "stranded": None}
    text = response.content.decode()
    for leak in ("127.0.0.1", str(closed), "private-path", "refused", "Error", "redis",
                 "http"):
        assert leak not in text, leak


class Silent:
    """A TCP server that accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self.stop.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.mark.django_db
def test_readiness_is_bounded_when_dependencies_hang(client, settings):
    silent = Silent()
    settings.READINESS_TIMEOUT_S = 0.4
    settings.HORIZON_URL = f"http://127.0.0.1:{silent.port}/horizon"
    settings.AP_PLATFORM_URL = f"http://127.0.0.1:{silent.port}/ap/platform"
    settings.RAZORPAY_API_URL = f"http://127.0.0.1:{silent.port}/razorpay"
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{silent.port}/0"
    try:
        started = time.monotonic()
        response = client.get("/health/ready")
        elapsed = time.monotonic() - started
    finally:
        silent.close()

    checks = response.json()["checks"]
    assert response.status_code == 503
    assert checks == {**dict.fromkeys(CHECKS, "fail"), "database": "ok"}
    # Four hanging checks one after another would take 1.6 s.
    assert elapsed < 1.0, elapsed


# --- issue 25 §4: readiness tells strangers nothing and costs nothing -----------------

class Counting:
    """An HTTP server that answers 200 ``{}`` to every GET and counts them."""

    def __init__(self):
        import http.server

        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                hits.append(self.path)
                body = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.django_db
def test_readiness_calls_each_third_party_once_per_cache_period(client, settings):
    outside = Counting()
    settings.HORIZON_URL = f"{outside.url}/horizon"
    settings.AP_PLATFORM_URL = f"{outside.url}/ap"
    settings.RAZORPAY_API_URL = f"{outside.url}/rzp"
    settings.READINESS_CACHE_S = 60
    try:
        answers = [client.get("/health/ready") for _ in range(5)]
    finally:
        outside.close()

    assert {a.status_code for a in answers} == {200}
    # One call per dependency for five readiness requests, not five each.
    assert sorted(outside.hits) == ["/ap/health", "/horizon/", "/rzp/v1/orders?count=1"]


@pytest.mark.django_db
def test_an_anonymous_readiness_answer_carries_no_internal_figures(client, settings):
    settings.METRICS_TOKEN = "m" * 40
    settings.HORIZON_URL = f"http://127.0.0.1:{free_port()}/horizon"  # fails fast, cached

    anonymous = client.get("/health/ready").json()
    wrong = client.get("/health/ready", HTTP_AUTHORIZATION="Bearer nope").json()
    scraper = client.get("/health/ready", HTTP_AUTHORIZATION="Bearer " + "m" * 40).json()

    assert set(anonymous) == set(wrong) == {"status", "checks"}
    assert set(scraper) == {"status", "checks", "oldest_stuck", "stranded"}
    assert scraper["stranded"] == dict.fromkeys(KINDS, 0)
