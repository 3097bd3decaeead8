"""Interactive forms under concurrency (issue 10, part 3): any number of simultaneous
POSTs of one deposit or withdrawal form cause at most one AP state change and one
Razorpay order or payout setup; the others land on a page that says where things
stand, never a 5xx. No database transaction or advisory lock is held across an
outbound HTTP call: record the intent, commit, call, record the outcome.

Real parts: the live server (threaded, its own database connection per request), the
sandbox over HTTP, the test database. Outbound calls are *observed*, not replaced: a
wrapper around ``httpx.Client.send`` notes each call Corridor makes to the sandbox's AP
platform server and Razorpay API (the live server runs in this process), with whether
the calling thread's connection was inside a transaction or held an advisory lock."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from decimal import Decimal

import httpx
import pytest
from django.conf import settings
from django.db import connection

from anchor import deposits
from anchor.models import DepositOrder
from payouts.models import WithdrawalRequest
from tests.flows import Customer, Wallet, run_manage, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

N = 8
SUBMITTING = 'data-state="submitting"'


@dataclass
class Call:
    method: str
    path: str
    rpc: str | None
    thread: str
    in_atomic: bool
    advisory_locks: int


@pytest.fixture
def outbound(monkeypatch):
    """Every outbound HTTP call of this process to AP's platform API or Razorpay, with
    the state of the calling thread's database connection at that moment."""
    calls: list[Call] = []
    lock = threading.Lock()
    real_send = httpx.Client.send

    def send(self, request, *args, **kwargs):
        path = request.url.path
        if "/ap/platform" in path or "/razorpay/v1/" in path:
            rpc = None
            if request.method == "POST" and "/ap/platform" in path:
                rpc = json.loads(request.content)[0]["method"]
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                               "AND locktype = 'advisory'")
                locks = cursor.fetchone()[0]
            with lock:
                calls.append(Call(request.method, path, rpc, threading.current_thread().name,
                                  connection.in_atomic_block, locks))
        return real_send(self, request, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "send", send)
    return calls


def server_calls(calls: list[Call]) -> list[Call]:
    """The calls the live server's request threads made (not the test's own)."""
    main = threading.main_thread().name
    return [c for c in calls if c.thread != main]


def assert_no_transaction_across_calls(calls: list[Call]) -> None:
    held = [c for c in calls if c.in_atomic or c.advisory_locks]
    assert held == [], held


def ap_status_changes(sandbox, transaction_id: str, status: str) -> int:
    """AP state changes into ``status``, counted on the sandbox AP's event outbox (one
    event per applied RPC)."""
    events = sandbox.http.get("/ap/sandbox/events",
                              params={"transaction_id": transaction_id}).json()["events"]
    return sum(1 for e in events if e["status"] == status)


def razorpay_orders(sandbox, transaction_id: str) -> list[dict]:
    response = sandbox.http.get("/razorpay/v1/orders", params={"receipt": transaction_id},
                                auth=(settings.RAZORPAY_KEY_ID, settings.RAZORPAY_KEY_SECRET))
    response.raise_for_status()
    return response.json()["items"]


def csrf(page: httpx.Response) -> dict:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    return {"csrfmiddlewaretoken": match.group(1)} if match else {}


def open_form(customer: Customer, url: str) -> str:
    response = customer.open(url)
    assert response.status_code == 302, response.text[:300]
    form_url = str(response.url.join(response.headers["location"]))
    assert customer.http.get(form_url).status_code == 200
    return form_url


def post_at_once(jobs: list[tuple[httpx.Client, str, dict]]) -> list[httpx.Response]:
    """POST every (client, url, data) at the same moment, one thread each."""
    barrier = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)

    def run(i, client, url, data):
        barrier.wait()
        try:
            results[i] = client.post(url, data=data)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(r, httpx.Response) for r in results), results
    return results


def clone(customer: Customer) -> httpx.Client:
    """Another connection of the same browser session (a second tab, a double click)."""
    return httpx.Client(timeout=30, follow_redirects=False, cookies=customer.http.cookies)


def deposit_confirm_data(customer: Customer, form_url: str, amount: str) -> dict:
    quote = customer.http.post(form_url, data={"amount": amount,
                                               **csrf(customer.http.get(form_url))})
    assert quote.status_code == 200, quote.text[:300]
    return {"amount": amount, "confirm": "yes", **csrf(quote)}


