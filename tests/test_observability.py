"""Observability: JSON log lines with the flow's ids and nothing secret in them, the
Prometheus metrics at /metrics, the stuck ages of /health/ready, and every process's own
lines (gunicorn, the Celery worker and beat) as JSON.

The full-flow test drives a deposit and a withdrawal through the sandbox over real HTTP
(Corridor's live server in this process, so its log lines are captured here) and reads
every line back."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from structlog.contextvars import bound_contextvars, get_contextvars

from anchor import deposits, platform, releases
from anchor.models import DepositOrder, DepositPayment, DepositRelease
from corridor.logging import json_formatter
from payouts import guard, poller
from payouts.models import WithdrawalPayout, WithdrawalRequest
from sagas import engine
from tests.factories import (
    DepositOrderFactory,
    DepositPaymentFactory,
    DepositReleaseFactory,
    PayoutAttemptFactory,
    StellarReceiptFactory,
    WithdrawalPayoutFactory,
    WithdrawalRequestFactory,
)
from tests.flows import Customer, Wallet, wait_for

ACCOUNT_NUMBER = "50100123456789"
SECRET_SETTINGS = ["SECRET_KEY", "AP_PLATFORM_AUTH_SECRET", "AP_CALLBACK_AUTH_SECRET",
                   "AP_INTERACTIVE_JWT_SECRET", "AP_MORE_INFO_JWT_SECRET",
                   "RAZORPAY_KEY_SECRET", "RAZORPAY_WEBHOOK_SECRET",
                   "STELLAR_DISTRIBUTION_SECRET", "SANDBOX_AP_SEP10_JWT_SECRET",
                   "RAZORPAYX_ACCOUNT_NUMBER"]


class Capture(logging.Handler):
    """Every record reaching the root logger: its raw message and the JSON line the
    configured formatter makes of it (formatted where it was logged, so with the
    context of that thread)."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.setFormatter(json_formatter())
        self.raw: list[str] = []
        self.lines: list[str] = []

    def emit(self, record):
        self.raw.append(record.getMessage())
        self.lines.append(self.format(record))

    def parsed(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]


@pytest.fixture
def captured():
    handler = Capture()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


def probe(what: str = "probe"):
    """A stand-in dependency that logs one line from inside the code under test."""
    def log_and_return(*_args, **_kwargs):
        logging.getLogger("tests.probe").info(what)
        return None
    return log_and_return


def probe_line(captured: Capture) -> dict:
    lines = [line for line in captured.parsed() if line["logger"] == "tests.probe"]
    assert len(lines) == 1, lines
    return lines[0]


# --- log format and redaction ----------------------------------------------------------

def test_lines_are_json_with_the_bound_context_and_extras(captured):
    log = logging.getLogger("anchor.somewhere")

    with bound_contextvars(request_id="req-1", transaction_id="tx-1"):
        log.info("released %s", "12.5 USDC", extra={"attempt": 2})
    log.warning("outside")

    first, second = captured.parsed()
    assert first["event"] == "released 12.5 USDC"
    assert (first["level"], first["logger"]) == ("info", "anchor.somewhere")
    assert (first["request_id"], first["transaction_id"], first["attempt"]) == ("req-1",
                                                                                 "tx-1", 2)
    assert first["timestamp"].endswith("Z")
    assert "transaction_id" not in second and "request_id" not in second


def test_the_configured_root_handler_writes_json_lines():
    formatters = [h.formatter for h in logging.getLogger().handlers
                  if type(h) is logging.StreamHandler]
    assert formatters, logging.getLogger().handlers
    record = logging.LogRecord("payouts.guard", logging.INFO, __file__, 1, "paid %s", ("x",),
                               None)

    assert json.loads(formatters[0].format(record))["event"] == "paid x"


