"""A failover that loses the last seconds of commits (issue 25 §2), one outbox at a time.

Each test lets money leave (a Stellar payment, a RazorpayX payout) and then loses the
commits that recorded it (tests/rewind.py: the database as a standby cut just before
them holds it), while the outside world (the sandbox) keeps everything. Then it runs
what beat runs, and checks that nothing was paid twice and the lost row was rebuilt
from the chain or the provider:

- withdrawal payout -> RazorpayX, by the attempt's key (derived from the withdrawal,
  so a re-claimed payout replays it) and by reference;
- deposit release, AP still ``pending_anchor`` -> the chain, by the release's memo
  and destination from the distribution account;
- deposit release, AP ``completed`` -> AP's hash, checked on the chain;
- deposit order, the customer paid it -> Razorpay's order by receipt and AP's amounts;
- withdrawal refund, AP still ``pending_anchor`` -> the chain, by destination, amount
  and memo from the distribution account (the refund sweep, or the next refund claim);
- withdrawal refund, AP ``refunded`` -> AP's refund hash, checked on the chain;
- a receipt's own refund (``receipt:<id>``, no AP transaction) -> the chain, by the
  receipt's sender and unconsumed amount from the distribution account (the refund
  sweep, or the next refund claim);
- deposit INR refund -> Razorpay's refunds of the payment, by our receipt (the
  reconciler), and a claim made again replays the derived idempotency key.
A saga leg's lost hub payment: tests/test_remittances.py (found on chain, not paid
again, stopped for review).
"""

from __future__ import annotations

import random
import time
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from anchor import deposits, platform, reconciler, releases, stellar
from anchor import operations as deposit_operations
from anchor import refunds as deposit_refunds
from anchor.models import DepositOrder, DepositPayment, DepositRefund, DepositRelease
from ledger import services as ledger
from ledger.models import Entry
from payouts import operations, poller, receipts, tasks
from payouts.models import (
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from sagas.models import ReviewItem
from tests import rewind
from tests.flows import (
    Customer,
    Wallet,
    ap,
    assert_payout_once,
    assert_released_once,
    opened_withdrawal,
    paid_deposit,
    pending_anchor_withdrawal,
    purge_broker,
    run_manage,
    sandbox_payouts,
    settle,
    short_withdrawal,
    wait_for,
)
from tests.recon import compared
from tests.sandbox.razorpay_calls import sandbox_refunds
from treasury.reconcile import open_distribution, reconcile

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_payout_whose_claim_was_lost_after_razorpayx_took_it_pays_once(clean_sandbox):
    # given a verified withdrawal whose payout RazorpayX accepted (no webhook yet)
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.5)
    clean_sandbox.fault("razorpayx.webhook_lose", times=3)
    _, transaction_id = pending_anchor_withdrawal(clean_sandbox)
    before = rewind.mark()
    poller.poll_withdrawals()
    assert len(sandbox_payouts(clean_sandbox, transaction_id)) == 1

    # when the failover loses every commit since (the claim, the attempt's key)
    lost = rewind.rewind(before)
    assert lost["withdrawal_payouts"] == 1 and lost["payout_attempts"] == 1
    assert not WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists()

    # then the poller's next passes rebuild the payout from RazorpayX, paying nothing more
    settle(transaction_id)
    assert_payout_once(clean_sandbox, transaction_id)


def test_a_release_whose_claim_was_lost_after_it_was_submitted_pays_once(clean_sandbox):
    # given a paid deposit whose release was submitted, its worker killed before it
    # told AP (AP still pending_anchor)
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    before = rewind.mark()
    killed = run_manage("release_deposit", transaction_id, crash_at="after_submit")
    assert killed.returncode == -9, killed.stderr[-2000:]
    wait_for(lambda: len(wallet.usdc_payments()) == 1, what="the release on chain")

    # when the failover loses the claim (the envelope, its hash, the channel's sequence)
    lost = rewind.rewind(before)
    assert lost["deposit_releases"] == 1
    assert ap(transaction_id)["status"] == "pending_anchor"

    # then the sweep that finds AP pending_anchor adopts the payment on chain
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def test_a_release_lost_after_ap_completed_is_rebuilt_from_ap_and_the_chain(clean_sandbox):
    # given a deposit released and completed in AP
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    before = rewind.mark()
    assert settle(transaction_id).status == "completed"
    assert ap(transaction_id)["status"] == "completed"

    # when the failover loses every commit of the release
    lost = rewind.rewind(before)
    assert lost["deposit_releases"] == 1
    assert DepositPayment.objects.get(transaction_id=transaction_id).release_claimed_at is None

    # then the reconciler rebuilds the release from AP's hash, found on the chain
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)
    assert DepositRelease.objects.get(transaction_id=transaction_id).tx_hash == \
        ap(transaction_id)["stellar_transactions"][0]["id"]