def assert_deposit_outcome(sandbox, transaction_id, responses, calls):
    order = DepositOrder.objects.get(transaction_id=transaction_id)
    checkout = f"/sep24/checkout/{order.order_id}"
    statuses = [r.status_code for r in responses]
    assert all(s < 500 for s in statuses), statuses
    for r in responses:
        assert (r.status_code in (302, 303) and r.headers["location"] == checkout) or (
            r.status_code == 200 and SUBMITTING in r.text), (r.status_code, r.text[:300])
    assert [o["id"] for o in razorpay_orders(sandbox, transaction_id)] == [order.order_id]
    mine = server_calls(calls)
    assert [c.rpc for c in mine if c.rpc] == ["request_offchain_funds"]
    assert len([c for c in mine if c.method == "POST" and c.path.endswith("/v1/orders")]) == 1
    assert ap_status_changes(sandbox, transaction_id, "pending_user_transfer_start") == 1
    assert order.funds_requested_at is not None
    assert_no_transaction_across_calls(mine)


def test_simultaneous_deposit_posts_of_one_session_make_one_order_and_one_ap_call(
        clean_sandbox, outbound):
    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()
    customer = Customer(clean_sandbox)
    form_url = open_form(customer, url)
    data = deposit_confirm_data(customer, form_url, "1000")

    responses = post_at_once([(clone(customer), form_url, data) for _ in range(N)])

    assert_deposit_outcome(clean_sandbox, transaction_id, responses, outbound)
    # Every later visit goes to the one checkout and asks nothing of anyone.
    before = len(outbound)
    again = customer.http.post(form_url, data=data)
    assert again.status_code == 302
    assert again.headers["location"] == customer.http.get(form_url).headers["location"]
    assert [c.path for c in server_calls(outbound[before:])] == []