def test_secrets_tokens_and_bank_details_are_masked_wherever_they_appear(captured):
    secrets = [getattr(settings, name) for name in SECRET_SETTINGS]
    jwt_token = "eyJhbGciOiJIUzI1NiJ9.eyJqdGkiOiJ0eC0xIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
    seed = "SCZANGBA5YHTNYVVV4C3U252E2B6P6F5T3U6MM63WBSBZATAQI3EBTQ4"
    log = logging.getLogger("anchor.leaky")

    log.info("GET /sep24/interactive?transaction_id=tx-1&token=%s 200", jwt_token)
    log.info("settings dump %s", " ".join(secrets))
    log.info("signed with %s", seed)
    log.info("refused: account number %s, upi asha.verma@okhdfc", ACCOUNT_NUMBER)
    log.info("body %s", json.dumps({"account_number": ACCOUNT_NUMBER, "ifsc": "HDFC0001234"}))
    log.info("beneficiary", extra={"account_number": ACCOUNT_NUMBER, "vpa": "asha@okhdfc",
                                   "api_token": "tok-123456789"})

    text = "\n".join(captured.lines)
    assert all(secret in "\n".join(captured.raw) for secret in secrets)  # they were logged
    for needle in [*secrets, jwt_token, seed, ACCOUNT_NUMBER, "asha.verma", "asha@",
                   "tok-123456789"]:
        assert needle not in text, needle
    lines = captured.parsed()
    assert lines[3]["event"] == "refused: account number ****6789, upi ****@okhdfc"
    assert lines[5]["account_number"] == "****6789" and lines[5]["vpa"] == "****@okhdfc"
    assert "HDFC0001234" in lines[4]["event"]  # a branch code is not a secret


_EARLY_LINE_SCRIPT = r"""
import logging
from corridor.logging import json_formatter
formatter = json_formatter()
# A gunicorn master formats lines before Django is set up; its workers fork from it.
formatter.format(logging.LogRecord("gunicorn.error", logging.INFO, "", 1, "early", (), None))
import django
django.setup()
from django.conf import settings
print(formatter.format(logging.LogRecord("gunicorn.error", logging.INFO, "", 1, "late %s",
                                         (settings.AP_PLATFORM_AUTH_SECRET,), None)))
"""


def test_secrets_are_masked_even_after_a_line_logged_before_settings_were_ready():
    from tests.conftest import ROOT

    done = subprocess.run([sys.executable, "-c", _EARLY_LINE_SCRIPT], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ,
                               "DJANGO_SETTINGS_MODULE": "corridor.settings"})

    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["event"] == "late [REDACTED]"


# --- ids bound at the entry points -------------------------------------------------------

@pytest.mark.django_db
def test_release_start_binds_the_transaction_id(captured, monkeypatch):
    order = DepositOrderFactory()
    DepositPaymentFactory(transaction_id=order.transaction_id, order_id=order.order_id)
    monkeypatch.setattr(releases.platform, "get_transaction", probe())

    with pytest.raises(releases.ReleaseRefused):
        releases.release_start(transaction_id=order.transaction_id)

    assert probe_line(captured)["transaction_id"] == order.transaction_id
    assert "transaction_id" not in get_contextvars()  # unbound on the way out


@pytest.mark.django_db
def test_release_drive_binds_the_transaction_id(captured, monkeypatch):
    release = DepositReleaseFactory(status=DepositRelease.Status.SUBMITTED)
    monkeypatch.setattr(releases, "_drive", lambda r, redrive: probe()() or r)

    releases.release_drive(release_id=release.pk)

    assert probe_line(captured)["transaction_id"] == release.transaction_id


@pytest.mark.django_db
def test_deposit_services_bind_the_transaction_id(captured, monkeypatch):
    order = DepositOrderFactory()
    monkeypatch.setattr(deposits.platform, "get_transaction", probe())
    with pytest.raises(deposits.DepositStateError):
        deposits.deposit_submit(transaction_id="tx-submit", amount_in=Decimal("1000"))
    # A payment of the wrong amount is logged from inside payment_record.
    outcome = deposits.payment_record(payment={"id": "pay_x", "order_id": order.order_id,
                                               "status": "captured", "amount": 1,
                                               "currency": "INR"})

    lines = captured.parsed()
    assert outcome == "amount_mismatch"
    assert [line.get("transaction_id") for line in lines] == ["tx-submit",
                                                               order.transaction_id]


def _withdrawal(transaction_id: str, **extra) -> WithdrawalRequest:
    return WithdrawalRequestFactory(transaction_id=transaction_id, memo="42", memo_type="id",
                                    funds_requested_at=timezone.now(), **extra)


