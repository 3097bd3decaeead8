"""SEP-24 interactive entry: token check and the session (AP NOTES §4.2-4.3).

The token is HS256 with AP's interactive secret (``secret.sep24.interactive_url.
jwt_secret``), carries ``jti`` = the transaction id and ``exp`` (600 s by default), and
can be replayed until then, so it only opens a session bound to that transaction, with
the scope of the link it came from (below)."""

from __future__ import annotations

import jwt
from django.conf import settings
from django.core import checks

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


# What a verified token lets its session open, per transaction. The interactive URL
# (the wallet starting the flow) opens the forms and the status page; AP's
# more_info_url (the status link, which wallets show and users share) opens the status
# page only, so whoever holds it cannot submit a form or set the payout account.
SCOPE_INTERACTIVE = "interactive"
SCOPE_MORE_INFO = "more_info"
_RANK = {SCOPE_MORE_INFO: 1, SCOPE_INTERACTIVE: 2}


@checks.register(checks.Tags.security)
def check_token_secrets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """The two links are told apart only by their secrets (AP NOTES §2.3: a different
    secret for each of AP's secrets): with one secret a status link would open the
    forms."""
    if settings.AP_INTERACTIVE_JWT_SECRET == settings.AP_MORE_INFO_JWT_SECRET:
        return [checks.Error(
            "AP_INTERACTIVE_JWT_SECRET and AP_MORE_INFO_JWT_SECRET are the same: a "
            "more_info_url (status link) token would open the SEP-24 forms.",
            hint="Give AP's secret.sep24.interactive_url.jwt_secret and "
                 "secret.sep24.more_info_url.jwt_secret different values.",
            id="anchor.E001")]
    return []


def open_session(request, claims: dict, scope: str) -> None:
    """Remember in the session that ``claims["jti"]`` may be opened with ``scope``
    (``SCOPE_INTERACTIVE`` or ``SCOPE_MORE_INFO``). A session keeps the widest scope it
    was given for a transaction: opening the status link after the interactive URL does
    not take the forms away. Session shape: ``{"scopes": {transaction_id: scope},
    "sub": account, "subs": {transaction_id: account}, "checkout_paid":
    {transaction_id: order_id}}``."""
    if scope not in _RANK:
        raise ValueError(f"unknown SEP-24 scope {scope!r}")
    data = dict(request.session.get(SESSION_KEY, {}))
    scopes = dict(data.get("scopes", {}))
    transaction_id = claims["jti"]
    if _RANK.get(scopes.get(transaction_id), 0) < _RANK[scope]:
        scopes[transaction_id] = scope
    subs = {**data.get("subs", {}), transaction_id: claims.get("sub") or ""}
    request.session[SESSION_KEY] = {**data, "scopes": scopes, "sub": claims.get("sub"),
                                    "subs": subs}


def session_sub(request, transaction_id: str) -> str:
    """The SEP-10 subject (``G...`` or ``G...:memo``) of the token that opened
    ``transaction_id`` in this session ("" if none): whose limits and KYC apply."""
    return request.session.get(SESSION_KEY, {}).get("subs", {}).get(transaction_id, "")


def session_scope(request, transaction_id: str) -> str | None:
    """The scope this session holds for ``transaction_id``, or None."""
    return request.session.get(SESSION_KEY, {}).get("scopes", {}).get(transaction_id)


def session_allows(request, transaction_id: str, scope: str = SCOPE_INTERACTIVE) -> bool:
    """True when the session may open ``transaction_id``'s pages that need ``scope``:
    the forms need ``SCOPE_INTERACTIVE``, the status page ``SCOPE_MORE_INFO`` (which an
    interactive session also has)."""
    return _RANK.get(session_scope(request, transaction_id) or "", 0) >= _RANK[scope]


def note_checkout_paid(request, transaction_id: str, order_id: str) -> None:
    """Remember that this session came back from Razorpay Checkout with a valid success
    signature for ``order_id`` (anchor.razorpay.verify_checkout_signature): its pages
    stop offering to pay, although no payment is recorded until the webhook comes."""
    data = dict(request.session.get(SESSION_KEY, {}))
    data["checkout_paid"] = {**data.get("checkout_paid", {}), transaction_id: order_id}
    request.session[SESSION_KEY] = data


def checkout_paid(request, transaction_id: str) -> str | None:
    """The order id this session paid at Checkout for ``transaction_id``, or None."""
    return request.session.get(SESSION_KEY, {}).get("checkout_paid", {}).get(transaction_id)


def note_checkout_failed(request, transaction_id: str) -> None:
    """Remember, for the next status page only, that Checkout came back with a failed
    attempt (``error[...]`` in its return: nothing was captured, NOTES §1.6)."""
    data = dict(request.session.get(SESSION_KEY, {}))
    data["checkout_failed"] = sorted({*data.get("checkout_failed", []), transaction_id})
    request.session[SESSION_KEY] = data


def take_checkout_failed(request, transaction_id: str) -> bool:
    """Whether Checkout's last return for ``transaction_id`` was a failure; forgets it."""
    data = dict(request.session.get(SESSION_KEY, {}))
    failed = data.get("checkout_failed", [])
    if transaction_id not in failed:
        return False
    data["checkout_failed"] = [t for t in failed if t != transaction_id]
    request.session[SESSION_KEY] = data
    return True
