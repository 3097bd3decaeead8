"""``bench/saga.py``'s ``commits_per_release`` probe, run by pytest with the test suite's
fixtures (``-p tests.conftest``: the sandbox over real HTTP, Corridor's live server) on
the bench server (fsync=on), never collected by ``make test`` (testpaths = tests).

One paid deposit is brought to the outbox as ``tests/test_deposit_flow.py`` does; the
write commits of ``anchor.releases.release_start`` (claim, submit, mark, notify AP) are
counted by ``tests/dbcount.py`` and written to ``$BENCH_PROBE_OUT``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anchor import releases
from tests.dbcount import count_write_commits
from tests.flows import Wallet, paid_deposit

pytestmark = pytest.mark.django_db(transaction=True)


def test_commits_of_one_deposit_release(clean_sandbox):
    wallet = Wallet(clean_sandbox)
    transaction_id = paid_deposit(clean_sandbox, wallet)

    with count_write_commits() as counted:
        release = releases.release_start(transaction_id=transaction_id)

    assert release.tx_hash, release
    Path(os.environ["BENCH_PROBE_OUT"]).write_text(str(counted["commits"]))
