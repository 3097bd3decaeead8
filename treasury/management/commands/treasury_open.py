"""``manage.py treasury_open``: open the books from what the outside holds, once:
the distribution account's opening USDC (Horizon) and the RazorpayX account's opening
balance (``banking_balances``) (treasury/reconcile.py ``open_distribution``,
``open_razorpayx``). ``make run``, ``make demo`` and ``make chaos`` run it before money
moves."""

from django.core.management.base import BaseCommand

from treasury.reconcile import open_distribution, open_razorpayx


class Command(BaseCommand):
    help = "Book the distribution account's opening USDC and RazorpayX's opening INR (once)."

    def handle(self, *args, **options):
        usdc = open_distribution(operator="treasury_open")
        inr = open_razorpayx(operator="treasury_open")
        if not usdc and not inr:
            self.stdout.write("treasury_open: already booked (nothing to do)")
            return
        self.stdout.write(f"treasury_open: booked {usdc} USDC on stellar:distribution, "
                          f"{inr} INR on razorpayx:current")