@pytest.mark.parametrize("check", ["on", "off"])
def test_a_release_whose_rebuild_was_lost_after_its_envelope_landed_pays_once(
        clean_sandbox, settings, check):
    """Chaos (20 loaded seeds, seed 4): ``double_payment deposit f2e5a235…: 2 USDC
    payments``. The first envelope died; a rebuild built, stored and submitted a second,
    which landed; the failover lost the rebuild's commit, so the row held the first
    envelope again, provably dead, and the next drive rebuilt a third, which paid the
    customer again. A rebuild first asks the chain for this deposit's payment under a
    hash the row does not hold."""
    settings.RELEASE_LOST_SUCCESSOR_CHECK = check == "on"
    settings.STELLAR_TX_TIMEOUT_S = 8  # a rebuilt envelope still valid when a loaded
    # machine gets to submit it (3 s ran out four times in a row beside a campaign)
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)
    clean_sandbox.fault("horizon.submit_drop", times=1, wait_s=0.3)  # never queued
    first = releases.release_start(transaction_id=transaction_id)
    assert (first.status, first.attempts) == ("submitting", 1), first.last_error
    before = rewind.mark()
    # the first envelope dies; the re-drive rebuilds it and the successor lands
    wait_for(lambda: stellar.history_height()[1] > first.max_time, timeout=20,
             what="a ledger closed after the first envelope's max_time")
    rebuilt = settle(transaction_id)
    assert (rebuilt.status, rebuilt.attempts) == ("completed", 2), rebuilt.last_error
    assert len(wallet.usdc_payments()) == 1

    # when the failover loses every commit after the first envelope was stored
    rewind.rewind(before)
    assert DepositRelease.objects.get(transaction_id=transaction_id).tx_hash == first.tx_hash

    # then the re-drive finds the successor on chain and adopts it, paying nothing more
    settle(transaction_id)
    if check == "off":  # the naive rebuild: a third envelope pays the customer again
        assert len(wallet.usdc_payments()) == 2
        return
    assert len(wallet.usdc_payments()) == 1
    release = DepositRelease.objects.get(transaction_id=transaction_id)
    assert (release.status, release.tx_hash) == ("completed", rebuilt.tx_hash)
    assert_released_once(wallet, transaction_id)


def test_a_deposit_order_lost_after_the_customer_paid_it_is_rebuilt_and_released_once(
        clean_sandbox, settings):
    # given a deposit whose order Corridor stored and AP took (pending_user_transfer_start)
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, url = wallet.start_deposit()
    before = rewind.mark()
    customer = Customer(clean_sandbox)
    order_id = customer.submit_amount(url, "1000")
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"

    # when the failover loses the order, and the customer pays it at Razorpay
    lost = rewind.rewind(before)
    assert lost["deposit_orders"] == 1
    customer.pay(order_id)
    purge_broker()  # no worker: the webhook found no order ("unknown_order")
    assert not DepositPayment.objects.exists()

    # then the order reconciler rebuilds the order and records the payment (earlier
    # tests' deposits, still waiting in the session's sandbox, are rebuilt too)
    settings.DEPOSIT_ORDER_REBUILD = True
    assert reconciler.reconcile_orders().get("order_rebuilt", 0) >= 1
    assert DepositOrder.objects.get(transaction_id=transaction_id).order_id == order_id

    def confirmed() -> bool:  # the order reconciler's passes, as beat runs them
        time.sleep(settings.ORDER_RECONCILER_AGE_S + 0.1)
        reconciler.reconcile_orders()
        return DepositPayment.objects.filter(transaction_id=transaction_id,
                                             confirmation="confirmed").exists()

    wait_for(confirmed, timeout=60, what="payment recorded and confirmed")
    assert settle(transaction_id).status == "completed"
    assert_released_once(wallet, transaction_id)


def _deposit_refund_after_beat(settings, transaction_id: str) -> DepositRefund | None:
    """One pass of what beat runs for a deposit's INR (the order reconciler, the notify
    sweep, the release reconciler with its rebuilds, the refund sweep), then a drive of
    its refund: the refund once final (completed, or a person's), else None."""
    time.sleep(max(settings.ORDER_RECONCILER_AGE_S, settings.RECONCILER_AGE_S) + 0.1)
    reconciler.reconcile_orders()
    reconciler.sweep_unnotified()
    reconciler.reconcile_releases()
    deposit_refunds.sweep_refunds()
    row = DepositRefund.objects.filter(transaction_id=transaction_id).first()
    if row is not None:
        row = deposit_refunds.refund_drive(refund_id=row.pk)
    return row if row is not None and row.status in ("completed", "manual_review") else None


def test_a_late_deposit_whose_order_was_lost_is_rebuilt_and_its_inr_refunded_once(
        clean_sandbox, settings):
    """Chaos seed 1 with one burner (issue 25): the failover lost a deposit's order and
    the payment webhook's inbox row; AP had expired the deposit and the customer paid
    anyway. The rebuild looked at ``pending_user_transfer_start`` deposits only, so
    the captured INR had no order, no payment row and no refund: stranded for ever."""
    # given a deposit whose order Corridor stored and AP took, then expired
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, url = wallet.start_deposit()
    before = rewind.mark()
    customer = Customer(clean_sandbox)
    order_id = customer.submit_amount(url, "1000")
    platform.rpc("notify_transaction_expired", {"transaction_id": transaction_id,
                                                "message": "no payment in time"})

    # when the failover loses the order, and the customer pays it at Razorpay anyway
    lost = rewind.rewind(before)
    assert lost["deposit_orders"] == 1
    customer.pay(order_id)
    purge_broker()  # no worker: the webhook found no order ("unknown_order")
    assert not DepositPayment.objects.exists()

    # then the order reconciler rebuilds the order from Razorpay and AP, records the
    # payment, and the INR goes back once (AP expired: the refund is queued for a person)
    settings.DEPOSIT_ORDER_REBUILD = True
    assert reconciler.reconcile_orders().get("order_rebuilt", 0) >= 1
    assert DepositOrder.objects.get(transaction_id=transaction_id).order_id == order_id

    refund = wait_for(lambda: _deposit_refund_after_beat(settings, transaction_id),
                      timeout=60, what="the captured INR refunded", explain=lambda: (
        list(DepositOrder.objects.filter(transaction_id=transaction_id).values("status")),
        list(DepositPayment.objects.filter(transaction_id=transaction_id).values(
            "confirmation", "notify_attempts", "notify_error", "ap_notified_at"))))
    assert (refund.trigger, refund.ap_status_at_claim) == ("expired", "expired")
    made = _deposit_refunds_at_razorpay(clean_sandbox, transaction_id)
    assert [r["id"] for r in made] == [refund.refund_id]
    assert refund.provider_status == "processed"


