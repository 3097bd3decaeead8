"""Operator actions on deposits (the Django admin's operator console, DESIGN.md §1
"Operators"). What every operator action shares (``OperationRefused``, ``Preview``,
permission and note checks) is in ``common.console``.

Each action is one keyword-only service that owns its transaction, its locks and its
audit row (STYLE.md "one action, one transaction, one audit row"): the external reads
that prove the action safe (Horizon, AP) run first, outside any transaction; then one
transaction re-checks the row under a lock, makes the change and writes the audit row
naming the operator and their note; external writes (a Stellar submission, an AP
notify) run after the commit, as the outbox they belong to does it. One read stays
inside: a new Stellar envelope's sequence, taken from Horizon under the channel
account's row lock exactly as the release outbox takes it (DESIGN.md §4 step 1), so
that two envelopes can never share a sequence. A refusal raises ``OperationRefused``
and writes nothing.

Every action has a ``*_preview`` beside it: the same checks, read only, and the words
the confirmation page shows ("what will happen"), so what the operator confirms is
what the service does.

- ``release_redrive`` (permission ``anchor.redrive_release``).
- ``deposit_refund`` (permission ``anchor.refund_deposit``): refunds a deposit's whole
  captured INR through Razorpay (anchor/refunds.py), for a deposit whose release is
  not going to happen; AP ``notify_refund_sent`` once Razorpay processed it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction

from anchor import platform, refunds, releases, stellar
from anchor import razorpay as rzp
from anchor.models import DepositPayment, DepositRefund, DepositRelease, ReleaseEvent
from common.console import (
    OperationRefused,
    Preview,
    clean_note,
    operator_name,
    require_permission,
)

log = logging.getLogger(__name__)


# --- release: re-drive ------------------------------------------------------------

@dataclass
class _RedriveCheck:
    release: DepositRelease
    chain: releases.ChainCheck
    ap_status: str


def _redrive_check(release_id: int) -> _RedriveCheck:
    """Everything that must hold before a re-drive, read outside any transaction.
    Sources: DESIGN.md §4 ("only Corridor's own record of a captured INR payment makes
    a deposit releasable"; step 3 "a new envelope only when the stored one is provably
    dead", decided by ``anchor.envelopes``, the rule every outbox uses: ``unknown`` is
    refused like ``live``; "a C... destination needs a token transfer"), AP NOTES §1.6
    (``notify_onchain_funds_sent`` only from ``pending_anchor`` with funds received)."""
    release = DepositRelease.objects.filter(pk=release_id).first()
    if release is None:
        raise OperationRefused(f"release {release_id} does not exist")
    if release.status != DepositRelease.Status.MANUAL_REVIEW:
        raise OperationRefused(f"release is {release.status}; only a release in "
                               "manual_review is re-driven by hand (the reconciler drives "
                               "the others)")
    if release.destination.startswith("C"):
        raise OperationRefused("the destination is a contract (C...): it needs a token "
                               "transfer, which is not built")
    if DepositRefund.objects.filter(transaction_id=release.transaction_id).exists():
        raise OperationRefused("this deposit's INR is refunded (Deposit refunds): no USDC "
                               "is released for it")
    if not DepositPayment.objects.filter(
            transaction_id=release.transaction_id,
            confirmation=DepositPayment.Confirmation.CONFIRMED).exists():
        raise OperationRefused("Corridor holds no captured payment for this deposit that "
                               "Razorpay confirmed")
    try:
        chain = releases.release_chain_check(release)
    except stellar.HorizonUnavailable as exc:
        raise OperationRefused(f"Horizon cannot be read, so nothing is proven: {exc}") from exc
    if not chain.provably_off_chain:
        raise OperationRefused(f"not provably off chain: {chain.reason}")
    try:
        ap_tx = platform.get_transaction(release.transaction_id)
    except platform.PlatformError as exc:
        raise OperationRefused(f"AP cannot be read: {exc}") from exc
    ap_status = (ap_tx or {}).get("status", "missing")
    if ap_status != "pending_anchor":
        raise OperationRefused(f"AP shows the deposit {ap_status}; a release is only sent "
                               "while AP waits in pending_anchor")
    return _RedriveCheck(release, chain, ap_status)


def release_redrive_preview(*, release_id: int) -> Preview:
    """The confirmation page of ``release_redrive``: its checks, read only."""
    release = DepositRelease.objects.get(pk=release_id)
    preview = Preview(evidence=[
        ("AP transaction", release.transaction_id), ("status", release.status),
        ("reason", release.last_error), ("amount", f"{release.amount} {release.asset_code}"),
        ("destination", release.destination),
        ("memo", f"{release.memo_type} {release.memo}".strip()),
        ("stored hash", release.tx_hash or "(none)"), ("attempts", release.attempts)])
    try:
        check = _redrive_check(release_id)
        preview.evidence += [("chain", check.chain.reason), ("AP status", check.ap_status)]
    except OperationRefused as exc:
        preview.refusal = str(exc)
    preview.will = [
        f"Build a new payment of {release.amount} {release.asset_code} to "
        f"{release.destination} on a channel account: attempt {release.attempts + 1}, "
        "new sequence, new time bounds, new hash (the stored envelope is provably dead, "
        "so at most one of them can ever pay).",
        "Store it and write one deposit_release_events row with your name and note, in "
        "one transaction.",
        "Then submit it to Stellar, tell AP notify_onchain_funds_sent with the new hash "
        "and mark the release completed (if the submission's outcome is unknown, the "
        "reconciler carries on with the same envelope).",
    ]
    return preview


def release_redrive(*, release_id: int, operator, note: str) -> DepositRelease:
    """Re-drive a deposit release in ``manual_review`` whose payment is provably not on
    chain (no envelope ever built, or the stored one is dead: DESIGN.md §4 step 3).

    Money: pays ``release.amount`` USDC to the release's destination once more under a
    new envelope; the old one can never land, so the customer is paid at most once
    (invariant 1). State: one commit stores the new envelope (status ``submitting``,
    attempts + 1) and the ``deposit_release_events`` row; then the release outbox
    submits it and completes AP (``releases.release_drive``). Returns the release as it
    stands afterwards. Raises OperationRefused (nothing written)."""
    require_permission(operator, "anchor.redrive_release")
    note = clean_note(note)
    check = _redrive_check(release_id)
    old_hash = check.release.tx_hash
    try:
        with transaction.atomic():
            release = releases.release_prepare_redrive(
                release_id=release_id, expected_hash=old_hash,
                reason=f"re-driven by {operator_name(operator)}: {note}")
            ReleaseEvent.objects.create(
                release=release, event="release.redrive", operator=operator_name(operator),
                note=note, detail={"chain": check.chain.state, "evidence": check.chain.reason,
                                   "proof": check.chain.detail,
                                   "old_hash": old_hash, "new_hash": release.tx_hash,
                                   "attempt": release.attempts, "ap_status": check.ap_status})
    except releases.ReleaseRefused as exc:
        raise OperationRefused(str(exc)) from exc
    except (stellar.NoChannelFree, stellar.HorizonUnavailable) as exc:
        raise OperationRefused(f"no envelope could be built now: {exc}") from exc
    log.info("release %s re-driven by %s", release.transaction_id, operator_name(operator))
    return releases.release_drive(release_id=release_id)


# --- deposit: refund the INR --------------------------------------------------------

def deposit_refund_preview(*, transaction_id: str) -> Preview:
    """What ``deposit_refund`` would do now, read only."""
    preview = Preview(will=[
        "Refund the whole captured payment to the customer through Razorpay "
        "(POST /v1/payments/{id}/refund, our receipt and idempotency key stored first).",
        "Never release USDC for this deposit afterwards.",
        "Once Razorpay shows the refund processed, record it in AP (notify_refund_sent: "
        "AP refunded); if AP cannot be moved (expired), the refund waits in the review "
        "queue."])
    try:
        check = refunds.refund_check(transaction_id)
    except OperationRefused as exc:
        preview.refusal = str(exc)
        return preview
    preview.evidence = [
        ("payment", check.payment.payment_id),
        ("amount", f"₹{rzp.paise_to_rupees(check.payment.amount_paise)} "
                   f"({check.payment.amount_paise} paise)"),
        ("AP status", check.ap_tx.get("status")),
        ("AP amount_in", check.ap_tx.get("amount_in")),
        ("release", f"{check.release.status}: {check.release.last_error}"
                    if check.release else "none claimed"),
    ]
    return preview


def deposit_refund(*, transaction_id: str, operator, note: str) -> DepositRefund:
    """Refund deposit ``transaction_id``'s captured INR (the whole payment, integer
    paise) through Razorpay, for a deposit whose release is not going to happen (AP
    ``error``, the customer's limits, a release that never built an envelope): the
    claim and its audit row in one transaction, the Razorpay call and AP after the
    commit (anchor/refunds.py). Refused when a release sent or may send USDC, AP shows
    ``completed``/``refunded``, or a refund exists. Raises OperationRefused."""
    require_permission(operator, "anchor.refund_deposit")
    note = clean_note(note)
    return refunds.refund_claim(transaction_id=transaction_id,
                                trigger=DepositRefund.Trigger.OPERATOR,
                                reason=f"operator: {note}", operator=operator, note=note)