@pytest.mark.django_db
def test_withdrawal_process_and_the_guard_bind_the_transaction_id(captured, monkeypatch):
    _withdrawal("tx-w1")
    payout = WithdrawalPayoutFactory(transaction_id="tx-w2", amount_paise=79800,
                                     fund_account_id="fa_1")
    PayoutAttemptFactory(payout=payout, number=1, provider_payout_id="pout_1")

    class Provider:
        def fetch(self, _payout_id):
            probe()()
            raise RuntimeError("provider down")

    monkeypatch.setattr(poller.receipts, "verify",
                        lambda *a, **k: probe()() or poller.receipts.Verdict("waiting"))
    monkeypatch.setattr(guard, "provider", lambda: Provider())

    assert poller.withdrawal_process(ap_tx={"id": "tx-w1", "status": "pending_anchor"}) == \
        "waiting"
    guard.payout_resume(payout=payout)

    assert [line["transaction_id"] for line in captured.parsed()] == ["tx-w1", "tx-w2"]


@pytest.mark.django_db(transaction=True)
def test_a_saga_run_binds_the_saga_id(captured, monkeypatch):
    saga = engine.start(kind="testing", reference=f"obs-{uuid.uuid4()}",
                        input={"amount": "10.00"}, dispatch=False)
    monkeypatch.setattr(engine._Run, "drive", lambda self: probe()() or "running")

    engine.run(saga.id, "probe-worker", dispatch=False)

    assert probe_line(captured)["saga_id"] == saga.id


@pytest.mark.django_db
def test_a_celery_task_binds_its_task_id_and_the_transaction_it_takes(captured):
    from anchor import tasks

    with bound_contextvars(request_id="outer"):
        result = tasks.deposit_release.apply(args=["tx-task"])  # eager, as in-process
        after = get_contextvars()

    line = next(line for line in captured.parsed() if "not started" in line["event"])
    assert (line["task_id"], line["task_name"]) == (result.id, "anchor.tasks.deposit_release")
    assert line["transaction_id"] == "tx-task"
    assert line["request_id"] == "outer"
    assert after == {"request_id": "outer"}  # the task's ids are gone, the caller's kept


@pytest.mark.django_db
def test_requests_carry_a_request_id_echoed_in_the_response(client, captured):
    given = client.post("/callbacks/event", b"{}", content_type="application/json",
                        HTTP_X_REQUEST_ID="edge-4711")
    fresh = client.post("/callbacks/event", b"{}", content_type="application/json",
                        HTTP_X_REQUEST_ID="not a valid id!")

    assert given["X-Request-Id"] == "edge-4711"
    assert re.fullmatch(r"[0-9a-f]{32}", fresh["X-Request-Id"])
    by_request = {}
    for line in captured.parsed():
        by_request.setdefault(line.get("request_id"), []).append(line)
    # The event's outcome rides on the request's own line (no line of its own).
    assert [(x["logger"], x.get("outcome"), x.get("status"))
            for x in by_request["edge-4711"]] == [
        ("corridor.request", "unauthorized", 401),
        ("django.request", "unauthorized", None)]
    assert len(by_request[fresh["X-Request-Id"]]) == 2
    assert get_contextvars() == {}


# --- metrics and health ---------------------------------------------------------------