@pytest.mark.parametrize(("driven", "lost_from", "record_refunded"), [
    (False, "payment recorded", True), (True, "payment recorded", True),
    (False, "before the payment", True), (False, "before the payment", False)],
    ids=["lost after the payment", "driven, lost after the payment",
         "payment row lost too", "payment row lost too, refunded not recorded"])
def test_a_late_deposits_refund_lost_after_razorpay_made_it_is_rebuilt_once(
        clean_sandbox, settings, driven, lost_from, record_refunded):
    """20-seed loaded chaos at 5b283ee, seeds 3 and 15 (issue 25): a deposit AP had
    expired was paid anyway; Corridor refunded the INR (Razorpay made the refund, and
    (``driven``) the drive went on to its end: AP cannot record a refund on an expired
    deposit, a person does); the failover then lost the refund row and the payment's
    confirmation. Razorpay now showed the payment ``refunded``, so the order reconciler
    rejected it, and nothing rebuilt the refund: ``refund None, 1 made`` after the
    settle, the INR that went back never booked.

    At 6756f1d, seed 8: the failover lost the payment row and the order's paid mark too
    (``lost_from`` before the payment). The order reconciler recorded only ``captured``
    payments and Razorpay showed this one ``refunded``: never recorded, so its refund
    was never rebuilt. It now records a refunded payment as well (then rejected, or, as
    here, our refund found and rebuilt). Refunded not recorded: ``refund None``."""
    settings.DEPOSIT_REFUNDED_PAYMENT_RECORD = record_refunded
    # given a late deposit: AP expired it, then the customer paid
    wallet = Wallet(clean_sandbox)
    purge_broker()
    transaction_id, url = wallet.start_deposit()
    customer = Customer(clean_sandbox)
    order_id = customer.submit_amount(url, "1000")
    platform.rpc("notify_transaction_expired", {"transaction_id": transaction_id,
                                                "message": "no payment in time"})
    if lost_from == "before the payment":
        before = rewind.mark()
    customer.pay(order_id)
    wait_for(lambda: DepositPayment.objects.filter(transaction_id=transaction_id).exists(),
             what="payment webhook recorded")
    purge_broker()
    if lost_from == "payment recorded":
        before = rewind.mark()

    # and its INR refunded at Razorpay
    with pytest.raises(platform.RpcError):
        deposits.funds_received(transaction_id=transaction_id)
    refund = deposit_refunds.refund_if_ap_expired(transaction_id=transaction_id)
    refund = _drive_until_final(transaction_id) if driven else \
        deposit_refunds.refund_drive(refund_id=refund.pk)
    made = _deposit_refunds_at_razorpay(clean_sandbox, transaction_id)
    assert [r["id"] for r in made] == [refund.refund_id]

    # when the failover loses every commit since the payment was recorded
    lost = rewind.rewind(before)
    assert lost["deposit_refunds"] == 1
    purge_broker()

    if lost_from == "before the payment":
        assert lost["deposit_payments"] == 1
    if not record_refunded:  # the protection switched off: the refund is never rebuilt
        for _ in range(3):
            assert _deposit_refund_after_beat(settings, transaction_id) is None
        assert not DepositPayment.objects.filter(transaction_id=transaction_id).exists()
        return
    # then what beat runs rebuilds the refund from Razorpay, once, and books it
    row = wait_for(lambda: _deposit_refund_after_beat(settings, transaction_id),
                   timeout=30, what="the refund rebuilt", explain=lambda: (
        list(DepositRefund.objects.filter(transaction_id=transaction_id).values(
            "status", "last_error")), ap(transaction_id)["status"],
        list(DepositPayment.objects.filter(transaction_id=transaction_id).values(
            "confirmation", "confirmation_error", "notify_attempts", "notify_error"))))
    assert [r["id"] for r in _deposit_refunds_at_razorpay(clean_sandbox, transaction_id)] \
        == [row.refund_id]
    assert row.provider_status == "processed"
    assert Entry.objects.filter(idempotency_key=f"deposit_refund:{row.pk}").count() == 1
    assert DepositPayment.objects.get(transaction_id=transaction_id).confirmation == \
        "confirmed"  # its capture booked, as the refund's reversal of it is
    assert ap(transaction_id)["status"] == "expired"


