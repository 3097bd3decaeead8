"""``manage.py otp_enroll USERNAME [--replace]``: give a staff user a confirmed TOTP device
(django-otp) and print its ``otpauth://`` provisioning URI once, to scan into an
authenticator app (RFC 6238, 30 s steps, 6 digits, SHA-1, issuer ``OTP_TOTP_ISSUER``).

Refuses a user who is not staff, and one who already has a TOTP device unless
``--replace`` (which deletes the old devices: lost phone, rotation)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice


class Command(BaseCommand):
    help = "Enrol a staff user's TOTP device and print its otpauth:// URI once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--replace", action="store_true",
                            help="delete the user's existing TOTP devices first")
        parser.add_argument("--name", default="authenticator", help="the device's name")

    def handle(self, *args, username: str, replace: bool, name: str, **options):
        user_model = get_user_model()
        try:
            user = user_model.objects.get(**{user_model.USERNAME_FIELD: username})
        except user_model.DoesNotExist:
            raise CommandError(f"no user {username!r}")
        if not user.is_staff:
            raise CommandError(f"{username!r} is not staff: the admin would refuse it anyway")
        with transaction.atomic():
            existing = TOTPDevice.objects.devices_for_user(user, confirmed=None)
            if existing.exists() and not replace:
                raise CommandError(f"{username!r} already has a TOTP device; "
                                   "pass --replace to replace it")
            existing.delete()
            device = TOTPDevice.objects.create(user=user, name=name, confirmed=True)
        self.stdout.write(device.config_url)
