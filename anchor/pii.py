"""Personal data at rest: the customers' SEP-9 fields and their files (anchor/customers.py)
are stored only as Fernet tokens (``cryptography``: AES-128-CBC with PKCS7 padding and
an HMAC-SHA256 over version, timestamp, IV and ciphertext; a token that was altered or
made under another key does not decrypt).

Keys: ``settings.PII_KEYS`` (environment ``CORRIDOR_PII_KEYS``, comma-separated, each a
urlsafe-base64 32-byte Fernet key as ``manage.py pii_key`` prints). The first key
encrypts; every key decrypts, so a key is rotated by putting a new one first and, once
``manage.py pii_key --rotate`` re-encrypted every row, dropping the old one. Production
refuses to start without a key or with the development one (corridor/checks.py).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class PiiKeyError(Exception):
    """No usable key, or a token no configured key can open (altered, or made under a
    key that was dropped)."""


def new_key() -> str:
    """A fresh Fernet key (44 characters of urlsafe base64)."""
    return Fernet.generate_key().decode()


def valid_key(key: str) -> bool:
    try:
        Fernet(key.encode())
    except (ValueError, TypeError):
        return False
    return True


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise PiiKeyError("CORRIDOR_PII_KEYS is empty: personal data cannot be stored")
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except (ValueError, TypeError) as exc:
        raise PiiKeyError(f"CORRIDOR_PII_KEYS holds a key that is not a Fernet key: "
                          f"{exc}") from exc


def _current() -> MultiFernet:
    return _fernet(tuple(k.strip() for k in settings.PII_KEYS if k.strip()))


def seal(data: bytes) -> bytes:
    """``data`` encrypted under the first key. Raises PiiKeyError."""
    return _current().encrypt(data)


def unseal(token: bytes | memoryview) -> bytes:
    """The plaintext of a token made by ``seal`` under any configured key. Raises
    PiiKeyError."""
    try:
        return _current().decrypt(bytes(token))
    except InvalidToken as exc:
        raise PiiKeyError("a stored token does not open with any configured key") from exc


def seal_json(value: dict[str, Any]) -> bytes:
    return seal(json.dumps(value, ensure_ascii=False, sort_keys=True).encode())


def unseal_json(token: bytes | memoryview | None) -> dict[str, Any]:
    """{} for None (nothing stored, or erased)."""
    return {} if token is None else json.loads(unseal(token))


def rotated(token: bytes | memoryview) -> bytes:
    """The token re-encrypted under the first key (``MultiFernet.rotate``)."""
    try:
        return _current().rotate(bytes(token))
    except InvalidToken as exc:
        raise PiiKeyError("a stored token does not open with any configured key") from exc
