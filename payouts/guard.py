"""The at-most-once payout guard (DEC-009), DESIGN.md §5 steps 2-5.

2. claim: insert the ``withdrawal_payouts`` row (``processing``) and its first
   ``payout_attempts`` row (a fresh UUID key) in one transaction; the unique
   ``transaction_id`` makes a second claim fail.
3. disburse through the provider with that attempt's key.
4. mark paid: ``completed`` with the UTR (RazorpayX usually answers ``processing`` and
   sends the UTR later: the row stays ``processing`` with the provider's payout id and
   AP moves to ``pending_external``).
5. complete AP: ``notify_offchain_funds_sent`` with ``external_transaction_id`` = UTR;
   on -32600 re-read: done only if ``completed``.

A ``processing`` row without a provider payout id has an unknown outcome: Corridor
asks the provider by reference, replays the same key, and when it stays unknown past
PAYOUT_UNKNOWN_REVIEW_S sends it to ``manual_review`` -- never ``failed`` by timeout,
never a new key. A new key is minted only by an operator after the provider said
``failed``. A ``reversed`` after ``processed`` goes to the operators' queue.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from structlog.contextvars import bound_contextvars

from anchor import limits, platform
from common.crashpoints import crash_point
from payouts import beneficiaries, books, receipts
from payouts.models import PayoutAttempt, WithdrawalPayout, WithdrawalRefund, WithdrawalRequest
from payouts.providers.base import DisburseResult, ProviderPayout
from payouts.providers.razorpayx import provider as default_provider

log = logging.getLogger(__name__)
Status = WithdrawalPayout.Status
NARRATION = "Corridor withdrawal"
# Forward-only ranks of provider statuses (razorpay/NOTES.md §2.6, resilient-tech).
RANK = {"pending": 2, "scheduled": 2, "queued": 3, "processing": 4, "processed": 5,
        "cancelled": 5, "failed": 5, "rejected": 5, "reversed": 6}


def provider():
    return default_provider()


# The namespace of every payout attempt's idempotency key (never change it: a key is
# re-derived after a lost commit and must equal the one RazorpayX already has).
ATTEMPT_KEY_NAMESPACE = uuid.UUID("5b0e3c2a-9f6d-4c1e-8a57-2d64f0c1b7e3")


def attempt_key(*, transaction_id: str, number: int) -> uuid.UUID:
    """The ``X-Payout-Idempotency`` key of attempt ``number`` of a withdrawal's payout:
    derived from the withdrawal and the attempt counter (razorpay/NOTES.md §2.5,
    recommendation; a UUID, 36 characters, RazorpayX's limit). A claim whose commit a
    failover lost is claimed again with the same key, so RazorpayX answers with the
    payout it already made instead of making a second one (issue 25 §2)."""
    return uuid.uuid5(ATTEMPT_KEY_NAMESPACE, f"{transaction_id}/{number}")


def lock_request(transaction_id: str) -> None:
    """Lock the withdrawal's request row, in a transaction that is about to move its
    payout to ``failed``. The move flips ``awaits_payout``, whose trigger then writes
    the request (payouts/migrations/0006); locking it first keeps the lock order of
    every withdrawal path, the request then the payout (``payout_new_attempt``, the
    withdrawal refund), so the two cannot deadlock."""
    list(WithdrawalRequest.objects.select_for_update().filter(
        transaction_id=transaction_id).values_list("pk", flat=True))


# --- entry points ------------------------------------------------------------------

def payout_run(*, request: WithdrawalRequest) -> WithdrawalPayout | None:
    """Pay a verified withdrawal once. Existing payouts are resumed, never re-paid.
    Before the first claim the beneficiary must be verified (payouts/beneficiaries.py):
    None while its validation is pending, and None with the request moved to
    ``manual_review`` when it is refused (a mismatch, an invalid account)."""
    with bound_contextvars(transaction_id=request.transaction_id):
        if not WithdrawalPayout.objects.filter(transaction_id=request.transaction_id).exists():
            verdict = beneficiaries.check(request)  # whose account: before the first payout
            if verdict.outcome == beneficiaries.REFUSED:
                _request_to_review(request, f"beneficiary not verified: {verdict.reason}")
                return None
            if verdict.outcome == beneficiaries.WAITING:
                return None
        if not settings.PAYOUT_GUARD:
            return _unguarded_payout(request)
        try:
            payout = payout_claim(request=request)
        except NotPayable as exc:
            log.info("payout %s not claimed: %s", request.transaction_id, exc)
            return None
        if payout is None:
            return payout_resume(payout=WithdrawalPayout.objects.get(
                transaction_id=request.transaction_id))
        crash_point("after_claim")
        attempt = payout.attempt_rows.get(number=payout.attempts)
        return _disburse(payout, attempt)


class NotPayable(Exception):
    """The request stopped being payable after the caller read it."""


def payout_claim(*, request: WithdrawalRequest) -> WithdrawalPayout | None:
    """Step 2, one commit. None when the row exists already. Under the request's row
    lock (the lock order of every withdrawal path) the request must still be payable:
    not moved to ``manual_review`` or ``expired``, and no refund of its USDC started,
    since the caller read it (found by the attacker trial: a worker that read the request
    before an operator refunded it would otherwise claim and pay), and its payee still
    allowed (:func:`payee_refusal`; refused: the request goes to ``manual_review`` in
    the same commit). Raises NotPayable."""
    try:
        with transaction.atomic():
            current = WithdrawalRequest.objects.select_for_update().get(pk=request.pk)
            if current.status in (WithdrawalRequest.Status.MANUAL_REVIEW,
                                  WithdrawalRequest.Status.EXPIRED):
                raise NotPayable(f"the request is {current.status}")
            if WithdrawalRefund.objects.filter(transaction_id=current.transaction_id).exists():
                raise NotPayable("a refund of its USDC was started")
            refusal = payee_refusal(current)
            if refusal:
                _request_to_review(current, f"not paid: {refusal}")
            else:
                return _claim(request)
    except IntegrityError:
        return None
    raise NotPayable(refusal)


def payee_refusal(request: WithdrawalRequest) -> str:
    """Why ``request``'s payee may not be paid now ("" when it may): the customer's KYC
    as it stands at this moment (anchor.limits.payee_refusal). Called by the claim and
    by every disbursement (:func:`_disburse`: a first payment, the replay of an
    unknown outcome, an operator's new attempt)."""
    receiver = request.customer_id if request.kind == WithdrawalRequest.Kind.RECEIVE else ""
    return limits.payee_refusal(transaction_id=request.transaction_id, receiver_id=receiver)


def _claim(request: WithdrawalRequest) -> WithdrawalPayout:
    payout = WithdrawalPayout.objects.create(
        transaction_id=request.transaction_id, status=Status.PROCESSING,
        amount_paise=request.amount_out_paise, fund_account_id=request.fund_account_id,
        mode="UPI" if request.beneficiary_type == "vpa" else "IMPS",
        provider=provider().name)
    PayoutAttempt.objects.create(payout=payout, number=1, idempotency_key=attempt_key(
        transaction_id=request.transaction_id, number=1))
    return payout


def payout_rebuild(*, request: WithdrawalRequest, ap_tx: dict) -> WithdrawalPayout | None:
    """A withdrawal with no payout row whose AP transaction says a payout was started
    (``ap_tx``: AP's object, ``pending_external`` or ``completed``): the row, its
    attempt and the request's verification a failover lost with its last commits while
    RazorpayX kept the payout (issue 25 §2). Rebuilt from RazorpayX's one payout under
    the transaction's reference (razorpay/NOTES.md §2.9) when its paise and fund account
    are the request's and, AP ``completed``, its UTR is AP's
    ``external_transaction_id``; the receipts must verify again (``receipts.verify``).

    One transaction under the request's lock: the request ``funds_verified`` and booked
    (rule 3) if that was lost too, the payout ``processing`` with attempt 1 under its
    derived key (:func:`attempt_key`) and the provider's payout id. Then the provider's
    status moves it as any poll does (:func:`payout_apply_status`: ``processed`` ->
    ``completed``, booked by rule 4, AP told, which a ``completed`` AP answers -32600
    and the re-read accepts). Nothing is paid: the only call that could pay is never
    made here. Returns the payout, or None (a row exists, RazorpayX holds none or
    several under the reference, they disagree, the receipts do not verify yet, the
    request is in review or expired: logged). Raises rzp.RazorpayError (asked again on
    the next pass)."""
    tid = request.transaction_id
    with bound_contextvars(transaction_id=tid):
        if WithdrawalPayout.objects.filter(transaction_id=tid).exists():
            return None
        found = provider().find_by_reference(tid)
        if len(found) != 1:
            if found:
                log.error("payout of %s not rebuilt: %d provider payouts under its "
                          "reference (%s): a person decides", tid, len(found),
                          ", ".join(p.payout_id for p in found))
            return None
        state = found[0]
        fund_account = state.raw.get("fund_account_id") or request.fund_account_id
        utr = ap_tx.get("external_transaction_id") or ""
        if state.amount_paise != request.amount_out_paise or \
                fund_account != request.fund_account_id or \
                (ap_tx.get("status") == "completed" and utr != state.utr):
            log.error("payout of %s not rebuilt: provider %s (%s paise to %s, UTR %s), "
                      "request %s paise to %s, AP UTR %s", tid, state.payout_id,
                      state.amount_paise, fund_account, state.utr,
                      request.amount_out_paise, request.fund_account_id, utr)
            return None
        verdict = receipts.verify(request, ap_source=ap_tx.get("source_account") or
                                  request.source_account)
        if verdict.outcome != "ok":
            log.info("payout of %s not rebuilt yet: receipts %s %s", tid, verdict.outcome,
                     verdict.reason)
            return None
        with transaction.atomic():
            current = WithdrawalRequest.objects.select_for_update().get(pk=request.pk)
            if current.status not in (WithdrawalRequest.Status.AWAITING_FUNDS,
                                      WithdrawalRequest.Status.FUNDS_VERIFIED) or \
                    WithdrawalPayout.objects.filter(transaction_id=tid).exists():
                return None
            if current.status != WithdrawalRequest.Status.FUNDS_VERIFIED:
                WithdrawalRequest.objects.filter(pk=current.pk).update(
                    status=WithdrawalRequest.Status.FUNDS_VERIFIED,
                    received_amount=verdict.received, chain_evidence=verdict.evidence,
                    review_reason=verdict.reason, updated_at=timezone.now())
                books.received(current, verdict.received)  # rule 3, as the poller books it
            payout = WithdrawalPayout.objects.create(
                transaction_id=tid, status=Status.PROCESSING, amount_paise=state.amount_paise,
                fund_account_id=fund_account, mode=state.raw.get("mode") or (
                    "UPI" if current.beneficiary_type == "vpa" else "IMPS"),
                provider=provider().name, provider_payout_id=state.payout_id,
                last_error=f"rebuilt from the provider's {state.payout_id} (a lost commit)")
            PayoutAttempt.objects.create(
                payout=payout, number=1, provider_payout_id=state.payout_id,
                idempotency_key=attempt_key(transaction_id=tid, number=1))
        log.warning("payout of %s rebuilt from the provider's %s (%s; AP %s)", tid,
                    state.payout_id, state.status, ap_tx.get("status"))
        return payout_apply_status(payout=payout, state=state)


def payout_resume(*, payout: WithdrawalPayout) -> WithdrawalPayout:
    """Self-healing for an existing row (after a crash, a stale AP status, a poll)."""
    with bound_contextvars(transaction_id=payout.transaction_id):
        if payout.status == Status.COMPLETED:
            if payout.ap_completed_at is None:
                return payout_complete_ap(payout=payout)
            return payout
        if payout.status != Status.PROCESSING:
            return payout  # failed / reversed / manual_review wait for a person
        attempt = payout.attempt_rows.get(number=payout.attempts)
        if attempt.provider_payout_id:
            try:
                state = provider().fetch(attempt.provider_payout_id)
            except Exception as exc:  # unreachable provider: try again on the next poll
                _note(payout, f"fetch: {exc}")
                return _fresh(payout)
            return payout_apply_status(payout=payout, state=state)
        # Outcome unknown: look for it by reference, then replay the same key and body.
        try:
            found = provider().find_by_reference(payout.transaction_id)
        except Exception as exc:
            _note(payout, f"find_by_reference: {exc}")
            return _unknown_too_long(payout)
        if len(found) > 1:
            return _to_review(payout, f"{len(found)} provider payouts under one reference: "
                                      + ", ".join(p.payout_id for p in found))
        if found:
            _record(payout, attempt, found[0])
            return payout_apply_status(payout=_fresh(payout), state=found[0])
        return _disburse(payout, attempt)


def payout_apply_status(*, payout: WithdrawalPayout, state: ProviderPayout,
                        complete_ap: bool = True) -> WithdrawalPayout:
    """Move our row by the provider's status, forward only (webhooks and polls).
    processed -> completed (then AP), failed/cancelled/rejected -> failed, reversed ->
    reversed (operators' queue); a lower-ranked status than we hold is ignored. Only the
    current attempt moves the row: an earlier attempt's status is recorded on its own
    ``payout_attempts`` row (and sends ours to manual_review if it says paid).
    ``complete_ap=False`` leaves step 5 to the caller (a webhook applying inside its
    dedupe transaction tells AP after the commit). Every status change is a declared
    ``WithdrawalPayout.transition`` under the row lock."""
    with bound_contextvars(transaction_id=payout.transaction_id):
        with transaction.atomic():
            if state.status in provider().failed_statuses:
                lock_request(payout.transaction_id)
            current = WithdrawalPayout.objects.select_for_update().get(pk=payout.pk)
            # The attempt and the status it holds are read under the row lock: read
            # before it, a stale "processing" waiting behind a "processed" would write
            # its rank back over the newer one (tests/test_payout_apply_race.py).
            attempt = current.attempt_rows.filter(provider_payout_id=state.payout_id).first() \
                or current.attempt_rows.get(number=current.attempts)
            held = RANK.get(attempt.provider_status, 0)
            if RANK.get(state.status, 0) < held:
                return current
            PayoutAttempt.objects.filter(pk=attempt.pk).update(
                provider_status=state.status, provider_payout_id=state.payout_id,
                provider_reason=(state.reason or "")[:60], updated_at=timezone.now())
            if attempt.number != current.attempts:
                # An earlier attempt's news (a late or redelivered webhook): it is kept
                # on that attempt's row, and moves ours only if it says money moved,
                # which a new attempt must never coexist with (operators decide).
                if state.status in ("processed", "reversed") and \
                        current.status != Status.MANUAL_REVIEW:
                    WithdrawalPayout.transition(
                        current.pk, current.status, Status.MANUAL_REVIEW, require=True,
                        last_error=(f"attempt {attempt.number} is {state.status} at the "
                                    f"provider while attempt {current.attempts} is the "
                                    "current one: check both"))
                log.info("payout %s: attempt %s says %s; attempt %s is current",
                         current.transaction_id, attempt.number, state.status,
                         current.attempts)
                return _fresh(current)
            fields = {"provider_payout_id": current.provider_payout_id or state.payout_id}
            charge = {name: value for name, value in (("fees_paise", state.fees_paise),
                                                      ("tax_paise", state.tax_paise))
                      if value is not None}
            if state.status == "processed" and current.status == Status.PROCESSING:
                WithdrawalPayout.transition(current.pk, Status.PROCESSING, Status.COMPLETED,
                                            require=True, reference=state.utr, last_error="",
                                            **fields, **charge)
                books.paid(_fresh(current))  # rule 4, in this transaction
            elif state.status in provider().failed_statuses and current.status == Status.PROCESSING:
                WithdrawalPayout.transition(
                    current.pk, Status.PROCESSING, Status.FAILED, require=True,
                    last_error=f"provider {state.status}: {state.reason}"[:2000], **fields)
            elif state.status == "reversed" and current.status in (Status.PROCESSING,
                                                                    Status.COMPLETED):
                after = "processed" if held == RANK["processed"] else "processing"
                WithdrawalPayout.transition(
                    current.pk, current.status, Status.REVERSED, require=True,
                    reference=current.reference or state.utr,
                    last_error=f"reversed by the bank after {after}: {state.reason}"[:2000],
                    **fields, **charge)
                books.reversed_(_fresh(current))  # rule 5, in this transaction
            elif fields["provider_payout_id"] != current.provider_payout_id:
                # No status change: only the provider's id is news. A status we hold
                # already (a redelivered or late event) writes nothing at all.
                WithdrawalPayout.objects.filter(pk=current.pk).update(
                    updated_at=timezone.now(), **fields)
            current = _fresh(current)
        if current.status == Status.PROCESSING:
            _too_old_to_wait(current)
        if complete_ap and current.status == Status.COMPLETED and current.ap_completed_at is None:
            crash_point("after_mark_paid")
            return payout_complete_ap(payout=current)
        return _fresh(current)


def payout_complete_ap(*, payout: WithdrawalPayout) -> WithdrawalPayout:
    """Step 5: ``notify_offchain_funds_sent`` with the UTR; -32600 -> re-read."""
    with bound_contextvars(transaction_id=payout.transaction_id):
        try:
            platform.rpc_once("notify_offchain_funds_sent",
                              {"transaction_id": payout.transaction_id,
                               "external_transaction_id": payout.reference,
                               "funds_sent_at": timezone.now().isoformat().replace("+00:00", "Z")},
                              reached=lambda tx: tx.get("status") == "completed")
        except (platform.RpcError, platform.PlatformError) as exc:
            _note(payout, f"notify_offchain_funds_sent: {exc}")
            return _fresh(payout)
        crash_point("after_ap_call")
        WithdrawalPayout.objects.filter(pk=payout.pk, ap_completed_at__isnull=True).update(
            ap_completed_at=timezone.now(), updated_at=timezone.now())
        return _fresh(payout)


# --- steps ---------------------------------------------------------------------------

def _disburse(payout: WithdrawalPayout, attempt: PayoutAttempt) -> WithdrawalPayout:
    request = WithdrawalRequest.objects.filter(transaction_id=payout.transaction_id).first()
    refusal = payee_refusal(request) if request is not None else ""
    if refusal:  # the payee's status changed since the claim: a person decides
        return _to_review(payout, f"not paid: {refusal}")
    result: DisburseResult = provider().disburse(
        fund_account_id=payout.fund_account_id, amount_paise=payout.amount_paise,
        reference=payout.transaction_id, idempotency_key=str(attempt.idempotency_key),
        narration=NARRATION, mode=payout.mode)
    crash_point("after_provider_call")
    if result.kind == "accepted":
        _record(payout, attempt, result.payout)
        payout = payout_apply_status(payout=_fresh(payout), state=result.payout)
        if payout.status == Status.PROCESSING:
            _pending_external(payout)
        return payout
    if result.kind == "rejected":
        with transaction.atomic():
            lock_request(payout.transaction_id)
            WithdrawalPayout.transition(
                payout.pk, Status.PROCESSING, Status.FAILED,
                last_error=f"provider refused: {result.reason}"[:2000])
            PayoutAttempt.objects.filter(pk=attempt.pk).update(provider_status="rejected")
        return _fresh(payout)
    _note(payout, f"disburse outcome unknown: {result.reason}")
    return _unknown_too_long(_fresh(payout))


def _record(payout: WithdrawalPayout, attempt: PayoutAttempt, state: ProviderPayout) -> None:
    with transaction.atomic():
        PayoutAttempt.objects.filter(pk=attempt.pk).update(
            provider_payout_id=state.payout_id, updated_at=timezone.now())
        WithdrawalPayout.objects.filter(pk=payout.pk, provider_payout_id="").update(
            provider_payout_id=state.payout_id, updated_at=timezone.now())


def _pending_external(payout: WithdrawalPayout) -> None:
    """AP pending_anchor -> pending_external while the provider is processing."""
    try:
        platform.rpc_once("notify_offchain_funds_pending",
                          {"transaction_id": payout.transaction_id,
                           "external_transaction_id": payout.provider_payout_id},
                          reached=lambda tx: tx.get("status") in ("pending_external",
                                                                  "completed"))
    except (platform.RpcError, platform.PlatformError) as exc:
        log.info("pending_external for %s not set: %s", payout.transaction_id, exc)


def _unknown_too_long(payout: WithdrawalPayout) -> WithdrawalPayout:
    age = timezone.now() - payout.clock_started_at
    if payout.status == Status.PROCESSING and not payout.provider_payout_id and \
            age > timedelta(seconds=settings.PAYOUT_UNKNOWN_REVIEW_S):
        return _to_review(payout, f"payout outcome unknown after {age}: {payout.last_error}")
    return payout


def _too_old_to_wait(payout: WithdrawalPayout) -> None:
    age = timezone.now() - payout.clock_started_at
    if age > timedelta(seconds=settings.PAYOUT_SETTLEMENT_WINDOW_S):
        _to_review(payout, f"no final state from the provider within the settlement "
                           f"window ({age})")


def _to_review(payout: WithdrawalPayout, reason: str) -> WithdrawalPayout:
    WithdrawalPayout.transition(payout.pk, Status.PROCESSING, Status.MANUAL_REVIEW,
                                last_error=reason[:2000])
    return _fresh(payout)


def _note(payout: WithdrawalPayout, error: str) -> None:
    WithdrawalPayout.note(payout.pk, error)


def _fresh(payout: WithdrawalPayout) -> WithdrawalPayout:
    return WithdrawalPayout.objects.get(pk=payout.pk)


def _request_to_review(request: WithdrawalRequest, reason: str) -> None:
    WithdrawalRequest.objects.filter(pk=request.pk).update(
        status=WithdrawalRequest.Status.MANUAL_REVIEW, review_reason=reason[:2000],
        updated_at=timezone.now())


def _unguarded_payout(request: WithdrawalRequest) -> WithdrawalPayout:
    """Test-only (PAYOUT_GUARD = False): what code that trusts AP's status does -- pay
    with a fresh key whenever AP says pending_anchor (no row claimed before the call,
    no look-up), then write down what happened and tell AP (pending_external). Correct
    while AP's status is fresh and nothing dies between the call and the notify; pays
    twice otherwise (``make chaos`` shows it). Each call is recorded as an attempt, so
    webhooks and polls still move the row as usual."""
    key = uuid.uuid4()
    mode = "UPI" if request.beneficiary_type == "vpa" else "IMPS"
    result = provider().disburse(
        fund_account_id=request.fund_account_id, amount_paise=request.amount_out_paise,
        reference=request.transaction_id, idempotency_key=str(key),
        narration=NARRATION, mode=mode)
    crash_point("after_provider_call")
    state = result.payout
    with transaction.atomic():
        payout, created = WithdrawalPayout.objects.select_for_update().get_or_create(
            transaction_id=request.transaction_id,
            defaults={"amount_paise": request.amount_out_paise, "status": Status.PROCESSING,
                      "fund_account_id": request.fund_account_id,
                      "mode": mode, "provider": provider().name})
        if not created:
            WithdrawalPayout.objects.filter(pk=payout.pk).update(attempts=F("attempts") + 1)
            payout.refresh_from_db()
        PayoutAttempt.objects.create(payout=payout, number=payout.attempts,
                                     idempotency_key=key,
                                     provider_payout_id=state.payout_id if state else "")
    if state is None:
        return _fresh(payout)
    _record(payout, payout.attempt_rows.get(number=payout.attempts), state)
    payout = payout_apply_status(payout=_fresh(payout), state=state)
    if payout.status == Status.PROCESSING:
        _pending_external(payout)
    return payout


# --- operator helpers (payouts/operations.py) ---------------------------------------

def payout_disburse_current(*, payout_id: int) -> WithdrawalPayout:
    """Step 3 for the payout's current attempt, right after an operator minted it
    (``operations.payout_new_attempt``): disburse under that attempt's own key, then
    steps 4-5 as usual. Only for a ``processing`` row whose current attempt has no
    provider payout yet; anything else is returned as it stands (the poller resumes
    it). Never mints a key."""
    payout = WithdrawalPayout.objects.get(pk=payout_id)
    attempt = payout.attempt_rows.get(number=payout.attempts)
    if payout.status != Status.PROCESSING or attempt.provider_payout_id:
        return payout
    return _disburse(payout, attempt)
