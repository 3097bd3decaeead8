"""Bench part ``releases`` (issue 11 §1): deposit releases per ledger close with N
channel accounts and asynchronous submission, against the sandbox closing a ledger
every 5 s like the real network. Never a test.

``python -m bench.releases --rounds N [--channels 20] [--ledger-close 5] [--steady 10]``
with DATABASE_URL (the server: fresh databases ``corridor_bench_releases`` and
``corridor_bench_releases_sandbox`` are created and dropped here) and CELERY_BROKER_URL.

What runs, each in its own process, as in ``make run``: the sandbox (Horizon, AP,
Razorpay stand-ins), Corridor's web (gunicorn, as Procfile) receiving the sandbox's
webhooks and AP events, and Celery workers (threads pool) doing the releases with
STELLAR_SUBMIT_MODE=async (two worker processes of 8 threads by default) and N channels
created by ``channels_create`` (seeds derived
from a dev secret). Setup (not measured) runs with 0.2 s ledgers: N channels, wallets
with USDC trustlines, and a backlog of deposits paid through the real flow (SEP-24
start, interactive form, Razorpay checkout, webhook, confirmation, AP
``notify_offchain_funds_received``), so each is ``pending_anchor`` with a captured
payment of ours: ready to release. Then the sandbox restarts on the same state with
``--ledger-close`` s ledgers, the worker starts and one ``deposit_release`` task per
deposit is enqueued at once.

Measured: payments applied on the sandbox ledger per ledger close (USDC payments from
the distribution account, read per ledger from ``/ledgers/{n}/payments``), over the
steady ledgers: after 2 warm-up ledgers, while the deposits not yet paid are at least
twice the channels. ``releases_per_ledger_per_channel`` = median payments per steady
ledger / channels; the ``--steady`` ledgers are split into ``--rounds`` consecutive
rounds, and the table shows the median [min-max] over ledgers and over rounds.
``cpu_ms_per_release``: CPU time (user + system, from /proc) of the Corridor processes
(the workers, and gunicorn's master and workers) across the
steady ledgers, divided by the payments in them. The sandbox's CPU is not Corridor's and
is printed apart. There is nothing to interleave: one system, one figure per ledger.

Last stdout line: ``releases: channels=… ledger_close_s=… releases_per_ledger_per_channel=…
cpu_ms_per_release=… …``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from bench.common import recreate, spread, with_name  # noqa: E402
from corridor.processes import free_port  # noqa: E402

WARMUP_LEDGERS = 2
SEED_SECRET = "bench-releases-dev-secret"
CLK_TCK = os.sysconf("SC_CLK_TCK")



def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (all threads), from /proc."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(entry)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        fields = stats.get(current)
        if fields:
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        todo.extend(children.get(current, []))
    return total


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict, log_dir: Path):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def wait_http(url: str, proc: Proc, timeout: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited: {proc.log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{proc.name} not ready at {url}")


class SandboxHandle:
    def __init__(self, url: str):
        import httpx

        self.url = url
        self.http = httpx.Client(base_url=url, timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument("--ledger-close", type=float, default=5.0)
    parser.add_argument("--steady", type=int, default=10)
    parser.add_argument("--wallets", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="threads per worker")
    parser.add_argument("--follow-delay", type=float, default=0.5)
    args = parser.parse_args()
    rounds = max(1, args.rounds)
    steady_total = max(args.steady, rounds)
    per_round = steady_total // rounds  # the last round takes the remainder
    channels = args.channels
    deposits = channels * (steady_total + WARMUP_LEDGERS + 1) + 2 * channels

    server = os.environ["DATABASE_URL"]
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:63799/0")
    db_url = with_name(server, "corridor_bench_releases")
    sandbox_db = with_name(server, "corridor_bench_releases_sandbox")
    recreate(db_url)
    recreate(sandbox_db)
    web_port, sandbox_port = free_port(), free_port()
    corridor_url, sandbox_url = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{sandbox_port}"
    env = {
        **os.environ,
        "DATABASE_URL": db_url, "SANDBOX_DATABASE_URL": sandbox_db,
        "CELERY_BROKER_URL": broker, "SANDBOX_URL": sandbox_url, "CORRIDOR_URL": corridor_url,
        "SANDBOX_CALLBACK_URL": f"{corridor_url}/callbacks",
        "SANDBOX_INTERACTIVE_URL": f"{corridor_url}/sep24/interactive",
        "SANDBOX_WEBHOOK_URL": f"{corridor_url}/webhooks/razorpay",
        "STELLAR_SUBMIT_MODE": "async", "STELLAR_CHANNEL_SEED_SECRET": SEED_SECRET,
        "STELLAR_CHANNEL_POOL_SIZE": str(channels),
        "RELEASE_FOLLOW_DELAY_S": str(args.follow_delay), "CHANNEL_WAIT_RETRY_S": "60",
        "STELLAR_LEDGER_CLOSE_S": str(args.ledger_close),
        "STELLAR_TX_TIMEOUT_S": str(max(20.0, 4 * args.ledger_close)),
        "SANDBOX_SUBMISSION_TIMEOUT_S": "30", "CORRIDOR_ENV_FILE": os.devnull,
    }
    env.pop("DJANGO_DEBUG", None)
    os.environ.update({k: v for k, v in env.items() if isinstance(v, str)})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "corridor.settings.development")
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / "bench-releases"
    log_dir.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    procs: list[Proc] = []
    try:
        subprocess.run([python, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                       env=env, check=True)
        sandbox = Proc("sandbox-setup", [python, "manage.py", "sandbox", "--addr",
                                         f"127.0.0.1:{sandbox_port}", "--reset"],
                       {**env, "SANDBOX_LEDGER_CLOSE_S": "0.2"}, log_dir)
        procs.append(sandbox)
        web = Proc("web", [python, "-m", "gunicorn", "corridor.wsgi", "--config",
                           "gunicorn.conf.py", "--bind", f"127.0.0.1:{web_port}",
                           "--workers", "2", "--threads", "4", "--timeout", "60"], env, log_dir)
        procs.append(web)
        wait_http(f"{sandbox_url}/sandbox/faults", sandbox)
        wait_http(f"{corridor_url}/health/", web)

        import django

        django.setup()
        ids = _setup(SandboxHandle(sandbox_url), channels=channels, deposits=deposits,
                     wallets=args.wallets)

        sandbox.stop()
        procs.remove(sandbox)
        sandbox = Proc("sandbox", [python, "manage.py", "sandbox", "--addr",
                                   f"127.0.0.1:{sandbox_port}"],
                       {**env, "SANDBOX_LEDGER_CLOSE_S": str(args.ledger_close)}, log_dir)
        procs.append(sandbox)
        wait_http(f"{sandbox_url}/sandbox/faults", sandbox)
        workers = [Proc(f"worker{n}", [python, "-m", "celery", "-A", "corridor", "worker",
                                       "--pool", "threads", "--concurrency",
                                       str(args.concurrency), "--loglevel", "WARNING",
                                       "--without-gossip", "--without-mingle",
                                       "--without-heartbeat", "-n",
                                       f"bench-releases-{n}-{os.getpid()}@bench"], env, log_dir)
                   for n in range(args.workers)]
        procs.extend(workers)
        time.sleep(3)
        result = _measure(SandboxHandle(sandbox_url), ids, channels=channels,
                          steady_total=steady_total, rounds=rounds, per_round=per_round,
                          corridor_pids=[w.proc.pid for w in workers] + [web.proc.pid],
                          sandbox_pid=sandbox.proc.pid, ledger_close=args.ledger_close)
    finally:
        for proc in reversed(procs):
            proc.stop()
        from django.db import connections

        connections.close_all()
        recreate(db_url, drop_only=True)
        recreate(sandbox_db, drop_only=True)
    _report(result, channels=channels, ledger_close=args.ledger_close, deposits=deposits)
    return 0


def _setup(sandbox, *, channels: int, deposits: int, wallets: int) -> list[str]:
    """N channels, wallets trusting USDC, ``deposits`` paid deposits in pending_anchor."""
    from anchor import channels as channel_service
    from anchor import deposits as deposit_service
    from anchor import inbox
    from anchor.models import DepositPayment
    from corridor.celery import app
    from sandbox.drivers import Customer, Wallet

    started = time.monotonic()
    # The drain below runs in this process: its per-payment INFO lines are not the bench's.
    logging.getLogger("anchor").setLevel(logging.WARNING)
    channel_service.channels_create(count=channels)
    people = [Wallet(sandbox) for _ in range(wallets)]

    def one(i: int) -> str:
        # The interactive form's service (anchor.deposits.deposit_submit) in this
        # process instead of its HTML pages: the same Razorpay order and AP call.
        wallet = people[i % len(people)]
        transaction_id, _ = wallet.start_deposit()
        order = deposit_service.deposit_submit(transaction_id=transaction_id,
                                               amount_in=Decimal("500"))
        Customer(sandbox).pay(order.order_id)
        return transaction_id

    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(one, range(deposits)))
    deadline = time.monotonic() + 120
    while DepositPayment.objects.filter(transaction_id__in=ids).count() < len(ids):
        if time.monotonic() > deadline:
            raise RuntimeError("payment webhooks did not all arrive")
        inbox.drain()  # the web server stores webhooks; a worker applies them (none yet)
        time.sleep(0.5)
    app.control.purge()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda t: deposit_service.notify_funds_received(transaction_id=t), ids))
    time.sleep(2)  # AP's pending_anchor events reach the web server and enqueue releases
    app.control.purge()  # ...which the bench enqueues itself, all at once
    _redis_clear()
    print(f"setup: {channels} channels, {len(people)} wallets, {len(ids)} deposits ready "
          f"to release in {time.monotonic() - started:.0f}s", flush=True)
    return ids


def _redis_clear() -> None:
    from anchor import stellar

    stellar._redis().delete(stellar.AWAITING_KEY, stellar.REFUSALS_KEY)


def _ledger_payments(sandbox, sequence: int, distribution: str) -> int:
    page = sandbox.http.get(f"/horizon/ledgers/{sequence}/payments",
                            params={"limit": 200}).json()
    return sum(1 for r in page["_embedded"]["records"]
               if r.get("type") == "payment" and r.get("from") == distribution
               and r.get("asset_code") == "USDC")


def _latest_ledger(sandbox) -> int:
    page = sandbox.http.get("/horizon/ledgers", params={"order": "desc", "limit": 1}).json()
    return int(page["_embedded"]["records"][0]["sequence"])


def _measure(sandbox, ids: list[str], *, channels: int, steady_total: int, rounds: int,
             per_round: int, corridor_pids: list[int], sandbox_pid: int,
             ledger_close: float) -> dict:
    from anchor import stellar, tasks
    from anchor.models import DepositRelease

    distribution = stellar.distribution_keypair().public_key
    start_ledger = _latest_ledger(sandbox)
    for transaction_id in ids:
        tasks.deposit_release.delay(transaction_id)
    enqueued_at = time.monotonic()
    seen = start_ledger
    paid_total = 0
    ledgers: list[dict] = []
    deadline = time.monotonic() + ledger_close * (steady_total + WARMUP_LEDGERS + 20)
    while time.monotonic() < deadline:
        latest = _latest_ledger(sandbox)
        if latest == seen:
            time.sleep(0.2)
            continue
        cpu, sandbox_cpu = sum(tree_cpu_s(p) for p in corridor_pids), tree_cpu_s(sandbox_pid)
        for sequence in range(seen + 1, latest + 1):
            paid = _ledger_payments(sandbox, sequence, distribution)
            paid_total += paid
            ledgers.append({"sequence": sequence, "paid": paid, "cpu": cpu,
                            "sandbox_cpu": sandbox_cpu, "unpaid": len(ids) - paid_total})
        seen = latest
        steady = [entry for entry in ledgers[WARMUP_LEDGERS:]
                  if entry["unpaid"] >= 2 * channels]
        if len(steady) >= steady_total + 1:
            break
    steady = [entry for entry in ledgers[WARMUP_LEDGERS:] if entry["unpaid"] >= 2 * channels]
    window = steady[1:steady_total + 1]  # CPU is read at each close: deltas from the one before
    if len(window) < steady_total:
        raise RuntimeError(f"only {len(window)} steady ledgers: {ledgers}")
    first = steady[0]
    releases = sum(entry["paid"] for entry in window)
    cpu_s = window[-1]["cpu"] - first["cpu"]
    sandbox_cpu_s = window[-1]["sandbox_cpu"] - first["sandbox_cpu"]
    per_ledger = [entry["paid"] for entry in window]
    groups = [per_ledger[i * per_round:(i + 1) * per_round if i < rounds - 1 else None]
              for i in range(rounds)]
    completed = DepositRelease.objects.filter(status="completed").count()
    return {"per_ledger": per_ledger, "round_medians": [statistics.median(g) for g in groups],
            "releases": releases, "cpu_ms": 1000 * cpu_s / max(releases, 1),
            "sandbox_cpu_ms": 1000 * sandbox_cpu_s / max(releases, 1),
            "refusals": stellar.channel_refusals(), "completed": completed,
            "elapsed_s": time.monotonic() - enqueued_at, "ledgers": ledgers}


def _report(result: dict, *, channels: int, ledger_close: float, deposits: int) -> None:
    per_channel = statistics.median(result["per_ledger"]) / channels
    print(f"releases per ledger ({len(result['per_ledger'])} steady ledgers of "
          f"{ledger_close:g}s, {channels} channels, backlog {deposits} deposits): "
          f"{spread(result['per_ledger'], '.1f')}; per round (median of its ledgers): "
          f"{spread(result['round_medians'], '.1f')}")
    print("releases per ledger per channel: "
          f"{spread([v / channels for v in result['per_ledger']])}")
    print(f"Corridor CPU per release (worker + web): {result['cpu_ms']:.1f} ms; "
          f"sandbox CPU per release (not Corridor's): {result['sandbox_cpu_ms']:.1f} ms")
    print(f"per ledger paid: {result['per_ledger']}; claims refused for want of a channel: "
          f"{result['refusals']}; completed when measured: {result['completed']}")
    print(f"releases: channels={channels} ledger_close_s={ledger_close:g} "
          f"releases_per_ledger_per_channel={per_channel:.2f} "
          f"cpu_ms_per_release={result['cpu_ms']:.1f} "
          f"sandbox_cpu_ms_per_release={result['sandbox_cpu_ms']:.1f} "
          f"steady_ledgers={len(result['per_ledger'])} refusals={result['refusals']}")


if __name__ == "__main__":
    sys.exit(main())