def _sample(text: str, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                return sample.value
    return None


def _known_state(now):
    """Releases: 2 completed, 1 manual_review, 1 submitting since 120 s. Payouts: 1
    completed, 1 processing since 300 s. Sagas: 1 running, due 60 s ago, no lease; 1
    completed."""
    DepositReleaseFactory.create_batch(2)
    DepositReleaseFactory(status=DepositRelease.Status.MANUAL_REVIEW)
    stuck = DepositReleaseFactory(status=DepositRelease.Status.SUBMITTING)
    DepositRelease.objects.filter(pk=stuck.pk).update(created_at=now - timedelta(seconds=120))
    WithdrawalPayoutFactory(transaction_id="tx-done", amount_paise=100, fund_account_id="fa",
                            status="completed")
    slow = WithdrawalPayoutFactory(transaction_id="tx-slow", amount_paise=100,
                                   fund_account_id="fa")
    WithdrawalPayout.objects.filter(pk=slow.pk).update(created_at=now - timedelta(seconds=300))
    for status, due_s in (("running", 60), ("completed", 600)):
        saga = engine.start(kind="testing", reference=f"obs-{uuid.uuid4()}",
                            input={"amount": "10.00"}, dispatch=False)
        from sagas.models import Saga

        Saga.objects.filter(pk=saga.id).update(status=status,
                                                wake_at=now - timedelta(seconds=due_s))


@pytest.mark.django_db
def test_metrics_report_rows_by_status_lags_and_outcomes(client):
    before = client.get("/metrics").content.decode()
    _known_state(timezone.now())

    client.post("/webhooks/razorpay/payments", b"{}", content_type="application/json",
                HTTP_X_RAZORPAY_SIGNATURE="forged")
    client.post("/webhooks/razorpay/payouts", b"{}", content_type="application/json",
                HTTP_X_RAZORPAY_SIGNATURE="forged")
    client.post("/callbacks/event", b"{}", content_type="application/json")
    response = client.get("/metrics")

    text = response.content.decode()
    assert response.status_code == 200
    releases_by = {s: _sample(text, "corridor_deposit_releases", status=s)
                   for s in ("submitting", "submitted", "failed", "completed", "manual_review")}
    assert releases_by == {"submitting": 1, "submitted": 0, "failed": 0, "completed": 2,
                           "manual_review": 1}
    assert _sample(text, "corridor_withdrawal_payouts", status="processing") == 1
    assert _sample(text, "corridor_withdrawal_payouts", status="completed") == 1
    assert _sample(text, "corridor_withdrawal_payouts", status="reversed") == 0
    assert _sample(text, "corridor_sagas", status="running") == 1
    assert _sample(text, "corridor_sagas", status="completed") == 1
    assert 119 <= _sample(text, "corridor_reconciler_lag_seconds") < 150
    assert 299 <= _sample(text, "corridor_poller_lag_seconds", queue="payout_processing") < 330
    assert _sample(text, "corridor_poller_lag_seconds", queue="withdrawal_awaiting") == 0
    assert 59 <= _sample(text, "corridor_oldest_stuck_seconds", kind="saga") < 90
    assert _sample(text, "corridor_metrics_scrape_errors") == 0
    for labels, name in (({"source": "razorpay", "outcome": "invalid_signature"},
                          "corridor_webhooks_total"),
                         ({"source": "razorpayx", "outcome": "invalid_signature"},
                          "corridor_webhooks_total"),
                         ({"outcome": "unauthorized"}, "corridor_ap_events_total")):
        assert _sample(text, name, **labels) == (_sample(before, name, **labels) or 0) + 1
    # django-prometheus's own, from its middlewares.
    assert _sample(text, "django_http_requests_total_by_method_total", method="POST") >= 3


@pytest.mark.django_db
def test_poller_lag_counts_a_receipt_whose_withdrawal_has_no_payout(client):

    w = _withdrawal("tx-lag", destination="GDEST")
    StellarReceiptFactory(
        paging_token="1", tx_hash="ab" * 32, from_account="GSRC", to_account="GDEST",
        asset="USDC:GISSUER", amount=Decimal("10"), memo_type="id", memo=w.memo,
        created_at=timezone.now() - timedelta(seconds=45))

    text = client.get("/metrics").content.decode()

    assert 44 <= _sample(text, "corridor_poller_lag_seconds", queue="withdrawal_awaiting") < 75


@pytest.mark.django_db
def test_health_reports_the_age_of_the_oldest_stuck_release_payout_and_saga(client):
    empty = client.get("/health/ready").json()["oldest_stuck"]
    _known_state(timezone.now())

    stuck = client.get("/health/ready").json()["oldest_stuck"]

    assert empty == {"release": None, "payout": None, "saga": None}
    assert 119 <= stuck["release"] < 150
    assert 299 <= stuck["payout"] < 330
    assert 59 <= stuck["saga"] < 90


@pytest.mark.django_db
def test_a_saga_with_a_live_lease_or_a_future_wake_is_not_stuck(client):
    from sagas.models import Saga

    now = timezone.now()
    for lease_until, wake_at in ((now + timedelta(seconds=60), now - timedelta(seconds=60)),
                                 (None, now + timedelta(seconds=60))):
        saga = engine.start(kind="testing", reference=f"obs-{uuid.uuid4()}",
                            input={"amount": "10.00"}, dispatch=False)
        Saga.objects.filter(pk=saga.id).update(
            wake_at=wake_at, lease_until=lease_until,
            lease_owner="worker-1" if lease_until else "")

    assert client.get("/health/ready").json()["oldest_stuck"]["saga"] is None


# --- a full deposit and withdrawal, every line read back ------------------------------

def _drive_deposit(sandbox, wallet) -> tuple[str, str]:
    transaction_id, url = wallet.start_deposit()
    customer = Customer(sandbox)
    order_id = customer.submit_amount(url, "1000")
    customer.pay(order_id)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    # What the worker's task does (in this process, so its lines are captured here).
    deposits.funds_received(transaction_id=transaction_id)
    wait_for(lambda: platform.get_transaction(transaction_id)["status"] == "completed",
             what="deposit completed")
    return transaction_id, url


def _drive_withdrawal(sandbox) -> tuple[str, str]:
    wallet = Wallet(sandbox)
    wallet.fund_usdc("100")
    transaction_id, url = wallet.start_withdrawal()
    pay = Customer(sandbox).submit_withdrawal(url, "10", account_number=ACCOUNT_NUMBER)
    wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])

    def settled():
        poller.poll_withdrawals()  # as beat does
        payout = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
        return payout is not None and payout.ap_completed_at is not None

    wait_for(settled, timeout=30, interval=0.3, what="withdrawal completed")
    return transaction_id, url


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_full_deposit_and_withdrawal_log_json_with_their_ids_and_no_secrets(
        clean_sandbox, captured):
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    deposit_id, deposit_url = _drive_deposit(clean_sandbox, Wallet(clean_sandbox))
    withdrawal_id, withdrawal_url = _drive_withdrawal(clean_sandbox)
    time.sleep(0.3)  # late webhooks

    lines = captured.parsed()  # every line is JSON
    ids = {deposit_id: "deposit", withdrawal_id: "withdrawal"}
    requests = [x for x in lines if x["logger"] == "corridor.request"]
    assert {x["path"] for x in requests} >= {
        f"/sep24/deposit/{deposit_id}", f"/sep24/withdraw/{withdrawal_id}",
        "/sep24/interactive", "/callbacks/event", "/webhooks/razorpay/payments",
        "/webhooks/razorpay/payouts"}
    for line in requests:
        assert line["request_id"], line
        path_id = next((i for i in ids if i in line["path"]), None)
        if path_id or line["path"] == "/sep24/interactive":
            assert line["transaction_id"] in ids, line
        if path_id:
            assert line["transaction_id"] == path_id, line
    # A webhook's and an AP event's outcome ride on their request line.
    webhooks = [x for x in requests if x["path"].startswith("/webhooks/razorpay/")]
    assert webhooks and all(x["request_id"] and x["outcome"] and x["source"]
                            for x in webhooks)
    # Stored webhooks are applied by the drain (anchor/inbox.py), which logs each with
    # the outcome. "ignored": events about no transaction (the fund account
    # validation's own).
    applied = [x for x in lines if x["event"] == "webhook applied"]
    assert {(x["source"], x.get("transaction_id")) for x in applied
            if x["outcome"] not in ("duplicate", "ignored")} == {("razorpay", deposit_id),
                                                                 ("razorpayx", withdrawal_id)}
    ap_events = [x for x in requests if x["path"] == "/callbacks/event"]
    assert all(x["outcome"] for x in ap_events)
    assert ap_events and {x["transaction_id"] for x in ap_events} <= set(ids)
    assert {x["transaction_id"] for x in lines if x["event"] == "deposit order created"} == \
        {deposit_id}
    assert {x["transaction_id"] for x in lines if x["event"] == "withdrawal submitted"} == \
        {withdrawal_id}

    text = "\n".join(captured.lines)
    tokens = [re.search(r"token=([^&]+)", url).group(1) for url in (deposit_url,
                                                                    withdrawal_url)]
    for needle in [ACCOUNT_NUMBER, *tokens, *(getattr(settings, n) for n in SECRET_SETTINGS)]:
        assert needle not in text, needle
    assert DepositOrder.objects.get(transaction_id=deposit_id).status == "paid"


