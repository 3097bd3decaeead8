"""Bench part ``ingest`` (issue 11 §3): AP callbacks and Razorpay / RazorpayX webhooks
against a trivial view, on the production web command, plus memory over 100K events.

Usage: ``python -m bench.ingest --rounds 3`` (``make bench`` calls it through
``bench/run.py``). Needs ``DATABASE_URL`` (the server; a fresh database
``corridor_bench_ingest`` is created and dropped here), ``CELERY_BROKER_URL``, and
``wrk`` (Debian package ``wrk``; installed with apt-get when missing and run as root).

- **Same server for all**: gunicorn with ``gunicorn.conf.py`` and the ``web`` line of
  ``Procfile`` (workers, threads, timeout), ``CORRIDOR_BENCH_NOOP=1`` adding the
  trivial view ``POST /bench/noop`` (corridor/views.py ``bench_noop``: the same
  middleware, no work), and one Celery worker as ``Procfile``'s ``worker`` line, which
  drains the follow-ups (anchor/inbox.py). The follow-up tasks themselves (release,
  payment confirmation) are routed (``CELERY_TASK_ROUTES``) to a queue no one consumes,
  ``bench_sink``, and counted there: each recorded event's follow-up is dispatched
  exactly once (checked at the end) and nothing reaches a sandbox.
- **Load**: ``wrk`` in its own process, 1 thread, ``--connections`` keep-alive
  connections, each request taken from a file of pre-built, distinct, correctly signed
  events (a thread stops when its share runs out; the file is sized from the noop's
  rate so it does not). Templates, read in place from ``../shared/reference``:
  AP: the transaction of ``anchor-platform/examples/sep24-deposit-short-flow
  .rpc-responses.json`` in ``pending_anchor`` inside a ``transaction_status_changed``
  event (AP NOTES §3; ``Authorization: Bearer`` JWT HS256 with the callback secret);
  Razorpay: ``razorpay/webhook_payment_captured_upi.json`` for one of the orders made
  here (amount and currency matching, so each is ``recorded``); RazorpayX:
  ``razorpay/webhook_payout_processed_upi.json`` for payouts Corridor does not hold
  (``unknown_payout``: the payout webhook of a known payout asks RazorpayX itself
  before answering, issue 9, and no RazorpayX runs here).
- **Interleaved**: each round runs noop, AP, Razorpay, RazorpayX for ``--seconds``
  each; a ratio is the kind's requests/s over the same round's noop; printed as
  median [min-max] over the rounds.
- **Memory**: then AP events until 10K and 100K have been recorded; RSS (``/proc``)
  summed over the gunicorn workers and over the Celery worker's processes at each
  mark; ``rss_growth_pct`` is the larger growth of the two.

Last line: ``ingest: ingest_vs_noop=<worst kind's median ratio> rss_growth_pct=<...>
noop_rps=... ap_rps=... razorpay_rps=... razorpayx_rps=...`` (medians).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import recreate, spread, with_name
from corridor.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "reference"
DB_NAME = "corridor_bench_ingest"
SINK = "bench_sink"
KINDS = ("noop", "ap", "razorpay", "razorpayx")
PATHS = {"noop": "/bench/noop", "ap": "/callbacks/event",
         "razorpay": "/webhooks/razorpay/payments", "razorpayx": "/webhooks/razorpay/payouts"}
# Sandbox values of the development settings (corridor/settings/base.py), which the
# bench's server runs with.
AP_SECRET = "sandbox-callback-secret-0123456789abcdef0123"
WEBHOOK_SECRET = "sandbox-razorpay-webhook-secret"
ORDER_PAISE = 100000

LUA = r"""
local reqs, n, i = {}, 0, 0
function setup(thread) end
function init(args)
  local f = assert(io.open(args[1], "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local nl = string.find(data, "\n", pos, true)
    local len = tonumber(string.sub(data, pos, nl - 1))
    n = n + 1
    reqs[n] = string.sub(data, nl + 1, nl + len)
    pos = nl + 1 + len
  end
end
function request()
  i = i + 1
  if i > n then
    wrk.thread:stop()
    return reqs[n]
  end
  return reqs[i]
end
"""



def _need_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=False,
                       stdout=subprocess.DEVNULL)
        found = shutil.which("wrk")
        if not found:
            subprocess.run(["apt-get", "update", "-q"], check=False, stdout=subprocess.DEVNULL)
            subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=False,
                           stdout=subprocess.DEVNULL)
            found = shutil.which("wrk")
    if not found:
        sys.exit("bench.ingest needs wrk: apt-get install -y wrk")
    return found


def _procfile_argv(name: str) -> list[str]:
    """``Procfile``'s ``name`` command, words split (the production serve)."""
    import shlex

    line = next(raw for raw in (ROOT / "Procfile").read_text().splitlines()
                if raw.startswith(f"{name}:"))
    return shlex.split(line.split(":", 1)[1])


# --- events ----------------------------------------------------------------------------

class Events:
    """Distinct, correctly signed request bodies of each kind (templates read in place)."""

    def __init__(self, port: int):
        self.port = port
        self.counter = 0
        examples = REFERENCE / "anchor-platform" / "examples"
        responses = json.loads((examples / "sep24-deposit-short-flow.rpc-responses.json")
                               .read_text())
        self.ap_tx = next(r["result"] for r in responses
                          if isinstance(r.get("result"), dict)
                          and r["result"].get("kind") == "deposit")
        self.payment = json.loads((REFERENCE / "razorpay" / "webhook_payment_captured_upi.json")
                                  .read_text())
        self.payout = json.loads((REFERENCE / "razorpay" / "webhook_payout_processed_upi.json")
                                 .read_text())
        import jwt

        self.ap_auth = "Bearer " + jwt.encode({"exp": int(time.time()) + 7200,
                                               "iat": int(time.time())},
                                              AP_SECRET, algorithm="HS256")
        self.next_order = 0

    def _raw(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                "Content-Type: application/json", f"Content-Length: {len(body)}",
                *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    def one(self, kind: str) -> bytes:
        self.counter += 1
        n = self.counter
        if kind == "noop":
            return self._raw(PATHS[kind], b'{"n": %d}' % n, {})
        if kind == "ap":
            tx = {**self.ap_tx, "id": f"bench-{uuid.uuid4()}", "status": "pending_anchor"}
            body = json.dumps({"id": str(uuid.uuid4()), "type": "transaction_status_changed",
                               "timestamp": "2026-12-02T00:00:00Z",
                               "payload": {"transaction": tx}}).encode()
            return self._raw(PATHS[kind], body, {"Authorization": self.ap_auth})
        if kind == "razorpay":
            order = self.next_order
            self.next_order += 1
            event = json.loads(json.dumps(self.payment))
            entity = event["payload"]["payment"]["entity"]
            entity.update(id=f"pay_bench{order:012d}", order_id=f"order_bench{order:012d}",
                          amount=ORDER_PAISE, base_amount=ORDER_PAISE, currency="INR")
            body = json.dumps(event).encode()
        else:
            event = json.loads(json.dumps(self.payout))
            event["payload"]["payout"]["entity"].update(
                id=f"pout_bench{n:012d}", reference_id=f"bench-unknown-{n}")
            body = json.dumps(event).encode()
        signature = hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
        return self._raw(PATHS[kind], body, {"X-Razorpay-Signature": signature,
                                             "X-Razorpay-Event-Id": f"evt_bench_{n}"})

    def file(self, kind: str, count: int, folder: Path) -> Path:
        path = folder / f"{kind}-{self.counter}.req"
        with path.open("wb") as out:
            for _ in range(count):
                raw = self.one(kind)
                out.write(b"%d\n" % len(raw) + raw)
        return path


# --- processes ---------------------------------------------------------------------------

def _rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return found


def _start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


_TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def _cpu_ms(pids) -> float:
    """User + system CPU milliseconds the processes ``pids`` have used so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) * _TICK_MS  # utime, stime
    return total


class CpuGroups:
    """CPU time of each process group during one wrk run (where a request's time
    goes): ``web`` (gunicorn's workers), ``worker`` (Celery's processes), ``postgres``
    (every process of the bench's server: backends, WAL writer, ...; found by the
    postmaster's pid file), ``wrk`` (the load generator, from its rusage)."""

    def __init__(self, web: subprocess.Popen, worker: subprocess.Popen, url: str):
        self.web, self.worker = web, worker
        from corridor import devservices  # the bench's server (DEVSERVICES_DIR)

        pid_file = devservices.PG_DATA / "postmaster.pid"
        self.postmaster = int(pid_file.read_text().split()[0]) if pid_file.exists() else None

    def groups(self) -> dict[str, list[int]]:
        return {"web": _children(self.web.pid),
                "worker": [self.worker.pid, *_children(self.worker.pid)],
                "postgres": ([self.postmaster, *_children(self.postmaster)]
                             if self.postmaster else [])}

    def snapshot(self) -> dict[str, float]:
        import resource

        taken = {name: _cpu_ms(pids) for name, pids in self.groups().items()}
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        taken["wrk"] = (children.ru_utime + children.ru_stime) * 1000.0
        return taken


def _wrk(wrk: str, port: int, path: str, script: Path, req_file: Path, seconds: float,
         connections: int) -> tuple[float, int, int]:
    """(requests/s, requests, non-2xx) of one wrk run."""
    out = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
         "-s", str(script), f"http://127.0.0.1:{port}{path}", "--", str(req_file)],
        capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return rps, requests, int(bad.group(1)) if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per kind per round")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--events", type=int, default=100_000,
                        help="memory phase total (0: skip the memory phase)")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (interleaved comparisons)")

    wrk = _need_wrk()
    url = with_name(os.environ["DATABASE_URL"], DB_NAME)
    broker = os.environ["CELERY_BROKER_URL"]
    recreate(url)
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    script = work / "events.lua"
    script.write_text(LUA)
    env = {**os.environ, "DATABASE_URL": url, "CELERY_BROKER_URL": broker,
           "CORRIDOR_BENCH_NOOP": "1", "PORT": str(port),
           "CORRIDOR_ENV_FILE": os.devnull, "LOG_LEVEL": "INFO",
           "CELERY_TASK_ROUTES": json.dumps({
               "anchor.tasks.deposit_release": {"queue": SINK},
               "anchor.tasks.deposit_funds_received": {"queue": SINK}}),
           "PROMETHEUS_MULTIPROC_DIR": str(work / "prometheus")}
    for name in ("DJANGO_SECRET_KEY", "DJANGO_DEBUG", "CORRIDOR_ENV"):
        env.pop(name, None)  # development settings, DEBUG off (sandbox secrets)
    (work / "prometheus").mkdir()
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT,
                   env=env, check=True)
    import redis

    sink = redis.Redis.from_url(broker)
    sink.delete(SINK, "celery")
    py = str(Path(sys.executable).parent)
    web_words = _procfile_argv("web")
    web = _start([sys.executable, "-m", *web_words[:1], *web_words[1:], "--bind",
                  f"127.0.0.1:{port}"], env, work / "web.log")
    worker_words = _procfile_argv("worker")
    worker = _start([f"{py}/celery", *worker_words[1:]], env, work / "worker.log")
    try:
        _run(args, wrk, port, script, work, env, web, worker, sink, url)
    finally:
        _stop(web)
        _stop(worker)
        sink.delete(SINK)
        if not args.keep:
            recreate(url, drop_only=True)
            shutil.rmtree(work, ignore_errors=True)


def _psql_count(url: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def _wait_up(port: int, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"http://127.0.0.1:{port}/bench/noop", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("gunicorn did not come up")


def _orders(url: str, count: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy("COPY deposit_orders (transaction_id, order_id, status, amount_in, "
                      "amount_in_paise, fee, amount_out, rate, currency, created_at, "
                      "updated_at) FROM STDIN") as copy:
            for i in range(count):
                copy.write_row([f"bench-deposit-{i}", f"order_bench{i:012d}",
                                "awaiting_payment", "1000.00", ORDER_PAISE, "20.00",
                                "11.5294118", "85.0000", "INR", "now", "now"])


def _run(args, wrk, port, script, work, env, web, worker, sink, url) -> None:
    _wait_up(port)
    events = Events(port)
    # Warm-up and sizing: the noop's rate bounds every kind's (a file per run).
    warm = events.file("noop", 200_000, work)
    noop_rps, _, _ = _wrk(wrk, port, PATHS["noop"], script, warm, 2, args.connections)
    warm.unlink()
    per_run = int(noop_rps * args.seconds * 1.5) + 1000
    _orders(url, per_run * args.rounds + 10)
    print(f"ingest bench: gunicorn {' '.join(_procfile_argv('web')[1:])}; worker "
          f"{' '.join(_procfile_argv('worker')[1:])}; wrk -t1 -c{args.connections}, "
          f"{args.seconds:.0f} s per kind per round, {args.rounds} rounds "
          f"(noop warm-up {noop_rps:.0f} req/s)")
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    sent = {k: 0 for k in KINDS}
    cpu = CpuGroups(web, worker, url)
    cpu_per_request: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS:
            req_file = events.file(kind, per_run, work)
            before = cpu.snapshot()
            rps, requests, bad = _wrk(wrk, port, PATHS[kind], script, req_file,
                                      args.seconds, args.connections)
            after = cpu.snapshot()
            for group, used in after.items():
                cpu_per_request[kind].setdefault(group, []).append(
                    (used - before.get(group, 0.0)) / max(1, requests))
            req_file.unlink()
            if bad:
                raise SystemExit(f"{kind}: {bad} non-2xx responses (see {work}/web.log)")
            if requests >= per_run:
                raise SystemExit(f"{kind}: the request file ran out ({requests} sent)")
            rates[kind].append(rps)
            sent[kind] += requests
            print(f"  round {r + 1} {kind:<10} {rps:8.0f} req/s ({requests} requests)")
    ratios = {k: [rates[k][i] / rates["noop"][i] for i in range(args.rounds)]
              for k in KINDS if k != "noop"}
    print(f"{'kind':<10} {'req/s median [min-max]':>28} {'vs noop median [min-max]':>28}")
    for kind in KINDS:
        ratio = spread(ratios[kind]) if kind in ratios else "1"
        print(f"{kind:<10} {spread(rates[kind], '.0f'):>28} {ratio:>28}")
    groups = ("web", "postgres", "worker", "wrk")
    print("CPU ms per request, median [min-max] over the rounds (2 cores: 2000 ms/s in all)")
    print(f"{'kind':<10}" + "".join(f"{g:>20}" for g in groups) + f"{'sum':>8}")
    for kind in KINDS:
        per = cpu_per_request[kind]
        total = statistics.median([sum(per[g][i] for g in groups) for i in range(args.rounds)])
        print(f"{kind:<10}" + "".join(f"{spread(per[g], '.2f'):>20}" for g in groups)
              + f"{total:8.2f}")

    # Exactly once: every recorded event with a follow-up dispatched once, to the sink.
    # (wrk counts the answers it read; a request in flight when it stopped is recorded
    # too, so the count to match is the database's.)
    # A stored webhook's row holds, once the drain applied it, the follow-ups its
    # effect asked for (none for an unknown payout): those are the ones to count.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _psql_count(
            url, "SELECT count(*) FROM inbound_events WHERE follow_ups IS NOT NULL "
                 "AND processed_at IS NULL"):
        time.sleep(0.5)
    followed = _psql_count(url, "SELECT coalesce(sum(jsonb_array_length(follow_ups)), 0) "
                                "FROM inbound_events WHERE follow_ups IS NOT NULL")
    while time.monotonic() < deadline and sink.llen(SINK) < followed:
        time.sleep(0.5)
    waiting = _psql_count(url, "SELECT count(*) FROM inbound_events WHERE follow_ups IS NOT "
                               "NULL AND processed_at IS NULL")
    outcomes = dict(_rows(url, "SELECT outcome, count(*) FROM inbound_events GROUP BY 1"))
    print(f"recorded: {outcomes}; follow-ups dispatched {sink.llen(SINK)} of {followed}, "
          f"waiting {waiting}")
    if sink.llen(SINK) != followed or waiting or outcomes.get("received"):
        raise SystemExit("follow-ups not dispatched exactly once")
    sink.delete(SINK)
    worst = min(statistics.median(v) for v in ratios.values())
    rates_line = (f"noop_rps={statistics.median(rates['noop']):.0f} "
                  f"ap_rps={statistics.median(rates['ap']):.0f} "
                  f"razorpay_rps={statistics.median(rates['razorpay']):.0f} "
                  f"razorpayx_rps={statistics.median(rates['razorpayx']):.0f}")
    if not args.events:
        print(f"ingest: ingest_vs_noop={worst:.2f} rss_growth_pct=skipped {rates_line}")
        return

    # Memory: AP events until 10K, then 100K, recorded.
    def pids():
        return _children(web.pid), [worker.pid, *_children(worker.pid)]

    rss = {}
    for mark in (10_000, args.events):
        while (done := _psql_count(url, "SELECT count(*) FROM inbound_events "
                                        "WHERE source = 'ap'")) < mark:
            need = mark - done
            req_file = events.file("ap", need, work)
            _wrk(wrk, port, PATHS["ap"], script, req_file,
                 need / max(1.0, statistics.median(rates["ap"])) * 1.3 + 1, args.connections)
            req_file.unlink()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _psql_count(
                url, "SELECT count(*) FROM inbound_events WHERE follow_ups IS NOT NULL "
                     "AND processed_at IS NULL"):
            time.sleep(0.5)
        sink.delete(SINK)
        web_pids, worker_pids = pids()
        rss[mark] = (_rss_kb(web_pids), _rss_kb(worker_pids))
        print(f"  after {mark} AP events: web RSS {rss[mark][0] / 1024:.1f} MiB "
              f"({len(web_pids)} workers), worker RSS {rss[mark][1] / 1024:.1f} MiB "
              f"({len(worker_pids)} processes)")
    growth = [100.0 * (rss[args.events][i] - rss[10_000][i]) / rss[10_000][i] for i in (0, 1)]
    print(f"RSS growth 10K -> {args.events // 1000}K: web {growth[0]:+.1f}%, "
          f"worker {growth[1]:+.1f}%")
    print(f"ingest: ingest_vs_noop={worst:.2f} rss_growth_pct={max(growth):.1f} {rates_line}")


def _rows(url: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