@pytest.mark.parametrize("released", [False, True])
def test_a_deposit_whose_order_and_payment_were_lost_after_ap_took_the_funds_pays_once(
        clean_sandbox, settings, released):
    """Chaos (late_money switch run, seed 1): the failover lost a deposit's order and
    payment after AP was told the INR arrived (``pending_anchor``), and (``released``)
    after the USDC left and AP completed. The rebuild looked at deposits waiting for the
    customer only: the AP sweep skipped it for want of a payment row ("AP's status alone
    never releases anything"), the USDC on chain was a stray payment and the books never
    held the deposit. Now the order is rebuilt from Razorpay and AP, its payment recorded
    from Razorpay, and the release found on chain: one USDC payment, booked."""
    wallet = Wallet(clean_sandbox)
    before = rewind.mark()
    transaction_id = paid_deposit(clean_sandbox, wallet)  # AP pending_anchor
    if released:
        assert settle(transaction_id).status == "completed"
        assert ap(transaction_id)["status"] == "completed"

    lost = rewind.rewind(before)
    assert (lost["deposit_orders"], lost["deposit_payments"]) == (1, 1)
    purge_broker()

    settings.DEPOSIT_ORDER_REBUILD = True

    def released_once() -> bool:  # what beat runs, pass after pass
        time.sleep(max(settings.ORDER_RECONCILER_AGE_S, settings.RECONCILER_AGE_S) + 0.1)
        reconciler.reconcile_orders()
        reconciler.sweep_ap_deposits()
        reconciler.reconcile_releases()
        return DepositRelease.objects.filter(transaction_id=transaction_id,
                                             status="completed").exists()

    wait_for(released_once, timeout=60, what="the deposit released (found) once",
             explain=lambda: (
                 list(DepositOrder.objects.filter(transaction_id=transaction_id)
                      .values("status")),
                 list(DepositPayment.objects.filter(transaction_id=transaction_id)
                      .values("confirmation", "ap_notified_at", "release_claimed_at")),
                 list(DepositRelease.objects.filter(transaction_id=transaction_id)
                      .values("status", "last_error")), ap(transaction_id)["status"]))
    assert_released_once(wallet, transaction_id)
    assert Entry.objects.filter(idempotency_key=f"deposit:{transaction_id}:released").exists()


# --- the withdrawal-refund outbox ---------------------------------------------------------

def _refunds_on_chain(wallet: Wallet) -> list[str]:
    """Hashes of the USDC payments the distribution account sent the wallet."""
    distribution = stellar.distribution_keypair().public_key
    return [p["transaction_hash"] for p in wallet.usdc_payments() if p["from"] == distribution]


def _assert_refunded_once(wallet: Wallet, request, settings) -> WithdrawalRefund:
    """One refund payment on chain; the row holds its hash, completed and booked (rule
    6), its receipts settled; AP refunded with that hash."""
    sent = _refunds_on_chain(wallet)
    assert len(sent) == 1, sent
    refund = WithdrawalRefund.objects.get(transaction_id=request.transaction_id)
    assert (refund.status, refund.tx_hash) == ("completed", sent[0]), refund.last_error
    assert Entry.objects.filter(idempotency_key=f"refund:{refund.pk}").exists()
    assert not StellarReceipt.objects.filter(transaction_id=request.transaction_id,
                                             settled_at__isnull=True).exists()
    tx = platform.get_transaction(request.transaction_id)
    assert tx["status"] == "refunded"
    assert [p["id"] for p in tx["refunds"]["payments"]] == [sent[0]]
    return refund


def test_a_withdrawal_refund_lost_after_it_was_submitted_is_adopted_not_paid_again(
        clean_sandbox, settings):
    # given a short withdrawal in review whose refund landed on chain, the drive cut by a
    # 504 before it told AP (AP still pending_anchor)
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet, request = short_withdrawal(clean_sandbox, settings)
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    before = rewind.mark()
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    first = operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                  note="short: sent back")
    assert first.status == "submitting"
    wait_for(lambda: _refunds_on_chain(wallet) == [first.tx_hash], what="refund on chain")

    # when the failover loses the refund's commit (row, envelope, audit row, booking)
    lost = rewind.rewind(before)
    assert lost["withdrawal_refunds"] == 1
    assert platform.get_transaction(request.transaction_id)["status"] == "pending_anchor"

    # then the refund sweep adopts the payment on chain and tells AP, and the operator
    # who refunds again (the console shows no refund) pays nothing more
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    # >= 1: the session's chain keeps earlier tests' payments, which the receipt scan
    # (its cursor flushed) reads again as raised receipts whose refunds it rebuilds too
    assert tasks.sweep_refunds().get("rebuilt", 0) >= 1
    refund = _assert_refunded_once(wallet, request, settings)
    assert refund.tx_hash == first.tx_hash
    with pytest.raises(operations.OperationRefused, match="refunded already"):
        operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                              note="again")
    _assert_refunded_once(wallet, request, settings)


def test_a_withdrawal_refund_lost_before_it_was_swept_is_adopted_by_the_next_claim(
        clean_sandbox, settings):
    # given the same refund lost after it landed, and no sweep yet
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet, request = short_withdrawal(clean_sandbox, settings)
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    before = rewind.mark()
    clean_sandbox.fault("horizon.submit_504_after_apply", times=1)
    first = operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                  note="short: sent back")
    wait_for(lambda: _refunds_on_chain(wallet) == [first.tx_hash], what="refund on chain")
    rewind.rewind(before)

    # when the operator refunds again at once
    refund = operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                   note="again")

    # then the claim adopts the payment on chain: one payment, AP refunded with its hash
    assert refund.tx_hash == first.tx_hash
    _assert_refunded_once(wallet, request, settings)


def test_a_withdrawal_refund_lost_after_ap_refunded_is_rebuilt_from_ap_and_the_chain(
        clean_sandbox, settings):
    # given a short withdrawal refunded, completed here and refunded in AP
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet, request = short_withdrawal(clean_sandbox, settings)
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    before = rewind.mark()
    done = operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                 note="short: sent back")
    assert done.status == "completed"

    # when the failover loses every commit of the refund
    lost = rewind.rewind(before)
    assert lost["withdrawal_refunds"] == 1

    # then the refund sweep rebuilds it from AP's refund hash, found on chain, and books it
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    # >= 1: the session's chain keeps earlier tests' payments, which the receipt scan
    # (its cursor flushed) reads again as raised receipts whose refunds it rebuilds too
    assert tasks.sweep_refunds().get("rebuilt", 0) >= 1
    refund = _assert_refunded_once(wallet, request, settings)
    assert refund.tx_hash == done.tx_hash



# --- a receipt's own refund (receipt:<id>) ----------------------------------------------

