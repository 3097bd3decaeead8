"""Interactive form submissions that are safe under concurrency (issue 10, part 3).

Two submissions of one form (two tabs, a double click, two sessions from one token)
must cause at most one AP state change and one Razorpay order or payout setup, and no
database transaction or lock may be held across an outbound call. So each submission
follows *record the intent, commit, call, record the outcome*:

1. **Claim** (one short transaction): insert the ``interactive_submissions`` row,
   unique on the AP transaction id, with a lease (``INTERACTIVE_SUBMIT_LEASE_S``). The
   insert that wins is the one holder; a row already there is taken over only when
   its lease lapsed (a conditional UPDATE that increments ``fence``), which is how a
   crashed or released attempt is resumed. Everyone else learns, without calling
   anything, that the submission is ``done`` (:class:`Claim` is None) or still being
   made by someone else (:class:`SubmissionInFlight`: the "being submitted" page).
2. **Call**, outside any transaction, and
3. **record each step's outcome** with :func:`advance` / :func:`finish`, in a
   transaction that first checks the fence (a holder that stalled past its lease and
   was taken over gets :class:`StaleSubmission` and writes nothing) and renews the
   lease.

A failure releases the claim (:func:`release`): a definite one (wrong state, refused
details) deletes the intent so the customer may submit again; a transient one (AP or
Razorpay unreachable) only ends the lease, so the next submission, or the sweeper
(:func:`sweep_submissions`, on beat), resumes it from its last committed step.

The steps of each kind live with the kind: deposits in anchor/deposits.py
(``deposit_submit``), withdrawals in payouts/withdrawals.py (``withdrawal_submit``),
which registers its resume hook here so anchor never imports payouts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from anchor.models import InteractiveSubmission

log = logging.getLogger(__name__)
Status = InteractiveSubmission.Status


class SubmissionInFlight(Exception):
    """Another request holds this submission's live claim: it is being made right now.
    Nothing was called; show the "being submitted" page, which refreshes itself."""


class StaleSubmission(SubmissionInFlight):
    """This holder's claim was taken over (it stalled past its lease): it stored
    nothing and must call nothing more."""


@dataclass
class Claim:
    """The live claim of a submission: ``fence`` is what every outcome write checks.
    ``resumed`` is True when an earlier attempt held it (it may have reached the
    providers: look before you create), ``step`` is the last step committed then."""

    submission: InteractiveSubmission
    fence: int
    resumed: bool

    @property
    def transaction_id(self) -> str:
        return self.submission.transaction_id

    @property
    def step(self) -> str:
        return self.submission.step


def now() -> datetime:
    return timezone.now()


def _lease_end() -> datetime:
    return now() + timedelta(seconds=settings.INTERACTIVE_SUBMIT_LEASE_S)


def claim(*, transaction_id: str, kind: str, amount_in: Decimal | None) -> Claim | None:
    """Claim the submission of ``transaction_id`` (``kind``: deposit | withdrawal;
    ``amount_in``: Decimal, INR for a deposit, USDC for a withdrawal; None when a sweep
    resumes the stored one). One commit, no outbound call.

    Returns the Claim (this caller is the one holder), or None when the submission is
    already done. Raises SubmissionInFlight while another holder's lease is live."""
    try:
        with transaction.atomic():
            row = InteractiveSubmission.objects.create(
                transaction_id=transaction_id, kind=kind, lease_until=_lease_end(),
                amount_in=amount_in if amount_in is not None else Decimal(0))
        return Claim(submission=row, fence=row.fence, resumed=False)
    except IntegrityError:
        pass
    row = InteractiveSubmission.objects.filter(transaction_id=transaction_id).first()
    if row is None:  # released (deleted) between our insert and this read: try once more
        return claim(transaction_id=transaction_id, kind=kind, amount_in=amount_in)
    if row.status == Status.DONE:
        return None
    if row.kind != kind:
        raise SubmissionInFlight(f"{transaction_id} is a {row.kind} submission")
    if row.lease_until > now():
        raise SubmissionInFlight(f"{transaction_id} is being submitted")
    taken = InteractiveSubmission.objects.filter(
        pk=row.pk, fence=row.fence, status=Status.IN_FLIGHT, lease_until__lte=now()
    ).update(fence=F("fence") + 1, lease_until=_lease_end(), attempts=F("attempts") + 1,
             updated_at=now())
    if taken != 1:
        raise SubmissionInFlight(f"{transaction_id} was taken over by another request")
    row.refresh_from_db()
    log.info("interactive submission resumed", extra={"step": row.step, "fence": row.fence,
                                                      "attempts": row.attempts})
    return Claim(submission=row, fence=row.fence, resumed=True)


