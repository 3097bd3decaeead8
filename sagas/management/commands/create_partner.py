from django.core.management import BaseCommand, CommandError
from django.core.validators import validate_slug
from django.db import IntegrityError
from stellar_sdk import StrKey

from sagas import remittances


class Command(BaseCommand):
    help = ("Create a remittance partner and print its API key (shown once; Corridor keeps "
            "only its hash). --account: the partner's Stellar account (G...), where its "
            "USDC comes from and where refunds go.")

    def add_arguments(self, parser):
        parser.add_argument("name", help="a slug: letters, digits, - and _")
        parser.add_argument("--account", required=True)

    def handle(self, *args, name, account, **options):
        try:
            validate_slug(name)
        except Exception as exc:
            raise CommandError(f"NAME must be a slug: {exc}")
        if not StrKey.is_valid_ed25519_public_key(account):
            raise CommandError("--account must be a G... Stellar account")
        try:
            partner, key = remittances.partner_create(name=name, stellar_account=account)
        except IntegrityError:
            raise CommandError(f"partner {name} exists")
        self.stdout.write(f"partner {partner.name} (id {partner.pk}) API key: {key}")
