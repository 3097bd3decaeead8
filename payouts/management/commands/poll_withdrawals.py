import json

from django.core.management import BaseCommand

from payouts import poller


class Command(BaseCommand):
    help = "Run the withdrawal poller once (what beat runs periodically)."

    def handle(self, *args, **options):
        self.stdout.write(json.dumps(poller.poll_withdrawals()))
