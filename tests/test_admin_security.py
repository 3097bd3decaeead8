"""The admin's login (issue 9, part 4): lockout after wrong passwords (django-axes),
Django's password validators, a TOTP second factor for staff (django-otp), session
expiry, and ``manage.py otp_enroll``.

Everything goes through the real login page ``/admin/login/`` with Django's test client
and the real database; the TOTP tokens are computed with django-otp's own ``TOTP`` from
the device's key, as an authenticator app computes them."""

from __future__ import annotations

import base64
import io
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from axes.models import AccessAttempt
from django.contrib.admin.forms import AdminPasswordChangeForm
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.contrib.sessions.models import Session
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple 42"
LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture(autouse=True)
def _fast_hasher(settings):
    # PBKDF2's million rounds per login would make 30 attempts slow; the lockout and
    # the validators do not depend on the hasher.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff(db) -> User:
    return User.objects.create_user("olga", password=PASSWORD, is_staff=True)


def login(client, username="olga", password=PASSWORD, **extra):
    return client.post(LOGIN, {"username": username, "password": password,
                               "next": "/admin/", **extra})


def reaches_admin(client) -> bool:
    response = client.get("/admin/")
    if response.status_code == 200:
        return True
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    return False


def totp_token(device: TOTPDevice) -> str:
    """The device's current token, as an authenticator app shows it (RFC 6238)."""
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


# --- lockout ---------------------------------------------------------------------------

def test_thirty_wrong_passwords_then_the_right_one_is_refused(client, staff, settings):
    for _ in range(30):
        response = login(client, password="wrong password")
        assert response.status_code in (200, 429)
    response = login(client)

    assert response.status_code == 429  # locked out: the right password does not help
    assert not reaches_admin(client)
    assert "_auth_user_id" not in client.session
    assert settings.AXES_FAILURE_LIMIT == 5  # the default lock
    attempt = AccessAttempt.objects.get(username="olga")
    assert attempt.failures_since_start >= settings.AXES_FAILURE_LIMIT


def test_the_lock_is_a_setting(client, staff):
    with override_settings(AXES_FAILURE_LIMIT=31):
        for _ in range(30):
            assert login(client, password="wrong password").status_code == 200
        response = login(client)

    assert response.status_code == 302
    assert reaches_admin(client)
    # a success resets the counter (AXES_RESET_ON_SUCCESS)
    assert not AccessAttempt.objects.filter(username="olga").exists()


def test_the_lock_counts_per_client_ip_too(client, staff):
    User.objects.create_user("petra", password=PASSWORD, is_staff=True)
    for n in range(5):  # five different usernames, one wrong password each, one IP
        login(client, username=f"nobody{n}", password="wrong password")

    response = login(client, username="petra")

    assert response.status_code == 429
    assert not reaches_admin(client)


def test_the_cool_off_is_a_setting(client, staff, settings):
    for _ in range(30):
        login(client, password="wrong password")
    assert login(client).status_code == 429

    # given the failures are older than the cool-off (AXES_COOLOFF_TIME hours)
    hours = settings.AXES_COOLOFF_TIME
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - timedelta(hours=hours, minutes=1))
    with override_settings(AXES_COOLOFF_TIME=hours + 1):  # a longer cool-off still locks
        assert login(client).status_code == 429
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - timedelta(hours=hours, minutes=1))

    response = login(client)

    assert response.status_code == 302
    assert reaches_admin(client)


# --- password validators --------------------------------------------------------------

def test_a_one_character_password_is_refused_by_the_validators(staff):
    with pytest.raises(ValidationError) as refused:
        validate_password("x", staff)
    assert "password_too_short" in {e.code for e in refused.value.error_list}

    form = AdminPasswordChangeForm(staff, {"password1": "x", "password2": "x"})
    assert not form.is_valid()
    staff.refresh_from_db()
    assert staff.check_password(PASSWORD)  # unchanged
    validate_password("a long and unusual passphrase 7", staff)  # a good one passes


def test_the_admin_password_change_page_refuses_a_one_character_password(client, staff):
    admin = User.objects.create_superuser("root", password=PASSWORD)
    client.force_login(admin)

    response = client.post(f"/admin/auth/user/{staff.pk}/password/",
                           {"password1": "x", "password2": "x"})

    assert response.status_code == 200  # the form again, with the errors
    assert "This password is too short" in response.content.decode()
    staff.refresh_from_db()
    assert staff.check_password(PASSWORD) and not staff.check_password("x")


# --- the second factor ----------------------------------------------------------------

