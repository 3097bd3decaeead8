"""SEP-24 interactive entry: token check and the session (AP NOTES §4.2-4.3).

The token is HS256 with AP's interactive secret (``secret.sep24.interactive_url.
jwt_secret``), carries ``jti`` = the transaction id and ``exp`` (600 s by default), and
can be replayed until then, so it only opens a session bound to that transaction."""

from __future__ import annotations

import jwt
from django.conf import settings

SESSION_KEY = "sep24"


class TokenError(Exception):
    """The interactive URL's token is missing, forged, expired or for another
    transaction."""


def verify_interactive_token(token: str, transaction_id: str) -> dict:
    """Return the claims, or raise TokenError with the reason."""
    return _verify(token, transaction_id, settings.AP_INTERACTIVE_JWT_SECRET)


def verify_more_info_token(token: str, transaction_id: str) -> dict:
    """The more_info_url token: same claims, AP's more-info secret (NOTES §4.2)."""
    return _verify(token, transaction_id, settings.AP_MORE_INFO_JWT_SECRET)


def _verify(token: str, transaction_id: str, secret: str) -> dict:
    if not token or not transaction_id:
        raise TokenError("missing transaction_id or token")
    try:
        claims = jwt.decode(token, secret, algorithms=["HS256"],
                            leeway=settings.AP_JWT_LEEWAY_S,
                            options={"require": ["exp", "jti"], "verify_aud": False})
    except jwt.ExpiredSignatureError:
        raise TokenError("this link has expired")
    except jwt.InvalidSignatureError:
        raise TokenError("the link was not signed by the anchor")
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(f"the link's token has no {exc.claim}")
    except jwt.PyJWTError:
        raise TokenError("the link's token is not valid")
    if claims.get("jti") != transaction_id:
        raise TokenError("token is for another transaction")
    return claims


def open_session(request, claims: dict) -> None:
    allowed = set(request.session.get(SESSION_KEY, {}).get("transactions", []))
    allowed.add(claims["jti"])
    request.session[SESSION_KEY] = {"transactions": sorted(allowed), "sub": claims.get("sub")}


def session_allows(request, transaction_id: str) -> bool:
    return transaction_id in request.session.get(SESSION_KEY, {}).get("transactions", [])