# --- every process's own lines: gunicorn, the Celery worker and beat -----------------

def _json_lines(text: str) -> list[dict]:
    """Every non-empty line of ``text`` as JSON with level, event and logger (fails
    with the line otherwise)."""
    parsed = []
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(item, dict) and {"level", "event", "logger"} <= set(item), line
        parsed.append(item)
    return parsed


@pytest.mark.slow
@pytest.mark.django_db
def test_gunicorn_error_and_access_lines_are_json():
    from tests.flows import Gunicorn

    jwt_token = "eyJhbGciOiJIUzI1NiJ9.eyJqdGkiOiJ0eC0xIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
    server = Gunicorn("logs", "--workers", "1")
    try:
        import httpx

        httpx.get(f"{server.url}/health/", headers={"X-Request-Id": "req-gunicorn-1"},
                  timeout=10)
        httpx.get(f"{server.url}/sep24/interactive",
                  params={"transaction_id": "tx-1", "token": jwt_token}, timeout=10)
    finally:
        server.stop()

    lines = _json_lines(server.stderr_path.read_text())
    assert server.stdout_path.read_text() == ""
    loggers = {line["logger"] for line in lines}
    assert {"gunicorn.error", "gunicorn.access"} <= loggers
    assert any(line["event"].startswith("Booting worker") for line in lines)
    access = [line for line in lines if line["logger"] == "gunicorn.access"]
    health = next(line for line in access if line.get("request_id") == "req-gunicorn-1")
    assert {k: health[k] for k in ("event", "method", "path", "status")} == {
        "event": "access", "method": "GET", "path": "/health/", "status": 200}
    assert isinstance(health["duration_ms"], float)
    assert any(line["path"] == "/sep24/interactive" for line in access)
    assert jwt_token not in server.stderr_path.read_text()