DISTRIBUTION = "stellar:distribution USDC"


def _raised_unknown_memo(sandbox, settings, amount: str) -> tuple[Wallet, StellarReceipt]:
    """A wallet's payment of ``amount`` USDC under a memo no withdrawal has, scanned
    and raised by the classifier ("unknown memo")."""
    settings.RECEIPT_GRACE_S = 0.3
    wallet = Wallet(sandbox)
    wallet.fund_usdc("20")
    memo = str(random.randrange(10**12, 10**13))
    tx_hash = wallet.pay(destination=receipts.withdraw_account(), amount=amount, memo=memo)
    time.sleep(settings.RECEIPT_GRACE_S + 0.1)
    receipt = _poll_until(lambda: StellarReceipt.objects.filter(
        tx_hash=tx_hash).exclude(review_reason="").first(), what="the receipt raised")
    assert receipt.review_reason.startswith("unknown memo"), receipt.review_reason
    return wallet, receipt


def _books_settled(settings) -> Decimal:
    """The distribution account's unexplained difference once the refund sweep ran: the
    session's sandbox carries earlier tests' receipts, scanned into this database with
    their refunds on chain and no row, which the sweep rebuilds (as it would after a
    failover), so they move the difference before the test's own flow, not during it."""
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    tasks.sweep_refunds()
    return compared(reconcile(), DISTRIBUTION)["difference"]


def _assert_receipt_refunded_once(wallet: Wallet, receipt: StellarReceipt,
                                  books_before: Decimal) -> WithdrawalRefund:
    """One refund payment on chain to the receipt's sender; the receipt's one refund row
    holds its hash, completed, booked once (the receipt received and sent back, rule 6);
    the receipt settled; the distribution account's books as far from the chain as they
    were before (nothing on chain the books do not hold)."""
    sent = _refunds_on_chain(wallet)
    assert len(sent) == 1, sent
    refund = WithdrawalRefund.objects.get(receipt=receipt)
    assert (refund.transaction_id, refund.status, refund.tx_hash) == (
        f"receipt:{receipt.pk}", "completed", sent[0]), refund.last_error
    assert refund.amount == receipt.amount
    for key in (f"refund:{refund.pk}", f"receipt:{receipt.pk}:received"):
        assert Entry.objects.filter(idempotency_key=key).count() == 1, key
    assert StellarReceipt.objects.get(pk=receipt.pk).settled_at is not None
    assert ledger.trial_balance().ok
    assert compared(reconcile(), DISTRIBUTION)["difference"] == books_before
    return refund


@pytest.mark.parametrize("first", ["sweep", "operator"])
def test_a_receipt_refund_lost_after_it_landed_is_adopted_not_sent_again(
        clean_sandbox, settings, first):
    """A receipt's own refund (``receipt:<id>``: here an unknown memo an operator sent
    back) landed on chain and the failover lost its row, its audit row and its booking:
    the receipt is raised, unsettled and unrefunded again, in the operators' queue. No
    request row leads the refund sweep to it, and the operator's "refund on chain" built a
    new envelope: the USDC went back twice, and the books missed the refund on chain."""
    # given an unknown-memo receipt an operator refunded on chain
    open_distribution()
    wallet, receipt = _raised_unknown_memo(clean_sandbox, settings, "4")
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    books_before = _books_settled(settings)
    before = rewind.mark()
    done = operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                              note="unknown memo: sent back")
    assert done.status == "completed", done.last_error
    assert _refunds_on_chain(wallet) == [done.tx_hash]

    # when the failover loses every commit of the refund (row, audit row, booking, the
    # receipt's settlement)
    lost = rewind.rewind(before)
    assert lost["withdrawal_refunds"] == 1
    assert not WithdrawalRefund.objects.filter(receipt=receipt).exists()
    assert StellarReceipt.objects.get(pk=receipt.pk).settled_at is None

    # then the refund sweep rebuilds the refund from the chain, or the operator who
    # refunds again (the queue shows the receipt unrefunded) adopts it: nothing is sent
    # again, whichever comes first, and the other finds it refunded
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    if first == "sweep":
        assert tasks.sweep_refunds().get("rebuilt", 0) >= 1  # as above: earlier tests' too
        assert WithdrawalRefund.objects.filter(receipt=receipt).exists()
    refund = operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                                note="again") if first == "operator" \
        else WithdrawalRefund.objects.get(receipt=receipt)
    assert refund.tx_hash == done.tx_hash
    for _ in range(3):
        poller.poll_withdrawals()
    tasks.sweep_refunds()
    with pytest.raises(operations.OperationRefused, match="refunded already"):
        operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                           note="and again")
    _assert_receipt_refunded_once(wallet, receipt, books_before)

# --- the deposit INR refund ---------------------------------------------------------------

def _deposit_refunds_at_razorpay(sandbox, transaction_id: str) -> list[dict]:
    payment = DepositPayment.objects.get(transaction_id=transaction_id)
    return sandbox_refunds(sandbox, payment.payment_id)


def _assert_inr_refunded_once(sandbox, transaction_id: str) -> DepositRefund:
    """One Razorpay refund of the payment; the row holds it, completed and booked; AP
    refunded with it."""
    made = _deposit_refunds_at_razorpay(sandbox, transaction_id)
    assert len(made) == 1, made
    refund = DepositRefund.objects.get(transaction_id=transaction_id)
    assert (refund.status, refund.refund_id) == ("completed", made[0]["id"]), \
        refund.last_error
    assert Entry.objects.filter(idempotency_key=f"deposit_refund:{refund.pk}").exists()
    tx = ap(transaction_id)
    assert tx["status"] == "refunded"
    assert [p["id"] for p in tx["refunds"]["payments"]] == [refund.refund_id]
    return refund


