"""``manage.py treasury_open``: book the distribution account's opening USDC once (what
it held before Corridor's books started; treasury/reconcile.py ``open_distribution``)."""

from django.core.management.base import BaseCommand

from treasury.reconcile import open_distribution


class Command(BaseCommand):
    help = "Book the distribution account's opening USDC (once)."

    def handle(self, *args, **options):
        amount = open_distribution(operator="treasury_open")
        self.stdout.write(f"treasury_open: booked {amount} USDC" if amount else
                          "treasury_open: already booked (nothing to do)")