def _fenced(c: Claim, **fields) -> None:
    """Inside the caller's transaction: check the fence, renew the lease, write
    ``fields``; the row stays locked until the caller commits, so no takeover can slip
    between this check and the caller's other writes. Raises StaleSubmission."""
    updated = InteractiveSubmission.objects.filter(
        pk=c.submission.pk, fence=c.fence, status=Status.IN_FLIGHT
    ).update(lease_until=_lease_end(), updated_at=now(), **fields)
    if updated != 1:
        raise StaleSubmission(f"{c.transaction_id}: the claim was taken over")
    for name, value in fields.items():
        setattr(c.submission, name, value)


def advance(c: Claim, step: str, *, also: Callable[[], object] | None = None, **fields):
    """Commit that ``step``'s intent or outcome is recorded (plus ``also()``'s writes,
    e.g. the DepositOrder row, in the same transaction). Returns ``also()``'s result.
    Raises StaleSubmission (nothing written)."""
    with transaction.atomic():
        _fenced(c, step=step, **fields)
        return also() if also is not None else None


def finish(c: Claim, *, also: Callable[[], object] | None = None):
    """Commit the submission ``done`` (with ``also()``'s writes). Raises StaleSubmission."""
    with transaction.atomic():
        _fenced(c, step="done", status=Status.DONE, last_error="")
        return also() if also is not None else None


def release(c: Claim, *, error: str, forget: bool) -> None:
    """End this holder's claim after a failure. ``forget``: the failure is definite and
    nothing was created that a retry must find (AP refused the state, the bank refused
    the details), so the intent is deleted and the customer may submit anew; else the
    lease ends now and the next submission or the sweeper resumes from ``step``.
    A stale claim releases nothing."""
    rows = InteractiveSubmission.objects.filter(pk=c.submission.pk, fence=c.fence,
                                                status=Status.IN_FLIGHT)
    if forget:
        rows.delete()
    else:
        rows.update(lease_until=now(), last_error=error[:2000], updated_at=now())


# --- the sweeper -------------------------------------------------------------------------

# kind -> resume(transaction_id) -> "completed" | "released" | "skipped"; registered by
# the module that owns the kind's steps.
RESUMERS: dict[str, Callable[[str], str]] = {}


def register_resumer(kind: str, resume: Callable[[str], str]) -> None:
    RESUMERS[kind] = resume


def sweep_submissions(*, limit: int = 100) -> dict[str, int]:
    """Beat: resume every in-flight submission whose lease lapsed more than
    ``INTERACTIVE_SUBMIT_SWEEP_AGE_S`` ago (its worker died, or gave up on an
    unreachable provider), with the same steps a new submission would take: the same
    Razorpay order (looked up by receipt), the same AP call. Cost grows with the stuck
    rows (partial index on in-flight). Returns {"completed": n, "released": n}."""
    import anchor.deposits  # noqa: F401 - registers the deposit resumer (payouts
    # registers the withdrawal one when its app is ready: anchor never imports payouts)
    counts = {"completed": 0, "released": 0}
    for row in stuck_submissions(limit=limit):
        resume = RESUMERS.get(row.kind)
        if resume is None:
            continue
        try:
            outcome = resume(row.transaction_id)
        except Exception as exc:  # noqa: BLE001 - one stuck row must not stop the sweep
            log.warning("submission %s not resumed yet: %s", row.transaction_id, exc)
            continue
        if outcome in counts:
            counts[outcome] += 1
    return counts


def stuck_submissions(*, limit: int = 100):
    """The sweep's query: in-flight submissions whose lease lapsed more than
    INTERACTIVE_SUBMIT_SWEEP_AGE_S ago, oldest lease first (``interactive_subm_open_idx``;
    corridor/periodic.py)."""
    cutoff = now() - timedelta(seconds=settings.INTERACTIVE_SUBMIT_SWEEP_AGE_S)
    return InteractiveSubmission.objects.filter(
        status=Status.IN_FLIGHT, lease_until__lt=cutoff).order_by("lease_until")[:limit]


def in_flight(transaction_id: str) -> InteractiveSubmission | None:
    """The submission of ``transaction_id`` still being made (live or lapsed lease),
    or None (none, or done). For the pages: a read, no claim."""
    return InteractiveSubmission.objects.filter(transaction_id=transaction_id,
                                                status=Status.IN_FLIGHT).first()


def is_live(row: InteractiveSubmission) -> bool:
    """True while ``row``'s holder may still be working on it (its lease is live)."""
    return row.lease_until > now()