def _drive_until_final(transaction_id: str) -> DepositRefund:
    pk = DepositRefund.objects.get(transaction_id=transaction_id).pk
    return wait_for(lambda: (lambda r: r if r.status in (
        "completed", "failed", "manual_review") else None)(
        deposit_refunds.refund_drive(refund_id=pk)), timeout=20, interval=0.3,
        what="refund final")


def test_a_deposit_refund_lost_after_ap_refunded_is_rebuilt_from_razorpay(
        clean_sandbox, settings):
    # given a deposit whose INR Razorpay refunded and AP recorded (refunded)
    purge_broker()
    clean_sandbox.fault("razorpay.refund_settle_delay", seconds=0.3)
    transaction_id = paid_deposit(clean_sandbox, Wallet(clean_sandbox))
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    before = rewind.mark()
    deposit_operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                                      note="customer cancelled")
    done = _drive_until_final(transaction_id)
    assert done.status == "completed"

    # when the failover loses every commit of the refund (row, booking, audit row)
    lost = rewind.rewind(before)
    assert lost["deposit_refunds"] == 1
    purge_broker()

    # then the reconciler rebuilds it from Razorpay (our receipt), no second refund
    time.sleep(settings.RECONCILER_AGE_S + 0.1)
    assert reconciler.reconcile_releases().get("refund_rebuilt") == 1
    refund = _assert_inr_refunded_once(clean_sandbox, transaction_id)
    assert refund.refund_id == done.refund_id


def test_a_deposit_refund_lost_before_ap_was_told_is_claimed_again_and_refunds_once(
        clean_sandbox, settings):
    # given a refund Razorpay made whose answer and webhook were lost (AP not told)
    purge_broker()
    clean_sandbox.fault("razorpay.refund_settle_delay", seconds=0.3)
    transaction_id = paid_deposit(clean_sandbox, Wallet(clean_sandbox))
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    before = rewind.mark()
    clean_sandbox.fault("razorpay.refund_create_5xx_after_create", times=1)
    clean_sandbox.fault("razorpay.refund_webhook_lose", times=1)
    deposit_operations.deposit_refund(transaction_id=transaction_id, operator=operator,
                                      note="customer cancelled")
    first = deposit_refunds.refund_drive(
        refund_id=DepositRefund.objects.get(transaction_id=transaction_id).pk)
    assert (first.status, first.attempts) == ("requested", 1)
    assert len(_deposit_refunds_at_razorpay(clean_sandbox, transaction_id)) == 1

    # when the failover loses the claim (its key), and the operator refunds again
    lost = rewind.rewind(before)
    assert lost["deposit_refunds"] == 1
    purge_broker()
    again = deposit_operations.deposit_refund(transaction_id=transaction_id,
                                              operator=operator, note="again")

    # then the claim carries the same key (derived from the payment): Razorpay answers
    # with the refund it made, and AP is told of that one
    assert again.idempotency_key == first.idempotency_key
    _drive_until_final(transaction_id)
    _assert_inr_refunded_once(clean_sandbox, transaction_id)


# --- the withdrawal request and its payout ------------------------------------------------

def _poll_until(predicate, *, what: str, timeout: float = 30.0):
    """The poller's passes, as beat runs them, until ``predicate()`` is truthy."""
    def step():
        poller.poll_withdrawals()
        return predicate()
    return wait_for(step, timeout=timeout, interval=0.3, what=what)


def _assert_books_once(transaction_id: str) -> None:
    """Rule 3 (USDC received) and rule 4 (INR paid) posted once each for the withdrawal."""
    for key in (f"withdrawal:{transaction_id}:received", f"withdrawal:{transaction_id}:paid"):
        assert Entry.objects.filter(idempotency_key=key).count() == 1, key


def _assert_receipt_consumed(memo: str, transaction_id: str) -> StellarReceipt:
    """The wallet's one receipt under the memo consumed by the withdrawal, out of the
    operators' queue (no review reason left on a settled receipt)."""
    receipt = StellarReceipt.objects.get(memo=memo)
    assert (receipt.transaction_id, receipt.settled_at is not None) == (transaction_id, True), \
        receipt.review_reason
    assert receipt.consumed_amount == receipt.amount
    assert not ReviewItem.objects.filter(kind="receipt", reference=receipt.tx_hash).exists()
    return receipt


def test_a_withdrawal_request_lost_after_ap_took_it_is_rebuilt_and_its_receipt_paid_once(
        clean_sandbox, settings):
    """Chaos seeds 2 and 3 with one burner (issue 25 §2): the failover lost a withdrawal's
    request row after AP took it (``pending_user_transfer_start``, memo given); the wallet
    paid with the memo anyway. Nothing rebuilt the request: the receipt was raised as
    "unknown memo" and stayed in the operators' queue, the INR never paid."""
    # given a withdrawal the customer submitted, AP waiting for its USDC
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    settings.RECEIPT_GRACE_S = 0.3
    wallet, transaction_id, url = opened_withdrawal(clean_sandbox)
    before = rewind.mark()
    pay = Customer(clean_sandbox).submit_withdrawal(url, "10")
    assert ap(transaction_id)["status"] == "pending_user_transfer_start"

    # when the failover loses the request, the wallet pays with the memo, and the
    # classifier raises the receipt (no withdrawal has its memo yet)
    lost = rewind.rewind(before)
    assert lost["withdrawal_requests"] == 1
    wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP observer")
    time.sleep(settings.RECEIPT_GRACE_S + 0.1)
    poller.poll_withdrawals()
    assert StellarReceipt.objects.get(memo=pay["memo"]).review_reason.startswith("unknown memo")

    # then the poller rebuilds the request from AP and RazorpayX, pays it once, and the
    # receipt is matched again: consumed, out of the queue
    settings.WITHDRAWAL_REQUEST_REBUILD = True
    request = _poll_until(lambda: WithdrawalRequest.objects.filter(
        transaction_id=transaction_id).first(), what="request rebuilt")
    assert (request.memo, request.amount_in) == (pay["memo"], Decimal("10"))
    settle(transaction_id)
    assert_payout_once(clean_sandbox, transaction_id)
    _poll_until(lambda: StellarReceipt.objects.filter(memo=pay["memo"],
                                                      settled_at__isnull=False).exists(),
                what="receipt consumed")
    _assert_receipt_consumed(pay["memo"], transaction_id)
    _assert_books_once(transaction_id)


