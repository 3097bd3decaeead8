"""``manage.py stranded``: what is owed with no owner now (corridor/stranded.py).

Prints one line per kind, ``<kind> count=<n> threshold_s=<seconds>``, then
``stranded: total=<n>``. ``--json`` prints ``{"counts": ..., "thresholds": ...}``
instead. Exit status 0 either way (``--fail`` exits 1 when anything is stranded)."""

import json

from django.core.management.base import BaseCommand, CommandError

from corridor.stranded import stranded_counts, stranded_thresholds


class Command(BaseCommand):
    help = "Print the stranded rows per kind (owed, no owner, past threshold)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="one JSON object")
        parser.add_argument("--fail", action="store_true",
                            help="exit 1 when anything is stranded")

    def handle(self, *args, **options):
        counts, thresholds = stranded_counts(), stranded_thresholds()
        if options["json"]:
            self.stdout.write(json.dumps({"counts": counts, "thresholds": thresholds}))
        else:
            for kind, count in counts.items():
                self.stdout.write(f"{kind} count={count} threshold_s={thresholds[kind]:g}")
            self.stdout.write(f"stranded: total={sum(counts.values())}")
        if options["fail"] and any(counts.values()):
            raise CommandError(f"stranded: {sum(counts.values())} rows owed with no owner")
