from django.core.management import BaseCommand

from anchor import deposits, releases
from anchor.models import DepositRelease


class Command(BaseCommand):
    help = ("Drive one deposit: notify AP of its recorded payment if needed and start its "
            "release, or re-drive an existing release (chain check first).")

    def add_arguments(self, parser):
        parser.add_argument("transaction_id")

    def handle(self, *args, transaction_id, **options):
        release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
        if release is None:
            deposits.funds_received(transaction_id=transaction_id)
        else:
            releases.release_drive(release_id=release.pk, redrive=True)
        release = DepositRelease.objects.filter(transaction_id=transaction_id).first()
        self.stdout.write(f"{transaction_id}: {release.status if release else 'no release'}")