def test_a_payout_lost_after_razorpayx_paid_and_ap_completed_is_rebuilt_not_paid_again(
        clean_sandbox, settings):
    """Chaos seed 3 with one burner (issue 25 §2): RazorpayX paid, AP was told
    ``completed``, and the failover lost the payout row, its attempt and the request's
    ``funds_verified``. AP's completed withdrawals are not polled: the request stayed
    ``awaiting_funds`` with no payout for ever (stranded, ``ap_mismatch``), its receipt
    owned by nobody."""
    # given a withdrawal paid out and completed in AP
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    settings.RECEIPT_GRACE_S = 0.3
    _, transaction_id = pending_anchor_withdrawal(clean_sandbox)
    before = rewind.mark()
    assert settle(transaction_id).status == "completed"
    assert ap(transaction_id)["status"] == "completed"

    # when the failover loses every commit since (request status, payout, attempt, books)
    lost = rewind.rewind(before)
    assert lost["withdrawal_payouts"] == 1 and lost["payout_attempts"] == 1
    assert WithdrawalRequest.objects.get(transaction_id=transaction_id).status == \
        "awaiting_funds"

    # then the poller rebuilds the payout from RazorpayX and AP: nothing paid again
    settings.WITHDRAWAL_REQUEST_REBUILD = True
    payout = _poll_until(lambda: WithdrawalPayout.objects.filter(
        transaction_id=transaction_id).first(), what="payout rebuilt")
    assert payout.status == "completed" and payout.ap_completed_at is not None
    assert_payout_once(clean_sandbox, transaction_id)
    assert payout.reference == ap(transaction_id)["external_transaction_id"]
    assert WithdrawalRequest.objects.get(transaction_id=transaction_id).status == \
        "funds_verified"
    memo = WithdrawalRequest.objects.get(transaction_id=transaction_id).memo
    _poll_until(lambda: StellarReceipt.objects.filter(memo=memo,
                                                      settled_at__isnull=False).exists(),
                what="receipt consumed")
    _assert_receipt_consumed(memo, transaction_id)
    _assert_books_once(transaction_id)


def test_a_request_and_payout_lost_after_ap_completed_are_rebuilt_not_paid_again(
        clean_sandbox, settings):
    """Both rows lost after the payout: the request rebuilt from AP and RazorpayX, the
    payout from RazorpayX; one payout, the receipt consumed."""
    # given a withdrawal submitted, paid by the wallet, paid out and completed in AP
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    settings.RECEIPT_GRACE_S = 0.3
    wallet, transaction_id, url = opened_withdrawal(clean_sandbox)
    before = rewind.mark()
    pay = Customer(clean_sandbox).submit_withdrawal(url, "10")
    wallet.pay(destination=pay["destination"], amount="10", memo=pay["memo"])
    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP observer")
    assert settle(transaction_id).status == "completed"
    assert ap(transaction_id)["status"] == "completed"

    # when the failover loses all of it
    lost = rewind.rewind(before)
    assert lost["withdrawal_requests"] == 1 and lost["withdrawal_payouts"] == 1

    # then both rows come back from AP and RazorpayX, and nothing is paid again
    settings.WITHDRAWAL_REQUEST_REBUILD = True
    _poll_until(lambda: WithdrawalPayout.objects.filter(transaction_id=transaction_id,
                                                        status="completed").exists(),
                what="request and payout rebuilt")
    assert_payout_once(clean_sandbox, transaction_id)
    _poll_until(lambda: StellarReceipt.objects.filter(memo=pay["memo"],
                                                      settled_at__isnull=False).exists(),
                what="receipt consumed")
    _assert_receipt_consumed(pay["memo"], transaction_id)
    _assert_books_once(transaction_id)


def _lost_request_with_raised_receipt(sandbox, settings, amount: str = "10"):
    """A withdrawal whose request a failover lost after AP took it; the wallet paid
    ``amount`` USDC with the memo and the classifier raised the receipt ("unknown
    memo"). Returns (wallet, transaction id, receipt)."""
    settings.RECEIPT_GRACE_S = 0.3
    wallet, transaction_id, url = opened_withdrawal(sandbox)
    before = rewind.mark()
    pay = Customer(sandbox).submit_withdrawal(url, "10")
    assert rewind.rewind(before)["withdrawal_requests"] == 1
    wallet.pay(destination=pay["destination"], amount=amount, memo=pay["memo"])
    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP observer")
    time.sleep(settings.RECEIPT_GRACE_S + 0.1)
    poller.poll_withdrawals()
    receipt = StellarReceipt.objects.get(memo=pay["memo"])
    assert receipt.review_reason.startswith("unknown memo"), receipt.review_reason
    return wallet, transaction_id, receipt


