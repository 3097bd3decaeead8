"""``make bench``'s releases part, run small, still prints its result line.

The bench is not part of ``make test`` (its figures need a quiet machine), so a change
elsewhere can break it unseen: stop 24's ``make bench`` found the releases part failing
in its set-up since webhooks are applied by the worker's drain (anchor/inbox.py), not
by the web request. This runs the same part with 2 channels, 0.5 s ledgers and one
short round, and checks the line it exists to print; it asserts no figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_releases_bench_runs_small_and_prints_its_line(tmp_path):
    # Its own Redis database: the bench purges the broker and clears the channel keys,
    # which must not touch the Celery tests running beside it (pytest-xdist).
    broker = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:63799/0")
    env = {**os.environ, "BENCH_LOG_DIR": str(tmp_path),
           "CELERY_BROKER_URL": broker.rsplit("/", 1)[0] + "/7"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "bench.releases", "--rounds", "1", "--channels", "2",
         "--ledger-close", "0.5", "--steady", "2", "--wallets", "2", "--workers", "1",
         "--concurrency", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.match(r"releases: channels=2 ledger_close_s=0.5 "
                    r"releases_per_ledger_per_channel=[0-9.]+ cpu_ms_per_release=[0-9.]+ ",
                    last), last
