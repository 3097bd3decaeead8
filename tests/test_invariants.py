"""``corridor.invariants``: the campaign's checks that need no campaign to show they can
fail. The review queue may hold only reasons a person alone can resolve; the reasons the
lost-commit rebuilds (issue 25 §2) write are such reasons, a retryable one is not."""

from __future__ import annotations

from corridor import invariants


def test_the_lost_commit_reasons_are_a_persons_and_a_retryable_one_is_flagged():
    quote_and_receiver = ("withdrawal", invariants._mask(
        "rebuilt after a lost commit, not payable: its firm quote 4a1b-77 is not in "
        "Corridor; its receiver cus_a19 is not in Corridor: a person refunds its USDC"))
    saga = ("saga", invariants._mask(
        "ManualReviewError: the hub already paid this anchor 10.25 USDC since the saga "
        "started with no record of it (commits lost): " + "ab" * 32 + " memo 12; booked"))
    retryable = ("withdrawal", invariants._mask("AP unreachable: ReadTimeout"))

    assert invariants.retryable_reasons({quote_and_receiver: 1, saga: 1, retryable: 2}) \
        == {retryable: 2}