def _procfile_argv(name: str) -> list[str]:
    """The Procfile's command line for process ``name``, run with this interpreter."""
    import shlex

    from honcho.environ import parse_procfile

    from tests.conftest import ROOT

    argv = shlex.split(parse_procfile((ROOT / "Procfile").read_text()).processes[name])
    assert argv[0] == "celery", argv
    return [sys.executable, "-m", "celery", *argv[1:]]


class _Process:
    """A process of the Procfile on the test database and broker, stdout and stderr
    kept apart."""

    def __init__(self, name: str, argv: list[str]):
        from tests.conftest import ARTIFACTS, ROOT
        from tests.flows import subprocess_env

        ARTIFACTS.mkdir(exist_ok=True)
        self.stdout_path = ARTIFACTS / f"{name}.out"
        self.stderr_path = ARTIFACTS / f"{name}.err"
        self._out = open(self.stdout_path, "w")  # noqa: SIM115 - closed in stop()
        self._err = open(self.stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=subprocess_env(), stdout=self._out,
                                     stderr=self._err)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._out.close()
        self._err.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_celery_worker_and_beat_of_the_procfile_write_only_json_lines():
    from corridor.celery import app
    from tests.flows import purge_broker, wait_for

    purge_broker()
    # The Procfile's lines; one pool process and no peer chatter keep the test light.
    worker = _Process("celery-json-worker", [*_procfile_argv("worker"), "--concurrency", "1",
                                             "--without-gossip", "--without-mingle"])
    beat = _Process("celery-json-beat", _procfile_argv("beat"))
    try:
        wait_for(lambda: "ready." in worker.stderr_path.read_text()
                 or worker.proc.poll() is not None, timeout=60, what="worker ready")
        result = app.send_task("anchor.tasks.reconcile_releases")
        wait_for(lambda: f"{result.id}] succeeded" in worker.stderr_path.read_text()
                 or worker.proc.poll() is not None, timeout=30, what="task done")
        wait_for(lambda: "beat: Starting" in beat.stderr_path.read_text()
                 or beat.proc.poll() is not None, timeout=30, what="beat started")
    finally:
        worker.stop()
        beat.stop()

    worker_lines = _json_lines(worker.stderr_path.read_text())
    beat_lines = _json_lines(beat.stderr_path.read_text())
    # No banners (--quiet); Celery's one unconditional print is its shutdown notice.
    assert worker.stdout_path.read_text().split() == "worker: Warm shutdown (MainProcess)".split()
    assert beat.stdout_path.read_text() == ""
    done = [line for line in worker_lines if line.get("task_id") == result.id]
    assert any("succeeded" in line["event"] for line in done), done
    assert {line["task_name"] for line in done} == {"anchor.tasks.reconcile_releases"}
    assert any(line["logger"] == "celery.apps.worker" and line["event"].endswith("ready.")
               for line in worker_lines)
    assert any(line["logger"] == "celery.beat" and "beat: Starting" in line["event"]
               for line in beat_lines)