def test_simultaneous_deposit_posts_from_two_sessions_of_one_token(clean_sandbox, outbound):
    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()
    first, second = Customer(clean_sandbox), Customer(clean_sandbox)
    form_url = open_form(first, url)
    assert open_form(second, url) == form_url
    data_1 = deposit_confirm_data(first, form_url, "1000")
    data_2 = deposit_confirm_data(second, form_url, "2000")

    jobs = [(clone(first), form_url, data_1) for _ in range(N // 2)] + \
           [(clone(second), form_url, data_2) for _ in range(N // 2)]
    responses = post_at_once(jobs[::2] + jobs[1::2])

    assert_deposit_outcome(clean_sandbox, transaction_id, responses, outbound)
    order = DepositOrder.objects.get(transaction_id=transaction_id)
    assert order.amount_in in (Decimal("1000.00"), Decimal("2000.00"))
    assert razorpay_orders(clean_sandbox, transaction_id)[0]["amount"] == order.amount_in_paise


WITHDRAW_FIELDS = {"amount": "10", "name": "Asha Verma", "method": "bank_account",
                   "account_number": "50100123456789", "ifsc": "HDFC0001234"}


def withdraw_confirm_data(customer: Customer, form_url: str, **fields) -> dict:
    fields = {**WITHDRAW_FIELDS, **fields}
    quote = customer.http.post(form_url, data={**fields, **csrf(customer.http.get(form_url))})
    assert quote.status_code == 200, quote.text[:300]
    return {**fields, "confirm": "yes", **csrf(quote)}


def assert_withdrawal_outcome(sandbox, transaction_id, responses, calls):
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    statuses = [r.status_code for r in responses]
    assert all(s < 500 for s in statuses), statuses
    for r in responses:
        pay_page = r.status_code == 200 and f'<code class="memo">{request.memo}</code>' in r.text
        assert pay_page or (r.status_code == 200 and SUBMITTING in r.text), (
            r.status_code, r.text[:300])
    assert request.memo and request.funds_requested_at is not None
    mine = server_calls(calls)
    assert [c.rpc for c in mine if c.rpc] == ["request_onchain_funds"]
    assert len([c for c in mine if c.method == "POST" and c.path.endswith("/v1/fund_accounts")
                ]) == 1
    assert ap_status_changes(sandbox, transaction_id, "pending_user_transfer_start") == 1
    assert_no_transaction_across_calls(mine)


def test_simultaneous_withdrawal_posts_make_one_setup_and_one_ap_call(clean_sandbox, outbound):
    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_withdrawal()
    first, second = Customer(clean_sandbox), Customer(clean_sandbox)
    form_url = open_form(first, url)
    assert open_form(second, url) == form_url
    data_1 = withdraw_confirm_data(first, form_url)
    data_2 = withdraw_confirm_data(second, form_url, amount="12")

    jobs = [(clone(first), form_url, data_1) for _ in range(N // 2)] + \
           [(clone(second), form_url, data_2) for _ in range(N // 2)]
    responses = post_at_once(jobs[1::2] + jobs[::2])

    assert_withdrawal_outcome(clean_sandbox, transaction_id, responses, outbound)
    assert WithdrawalRequest.objects.filter(transaction_id=transaction_id).count() == 1


# The dead worker's lease outlasts the checks made while it is live, on a slow machine too.
DEAD_WORKER_LEASE = {"INTERACTIVE_SUBMIT_LEASE_S": "3"}


def _crash_mid_submit(transaction_id: str, amount: str, crash_at: str):
    """A web worker that SIGKILLs itself at ``crash_at`` while submitting the form."""
    code = ("from decimal import Decimal; from anchor import deposits; "
            f"deposits.deposit_submit(transaction_id={transaction_id!r}, "
            f"amount_in=Decimal({amount!r}))")
    done = run_manage("shell", "-c", code, crash_at=crash_at, env=DEAD_WORKER_LEASE)
    assert done.returncode == -9, (done.returncode, done.stderr[-2000:])


def test_a_crash_between_intent_and_stored_order_is_completed_by_the_next_submission(
        clean_sandbox, outbound):
    from anchor import submissions
    from anchor.models import InteractiveSubmission

    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()
    customer = Customer(clean_sandbox)
    form_url = open_form(customer, url)
    data = deposit_confirm_data(customer, form_url, "1000")

    _crash_mid_submit(transaction_id, "1000", "deposit_submit.order_created")

    created = razorpay_orders(clean_sandbox, transaction_id)
    assert len(created) == 1  # Razorpay holds the order; Corridor never stored its id
    assert not DepositOrder.objects.filter(transaction_id=transaction_id).exists()
    intent = InteractiveSubmission.objects.get(transaction_id=transaction_id)
    assert intent.status == InteractiveSubmission.Status.IN_FLIGHT
    # While the dead worker's lease lasts, a submission waits on a clear page.
    before = len(outbound)
    waiting = customer.http.post(form_url, data=data)
    assert waiting.status_code == 200 and SUBMITTING in waiting.text
    assert server_calls(outbound[before:]) == []

    wait_for(lambda: not InteractiveSubmission.objects.filter(
        pk=intent.pk, lease_until__gt=submissions.now()).exists(), timeout=15,
        what="the dead worker's lease lapses")
    resumed = customer.http.post(form_url, data=data)

    order = DepositOrder.objects.get(transaction_id=transaction_id)
    assert resumed.status_code == 302
    assert resumed.headers["location"] == f"/sep24/checkout/{order.order_id}"
    assert order.order_id == created[0]["id"]  # the same order, adopted by its receipt
    assert [o["id"] for o in razorpay_orders(clean_sandbox, transaction_id)] == [order.order_id]
    assert ap_status_changes(clean_sandbox, transaction_id, "pending_user_transfer_start") == 1
    resumed_calls = server_calls(outbound[before:])
    assert [c.path for c in resumed_calls if c.method == "POST"
            and c.path.endswith("/v1/orders")] == []  # found by receipt, not created again
    assert [c.rpc for c in resumed_calls if c.rpc] == ["request_offchain_funds"]
    assert_no_transaction_across_calls(resumed_calls)
    # ... and it can be paid: Corridor records the payment on the order it stored.
    customer.pay(order.order_id)
    wait_for(lambda: DepositOrder.objects.get(pk=order.pk).status != "awaiting_payment"
             or deposits.DepositPayment.objects.filter(order_id=order.order_id).exists(),
             timeout=15, what="the payment webhook recorded on the stored order")


def test_the_sweeper_completes_a_submission_whose_worker_died_after_the_order(
        clean_sandbox, outbound):
    from anchor import submissions
    from anchor.models import InteractiveSubmission

    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_deposit()

    _crash_mid_submit(transaction_id, "1500", "deposit_submit.order_stored")
    assert DepositOrder.objects.get(transaction_id=transaction_id).funds_requested_at is None
    assert ap_status_changes(clean_sandbox, transaction_id, "pending_user_transfer_start") == 0

    assert submissions.sweep_submissions() == {"completed": 0, "released": 0}  # lease live
    wait_for(lambda: submissions.sweep_submissions()["completed"] == 1, timeout=15,
             interval=0.3, what="the sweeper completes the intent")

    order = DepositOrder.objects.get(transaction_id=transaction_id)
    assert order.funds_requested_at is not None and order.amount_in == Decimal("1500.00")
    assert [o["id"] for o in razorpay_orders(clean_sandbox, transaction_id)] == [order.order_id]
    assert ap_status_changes(clean_sandbox, transaction_id, "pending_user_transfer_start") == 1
    assert InteractiveSubmission.objects.get(transaction_id=transaction_id).status == "done"
    assert submissions.sweep_submissions() == {"completed": 0, "released": 0}


def _crash_mid_withdrawal(transaction_id: str, crash_at: str):
    code = ("from decimal import Decimal; from payouts import withdrawals; "
            "from payouts.providers.base import Beneficiary; "
            f"withdrawals.withdrawal_submit(transaction_id={transaction_id!r}, "
            "amount_in=Decimal('10'), beneficiary=Beneficiary(name='Asha Verma', "
            "kind='bank_account', account_number='50100123456789', ifsc='HDFC0001234'))")
    done = run_manage("shell", "-c", code, crash_at=crash_at, env=DEAD_WORKER_LEASE)
    assert done.returncode == -9, (done.returncode, done.stderr[-2000:])


def test_the_sweeper_completes_a_withdrawal_stored_before_its_ap_call(clean_sandbox):
    from anchor import submissions

    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_withdrawal()

    _crash_mid_withdrawal(transaction_id, "withdrawal_submit.request_stored")
    assert WithdrawalRequest.objects.get(transaction_id=transaction_id).funds_requested_at is None
    customer = Customer(clean_sandbox)
    entry = customer.open(url)
    waiting = customer.http.get(str(entry.url.join(entry.headers["location"])))
    assert waiting.status_code == 200 and SUBMITTING in waiting.text  # lease still live

    wait_for(lambda: submissions.sweep_submissions()["completed"] == 1, timeout=15,
             interval=0.3, what="the sweeper completes the withdrawal")

    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert request.funds_requested_at is not None and request.memo
    assert ap_status_changes(clean_sandbox, transaction_id, "pending_user_transfer_start") == 1
    pay = customer.http.get(str(entry.url.join(entry.headers["location"])))
    assert f'<code class="memo">{request.memo}</code>' in pay.text


def test_a_withdrawal_intent_without_stored_details_is_forgotten_by_the_sweeper(
        clean_sandbox, outbound):
    from anchor import submissions
    from anchor.models import InteractiveSubmission

    wallet = Wallet(clean_sandbox)
    transaction_id, url = wallet.start_withdrawal()

    _crash_mid_withdrawal(transaction_id, "withdrawal_submit.setup_created")
    assert not WithdrawalRequest.objects.filter(transaction_id=transaction_id).exists()
    wait_for(lambda: submissions.sweep_submissions()["released"] == 1, timeout=15,
             interval=0.3, what="the sweeper forgets the intent")

    assert not InteractiveSubmission.objects.filter(transaction_id=transaction_id).exists()
    assert ap_status_changes(clean_sandbox, transaction_id, "pending_user_transfer_start") == 0
    assert [c.rpc for c in server_calls(outbound) if c.rpc] == []
    # The customer fills the form again and it goes through once.
    customer = Customer(clean_sandbox)
    form_url = open_form(customer, url)
    done = customer.http.post(form_url, data=withdraw_confirm_data(customer, form_url))
    request = WithdrawalRequest.objects.get(transaction_id=transaction_id)
    assert done.status_code == 200 and f'<code class="memo">{request.memo}</code>' in done.text
    assert ap_status_changes(clean_sandbox, transaction_id, "pending_user_transfer_start") == 1
