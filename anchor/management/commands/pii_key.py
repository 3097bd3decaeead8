"""``manage.py pii_key``: print a new Fernet key for CORRIDOR_PII_KEYS.
``manage.py pii_key --rotate``: re-encrypt every customer's personal data and files
under the first key of CORRIDOR_PII_KEYS (run after putting a new key first; then the
old key can be dropped). Prints how many rows it re-encrypted."""

from django.core.management.base import BaseCommand
from django.db import transaction

from anchor import pii
from anchor.models import Customer, CustomerFile


class Command(BaseCommand):
    help = "Print a new personal-data key, or re-encrypt under the first configured key."

    def add_arguments(self, parser):
        parser.add_argument("--rotate", action="store_true",
                            help="re-encrypt every stored token under the first key")

    def handle(self, *args, rotate: bool = False, **options):
        if not rotate:
            self.stdout.write(pii.new_key() + "\n")
            return
        customers = files = 0
        with transaction.atomic():
            for row in Customer.objects.select_for_update().exclude(data=None).only("data"):
                Customer.objects.filter(pk=row.pk).update(data=pii.rotated(row.data))
                customers += 1
            for row in CustomerFile.objects.select_for_update().only("data"):
                CustomerFile.objects.filter(pk=row.pk).update(data=pii.rotated(row.data))
                files += 1
        self.stdout.write(f"pii_key: re-encrypted customers={customers} files={files}\n")
