import json

from django.core.management import BaseCommand

from anchor import reconciler


class Command(BaseCommand):
    help = "Run the deposit recovery passes once (what beat runs periodically)."

    def add_arguments(self, parser):
        parser.add_argument("--only", choices=["releases", "sweep", "orders", "expire"])

    def handle(self, *args, only=None, **options):
        passes = {
            "releases": reconciler.reconcile_releases,
            "sweep": reconciler.sweep_ap_deposits,
            "orders": reconciler.reconcile_orders,
            "expire": reconciler.expire_abandoned,
        }
        report = {name: fn() for name, fn in passes.items() if only in (None, name)}
        self.stdout.write(json.dumps(report, default=str))
