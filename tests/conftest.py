"""Shared fixtures: the real embedded PostgreSQL (pytest-django's test database), real
Redis, and the sandbox served over real HTTP by a ``manage.py sandbox`` subprocess.

Timing settings run at about a second here (DESIGN.md §7)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from corridor.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "reference"
ARTIFACTS = ROOT / "test-artifacts"

# Each xdist worker's Celery Redis database is set by tests/xdist_redis.py, a plugin
# loaded before Django's settings are read; pytest_sessionstart below refuses to run a
# worker whose settings and subprocess environment disagree.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")

FAST_TIMINGS = {
    "RECONCILER_PERIOD_S": 1.0,
    "RECONCILER_AGE_S": 1.0,
    "STELLAR_TX_TIMEOUT_S": 3.0,
    "STELLAR_CHANNEL_GRACE_S": 0.5,
    "STELLAR_LEDGER_CLOSE_S": 0.25,  # SANDBOX_LEDGER_CLOSE_S below
    "RELEASE_FOLLOW_MARGIN_S": 0.1,
    "RELEASE_RETRY_DELAY_S": 0.2,
    "AP_NOTIFY_RETRY_DELAY_S": 0.2,
    "AP_SWEEP_PERIOD_S": 1.0,
    "ORDER_RECONCILER_PERIOD_S": 1.0,
    "ORDER_RECONCILER_AGE_S": 0.5,
    "DEPOSIT_EXPIRY_S": 2.0,
    "INTERACTIVE_SUBMIT_LEASE_S": 1.0,
    "INTERACTIVE_SUBMIT_SWEEP_AGE_S": 0.3,
    "TRUSTLINE_WAIT_S": 5.0,
    "STELLAR_SUBMIT_TIMEOUT_S": 10.0,
    "WITHDRAW_POLL_PERIOD_S": 1.0,
    "WITHDRAW_SHORT_GRACE_S": 1.0,
    "PAYOUT_UNKNOWN_REVIEW_S": 2.0,
    "SAGA_LEASE_S": 1.0,
    "SAGA_RESUME_PERIOD_S": 1.0,
    "SAGA_RESUME_REQUEUE_S": 1.0,
    "SWEEP_MIN_GAP_S": 0.5,
    "SWEEP_MAX_RUN_S": 5.0,
    "LATE_MONEY_SWEEP_PERIOD_S": 1.0,
    "SAGA_DEFAULT_BACKOFF_MS": 50,
    "SAGA_BACKOFF_MAX_S": 0.5,
    "ANCHOR31_TIMEOUT_S": 1.0,
    "REMITTANCE_FUNDING_DEADLINE_S": 2.0,
    "REMITTANCE_FUNDING_GRACE_S": 1.0,
    "REMITTANCE_REFUND_DEADLINE_S": 5.0,
    "REMITTANCE_PAYOUT_DEADLINE_S": 10.0,
    "REMITTANCE_ERROR_REFUND_GRACE_S": 3.0,
    "REMITTANCE_FUNDING_POLL_S": 0.2,
    "REMITTANCE_ANCHOR_POLL_S": 0.2,
    "REMITTANCE_HUB_LOCK_WAIT_S": 5.0,
    "ENVELOPE_UNKNOWN_REVIEW_S": 3.0,
    "REFUND_SWEEP_AGE_S": 1.0,
    "REFUND_SWEEP_PERIOD_S": 1.0,
    "INBOUND_SWEEP_PERIOD_S": 1.0,
}
SANDBOX_TIMINGS = {
    "SANDBOX_LEDGER_CLOSE_S": "0.25",
    "SANDBOX_EVENT_BACKOFF_START_S": "0.1",
    "SANDBOX_EVENT_BACKOFF_MAX_S": "0.5",
    "SANDBOX_WEBHOOK_BACKOFF_S": "0.2",
    "SANDBOX_SUBMISSION_TIMEOUT_S": "2",
    "SANDBOX_SETTLEMENT_CYCLE_S": "1",
    "SANDBOX_ANCHOR31_LATE_REFUND_S": "1",
}


def _flush_retrying_deadlocks():
    """Transactional tests end with a TRUNCATE of every table; a late webhook or event
    that the sandbox delivers to the live server at that moment can hold a row lock the
    TRUNCATE waits on, and PostgreSQL may pick the TRUNCATE as the deadlock victim.
    Retry it (the live server's request finishes in milliseconds)."""
    from django.db import OperationalError
    from django.test.testcases import TransactionTestCase

    def teardown(self):
        for attempt in range(5):
            try:
                return _truncate(self)
            except OperationalError as exc:
                if "deadlock" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2)

    TransactionTestCase._fixture_teardown = teardown


