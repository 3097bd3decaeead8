"""``manage.py demo [--deposits N]``: the main job on real input, end to end.

Starts what it needs on fresh demo databases (the sandbox, Corridor's web server, Celery
workers and beat), drives N SEP-24 deposits through the sandbox as a wallet and a paying
customer would, with faults on (Horizon 504 after the transaction applied, every AP
event delivered twice, and the first worker SIGKILLed right after it submitted a
release), waits for the system to settle, stops everything it started and prints a
summary whose last line is::

    demo: deposits=20 deposits_completed=20 manual_review=0 double_payments=0 \
        ap_mismatches=0 elapsed_s=41.2   (one line)

``double_payments`` is counted on the sandbox's Stellar ledger (USDC payments received
per wallet beyond the first), ``ap_mismatches`` compares AP's final state with
``deposit_releases`` (completed there iff completed with the same hash here). The line
goes on with the withdrawals, the remittance sagas and the SEP-31 remittances sent in
(``inbound=20 inbound_completed=… inbound_refunded=… inbound_review=… inbound_rejected=…
double_payouts_inbound=0``; ``_drive_inbound``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg
from django.conf import settings
from django.core.management import BaseCommand

from corridor import processes

ROOT = Path(settings.BASE_DIR)
LOGS = ROOT / ".devservices" / "demo-logs"
DEMO_TIMINGS = {
    "RECONCILER_PERIOD_S": "2", "RECONCILER_AGE_S": "2", "STELLAR_TX_TIMEOUT_S": "6",
    "STELLAR_CHANNEL_GRACE_S": "1", "RELEASE_RETRY_DELAY_S": "0.5",
    "AP_NOTIFY_RETRY_DELAY_S": "0.5", "AP_SWEEP_PERIOD_S": "2",
    "ORDER_RECONCILER_PERIOD_S": "2", "ORDER_RECONCILER_AGE_S": "5",
    "DEPOSIT_EXPIRY_S": "3600", "SANDBOX_LEDGER_CLOSE_S": "0.5",
    "SANDBOX_SUBMISSION_TIMEOUT_S": "3", "SANDBOX_EVENT_BACKOFF_START_S": "0.2",
    "SANDBOX_EVENT_BACKOFF_MAX_S": "2", "SANDBOX_WEBHOOK_BACKOFF_S": "0.5",
    "STELLAR_SUBMIT_TIMEOUT_S": "10", "LOG_LEVEL": "WARNING",
    "WITHDRAW_POLL_PERIOD_S": "2", "WITHDRAW_SHORT_GRACE_S": "30",
    "PAYOUT_UNKNOWN_REVIEW_S": "120",
    "SAGA_RESUME_PERIOD_S": "2", "SAGA_DEFAULT_BACKOFF_MS": "200", "SAGA_BACKOFF_MAX_S": "2",
    "SAGA_RESUME_REQUEUE_S": "5", "SWEEP_MIN_GAP_S": "0.5", "SWEEP_MAX_RUN_S": "10",
    "LATE_MONEY_SWEEP_PERIOD_S": "2",
    "REMITTANCE_FUNDING_POLL_S": "0.5", "REMITTANCE_ANCHOR_POLL_S": "0.5",
    "REMITTANCE_ERROR_REFUND_GRACE_S": "5", "REMITTANCE_REFUND_DEADLINE_S": "120",
    # Treasury (issue 13 §2): 2-second settlement "days" (T+2: 4-6 s), a payment is a
    # break once no settlement carried it for 12 s, the statement is read at once.
    "SANDBOX_SETTLEMENT_CYCLE_S": "2", "TREASURY_SETTLEMENT_WINDOW_S": "12",
    "TREASURY_STATEMENT_GRACE_S": "0", "DEPOSIT_REFUND_SWEEP_AGE_S": "2",
    "DEPOSIT_REFUND_SWEEP_PERIOD_S": "1",
}



def _recreate_database(url: str) -> None:
    info = psycopg.conninfo.conninfo_to_dict(url)
    name = info.pop("dbname")
    info["dbname"] = "postgres"
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def _with_name(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


class Command(BaseCommand):
    help = "Drive N deposits through the sandbox with faults on and print a summary line."

    def add_arguments(self, parser):
        parser.add_argument("--deposits", type=int, default=int(os.environ.get("DEMO_N", 20)))
        parser.add_argument("--timeout", type=float, default=240.0)

    def handle(self, *args, deposits, timeout, **options):
        if os.environ.get("CORRIDOR_DEMO_CHILD") != "1":
            sys.exit(self._orchestrate(deposits, timeout))
        sys.exit(_Demo(self.stdout, deposits, timeout).run())

    def _orchestrate(self, deposits: int, timeout: float) -> int:
        """Fresh demo databases, then the demo itself in a child with their URLs."""
        base = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:54329/corridor"
        demo_db = _with_name(base, "corridor_demo")
        sandbox_db = _with_name(base, "corridor_sandbox_demo")
        _recreate_database(demo_db)
        _recreate_database(sandbox_db)
        broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:63799/0")
        env = {**os.environ, **DEMO_TIMINGS, "CORRIDOR_DEMO_CHILD": "1",
               "DATABASE_URL": demo_db, "SANDBOX_DATABASE_URL": sandbox_db,
               "CELERY_BROKER_URL": broker.rsplit("/", 1)[0] + "/2"}
        python = sys.executable
        subprocess.run([python, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                       env=env, check=True)
        return subprocess.call([python, "manage.py", "demo", "--deposits", str(deposits),
                                "--timeout", str(timeout)], cwd=ROOT, env=env)


class _Demo:
    def __init__(self, stdout, n: int, timeout: float):
        self.out = stdout
        self.n = n
        self.timeout = timeout
        self.supervisor: processes.Supervisor | None = None
        LOGS.mkdir(parents=True, exist_ok=True)

    def say(self, line: str) -> None:
        self.out.write(line)
        self.out.flush()

    def spawn(self, name: str, argv: list[str], **extra_env: str) -> subprocess.Popen:
        if self.supervisor is None:
            self.supervisor = processes.Supervisor(cwd=ROOT, logs=LOGS, env=self.env)
        return self.supervisor.spawn(name, argv, **extra_env)

    def stop_all(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop_all()

    def run(self) -> int:
        started = time.monotonic()
        sandbox_port, web_port = processes.free_port(), processes.free_port()
        sandbox_url = f"http://127.0.0.1:{sandbox_port}"
        web_url = f"http://127.0.0.1:{web_port}"
        self.env = {
            "SANDBOX_URL": sandbox_url, "CORRIDOR_URL": web_url,
            "HORIZON_URL": f"{sandbox_url}/horizon",
            "AP_PLATFORM_URL": f"{sandbox_url}/ap/platform",
            "RAZORPAY_API_URL": f"{sandbox_url}/razorpay",
            "SANDBOX_CALLBACK_URL": f"{web_url}/callbacks",
            "SANDBOX_INTERACTIVE_URL": f"{web_url}/sep24/interactive",
            "SANDBOX_WEBHOOK_URL": f"{web_url}/webhooks/razorpay",
        }
        for key, value in self.env.items():
            setattr(settings, key, value)
        python = sys.executable
        try:
            self.spawn("sandbox", [python, "manage.py", "sandbox", "--addr",
                                   f"127.0.0.1:{sandbox_port}", "--reset"])
            subprocess.run([python, "manage.py", "setup_periodic_tasks"], cwd=ROOT,
                           env={**os.environ, **self.env}, check=True, capture_output=True)
            self.spawn("web", [python, "-m", "gunicorn", "corridor.wsgi", "--bind",
                               f"127.0.0.1:{web_port}", "--workers", "2", "--threads", "8"])
            self.spawn("beat", [python, "-m", "celery", "-A", "corridor", "beat",
                                "--loglevel", "WARNING", "--scheduler",
                                "django_celery_beat.schedulers:DatabaseScheduler"])
            # This worker SIGKILLs itself right after its first Stellar submit.
            doomed = self.spawn("worker-doomed", self._worker_argv("doomed", 1),
                                CORRIDOR_CRASH_AT="after_submit")
            self._wait_http(f"{sandbox_url}/sandbox/faults")
            self._wait_http(f"{web_url}/health/", ok_codes=(200, 503))
            sandbox = _SandboxHandle(sandbox_url)
            from treasury.reconcile import open_distribution, open_razorpayx

            opening = open_distribution(operator="demo")  # before any money moves
            opening_inr = open_razorpayx(operator="demo")  # as manage.py treasury_open
            self.say(f"demo: opening booked: {opening} USDC on stellar:distribution, "
                     f"{opening_inr} INR on razorpayx:current\n")
            sandbox.fault("horizon.submit_504_after_apply", times=2)
            sandbox.fault("ap.event_duplicate", copies=2)
            threading.Thread(target=self._replace_doomed, args=(doomed,), daemon=True).start()

            wallets = self._drive(sandbox)
            self._settle(wallets)
            line = self._summary(sandbox, wallets, time.monotonic() - started)
            withdrawals = self._drive_withdrawals(sandbox)
            line = line.rstrip("\n").rsplit(" elapsed_s=", 1)[0] + " " + \
                self._withdrawal_summary(sandbox, withdrawals) + \
                f" elapsed_s={time.monotonic() - started:.1f}\n"
            line = line.rstrip("\n").rsplit(" elapsed_s=", 1)[0] + " " + \
                self._drive_remittances(sandbox, web_url) + \
                f" elapsed_s={time.monotonic() - started:.1f}\n"
            line = line.rstrip("\n").rsplit(" elapsed_s=", 1)[0] + " " + \
                self._drive_inbound(sandbox) + \
                f" elapsed_s={time.monotonic() - started:.1f}\n"
            fired = " ".join(f"{f['name']}={f['fired']}" for f in
                             sandbox.http.get("/sandbox/faults").json()["faults"])
            self.say(f"demo: faults fired: {fired}\n")
            sandbox.http.delete("/sandbox/faults").raise_for_status()
            line = line.rstrip("\n").rsplit(" elapsed_s=", 1)[0] + " " + \
                self._treasury(sandbox) + f" elapsed_s={time.monotonic() - started:.1f}\n"
        finally:
            self.stop_all()
        self.say(line)
        return 0

    def _drive_withdrawals(self, sandbox) -> list[str]:
        """N withdrawals paid on chain by their wallets, with faults: one poller process
        SIGKILLed right after its provider call, one payout processed then reversed,
        and AP's statuses gone stale (pending_anchor) once they completed."""
        from django_celery_beat.models import PeriodicTask

        from sandbox.drivers import Customer, Wallet

        def poller_enabled(enabled: bool) -> None:
            # save(), not update(): the database scheduler only notices saved changes.
            for task in PeriodicTask.objects.filter(task="payouts.tasks.poll_withdrawals"):
                task.enabled = enabled
                task.save()

        poller_enabled(False)
        time.sleep(6)  # beat re-reads its schedule; queued polls drain
        sandbox.fault("razorpayx.processed_then_reversed", times=1, after_s=1)
        sandbox.fault("razorpayx.settle_delay", seconds=0.5)

        def one(i: int) -> str:
            wallet = Wallet(sandbox)
            wallet.fund_usdc("100")
            transaction_id, url = wallet.start_withdrawal()
            pay = Customer(sandbox).submit_withdrawal(url, str(10 + i))
            wallet.pay(destination=pay["destination"], amount=str(10 + i), memo=pay["memo"])
            return transaction_id

        with ThreadPoolExecutor(max_workers=5) as pool:
            ids = list(pool.map(one, range(self.n)))
        self.say(f"demo: {self.n} withdrawals paid on chain; polling\n")
        time.sleep(2)  # AP's observer sees the payments
        doomed = subprocess.run([sys.executable, "manage.py", "poll_withdrawals"], cwd=ROOT,
                                env={**os.environ, **self.env,
                                     "CORRIDOR_CRASH_AT": "after_provider_call"},
                                capture_output=True, text=True, timeout=120)
        self.poller_killed = doomed.returncode == -signal.SIGKILL
        poller_enabled(True)
        self._settle_withdrawals(ids)
        sandbox.fault("ap.stale_status")  # AP now shows pending_anchor for everything
        time.sleep(6)  # a few more poller periods on stale statuses
        return ids

    def _settle_withdrawals(self, ids: list[str]) -> None:
        from payouts.models import WithdrawalPayout, WithdrawalRequest

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            done = 0
            for transaction_id in ids:
                payout = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
                review = WithdrawalRequest.objects.filter(
                    transaction_id=transaction_id, status="manual_review").exists()
                done += bool(review or (payout is not None and (
                    payout.status in ("reversed", "manual_review", "failed")
                    or (payout.status == "completed" and payout.ap_completed_at))))
            if done == len(ids):
                time.sleep(2)  # the late reversal
                return
            time.sleep(1)

    def _withdrawal_summary(self, sandbox, ids: list[str]) -> str:
        from corridor import invariants

        figures = invariants.withdrawal_figures(sandbox, ids)
        # The demo leaves ap.stale_status on at the end (its point): AP's reads lie, so
        # only the payout counts are reported here.
        figures.violations = [v for v in figures.violations if not v.startswith("ap_mismatch")]
        self._report(figures)
        c = figures.counts
        killed = "yes" if getattr(self, "poller_killed", False) else "no"
        self.say(f"demo: poller killed after its provider call: {killed}\n")
        return (f"withdrawals={len(ids)} "
                f"withdrawals_completed={c['withdrawals_completed']} "
                f"payouts_reversed={c['payouts_reversed']} "
                f"double_payouts={c['double_payouts']}")

    def _drive_remittances(self, sandbox, web_url: str) -> str:
        """DEMO_REMITTANCES (default 20) remittances through the partner API, each funded
        by the sandbox partner on chain, with a mix of anchor outcomes (about one in
        seven rejected before funding, one in seven refunded after funding, one in ten
        failed after funding); waits for every saga to stop and returns the summary keys.
        ``ledger_matches_chain`` compares the hub's USDC in the ledger with the hub
        account's USDC on the sandbox Horizon (both start at zero after the reset)."""
        from corridor import invariants
        from sagas import remittances
        from sagas.models import Saga

        n = int(os.environ.get("DEMO_REMITTANCES", 20))
        wallet = sandbox.http.get("/anchor31/sandbox/partner").json()
        _, key = remittances.partner_create(name="demo-partner",
                                            stellar_account=wallet["account"])
        for fault, times in (("anchor31.reject_before_funding", n // 7),
                             ("anchor31.refund_after_funding", n // 7),
                             ("anchor31.fail_payout", n // 10)):
            if times:
                sandbox.fault(fault, times=times)
        api = httpx.Client(base_url=web_url, timeout=30,
                           headers={"Authorization": f"Bearer {key}"})

        def one(i: int) -> int:
            created = api.post("/api/remittances", headers={"Idempotency-Key": f"demo-{i}"},
                               json={"amount": f"{10 + i}.25", "send_currency": "USDC",
                                     "receive_currency": "INR", "corridor": "USDC-INR",
                                     "beneficiary": {"name": f"Beneficiary {i}",
                                                     "account_number": f"5010012345{i:04d}",
                                                     "ifsc": "HDFC0001234"}})
            created.raise_for_status()
            body = created.json()
            sandbox.http.post("/anchor31/sandbox/partner/pay", json={
                "destination": body["hub_account"], "amount": body["amount"],
                "memo_type": body["memo_type"], "memo": body["memo"]}).raise_for_status()
            return body["memo"]

        with ThreadPoolExecutor(max_workers=5) as pool:
            references = list(pool.map(one, range(n)))
        self.say(f"demo: {n} remittances funded by the partner; waiting for the sagas\n")
        deadline = time.monotonic() + self.timeout
        while (invariants.sagas_of(references).filter(status__in=Saga.OPEN_STATUSES).exists()
               and time.monotonic() < deadline):
            time.sleep(1)
        sagas = invariants.saga_figures(references)
        books = invariants.books()
        self._report(sagas)
        self._report(books)
        done = sagas.counts
        matches = "yes" if books.counts["ledger_matches_chain"] else "no"
        on_chain, in_ledger = books.counts["hub_chain"], books.counts["hub_ledger"]
        shown = "no account" if on_chain is None else format(on_chain, "f")
        self.say(f"demo: hub USDC on chain {shown}, in the ledger {in_ledger:f}\n")
        return (f"sagas={n} sagas_completed={done['sagas_completed']} "
                f"sagas_compensated={done['sagas_compensated']} "
                f"sagas_manual_review={done['sagas_manual_review']} "
                f"ledger_matches_chain={matches}")

    def _drive_inbound(self, sandbox) -> str:
        """DEMO_INBOUND (default 20) SEP-31 remittances a foreign sending anchor sends in
        (sandbox/sender31.py), decided and paid by Corridor's own workers, with faults:
        about one in five receivers registered without the IFSC (AP waits in
        ``pending_customer_info_update`` until the anchor adds it), one in five whose
        bank's registered name differs from the KYC name (fund account validation sends
        it to a person, and the demo's operator rejects it: the USDC is refunded on
        chain), one in five paid short by the anchor (held for review), one in five whose
        account validates but whose bank then refuses the credit (the payout fails with
        ``bank_account_invalid`` and Corridor refunds the USDC by itself). Returns the
        summary keys; every remittance is in exactly one final group
        (``corridor.invariants.inbound_figures``)."""
        from corridor import invariants
        from sandbox.sender31 import RECEIVER_FIELDS, Payment, SendingAnchor

        REFUSED = ("error", "expired", "refunded", "completed")  # noqa: N806 - a constant
        n = int(os.environ.get("DEMO_INBOUND", 20))
        sandbox.fault("ap.stale_status", times=0)  # the withdrawals' lying reads end here
        anchor = SendingAnchor(sandbox.url)
        anchor.ensure_account(minimum_usdc=Decimal(100 * n))
        lock = threading.Lock()

        def one(i: int) -> str:
            sa = SendingAnchor(sandbox.url)
            account = f"9{i:04d}{int(time.time()) % 10**6:06d}"
            fields = {**RECEIVER_FIELDS, "bank_account_number": account}
            if i % 5 == 1:
                del fields["bank_number"]
            if i % 5 == 2:
                sandbox.http.post("/razorpay/sandbox/fund_accounts/validations/accounts",
                                  json={"account_number": account,
                                        "registered_name": "Rahul Mehta"}).raise_for_status()
            if i % 5 == 4:
                sandbox.http.post("/razorpay/sandbox/fund_accounts/validations/accounts",
                                  json={"account_number": account,
                                        "payout_failure": "bank_account_invalid"}
                                  ).raise_for_status()
            with lock:  # one Stellar sequence for the anchor's account
                started = sa.start(amount=f"{20 + i}.5", receiver_fields=fields)
            if i % 5 == 1:
                txn = sa.wait_for_status(started.transaction_id,
                                         ("pending_customer_info_update", *REFUSED),
                                         timeout=self.timeout)
                if txn["status"] in REFUSED:
                    return started.transaction_id  # counted as inbound_rejected
                sa.put_customer(type="sep31-receiver", memo=None,
                                customer_id=started.receiver_id,
                                fields={"bank_number": "HDFC0001234"})
            txn = sa.wait_for_status(started.transaction_id, ("pending_sender", *REFUSED),
                                     timeout=self.timeout)
            if txn["status"] in REFUSED:
                # Corridor refused it before asking for the USDC (a limit, the bank
                # details): a legitimate outcome, counted in the line, never raised.
                self.say(f"demo: inbound {started.transaction_id} refused before "
                         f"funding: {txn['status']} {txn.get('message') or ''}\n")
                return started.transaction_id
            short = Payment(amount=str(Decimal(txn["amount_in"]) - Decimal("0.5"))) \
                if i % 5 == 3 else Payment()
            with lock:
                sa.pay(txn, short)
            return started.transaction_id

        with ThreadPoolExecutor(max_workers=5) as pool:
            ids = list(pool.map(one, range(n)))
        self.say(f"demo: {n} SEP-31 remittances sent in and paid on chain; waiting\n")
        mismatched = ids[2::5]
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self._operator_rejects_mismatches(mismatched)
            figures = invariants.inbound_figures(sandbox, ids)
            if not figures.violations and not figures.counts["inbound_processing"] and \
                    not self._mismatches_waiting(mismatched):
                break
            time.sleep(2)
        self._report(figures)
        c = figures.counts
        return (f"inbound={n} inbound_completed={c['inbound_completed']} "
                f"inbound_refunded={c['inbound_refunded']} "
                f"inbound_review={c['inbound_review']} "
                f"inbound_rejected={c['inbound_rejected']} "
                f"double_payouts_inbound={c['double_payouts_inbound']}")

    @staticmethod
    def _mismatches_waiting(ids: list[str]):
        from payouts.models import WithdrawalRefund, WithdrawalRequest

        return (WithdrawalRequest.objects.filter(
            transaction_id__in=ids, status="manual_review",
            review_reason__contains="name mismatch")
            .exclude(transaction_id__in=WithdrawalRefund.objects.values("transaction_id")))

    def _operator_rejects_mismatches(self, ids: list[str]) -> None:
        """The demo's operator, through the same service as the admin action, refunds
        each remittance held for a registered-name mismatch (a person's call)."""
        from django.contrib.auth.models import Group, User

        from common.console import OperationRefused
        from payouts import operations

        waiting = list(self._mismatches_waiting(ids))
        if not waiting:
            return
        operator, created = User.objects.get_or_create(username="demo-operator",
                                                       defaults={"is_staff": True})
        if created:
            operator.groups.add(Group.objects.get(name="operators"))
        for request in waiting:
            try:
                operations.withdrawal_refund_on_chain(
                    request_id=request.pk, operator=User.objects.get(pk=operator.pk),
                    note="demo: the bank's registered name is not the receiver's; refund")
            except OperationRefused as exc:
                self.say(f"demo: refund of {request.transaction_id} refused: {exc}\n")

    def _worker_argv(self, name: str, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", "corridor", "worker", "--pool", "threads",
                "--concurrency", str(concurrency), "--loglevel", "WARNING", "-n",
                f"{name}@demo", "--without-gossip", "--without-mingle"]

    def _replace_doomed(self, doomed: subprocess.Popen) -> None:
        """Once the doomed worker died (or after a while), start the real workers."""
        deadline = time.monotonic() + 60
        while doomed.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.killed = doomed.returncode == -signal.SIGKILL
        self.spawn("worker-1", self._worker_argv("w1", 4))
        self.spawn("worker-2", self._worker_argv("w2", 4))

    def _wait_http(self, url: str, ok_codes=(200,)) -> None:
        processes.wait_http(url, ok_codes=ok_codes, timeout=60, logs=LOGS)

    def _drive(self, sandbox) -> dict[str, object]:
        from sandbox.drivers import Customer, Wallet

        def one(i: int):
            wallet = Wallet(sandbox)
            memo = {"memo": f"user-{i}", "memo_type": "text"} if i % 2 else {}
            transaction_id, url = wallet.start_deposit(**memo)
            customer = Customer(sandbox)
            order_id = customer.submit_amount(url, str(500 + 37 * i))
            customer.pay(order_id)
            return transaction_id, wallet

        with ThreadPoolExecutor(max_workers=5) as pool:
            results = list(pool.map(one, range(self.n)))
        self.say(f"demo: {self.n} deposits paid by customers; waiting for the releases\n")
        return dict(results)

    def _settle(self, wallets: dict) -> None:
        from anchor import platform
        from anchor.models import DepositRelease

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            terminal = 0
            for transaction_id in wallets:
                ap = platform.get_transaction(transaction_id) or {}
                review = DepositRelease.objects.filter(transaction_id=transaction_id,
                                                       status="manual_review").exists()
                terminal += ap.get("status") == "completed" or review
            if terminal == len(wallets):
                time.sleep(2)  # let duplicate deliveries and retries run out
                return
            time.sleep(1)

    def _summary(self, sandbox, wallets: dict, elapsed: float) -> str:
        from anchor.models import DepositRelease
        from corridor import invariants

        figures = invariants.deposit_figures(
            sandbox, {tid: wallet.address for tid, wallet in wallets.items()})
        self._report(figures)
        c = figures.counts
        review = DepositRelease.objects.filter(status="manual_review").count()
        killed = "yes" if getattr(self, "killed", False) else "no"
        self.say(f"demo: worker killed mid-release: {killed}\n")
        return (f"demo: deposits={len(wallets)} deposits_completed={c['deposits_completed']} "
                f"manual_review={review} "
                f"double_payments={c['double_payments'] + c['stray_payments']} "
                f"ap_mismatches={c['ap_mismatches']} elapsed_s={elapsed:.1f}\n")

    # --- treasury (issue 13 §2, §3, §5) ---------------------------------------------------
    def _treasury(self, sandbox) -> str:
        """Two deposits paid after AP expired them (refunded through Razorpay), then K
        known discrepancies, each injected on one payment or payout of its own (one at a
        time, so the fault lands where the demo says), one late settlement as a control
        (inside its window: no break), and the reconciliation compared with them by
        reference."""
        from anchor.models import DepositPayment, DepositRefund
        from corridor import invariants
        from ledger import chart
        from payouts.models import WithdrawalRefund
        from treasury.models import Break
        from treasury.reconcile import reconcile

        late = dict(self._late_deposit(sandbox, i) for i in range(2))
        injected: set[tuple[str, str, str]] = set()
        deposits = {}
        for fault, params, expect in (
                ("razorpay.settlement_fee_mismatch", {"fee_extra": 100}, "amount_differs"),
                ("razorpay.settlement_omit_payment", {}, "missing_outside"),
                ("razorpay.settlement_delay", {"cycles": 1}, None)):
            transaction_id, payment_id = self._deposit_with(sandbox, fault, params)
            deposits[transaction_id] = payment_id
            if expect:
                injected.add(("razorpay", expect, payment_id))
        for fault, params, expect in (
                ("razorpayx.statement_fee_mismatch", {"fees_extra": 100}, "amount_differs"),
                ("razorpayx.reversal_statement_only", {"after_s": 1}, "missing_in_books")):
            payout_id, status = self._withdrawal_with(sandbox, fault, params)
            reference = f"reversal:{payout_id}" if expect == "missing_in_books" else payout_id
            if expect == "missing_in_books" and status == "reversed":
                # Corridor's first read of the payout came after the silent reversal (a
                # loaded machine): it booked the reversal itself, so nothing is missing.
                self.say(f"demo: Corridor read {payout_id} reversed itself: no break "
                         "expected for its reversal\n")
                continue
            injected.add(("razorpayx", expect, reference))
        self.say(f"demo: {len(injected)} discrepancies injected: {sorted(injected)}\n")
        omitted = [p for (_, kind, p) in injected if kind == "missing_outside"]

        def settled() -> bool:
            # every payment but the omitted one settled and booked, the omitted one past
            # its window, the late refunds final, the reversal in the statement
            run = reconcile(trigger="demo")
            if run.status != "done":
                return False
            payments = DepositPayment.objects.filter(confirmation="confirmed").exclude(
                transaction_id__in=DepositRefund.objects.values("transaction_id"))
            unsettled = [p for p in payments if p.payment_id not in omitted and
                         not chart.posted(chart.settled_key(p.payment_id))]
            seen = {(b.source, b.kind, b.reference) for b in Break.objects.filter(status="open")}
            refunds_open = DepositRefund.objects.filter(
                status__in=DepositRefund.OPEN_STATUSES).exists()
            return not unsettled and not refunds_open and injected <= seen

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and not settled():
            time.sleep(2)
        run = reconcile(trigger="demo")
        open_ = {(b.source, b.kind, b.reference) for b in Break.objects.filter(status="open")}
        matched, missed, spurious = injected & open_, injected - open_, open_ - injected
        for item in sorted(missed):
            self.say(f"demo: break missed: {item}\n")
        for item in sorted(spurious):
            self.say(f"demo: break spurious: {item} "
                     f"{Break.objects.get(key=':'.join(item)[:200]).outside}\n")
        for name, b in sorted(run.balances.items()):
            self.say(f"demo: balance {name}: {b}\n")
        compared = all(b.get("compared", True) for b in run.balances.values())
        balanced = not any(k == "balance_differs" for _, k, _ in open_)
        figures = invariants.late_deposit_figures(sandbox, late)
        self._report(figures)
        self._write_report(run.day)
        ok = run.status == "done" and compared and balanced and not spurious
        refunds_usdc = WithdrawalRefund.objects.filter(status="completed").count()
        return (f"books_match_outside={'yes' if ok else 'no'} "
                f"breaks_injected={len(injected)} breaks_matched={len(matched)} "
                f"breaks_missed={len(missed)} breaks_spurious={len(spurious)} "
                f"refunds_inr={figures.counts['refunds_inr']} refunds_usdc={refunds_usdc}")

    def _write_report(self, day) -> None:
        from treasury import report

        LOGS.mkdir(parents=True, exist_ok=True)
        path = LOGS / f"daily-report-{day}.csv"
        path.write_text(report.report_csv(day))
        self.say(f"demo: daily report {day} written to {path}\n")
        for row in report.daily_report(day):
            self.say(f"demo: report {row.account} {row.currency} opening={row.opening} "
                     f"debits={row.debits} credits={row.credits} closing={row.closing} "
                     f"breaks_open={row.breaks_open}\n")

    def _late_deposit(self, sandbox, i: int) -> tuple[str, str]:
        """A deposit paid after AP expired it (as chaos's late deposit): (AP id, the
        wallet's address)."""
        from anchor import platform
        from anchor.models import DepositRefund
        from sandbox.drivers import Customer, Wallet

        wallet = Wallet(sandbox)
        transaction_id, url = wallet.start_deposit()
        customer = Customer(sandbox)
        order_id = customer.submit_amount(url, str(900 + 13 * i))
        platform.rpc_once("notify_transaction_expired",
                          {"transaction_id": transaction_id, "message": "demo: paid too late"},
                          reached=lambda tx: tx["status"] == "expired")
        customer.pay(order_id)
        self._until(lambda: DepositRefund.objects.filter(transaction_id=transaction_id).exists(),
                    f"the refund of late deposit {transaction_id}")
        return transaction_id, wallet.address

    def _deposit_with(self, sandbox, fault: str, params: dict) -> tuple[str, str]:
        from anchor import platform
        from anchor.models import DepositPayment
        from sandbox.drivers import Customer, Wallet

        sandbox.fault(fault, times=1, **params)
        wallet = Wallet(sandbox)
        transaction_id, url = wallet.start_deposit()
        customer = Customer(sandbox)
        customer.pay(customer.submit_amount(url, "777"))
        payment = self._until(lambda: DepositPayment.objects.filter(
            transaction_id=transaction_id).first(), f"the payment of {transaction_id}")
        self._until(lambda: (platform.get_transaction(transaction_id) or {}).get(
            "status") == "completed", f"deposit {transaction_id} completed")
        return transaction_id, payment.payment_id

    def _withdrawal_with(self, sandbox, fault: str, params: dict) -> tuple[str, str]:
        """A withdrawal paid with ``fault`` on: (RazorpayX payout id, Corridor's payout
        status once final: ``completed``, or ``reversed`` when a reversal the fault
        schedules was read before the payout was seen processed)."""
        from payouts.models import WithdrawalPayout
        from sandbox.drivers import Customer, Wallet

        sandbox.fault(fault, times=1, **params)
        wallet = Wallet(sandbox)
        wallet.fund_usdc("100")
        transaction_id, url = wallet.start_withdrawal()
        pay = Customer(sandbox).submit_withdrawal(url, "15")
        wallet.pay(destination=pay["destination"], amount="15", memo=pay["memo"])
        payout = self._until(lambda: WithdrawalPayout.objects.filter(
            transaction_id=transaction_id, status__in=("completed", "reversed")).first(),
            f"the payout of {transaction_id}")
        return payout.provider_payout_id, payout.status

    def _until(self, probe, what: str):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            time.sleep(0.5)
        raise RuntimeError(f"demo: timed out waiting for {what}")

    def _report(self, figures) -> None:
        for violation in figures.violations:
            self.say(f"demo: violation: {violation}\n")


class _SandboxHandle:
    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def fault(self, name: str, *, times: int | None = None, **params) -> None:
        self.http.post("/sandbox/faults", json={"name": name, "times": times, "params": params}
                       ).raise_for_status()
