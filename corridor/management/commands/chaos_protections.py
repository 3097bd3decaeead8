"""``manage.py chaos_protections [--seeds N] [--only NAME ...] [--no-faults-seeds M]``:
seeds-to-failure of every protection ``manage.py chaos --protection-off`` can switch off.

For each switch in ``chaos.PROTECTIONS``, in sequence (one campaign at a time: a 2-core
machine runs one well), a campaign ``--protection-off NAME --until-violation --seeds N``
(``--seed`` the first seed, ``--cpu-burners`` passed on), then, with ``--no-faults-seeds
M`` > 0, the same switch with ``--no-faults --seeds M``, which must find nothing: a switch
removes a protection, it does not cause a violation by itself. Each campaign is a
separate ``manage.py chaos`` (its own fresh databases, its output kept in
``.devservices/chaos-logs/protection-<name>[-nofaults].out``). Prints one line per
campaign as it ends, then the table::

    switch                 seeds_to_failure  no_faults_violations  first_violation
    payout_guard           1                 0                     double payout: ...

``seeds_to_failure`` is the rank of the first seed with a violation (1 = the first seed
run), ``>N`` when none of N found one; ``first_violation`` is that seed's first
violation line, so a failure found for another reason shows as such. Exit 1 when a
switch was not found within N seeds or its no-fault run found something.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from django.core.management import BaseCommand

from corridor.management.commands.chaos import LOGS, PROTECTIONS
from corridor.management.commands.demo import ROOT

FIRST = re.compile(r"^chaos: first violation at seed=(\d+)$", re.MULTILINE)
LAST = re.compile(r"^chaos: seeds=(\d+) runs=\d+ .*violations=(\d+) ", re.MULTILINE)
DETAIL = re.compile(r"^chaos:   (.*)$", re.MULTILINE)


class Command(BaseCommand):
    help = "Seeds-to-failure of each protection switch of manage.py chaos."

    def add_arguments(self, parser):
        parser.add_argument("--seeds", type=int, default=5, help="seeds per switch, at most")
        parser.add_argument("--seed", type=int, default=1, help="first seed")
        parser.add_argument("--only", nargs="*", choices=PROTECTIONS, default=None)
        parser.add_argument("--no-faults-seeds", type=int, default=1,
                            help="seeds of the --no-faults run per switch (0: none)")
        parser.add_argument("--cpu-burners", type=int, default=0)

    def handle(self, *args, seeds, seed, only, no_faults_seeds, cpu_burners, **options):
        rows = []
        for name in only or PROTECTIONS:
            found, first = self._campaign(name, seed, seeds, cpu_burners, no_faults=False)
            no_faults = None
            if no_faults_seeds > 0:
                no_faults, _ = self._campaign(name, seed, no_faults_seeds, cpu_burners,
                                              no_faults=True)
            rows.append((name, found, no_faults, first))
        self.stdout.write(f"{'switch':<22} {'seeds_to_failure':<17} "
                          f"{'no_faults_violations':<21} first_violation")
        failed = False
        for name, found, no_faults, first in rows:
            shown = str(found) if isinstance(found, int) else found
            failed |= not isinstance(found, int) or bool(no_faults)
            self.stdout.write(f"{name:<22} {shown:<17} "
                              f"{'-' if no_faults is None else no_faults:<21} {first[:160]}")
        sys.exit(1 if failed else 0)

    def _campaign(self, name: str, seed: int, seeds: int, burners: int, *,
                  no_faults: bool) -> tuple[int | str, str]:
        """One ``manage.py chaos`` run; returns (seeds-to-failure or ``>N``, the first
        violation line) for a faulted run, (violations, "") for a no-fault one."""
        argv = [sys.executable, "manage.py", "chaos", "--protection-off", name,
                "--seed", str(seed), "--seeds", str(seeds), "--cpu-burners", str(burners)]
        argv += ["--no-faults"] if no_faults else ["--until-violation"]
        LOGS.mkdir(parents=True, exist_ok=True)
        out_path = LOGS / f"protection-{name}{'-nofaults' if no_faults else ''}.out"
        started = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        out_path.write_text(done.stdout + done.stderr)
        last = LAST.findall(done.stdout)
        violations = int(last[-1][1]) if last else -1
        self.stdout.write(f"chaos_protections: {name} {'no-faults ' if no_faults else ''}"
                          f"violations={violations} rc={done.returncode} "
                          f"elapsed_s={time.monotonic() - started:.0f} ({out_path})")
        self.stdout.flush()
        if no_faults:
            return violations, ""
        first = FIRST.search(done.stdout)
        detail = DETAIL.search(done.stdout)
        if first is None:
            return f">{seeds}", "" if last else f"no result (rc={done.returncode})"
        return int(first.group(1)) - seed + 1, detail.group(1) if detail else ""