# Rows ``flush`` would TRUNCATE and then rebuild in its post_migrate signal: kept instead.
_KEPT_BY_FLUSH = frozenset({"django_content_type", "auth_permission", "django_migrations"})


def _truncate(case) -> None:
    """Django's ``flush`` for a transactional test's teardown, less its post_migrate
    signal: that signal recreates every content type and permission row (hundreds of
    queries, half the time of each flush); those two tables are kept instead, so the
    state each test starts from is the same. ``case`` is the TransactionTestCase."""
    from django.core.management.color import no_style
    from django.db import connections

    for db_name in case._databases_names(include_mirrors=False):
        connection = connections[db_name]
        tables = [t for t in connection.introspection.django_table_names(
            only_existing=True, include_views=False) if t not in _KEPT_BY_FLUSH]
        statements = connection.ops.sql_flush(no_style(), tables, reset_sequences=False,
                                              allow_cascade=False)
        connection.ops.execute_sql_flush(statements)


_flush_retrying_deadlocks()



def reference_path(*parts: str) -> Path:
    """A file of ../shared/reference. Skips with a reason when the folder is absent (a
    clone outside this workplace); fails instead when CI=true."""
    path = REFERENCE.joinpath(*parts)
    if not path.exists():
        message = f"../shared/reference is not beside this clone ({path} missing)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(autouse=True, scope="session")
def _fast_timings():
    from django.conf import settings

    for name, value in FAST_TIMINGS.items():
        setattr(settings, name, value)
    # The session's sandbox keeps every earlier test's AP deposits while each test's
    # flush drops their orders: no rebuilding those (tests/test_lost_commits.py does).
    settings.DEPOSIT_ORDER_REBUILD = False
    settings.WITHDRAWAL_REQUEST_REBUILD = False  # the same for withdrawals
    settings.RECEIVE_REBUILD = False  # the same for SEP-31 receives (test_lost_receives)


class Sandbox:
    """HTTP handle on the sandbox process: its base URL and its control endpoints."""

    def __init__(self, url: str, log_path: Path):
        self.url = url
        self.log_path = log_path
        self.http = httpx.Client(base_url=url, timeout=30)

    def fault(self, name: str, *, times: int | None = None, **params) -> None:
        response = self.http.post("/sandbox/faults", json={"name": name, "times": times,
                                                           "params": params})
        response.raise_for_status()

    def clear_faults(self) -> None:
        self.http.delete("/sandbox/faults").raise_for_status()


def _drain_now() -> None:
    """The test stand-in for a worker woken at once (anchor/inbox.py ``wake``)."""
    import logging

    from anchor import inbox

    try:
        inbox.drain()
    except Exception as exc:  # as a worker's failure would: the sweep drains later
        logging.getLogger(__name__).warning("test drain failed: %s", exc)


@pytest.fixture(autouse=True)
def inbound_drained_at_once(monkeypatch):
    """A delivery's wake-up drains at once, in the process that recorded it (no worker
    process in most tests): a stored webhook is applied, and its follow-ups published,
    right after its INSERT, as a worker woken by it would. Tests of the queue itself
    patch ``inbox.wake`` again (lost wake-ups) or restore ``inbox._waker.wake``."""
    from anchor import inbox

    monkeypatch.setattr(inbox, "wake", _drain_now)


@pytest.fixture
def no_late_deliveries(db):
    """Inside the test's transaction, no stored inbound event from an earlier test. The
    session's sandbox may deliver a webhook or AP event (a retry with backoff) through the
    live server after its test's flush; that row is committed and stays until the next
    transactional test's flush, so a test counting every row of ``inbound_events`` saw
    one too many (stop 25's three-worker run: 13 failures in tests/test_hostile_input.py,
    "returned 2"). The delete is rolled back with the test."""
    from anchor.models import InboundEvent

    InboundEvent.objects.all().delete()


