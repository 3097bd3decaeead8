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


def test_a_persons_reason_is_recognised_past_the_first_160_characters():
    """Chaos (20 loaded seeds, seeds 2-8): the hub return's "(commits lost)" review sits
    past character 160 of its reason, and the queue's counting key was cut there, so a
    person's item counted as a retry's in every seed after it opened."""
    hub_return = ("saga", invariants._mask(
        "ManualReviewError: 12.25 USDC from GA4MLWTHCWNC6YTJFE5QJBM4BBNMDEZVVXNWMZW3NCJSBBCM"
        "OSZMUZDH under memo CRGJ7GUJ2UJQ1QBAY (" + "cd" * 32 + ") arrived at the hub for "
        "no saga, and the hub has since paid that amount with no record of it (commits "
        "lost): " + "ef" * 32 + " to GB... memo 99; a person returns it or matches it"))

    assert invariants.retryable_reasons({hub_return: 1}) == {}
