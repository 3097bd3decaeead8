"""The one module of helpers the tests share (no test module imports another): drivers
that act as the outside world does (a wallet: Stellar account, SEP-24 start; a
customer: the interactive pages, Razorpay checkout), worker and gunicorn processes,
the one ``wait_for`` and the one ``settle``, deposits and withdrawals brought to a
given state, sagas driven and checked against DESIGN.md §8, and operator-console
actions driven through the admin. Everything goes over real HTTP to the sandbox and
to Corridor's live server. tests/test_structure.py keeps it the only such module."""

from __future__ import annotations

import importlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
from django.conf import settings
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.urls import reverse

from anchor import deposits, platform, reconciler
from anchor.models import DepositOrder, DepositPayment, DepositRelease
from ledger import services as ledger
from ledger.models import Entry, Posting
from payouts import poller
from payouts.models import WithdrawalPayout, WithdrawalRequest
from sagas import engine
from sagas.models import Saga, SagaEvent, SagaStep
from sandbox.drivers import Customer, Wallet, horizon  # noqa: F401 - re-exported for tests
from tests.conftest import ARTIFACTS, FAST_TIMINGS, ROOT, free_port


def wait_for(predicate, *, timeout: float = 30.0, interval: float = 0.2, what: str = "",
             explain=None):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` s, with
    what ``explain()`` returns (the state worth seeing) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            state = f"; state: {explain()!r}" if explain else ""
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or predicate}{state}")
        time.sleep(interval)


def rejected_first(monkeypatch) -> None:
    """The anchor's rejection is asynchronous (its worker moves the new transaction to
    ``error``): hold the leg's pre-payment check until it did, so "before funding" is
    what the test runs even on a loaded machine. (The other order is the race test.)"""
    from sagas import anchor31
    from sagas.plans.remittance import AnchorFund

    check = AnchorFund._check_not_rejected

    def after_the_rejection(intent):
        wait_for(lambda: anchor31.get_transaction(intent["anchor_tx_id"])["status"]
                 != "pending_sender", timeout=10, interval=0.05, what="the rejection")
        check(intent)

    monkeypatch.setattr(AnchorFund, "_check_not_rejected", staticmethod(after_the_rejection))


def unapplied_then_stale(monkeypatch, sandbox, method: str) -> list[str]:
    """The first ``method`` RPC of the live server (in this process) answers -32603
    before touching the transaction (``ap.rpc_32603``), and the next read of that
    transaction shows a stale ``pending_anchor`` (``ap.stale_status``): both switched on
    at the moment of the call. Returns a list that holds ``method`` once they were."""
    from anchor import platform

    real_rpc = platform.rpc
    armed: list[str] = []

    def rpc(name, params):
        if name == method and not armed:
            armed.append(name)
            sandbox.fault("ap.rpc_32603", times=1, methods=[method])
            sandbox.fault("ap.stale_status", times=1,
                          transaction_ids=[params["transaction_id"]])
        return real_rpc(name, params)

    monkeypatch.setattr(platform, "rpc", rpc)
    return armed


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a Corridor process that must see what the test process sees:
    the test database, the sandbox URLs and the fast timings."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SANDBOX_URL": settings.SANDBOX_URL,
        "HORIZON_URL": settings.HORIZON_URL,
        "AP_PLATFORM_URL": settings.AP_PLATFORM_URL,
        "RAZORPAY_API_URL": settings.RAZORPAY_API_URL,
        **{name: str(value) for name, value in FAST_TIMINGS.items()},
    }
    env.pop("CORRIDOR_CRASH_AT", None)
    env.update(extra)
    return env


def run_manage(*args: str, crash_at: str | None = None, timeout: float = 60,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``manage.py`` in a separate process (a worker), optionally SIGKILLing itself
    at a named crash point; ``env``: more environment variables for it."""
    extra = {**(env or {}), **({"CORRIDOR_CRASH_AT": crash_at} if crash_at else {})}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                          env=subprocess_env(**extra), capture_output=True, text=True,
                          timeout=timeout)


class CeleryWorker:
    """A real Celery worker process on the test broker and database."""

    def __init__(self, name: str = "worker", concurrency: int = 4, **extra_env: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path: Path = ARTIFACTS / f"celery-{name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "corridor", "worker", "--pool", "threads",
             "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "-n", f"{name}-{os.getpid()}@test"],
            cwd=ROOT, env=subprocess_env(**extra_env), stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: "ready." in self.log_path.read_text() or self.proc.poll() is not None,
                 timeout=60, what="celery worker ready")
        if self.proc.poll() is not None:
            raise RuntimeError(self.log_path.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def purge_broker() -> None:
    from corridor.celery import app

    app.control.purge()


def decimal(value) -> Decimal:
    return Decimal(str(value))


def query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


# --- deposits and withdrawals, end to end --------------------------------------------

def ap(transaction_id):
    """The AP transaction as AP's REST API shows it (a dict), or None."""
    return platform.get_transaction(transaction_id)


def start_and_pay(sandbox, wallet, amount="1000", *, pay=True, **start):
    """Wallet starts a deposit, the customer submits the amount and pays."""
    transaction_id, url = wallet.start_deposit(**start)
    customer = Customer(sandbox)
    order_id = customer.submit_amount(url, amount)
    if pay:
        customer.pay(order_id)
    return transaction_id, order_id


def paid_deposit(sandbox, wallet, **start) -> str:
    """A deposit whose payment Corridor recorded and AP knows (pending_anchor), with no
    release started: the state a worker is in just before the outbox."""
    purge_broker()
    transaction_id, _ = start_and_pay(sandbox, wallet, **start)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()  # no worker here: we drive the rest ourselves
    deposits.notify_funds_received(transaction_id=transaction_id)
    return transaction_id


def assert_released_once(wallet, transaction_id):
    """Invariants 1 and 6 for a deposit: exactly one USDC payment of the order's amount,
    with the stored hash; AP completed with that hash only; the release completed."""
    release = DepositRelease.objects.get(transaction_id=transaction_id)
    order = DepositOrder.objects.get(transaction_id=transaction_id)
    payments = wallet.usdc_payments()
    assert len(payments) == 1, payments
    assert Decimal(payments[0]["amount"]) == order.amount_out
    assert payments[0]["asset_issuer"] == settings.STELLAR_USDC_ISSUER
    assert payments[0]["transaction_hash"] == release.tx_hash
    tx = ap(transaction_id)
    assert tx["status"] == "completed"
    assert [st["id"] for st in tx["stellar_transactions"]] == [release.tx_hash]
    assert release.status == "completed"
    return release


def opened_withdrawal(sandbox, *, account=None):
    """A wallet funded with 100 USDC opens a withdrawal (the form not filled yet);
    returns (wallet, id, the form's url)."""
    wallet = Wallet(sandbox)
    wallet.fund_usdc("100")
    transaction_id, url = wallet.start_withdrawal(account=account)
    return wallet, transaction_id, url


def start_withdrawal(sandbox, *, amount="10", account=None, **beneficiary):
    """A funded wallet starts a withdrawal and fills the form; returns (wallet, id, pay)."""
    wallet, transaction_id, url = opened_withdrawal(sandbox, account=account)
    pay = Customer(sandbox).submit_withdrawal(url, amount, **beneficiary)
    return wallet, transaction_id, pay


def pay_and_wait_for_ap(wallet, pay, amount="10", **kw):
    """The wallet pays ``amount`` USDC to the withdrawal's destination and memo."""
    wallet.pay(destination=pay["destination"], amount=amount, memo=pay["memo"], **kw)


def paid_withdrawal(sbx, amount="10"):
    """A withdrawal of 10 USDC started and ``amount`` USDC paid; returns (wallet, id)."""
    wallet, transaction_id, pay = start_withdrawal(sbx)
    pay_and_wait_for_ap(wallet, pay, amount)
    return wallet, transaction_id


def pending_anchor_withdrawal(sbx):
    """:func:`paid_withdrawal` once AP's observer moved it to ``pending_anchor`` (the
    poller's next pass pays it); returns (wallet, id)."""
    wallet, transaction_id = paid_withdrawal(sbx)
    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="observer")
    return wallet, transaction_id


def short_withdrawal(sbx, settings):
    """A customer paid 9.5 of 10 USDC; the grace period passed: manual_review."""
    wallet, transaction_id = paid_withdrawal(sbx, amount="9.5")

    def in_review():
        poller.poll_withdrawals()
        return WithdrawalRequest.objects.filter(transaction_id=transaction_id,
                                                status="manual_review").first()

    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP observer")
    request = wait_for(in_review, timeout=settings.WITHDRAW_SHORT_GRACE_S + 10, interval=0.3,
                       what="short withdrawal in review")
    assert "short" in request.review_reason
    return wallet, request


def sandbox_payouts(sandbox, transaction_id):
    """The sandbox RazorpayX's payouts whose ``reference_id`` is ``transaction_id``."""
    rows = sandbox.http.get("/razorpay/sandbox/payouts").json()
    rows = rows.get("payouts", rows) if isinstance(rows, dict) else rows
    return [p for p in rows if p.get("reference_id") == transaction_id]


def assert_payout_once(sandbox, transaction_id):
    """Invariants 1 and 6 for a withdrawal: exactly one RazorpayX payout of the
    request's paise; the payout completed; AP completed with its UTR."""
    payout = WithdrawalPayout.objects.get(transaction_id=transaction_id)
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    payouts = sandbox_payouts(sandbox, transaction_id)
    assert len(payouts) == 1, payouts
    assert payouts[0]["amount"] == request.amount_out_paise
    assert payout.status == "completed"
    tx = ap(transaction_id)
    assert tx["status"] == "completed"
    assert tx["external_transaction_id"] == payout.reference != ""
    return payout


def settle(transaction_id: str, *, rounds: int | None = None):
    """Run what beat would run until the transaction's own row stops moving; returns
    that row (or None if there is none yet).

    A withdrawal (a ``WithdrawalRequest`` exists): ``payouts.poller.poll_withdrawals``
    until its ``WithdrawalPayout`` is out of ``processing`` (and, if completed, AP was
    told), 0.3 s apart, 20 rounds by default. A deposit: the reconciler
    (``reconcile_releases``, ``sweep_ap_deposits``) until its ``DepositRelease`` is
    ``completed`` or ``manual_review``, ``RECONCILER_AGE_S`` + 0.1 s apart, 15 rounds by
    default."""
    if WithdrawalRequest.objects.filter(transaction_id=transaction_id).exists():
        return _settle_withdrawal(transaction_id, rounds=rounds or 20)
    return _settle_deposit(transaction_id, rounds=rounds or 15)


def _settle_deposit(transaction_id, *, rounds):
    """Run the reconciler (as beat would) until the release is terminal."""
    for _ in range(rounds):
        release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
        if release and release.status in ("completed", "manual_review"):
            return release
        time.sleep(settings.RECONCILER_AGE_S + 0.1)
        reconciler.reconcile_releases()
        reconciler.sweep_ap_deposits()
    return DepositRelease.objects.filter(transaction_id=transaction_id).first()


def _settle_withdrawal(transaction_id, *, rounds):
    """Poll as beat would until AP completes or our row stops moving."""
    for _ in range(rounds):
        poller.poll_withdrawals()
        payout = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
        if payout and payout.status != "processing" and (
                payout.status != "completed" or payout.ap_completed_at):
            return payout
        time.sleep(0.3)
    return WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()


# --- sagas ------------------------------------------------------------------------------

_refs = itertools.count()


def new_saga(kind: str = "testing", **input_) -> Saga:
    input_.setdefault("amount", "10.00")
    return engine.start(kind=kind, reference=f"ref-{time.time_ns()}-{next(_refs)}",
                        input=input_, dispatch=False)


def fail_at(leg: str, mode: str, **more) -> dict:
    return {"faults": {"fail_at": {"leg": leg, "mode": mode, **more}}}


def drive(saga_id: int, worker: str = "driver", timeout: float = 10.0) -> engine.RunResult:
    """Run the saga as one worker would, waiting out retries and pendings, until it
    stops. (Celery does the waiting in production; see test_celery_*.)"""
    deadline = time.monotonic() + timeout
    while True:
        result = engine.run(saga_id, worker, dispatch=False)
        if result.status not in Saga.OPEN_STATUSES:
            return result
        assert time.monotonic() < deadline, f"saga {saga_id} still {result.status}"
        time.sleep(0.02)


def events(saga_id: int, *names: str) -> list[tuple]:
    rows = SagaEvent.objects.filter(saga_id=saga_id).order_by("id")
    if names:
        rows = rows.filter(event__in=names)
    return [(e.event, e.idx) for e in rows]


def bookings(saga_id: int) -> list[str]:
    return list(Entry.objects.filter(saga_id=saga_id).order_by("id")
                .values_list("idempotency_key", flat=True))


def invariant_violations(saga_id: int) -> list[str]:
    """DESIGN.md §8 invariants 2-5 for one saga, as a list of what is wrong.

    2 nothing lost: the saga ended completed, compensated or in manual_review.
    3 ledger: every entry sums to zero per currency, balances equal postings; a
      compensated saga nets every account it touched back to zero.
    4 compensations ran strictly last-to-first over the completed steps, once each,
      each with its own booking keyed ``:undo`` in the same order.
    5 no write from a stale fence: event fences never go down; each step booked once
      forward and once back at most."""
    saga = Saga.objects.get(pk=saga_id)
    steps = list(SagaStep.objects.filter(saga=saga).order_by("idx"))
    wrong = []
    if saga.status in Saga.OPEN_STATUSES:
        wrong.append(f"2: saga still {saga.status}")
    trial = ledger.trial_balance()
    if not trial.ok:
        wrong.append(f"3: trial balance {trial}")
    if saga.status == Saga.Status.COMPENSATED:
        net: dict = defaultdict(Decimal)
        for code, ccy, amount in Posting.objects.filter(entry__saga_id=saga_id).values_list(
                "account__code", "account__currency", "amount"):
            net[(code, ccy)] += amount
        if any(net.values()):
            wrong.append(f"3: compensated saga nets {dict(net)}")
    undone = [idx for event, idx in events(saga_id, "step.compensated")]
    compensated = [s.idx for s in steps if s.status == SagaStep.Status.COMPENSATED]
    if undone != sorted(compensated, reverse=True):
        wrong.append(f"4: compensations ran in order {undone}")
    if saga.status == Saga.Status.COMPENSATED:
        failed = next((s.idx for s in steps if s.status == SagaStep.Status.FAILED), None)
        if failed is None or compensated != list(range(failed)):
            wrong.append(f"4: failed step {failed}, compensated {compensated}")
    undo_keys = [k for k in bookings(saga_id) if k.endswith(":undo")]
    if undo_keys != [f"{saga_id}:{idx}:undo" for idx in undone]:
        wrong.append(f"4: undo bookings {undo_keys} for compensations {undone}")
    fences = [e.fence for e in SagaEvent.objects.filter(saga=saga).order_by("id")]
    if fences != sorted(fences):
        wrong.append(f"5: event fences went down: {fences}")
    per_step = Counter(k.split("@")[0] for k in bookings(saga_id))
    done = [s.idx for s in steps if s.status in ("done", "compensating", "compensated")]
    expected = Counter({f"{saga_id}:{i}": 1 for i in done}
                       | {f"{saga_id}:{i}:undo": 1 for i in compensated})
    if per_step != expected:
        wrong.append(f"5: bookings {dict(per_step)}, expected {dict(expected)}")
    return wrong


# --- the operator console, driven through the admin -------------------------------------

NOTE = "ticket OPS-42: checked with the bank"
sync_groups = importlib.import_module(
    "treasury.migrations.0002_review_queue_breaks").sync_groups


def changelist(model: str) -> str:
    return reverse(f"admin:{model}_changelist")


def confirmation_page(client, model: str, action: str, pk) -> str:
    """The first POST, as from the changelist's action menu: the confirmation page."""
    response = client.post(changelist(model), {"action": action, ACTION_CHECKBOX_NAME: [pk]})
    assert response.status_code == 200, response.content[:500]
    page = response.content.decode()
    assert "What will happen" in page
    assert 'name="post" value="yes"' in page
    return page


def confirm(client, model: str, action: str, pk, **fields) -> list[str]:
    """The second POST, from the confirmation page; returns the messages shown."""
    response = client.post(changelist(model), {"action": action, ACTION_CHECKBOX_NAME: [pk],
                                               "post": "yes", "note": NOTE, **fields},
                           follow=True)
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def refused(messages_shown: list[str]) -> bool:
    return any(m.startswith("Refused, nothing changed") for m in messages_shown)


# --- gunicorn ---------------------------------------------------------------------------

METRICS_TOKEN = "metrics-token-for-tests-0123456789"


class Gunicorn:
    """``gunicorn corridor.wsgi -c gunicorn.conf.py`` on a free port, on the test
    database, its stdout and stderr kept in files."""

    def __init__(self, name: str, *args: str, **env: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = ARTIFACTS / f"gunicorn-{name}.out"
        self.stderr_path = ARTIFACTS / f"gunicorn-{name}.err"
        self._out = open(self.stdout_path, "w")  # noqa: SIM115 - closed in stop()
        self._err = open(self.stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "corridor.wsgi", "--config", "gunicorn.conf.py",
             "--bind", f"127.0.0.1:{self.port}", *args],
            cwd=ROOT, env=subprocess_env(**env), stdout=self._out, stderr=self._err)

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(self.stderr_path.read_text())
            # Any answer will do; not /health/, whose count the tests read (a probe that
            # timed out here may still be served later).
            try:
                return bool(httpx.get(f"{self.url}/metrics", timeout=2,
                                      headers={"Authorization": f"Bearer {METRICS_TOKEN}"}))
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=60, what="gunicorn up")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._out.close()
        self._err.close()


def processing_payout(sbx, *faults: str) -> WithdrawalPayout:
    """A withdrawal whose payout RazorpayX created and Corridor holds ``processing``,
    with the payout's own webhooks switched off (``faults`` are taken at create)."""
    wallet, transaction_id, pay = start_withdrawal(sbx)
    for name in ("razorpayx.webhook_lose", *faults):
        sbx.fault(name, times=1)
    pay_and_wait_for_ap(wallet, pay)

    def created():
        poller.poll_withdrawals()
        return WithdrawalPayout.objects.filter(transaction_id=transaction_id).exclude(
            provider_payout_id="").first()

    payout = wait_for(created, what="payout created")
    assert payout.status == "processing"
    return payout


# --- RazorpayX beneficiaries for Fund Account Validation ---------------------------------


def razorpayx(sandbox, method: str, path: str, **kwargs) -> httpx.Response:
    """A RazorpayX API call to the sandbox (``/razorpay/v1{path}``, our Basic auth)."""
    return httpx.request(method, f"{sandbox.url}/razorpay/v1{path}", timeout=20,
                         auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET),
                         **kwargs)


def unique_account_number() -> str:
    """A 15-digit bank account number no other test uses (the sandbox's validation
    outcomes are chosen per account number)."""
    import uuid

    return str(uuid.uuid4().int)[:15]


def bank_fund_account(sandbox, *, holder: str = "Priya Sharma",
                      number: str | None = None) -> dict:
    """A contact and a bank fund account in the sandbox RazorpayX, holder ``holder``."""
    import uuid

    contact = razorpayx(sandbox, "POST", "/contacts", json={
        "name": holder, "type": "customer", "reference_id": f"c-{uuid.uuid4().hex[:12]}"})
    assert contact.status_code == 200, contact.text
    response = razorpayx(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact.json()["id"], "account_type": "bank_account",
        "bank_account": {"name": holder, "ifsc": "HDFC0000053",
                         "account_number": number or unique_account_number()}})
    assert response.status_code == 200, response.text
    return response.json()


def vpa_fund_account(sandbox, *, name: str = "Ravi Kumar") -> dict:
    """A contact named ``name`` and a fresh VPA fund account in the sandbox RazorpayX."""
    import uuid

    contact = razorpayx(sandbox, "POST", "/contacts", json={
        "name": name, "type": "customer", "reference_id": f"c-{uuid.uuid4().hex[:12]}"})
    assert contact.status_code == 200, contact.text
    response = razorpayx(sandbox, "POST", "/fund_accounts", json={
        "contact_id": contact.json()["id"], "account_type": "vpa",
        "vpa": {"address": f"ravi.{uuid.uuid4().hex[:8]}@okhdfcbank"}})
    assert response.status_code == 200, response.text
    return response.json()


def validation_account(sandbox, **body) -> httpx.Response:
    """Choose what validating one beneficiary account answers in the sandbox
    (``POST /razorpay/sandbox/fund_accounts/validations/accounts``; body there)."""
    return httpx.post(f"{sandbox.url}/razorpay/sandbox/fund_accounts/validations/accounts",
                      json=body, timeout=10)


def platform_rpc(sandbox, *requests: dict) -> list[dict]:
    """A JSON-RPC batch to the sandbox AP's platform API (``/ap/platform/``) with a
    fresh platform token; the list of reply objects."""
    import jwt

    issued = int(time.time())
    token = jwt.encode({"iat": issued, "exp": issued + 30, "aud": "platform_api"},
                       settings.AP_PLATFORM_AUTH_SECRET, algorithm="HS256")
    response = httpx.post(f"{sandbox.url}/ap/platform/", json=list(requests), timeout=30,
                          headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def platform_call(sandbox, method: str, **params) -> dict:
    """One RPC; the reply object (``result`` or ``error``)."""
    return platform_rpc(sandbox, {"jsonrpc": "2.0", "id": "1", "method": method,
                                  "params": params})[0]


def platform_result(sandbox, method: str, **params) -> dict:
    reply = platform_call(sandbox, method, **params)
    assert "result" in reply, reply
    return reply["result"]