@pytest.fixture(scope="session")
def sandbox(django_db_setup, live_server, django_db_blocker) -> Sandbox:
    """The sandbox, started once per session, posting events and webhooks to the
    Corridor ``live_server`` (which serves from the test database). After
    ``django_db_setup``: the sandbox migrates its test database itself, and racing
    pytest-django's creation of it failed with "relation ... already exists"."""
    from django.conf import settings

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = settings.DATABASES["sandbox"]
    sandbox_db_url = (
        f"postgresql://{db.get('USER') or 'postgres'}@{db.get('HOST')}:{db.get('PORT')}/"
        f"{db['TEST']['NAME']}"
    )
    env = {
        **os.environ,
        **SANDBOX_TIMINGS,
        "SANDBOX_DATABASE_URL": sandbox_db_url,
        "SANDBOX_URL": url,
        "CORRIDOR_URL": live_server.url,
        "SANDBOX_CALLBACK_URL": f"{live_server.url}/callbacks",
        "SANDBOX_INTERACTIVE_URL": f"{live_server.url}/sep24/interactive",
        "SANDBOX_WEBHOOK_URL": f"{live_server.url}/webhooks/razorpay",
    }
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / f"sandbox{os.environ.get('TEST_DB_SUFFIX', '')}{XDIST_WORKER}.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "sandbox", "--addr", f"127.0.0.1:{port}",
         "--reset"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sandbox exited early; see {log_path}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/sandbox/faults", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"sandbox did not start; see {log_path}")
        time.sleep(0.2)
    settings.SANDBOX_URL = url
    settings.HORIZON_URL = f"{url}/horizon"
    settings.AP_PLATFORM_URL = f"{url}/ap/platform"
    settings.RAZORPAY_API_URL = f"{url}/razorpay"
    settings.QUOTE_RATE_URL = f"{url}/fx/rates?pair=USDC-INR"
    handle = Sandbox(url, log_path)
    yield handle
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def clean_sandbox(sandbox):
    """The sandbox with every fault switch off before and after the test."""
    sandbox.clear_faults()
    yield sandbox
    sandbox.clear_faults()


@pytest.fixture(scope="session", autouse=True)
def _flush_retries_a_deadlock():
    """A transactional test's teardown TRUNCATE can deadlock with a late delivery the
    sandbox is still writing through the live server (a webhook, an AP event): PostgreSQL
    aborts one of the two, and the flush is simply run again."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    original = flush.Command.handle

    def handle(self, **options):
        for attempt in range(5):
            try:
                return original(self, **options)
            except CommandError as exc:
                if "deadlock detected" not in str(exc.__cause__) or attempt == 4:
                    raise
                time.sleep(0.2)

    flush.Command.handle = handle
    yield
    flush.Command.handle = original


def pytest_sessionstart(session):
    """Stop before any test if this process's Celery broker is not its worker's own."""
    from django.conf import settings

    from tests.xdist_redis import broker_database_for

    wanted = broker_database_for(XDIST_WORKER)
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis://") and not (
            url.endswith(f"/{wanted}") and os.environ.get("CELERY_BROKER_URL") == url):
        raise pytest.UsageError(
            f"worker {XDIST_WORKER or 'main'}: settings.CELERY_BROKER_URL={url}, environment "
            f"{os.environ.get('CELERY_BROKER_URL')}, wanted database {wanted}: is "
            "'-p tests.xdist_redis' in pytest's addopts?")


# The two chaos campaigns (tests/campaign.py: their own PostgreSQL and Redis, so any
# order is safe), each alone in its file, by where it should start.
_LONG_FIRST = "tests/test_chaos.py"  # the loaded three-seed campaign: the longest file
_SHORT_LAST = "tests/test_chaos_guard_off.py"


def pytest_collection_modifyitems(session, config, items):
    """The loaded chaos campaign first, the guard-off campaign last. pytest-xdist's
    ``--dist loadfile`` hands out files with the most tests first (ties in this order),
    one to each worker as it runs dry: the one-test files come last, and of those the
    longest one (about 560 s on CI) must start first, beside the rest of them and the
    guard-off campaign on the other worker, or it alone ends the run (CI, 2 cores:
    both campaigns in one file on one worker, 720 s, while the other worker's last
    files took about 370 s)."""
    items.sort(key=lambda item: (not item.nodeid.startswith(_LONG_FIRST),
                                 item.nodeid.startswith(_SHORT_LAST)))


@pytest.fixture(scope="module")
def playwright():
    """Playwright's sync API for a module's browser tests (tests/browser.py:
    ``start_playwright``; skips, or fails under CI=true, without Chromium)."""
    from tests.browser import start_playwright

    with start_playwright() as p:
        yield p


@pytest.fixture
def page(playwright, tmp_path):
    """A phone-sized Chromium page in a fresh profile, its responses recorded in
    ``page.responses`` (tests/browser.py: ``open_page``)."""
    from tests.browser import open_page

    with open_page(playwright, tmp_path / "chromium-profile") as opened:
        yield opened
