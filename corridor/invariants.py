"""The money invariants, checked after a run has settled: one checker shared by
``manage.py demo`` and ``manage.py chaos``.

Each ``*_figures`` function takes the ids a run created and returns counts plus a list
of ``violations`` (strings naming the id and what broke). Figures are counted where the
money is, not where Corridor says it is: USDC payments on the sandbox's Stellar ledger,
payouts on the sandbox's RazorpayX, the hub's balance on the sandbox Horizon.

- deposits: exactly one USDC payment per completed deposit, none for any other
  (``double_payments``, ``stray_payments``); AP ``completed`` iff ``deposit_releases``
  ``completed`` with the same hash (``ap_mismatches``);
- withdrawals: at most one RazorpayX payout per withdrawal (``double_payouts``, by the
  payout's ``reference_id``, which Corridor sets to the AP transaction id); AP
  ``completed`` iff the payout is ``completed``; a ``reversed`` payout (in the
  operators' queue) agrees with AP ``completed`` or still pending (DESIGN.md §5);
- sagas: every saga final (``completed``, ``compensated``) or ``manual_review`` with a
  reason; compensations ran last step first (``step.compensated`` events in strictly
  decreasing ``idx``); no stale worker's write got through (``stale_writes``);
- books: the trial balance is balanced (``ledger.trial_balance().ok``) and the hub's USDC
  in the ledger equals its balance on chain (``ledger_matches_chain``);
- ``stranded(age_s)``: money rows that are not terminal and have not moved for
  ``age_s`` seconds, per kind (one function, so it can later call the shared
  definition behind /health and /metrics);
- ``review_reasons()``: the operators' queue (``operator_review_queue``) counted per
  (kind, reason); ``retryable_reasons`` names the ones a retry would fix, which are
  violations: only what an operator alone can resolve may wait there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone


@dataclass
class Figures:
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def merge(self, other: Figures) -> Figures:
        for key, value in other.counts.items():
            self.add(key, value)
        self.violations.extend(other.violations)
        return self


def _usdc_payments_to(sandbox, address: str) -> list[dict]:
    reply = sandbox.http.get(f"/horizon/accounts/{address}/payments",
                             params={"limit": 200})
    if reply.status_code == 404:
        return []
    reply.raise_for_status()
    return [r for r in reply.json()["_embedded"]["records"]
            if r.get("type") == "payment" and r.get("to") == address
            and r.get("asset_code") == settings.STELLAR_USDC_CODE]


def deposit_figures(sandbox, deposits: dict[str, str]) -> Figures:
    """``deposits``: AP transaction id -> the wallet address it pays (a fresh account
    per deposit, so every USDC payment it received is this deposit's)."""
    from anchor import platform
    from anchor.models import DepositRelease

    out = Figures(counts={"deposits": len(deposits), "deposits_completed": 0,
                          "double_payments": 0, "stray_payments": 0, "ap_mismatches": 0})
    for transaction_id, address in deposits.items():
        ap = platform.get_transaction(transaction_id) or {}
        release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
        ap_done = ap.get("status") == "completed"
        ours_done = release is not None and release.status == "completed"
        out.add("deposits_completed", ap_done)
        ap_hashes = [st.get("id") for st in ap.get("stellar_transactions") or []]
        if ap_done != ours_done or (ap_done and ap_hashes != [release.tx_hash]):
            out.add("ap_mismatches")
            out.violations.append(
                f"ap_mismatch deposit {transaction_id}: AP {ap.get('status')} "
                f"{ap_hashes}, release {release and release.status} "
                f"{release and release.tx_hash}")
        paid = len(_usdc_payments_to(sandbox, address))
        if ours_done or ap_done:
            if paid > 1:
                out.add("double_payments", paid - 1)
                out.violations.append(f"double_payment deposit {transaction_id}: "
                                      f"{paid} USDC payments")
            elif paid == 0:
                out.violations.append(f"completed deposit {transaction_id} has no payment")
        elif paid:
            out.add("stray_payments", paid)
            out.violations.append(f"stray_payment deposit {transaction_id} "
                                  f"({release and release.status}): {paid} USDC payments")
    return out


def late_deposit_figures(sandbox, deposits: dict[str, str]) -> Figures:
    """Deposits paid after AP expired them (``deposits``: AP transaction id -> the
    wallet address it would have paid): each captured payment refunded through Razorpay
    exactly once (counted on the sandbox's refunds of that payment), no USDC ever sent,
    AP left ``expired`` (AP cannot move an expired deposit, issue 13 §3)."""
    from anchor import platform
    from anchor.models import DepositPayment, DepositRefund

    out = Figures(counts={"late_deposits": len(deposits), "refunds_inr": 0,
                          "double_refunds": 0})
    for transaction_id, address in deposits.items():
        payment = DepositPayment.objects.filter(transaction_id=transaction_id).first()
        refund = DepositRefund.objects.filter(transaction_id=transaction_id).first()
        made = [] if payment is None else sandbox.http.get(
            "/razorpay/sandbox/refunds", params={"payment_id": payment.payment_id}
        ).json()["refunds"]
        if len(made) > 1:
            out.add("double_refunds", len(made) - 1)
            out.violations.append(f"double_refund deposit {transaction_id}: "
                                  f"{len(made)} Razorpay refunds")
        out.add("refunds_inr", sum(1 for r in made if r.get("status") == "processed"))
        if payment is not None and (refund is None or not made):
            out.violations.append(f"late deposit {transaction_id}: INR captured, "
                                  f"refund {refund and refund.status}, {len(made)} made")
        if refund is not None and made and refund.refund_id != made[0]["id"]:
            out.violations.append(f"late deposit {transaction_id}: our refund "
                                  f"{refund.refund_id}, Razorpay's {made[0]['id']}")
        if _usdc_payments_to(sandbox, address):
            out.violations.append(f"stray_payment late deposit {transaction_id}: USDC sent")
        status = (platform.get_transaction(transaction_id) or {}).get("status")
        if status != "expired":
            out.violations.append(f"late deposit {transaction_id}: AP {status}, not expired")
    return out


def _payouts_made(sandbox, ids: list[str], out: Figures, *, key: str,
                  what: str) -> dict[str, int]:
    """RazorpayX payouts per transaction id, as the sandbox holds them; each one beyond
    the first is counted under ``key`` and is a violation."""
    per_reference: dict[str, int] = {}
    for payout in sandbox.http.get("/razorpay/sandbox/payouts").json()["payouts"]:
        per_reference[payout["reference_id"]] = per_reference.get(payout["reference_id"], 0) + 1
    made = {transaction_id: per_reference.get(transaction_id, 0) for transaction_id in ids}
    for transaction_id, n in made.items():
        if n > 1:
            out.add(key, n - 1)
            out.violations.append(f"double_payout {what} {transaction_id}: {n} payouts")
    return made


def withdrawal_figures(sandbox, ids: list[str]) -> Figures:
    from anchor import platform
    from payouts.models import WithdrawalPayout

    out = Figures(counts={"withdrawals": len(ids), "withdrawals_completed": 0,
                          "payouts_reversed": 0, "double_payouts": 0, "ap_mismatches": 0})
    _payouts_made(sandbox, ids, out, key="double_payouts", what="withdrawal")
    for transaction_id in ids:
        row = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
        status = row.status if row else None
        out.add("withdrawals_completed", status == "completed")
        out.add("payouts_reversed", status == "reversed")
        ap = (platform.get_transaction(transaction_id) or {}).get("status")
        # A payout reversed (after processed) waits in the operators' queue; AP shows
        # completed if Corridor had told it, else still pending: both agree.
        agrees = (ap == "completed") == (status == "completed") or (
            status == "reversed" and ap in ("completed", "pending_anchor", "pending_external"))
        if not agrees:
            out.add("ap_mismatches")
            out.violations.append(f"ap_mismatch withdrawal {transaction_id}: AP {ap}, "
                                  f"payout {status}")
    return out


def inbound_figures(sandbox, ids: list[str]) -> Figures:
    """SEP-31 remittances sent in (payouts/receive.py): each in exactly one final group
    -- ``completed`` (INR paid, AP completed), ``refunded`` (the USDC went back on chain
    to the sending anchor: Corridor's refund completed, AP ``refunded``, or ``error``
    naming the refund of a short payment), ``review`` (a person decides: request or
    payout in review, failed or reversed), ``rejected`` (refused before any USDC: AP
    error or expired, no payout), or ``processing`` (the provider has not settled the
    payout yet, or the refund outbox has not finished; the stranded check owns both) --
    at most one RazorpayX payout per transaction, and never both INR paid and the USDC refunded."""
    from anchor import platform
    from payouts.models import WithdrawalPayout, WithdrawalRefund, WithdrawalRequest

    out = Figures(counts={"inbound": len(ids), "inbound_completed": 0, "inbound_refunded": 0,
                          "inbound_review": 0, "inbound_rejected": 0, "inbound_processing": 0,
                          "double_payouts_inbound": 0})
    made_per_id = _payouts_made(sandbox, ids, out, key="double_payouts_inbound",
                                what="inbound")
    paid = {p["reference_id"] for p in sandbox.http.get("/razorpay/sandbox/payouts").json()[
        "payouts"] if p["status"] == "processed"}
    for transaction_id in ids:
        made = made_per_id[transaction_id]
        payout = WithdrawalPayout.objects.filter(transaction_id=transaction_id).first()
        request = WithdrawalRequest.objects.filter(transaction_id=transaction_id).first()
        refund = WithdrawalRefund.objects.filter(transaction_id=transaction_id).first()
        ap = (platform.get_transaction(transaction_id) or {}).get("status")
        if refund is not None and transaction_id in paid:
            out.violations.append(f"inbound {transaction_id}: INR paid and the USDC refunded")
        if refund is not None and refund.status == "completed":
            out.add("inbound_refunded")
        elif refund is not None and refund.status != "manual_review":
            out.add("inbound_processing")  # the refund sweep finishes it
        elif payout is not None and payout.status == "completed" and ap == "completed":
            out.add("inbound_completed")
        elif (request is not None and request.status == "manual_review") or (
                payout is not None and payout.status in ("manual_review", "failed",
                                                         "reversed")):
            out.add("inbound_review")
        elif ap in ("error", "expired") and payout is None and made == 0:
            out.add("inbound_rejected")
        elif payout is not None and payout.status == "processing":
            out.add("inbound_processing")  # the provider's settlement window: stranded
            # past its threshold (corridor/stranded.py payout_processing), not here
        else:
            out.violations.append(f"inbound {transaction_id} not final: AP {ap}, payout "
                                  f"{payout and payout.status}, request "
                                  f"{request and request.status}")
    return out


def sagas_of(references: list[str]):
    """The sagas that own remittances ``references`` (their memos): the remittance's
    saga by reference, or, when a failover lost that saga after the API answered 202,
    the ``hub_return`` saga of the partner's payment under that memo (issue 25 §2). By
    reference, not id: a lost saga's id is issued again to the next remittance."""
    from django.db.models import Q

    from sagas.models import Saga

    return Saga.objects.filter(Q(reference__in=references)
                               | Q(kind="hub_return", input__memo__in=references))


def saga_figures(references: list[str]) -> Figures:
    """Sagas of remittances ``references`` (the memos the API answered): each final,
    compensated in reverse order, no stale write. A reference with no saga at all is a
    violation when the partner's USDC under it reached the hub (nothing owns that money);
    lost before the partner paid, it is counted as ``sagas_lost_unpaid`` (nothing moved)."""
    from anchor import stellar
    from sagas import hub
    from sagas.models import Saga, SagaEvent

    out = Figures(counts={"sagas": len(references), "sagas_lost_unpaid": 0})
    for status in Saga.Status.values:
        out.counts[f"sagas_{status}"] = 0
    owned = set()
    for saga in sagas_of(references):
        owned.add(saga.input.get("memo") if saga.kind == "hub_return" else saga.reference)
        out.add(f"sagas_{saga.status}")
        if saga.status in Saga.OPEN_STATUSES:
            out.violations.append(f"saga {saga.pk} not final: {saga.status}")
        elif saga.status == Saga.Status.MANUAL_REVIEW and not saga.error.strip():
            out.violations.append(f"saga {saga.pk} in manual_review without a reason")
        order = list(SagaEvent.objects.filter(saga=saga, event="step.compensated")
                     .order_by("id").values_list("idx", flat=True))
        if any(a <= b for a, b in zip(order, order[1:], strict=False)):
            out.violations.append(f"saga {saga.pk} compensated out of order: {order}")
        out.violations.extend(f"saga {saga.pk} {v}" for v in stale_writes(saga.pk))
    lost = sorted(set(references) - owned)
    address = hub.hub_address() if lost else ""
    paid = {t.memo for t in stellar.find_transfers_by_reference(address, None)
            if t.destination == address} if lost else set()
    for reference in lost:
        if reference in paid:
            out.violations.append(f"remittance {reference}: its USDC reached the hub and "
                                  "no saga owns it")
        else:
            out.add("sagas_lost_unpaid")
    return out


def stale_writes(saga_id: int) -> list[str]:
    """DESIGN.md §8 invariant 5 for one saga: no write of a stale fence got through.
    Event fences never go down (a worker that lost its lease wrote nothing after the
    one that took over), and each step is booked at most once forward and once back
    (keys ``<saga>:<idx>`` and ``<saga>:<idx>:undo``; a per-attempt key ``@<fence>``
    counts as the same step)."""
    from collections import Counter

    from ledger.models import Entry
    from sagas.models import SagaEvent

    wrong = []
    fences = list(SagaEvent.objects.filter(saga_id=saga_id).order_by("id")
                  .values_list("fence", flat=True))
    if fences != sorted(fences):
        wrong.append(f"stale write: event fences went down: {fences}")
    keys = Entry.objects.filter(saga_id=saga_id, idempotency_key__startswith=f"{saga_id}:")
    per_step = Counter(k.split("@")[0] for k in keys.values_list("idempotency_key", flat=True))
    twice = {k: n for k, n in per_step.items() if n > 1}
    if twice:
        wrong.append(f"stale write: a step booked more than once: {twice}")
    return wrong


def books() -> Figures:
    """The ledger balances and the hub's books equal its chain balance."""
    from anchor import stellar
    from ledger import services as ledger

    out = Figures()
    trial = ledger.trial_balance()
    if not trial.ok:
        out.violations.append(f"ledger unbalanced: totals={trial.totals} drift={trial.drift} "
                              f"unbalanced={trial.unbalanced[:5]}")
    on_chain = stellar.asset_balance(stellar.hub_keypair().public_key, stellar.usdc())
    in_ledger = ledger.balance(account="hub", currency="USDC")
    out.counts["ledger_matches_chain"] = int((on_chain or Decimal(0)) == in_ledger)
    out.counts["hub_chain"] = on_chain  # type: ignore[assignment]
    out.counts["hub_ledger"] = in_ledger  # type: ignore[assignment]
    if not out.counts["ledger_matches_chain"]:
        out.violations.append(f"hub USDC on chain {on_chain} != in the ledger {in_ledger}")
    return out


def treasury() -> Figures:
    """The books against the outside (treasury/reconcile.py, issue 13 §2): a
    reconciliation now must read every provider, compare every balance, and leave no
    balance difference its row breaks do not explain (row breaks themselves are what
    the sandbox's settlement and statement faults inject: counted, not violations)."""
    from treasury.models import Break
    from treasury.reconcile import reconcile

    out = Figures(counts={"books_match_outside": 0, "breaks_open": 0})
    run = reconcile(trigger="check")
    if run.status != "done":
        out.violations.append(f"reconciliation failed: {run.error}")
        return out
    unexplained = list(Break.objects.filter(status="open", kind="balance_differs"))
    for found in unexplained:
        out.violations.append(f"books differ from the outside: {found.key} by "
                              f"{found.difference} {found.currency} (books {found.books}, "
                              f"outside {found.outside})")
    compared = all(b.get("compared", True) for b in run.balances.values())
    out.counts["books_match_outside"] = int(not unexplained and compared)
    open_breaks = Break.objects.filter(status="open")
    out.counts["breaks_open"] = open_breaks.count()
    # Per source and kind, so a campaign can tell the breaks its faults injected from
    # any other (``breaks_open:<source>:<kind>``; cumulative over the world's life).
    for source, kind in open_breaks.values_list("source", "kind"):
        out.add(f"breaks_open:{source}:{kind}")
    return out


def stranded(age_s: float) -> dict[str, int]:
    """Money that stopped moving: per kind, rows not terminal and unchanged for
    ``age_s`` seconds (an operator's queue is terminal for this purpose)."""
    from anchor.models import DepositPayment, DepositRefund, DepositRelease
    from payouts.models import WithdrawalPayout, WithdrawalRefund, WithdrawalRequest
    from sagas.models import Saga

    before = timezone.now() - timedelta(seconds=age_s)
    # A payment being refunded (captured after AP expired its deposit) is its refund's.
    confirmed = DepositPayment.objects.filter(confirmation="confirmed", created_at__lt=before
                                              ).exclude(transaction_id__in=DepositRefund.objects
                                                        .values("transaction_id"))
    released = DepositRelease.objects.values("transaction_id")
    return {
        "releases": DepositRelease.objects.filter(status__in=DepositRelease.OPEN_STATUSES,
                                                  updated_at__lt=before).count(),
        "payouts": WithdrawalPayout.objects.filter(status="processing",
                                                   updated_at__lt=before).count(),
        "refunds": WithdrawalRefund.objects.filter(status__in=("submitting", "submitted"),
                                                   updated_at__lt=before).count(),
        "deposit_refunds": DepositRefund.objects.filter(
            status__in=("requested", "pending", "processed"), updated_at__lt=before).count(),
        "sagas": Saga.objects.filter(status__in=Saga.OPEN_STATUSES,
                                     updated_at__lt=before).count(),
        "captured_not_notified": confirmed.filter(ap_notified_at__isnull=True).count(),
        "captured_not_released": confirmed.exclude(transaction_id__in=released).count(),
        "received_not_consumed": WithdrawalRequest.objects.filter(
            status="funds_verified", updated_at__lt=before, refund__isnull=True).exclude(
            transaction_id__in=WithdrawalPayout.objects.values("transaction_id")).count(),
    }


# Reasons only a person can resolve (a fact about the world changed, money came back,
# a partner refused, the evidence contradicts itself). Anything else in the queue is a
# reason a retry would fix, so its presence there is a violation.
OPERATOR_ONLY = [
    r"revers",  # processed, then returned by the bank
    r"\bfailed\b.*(bank|beneficiar|reject)|beneficiary|payout failed|provider said failed",
    r"reject",  # the receiving anchor or the provider refused
    r"refund",  # an anchor refunded or a refund needs a person
    r"short|more decimals|decimals|wrong asset|shared memo|memo .*(repeat|shared)|not ours",
    r"contract destination|C\.\.\.",
    r"can never land|included but failed|tx_failed",
    r"deadline|expired",
    r"settlement window",  # the provider never finalised it: a person calls the bank
    r"second payment|overpaid",  # the wallet paid more than asked: a person sends it back
    # a failover lost what only Corridor held (issue 25 §2): a receive's firm quote (its
    # rate and expiry) or receiver (their KYC, which the sending anchor must send again),
    # a saga's record of the anchor transaction its hub payment funded (SEP-31 has no
    # look-up by memo): rebuilt and booked from the chain, matched by a person
    r"rebuilt after a lost commit, not payable: .*not in Corridor|\(commits lost\)",
    # USDC at the hub under a memo no saga and no reference of Corridor's names (an
    # anchor's refund whose saga record a failover lost, or a stranger's payment): booked
    # to owed:hub-unmatched and returned only by a person, who knows whose it is
    r"arrived at the hub for no saga, under no reference Corridor issued",
    # a reconciliation break: the provider's record differs (a settlement or statement
    # fault); a person explains it or chases the provider
    r"^(razorpay|razorpayx|horizon) (missing_outside|missing_in_books|amount_differs|"
    r"utr_differs) ",
]


def review_reasons() -> dict[tuple[str, str], int]:
    """The operators' queue, counted per (kind, reason with ids and numbers masked)."""
    from sagas.models import ReviewItem

    counts: dict[tuple[str, str], int] = {}
    for kind, reason in ReviewItem.objects.values_list("kind", "reason"):
        key = (kind, _mask(reason))
        counts[key] = counts.get(key, 0) + 1
    return counts


def _mask(reason: str) -> str:
    reason = re.sub(r"\b[0-9a-f]{16,}\b", "<hex>", reason.strip().splitlines()[0] if reason
                    else "")
    reason = re.sub(r"\b[GMC][A-Z2-7]{55,68}\b", "<account>", reason)
    # The whole first line: a person's reason may say so past any cut (the hub return's
    # "(commits lost)" sits past character 160; a cut there read it as a retry's).
    return re.sub(r"\d+(\.\d+)?", "<n>", reason)[:2000]


def retryable_reasons(reasons: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The subset of ``reasons`` that no OPERATOR_ONLY pattern explains."""
    return {key: n for key, n in reasons.items()
            if not any(re.search(p, key[1], re.IGNORECASE) for p in OPERATOR_ONLY)}