def test_a_lost_request_whose_receipt_an_operator_refunded_is_rebuilt_in_review_not_paid(
        clean_sandbox, settings):
    """The operator sent the "unknown memo" USDC back before the request was rebuilt:
    the rebuilt request must not pay the INR too (its receipts still sum to its
    amount_in, so the poller would verify and pay them)."""
    # given a lost request whose raised receipt an operator refunded on chain
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet, transaction_id, receipt = _lost_request_with_raised_receipt(clean_sandbox,
                                                                        settings)
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    refund = operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                                note="unknown memo: sent back")
    assert refund.status == "completed", refund.last_error

    # when the poller rebuilds the request from AP and RazorpayX
    settings.WITHDRAWAL_REQUEST_REBUILD = True
    request = _poll_until(lambda: WithdrawalRequest.objects.filter(
        transaction_id=transaction_id).first(), what="request rebuilt")
    for _ in range(5):
        poller.poll_withdrawals()

    # then it waits in review (the USDC went back once), and no INR is paid
    request.refresh_from_db()
    assert request.status == "manual_review" and "refunded" in request.review_reason
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
    assert not WithdrawalPayout.objects.filter(transaction_id=transaction_id).exists()
    assert _refunds_on_chain(wallet) == [refund.tx_hash]



def test_a_lost_request_whose_receipt_refund_was_lost_too_is_rebuilt_in_review_not_paid(
        clean_sandbox, settings):
    """As above, and a second failover lost the receipt's refund after it landed: the
    rebuilt request found no refund row under its memo, was stored ``awaiting_funds``,
    the "unknown memo" review of its receipt was withdrawn and the INR paid beside the
    USDC already sent back, unless the refund sweep happened to rebuild the refund
    first."""
    # given a lost request whose raised receipt an operator refunded on chain, the
    # refund's commits lost in turn
    clean_sandbox.fault("razorpayx.settle_delay", seconds=0.2)
    wallet, transaction_id, receipt = _lost_request_with_raised_receipt(clean_sandbox,
                                                                        settings)
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    before = rewind.mark()
    done = operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=operator,
                                              note="unknown memo: sent back")
    assert done.status == "completed", done.last_error
    assert rewind.rewind(before)["withdrawal_refunds"] == 1

    # when the poller rebuilds the request from AP and RazorpayX (no refund sweep yet)
    settings.WITHDRAWAL_REQUEST_REBUILD = True
    request = _poll_until(lambda: WithdrawalRequest.objects.filter(
        transaction_id=transaction_id).first(), what="request rebuilt")
    for _ in range(5):
        poller.poll_withdrawals()

    # then the receipt's refund is found on chain first: the request waits in review,
    # no INR is paid, and the USDC went back once, its refund rebuilt and booked
    request.refresh_from_db()
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
    assert (request.status, "refunded" in request.review_reason) == ("manual_review", True)
    assert _refunds_on_chain(wallet) == [done.tx_hash]
    refund = WithdrawalRefund.objects.get(receipt=receipt)
    assert (refund.status, refund.tx_hash) == ("completed", done.tx_hash), refund.last_error
    assert Entry.objects.filter(idempotency_key=f"refund:{refund.pk}").count() == 1

def test_a_refunded_withdrawal_whose_request_and_refund_were_lost_is_not_refunded_again(
        clean_sandbox, settings):
    """A short withdrawal refunded on chain (AP ``refunded``), then the failover lost its
    request and its refund. AP's refunded withdrawals were never looked at: the receipt
    was raised as "unknown memo", an operator's "refund on chain" away from sending the
    USDC back a second time."""
    # given a short withdrawal whose USDC an operator refunded (AP refunded)
    settings.RECEIPT_GRACE_S = 0.3
    wallet, transaction_id, url = opened_withdrawal(clean_sandbox)
    before = rewind.mark()
    pay = Customer(clean_sandbox).submit_withdrawal(url, "10")
    wallet.pay(destination=pay["destination"], amount="9.5", memo=pay["memo"])
    wait_for(lambda: ap(transaction_id)["status"] == "pending_anchor", what="AP observer")
    request = _poll_until(lambda: WithdrawalRequest.objects.filter(
        transaction_id=transaction_id, status="manual_review").first(),
        what="short withdrawal in review")
    operator = User.objects.create_superuser("op", "op@example.com", "pw")
    done = operations.withdrawal_refund_on_chain(request_id=request.pk, operator=operator,
                                                 note="short: sent back")
    assert done.status == "completed" and ap(transaction_id)["status"] == "refunded"

    # when the failover loses the request and the refund
    lost = rewind.rewind(before)
    assert lost["withdrawal_requests"] == 1 and lost["withdrawal_refunds"] == 1

    # then the poller rebuilds the request (in review), the refund sweep its refund from
    # AP and the chain, and the receipt is accounted for: nothing goes back twice
    settings.WITHDRAWAL_REQUEST_REBUILD = True
    request = _poll_until(lambda: WithdrawalRequest.objects.filter(
        transaction_id=transaction_id).first(), what="request rebuilt")
    assert request.status == "manual_review"
    time.sleep(settings.REFUND_SWEEP_AGE_S + 0.1)
    # (earlier tests' refunded withdrawals, still in the session's sandbox, too)
    assert tasks.sweep_refunds().get("rebuilt", 0) >= 1
    refund = _assert_refunded_once(wallet, request, settings)
    assert refund.tx_hash == done.tx_hash
    poller.poll_withdrawals()
    receipt = StellarReceipt.objects.get(memo=pay["memo"])
    assert receipt.settled_at is not None
    assert not ReviewItem.objects.filter(kind="receipt", reference=receipt.tx_hash).exists()
    assert sandbox_payouts(clean_sandbox, transaction_id) == []