@override_settings(ADMIN_OTP_REQUIRED=True)
def test_with_otp_required_the_right_password_without_a_device_is_refused(client, staff):
    response = login(client)

    assert response.status_code == 200  # the login page again
    assert not reaches_admin(client)


@override_settings(ADMIN_OTP_REQUIRED=True)
def test_with_otp_required_a_valid_totp_token_is_needed(client, staff):
    device = TOTPDevice.objects.create(user=staff, name="phone", confirmed=True)

    # no token, or a wrong one: refused
    assert login(client).status_code == 200
    assert not reaches_admin(client)
    wrong = f"{(int(totp_token(device)) + 1) % 10**6:06d}"
    assert login(client, otp_device=device.persistent_id, otp_token=wrong).status_code == 200
    assert not reaches_admin(client)

    device.refresh_from_db()
    device.throttle_reset()  # django-otp delays the next try after a wrong token
    response = login(client, otp_device=device.persistent_id, otp_token=totp_token(device))

    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert reaches_admin(client)


@override_settings(ADMIN_OTP_REQUIRED=True)
def test_with_otp_required_a_password_only_session_does_not_reach_the_admin(client, staff):
    TOTPDevice.objects.create(user=staff, name="phone", confirmed=True)
    client.force_login(staff)  # authenticated, but never verified by a device

    assert not reaches_admin(client)


def test_without_otp_required_the_password_is_enough(client, staff):
    TOTPDevice.objects.create(user=staff, name="phone", confirmed=True)

    assert login(client).status_code == 302
    assert reaches_admin(client)


# --- sessions ----------------------------------------------------------------------------

@override_settings(SESSION_COOKIE_AGE=600)
def test_the_session_lasts_session_cookie_age(client, staff):
    response = login(client)

    cookie = response.cookies["sessionid"]
    assert cookie["max-age"] == 600
    assert client.session.get_expiry_age() == 600
    assert reaches_admin(client)

    # given the session's expiry has passed
    Session.objects.filter(session_key=client.session.session_key).update(
        expire_date=timezone.now() - timedelta(seconds=1))

    assert not reaches_admin(client)


@override_settings(SESSION_EXPIRE_AT_BROWSER_CLOSE=True, SESSION_COOKIE_AGE=600)
def test_the_session_can_end_when_the_browser_closes(client, staff):
    response = login(client)

    cookie = response.cookies["sessionid"]
    assert cookie["max-age"] == "" and cookie["expires"] == ""  # a browser-session cookie
    assert client.session.get_expire_at_browser_close()
    assert reaches_admin(client)


# --- enrolment ---------------------------------------------------------------------------

def _enrol(*args) -> str:
    out = io.StringIO()
    call_command("otp_enroll", *args, stdout=out)
    return out.getvalue().strip()


@override_settings(ADMIN_OTP_REQUIRED=True)
def test_otp_enroll_prints_the_provisioning_uri_that_logs_in(client, staff):
    uri = _enrol("olga")

    parts = urlsplit(uri)
    assert (parts.scheme, parts.netloc, parts.path) == ("otpauth", "totp", "/Corridor%3Aolga")
    query = parse_qs(parts.query)
    device = TOTPDevice.objects.get(user=staff)
    assert device.confirmed
    secret = query["secret"][0]
    assert base64.b32decode(secret + "=" * (-len(secret) % 8)) == device.bin_key
    assert query["issuer"] == ["Corridor"] and query["digits"] == ["6"]

    response = login(client, otp_device=device.persistent_id, otp_token=totp_token(device))

    assert response.status_code == 302
    assert reaches_admin(client)


def test_otp_enroll_refuses_a_second_device_unless_replace(staff):
    _enrol("olga")
    first = TOTPDevice.objects.get(user=staff)

    with pytest.raises(CommandError, match="already has a TOTP device"):
        _enrol("olga")
    assert list(TOTPDevice.objects.filter(user=staff)) == [first]

    _enrol("olga", "--replace")
    replaced = TOTPDevice.objects.get(user=staff)
    assert replaced.pk != first.pk and replaced.key != first.key


def test_otp_enroll_refuses_unknown_and_non_staff_users(db):
    User.objects.create_user("nina", password=PASSWORD)

    with pytest.raises(CommandError, match="no user"):
        _enrol("ghost")
    with pytest.raises(CommandError, match="not staff"):
        _enrol("nina")
    assert not TOTPDevice.objects.exists()


def test_the_console_is_titled_corridor_not_django(client):
    """The new-user trial's finding: the header and the tab said "Django administration"."""
    page = client.get(LOGIN).content.decode()
    assert "Corridor operations" in page and "Django administration" not in page
