"""The operators' admin with a TOTP second factor (django-otp; issue 9, part 4).

``install()`` (from ``CorridorConfig.ready()``) turns ``django.contrib.admin.site`` into
a ``CorridorAdminSite`` in place, as django-otp documents for ``OTPAdminSite``
(``admin.site.__class__ = OTPAdminSite``), so every ``ModelAdmin`` already registered
keeps working. With ``ADMIN_OTP_REQUIRED`` on (the default in production) the login page
asks for the 6-digit token of the operator's TOTP device (``manage.py otp_enroll``) and
only a session verified by that device reaches the admin; a staff user without a device
cannot log in. Off (development, tests that ``force_login``), it is Django's plain admin.
The setting is read at each request, so a test can switch it.

Wrong passwords count towards django-axes' lockout (settings ``AXES_*``); wrong tokens
are throttled per device by django-otp (``OTP_TOTP_THROTTLE_FACTOR``, doubling delays).
"""

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.sites import AdminSite
from django_otp.admin import OTPAdminAuthenticationForm, OTPAdminSite


class CorridorAdminSite(OTPAdminSite):
    """``OTPAdminSite`` when ``settings.ADMIN_OTP_REQUIRED``, else Django's ``AdminSite``;
    titled as Corridor's operations console, not "Django administration"."""

    site_header = "Corridor operations"
    site_title = "Corridor operations"
    index_title = "Review queue, releases, payouts, ledger and schedules"

    @property
    def login_form(self):
        return OTPAdminAuthenticationForm if settings.ADMIN_OTP_REQUIRED else None

    @property
    def login_template(self):
        return OTPAdminSite.login_template if settings.ADMIN_OTP_REQUIRED else None

    def has_permission(self, request) -> bool:
        if settings.ADMIN_OTP_REQUIRED:
            return super().has_permission(request)
        return AdminSite.has_permission(self, request)


def install() -> None:
    """Make the default admin site a ``CorridorAdminSite`` (idempotent)."""
    admin.site.__class__ = CorridorAdminSite
