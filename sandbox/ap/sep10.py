"""SEP-10 web authentication and SEP-1 ``stellar.toml`` of the AP stand-in, as AP 4.x
serves them (issue 14; SEP-10 v3.4, SEP-1 v2.7), built with stellar-sdk's own SEP-10
helpers (``stellar_sdk.sep.stellar_web_authentication``).

- ``GET /ap/sep/auth?account=[&home_domain=][&client_domain=][&memo=]``: a challenge
  ``{"transaction": <XDR>, "network_passphrase"}``: source = SIGNING_KEY, sequence 0,
  time bounds now .. now + CHALLENGE_TIMEOUT_S, first operation ``"<home domain>
  auth"`` (a ManageData with the client as source and a 48-byte random value, base64),
  then ``web_auth_domain`` (the host without its port). The home domain is the host and
  port the wallet reached the sandbox on (tests start it on random ports); another one
  is refused. ``client_domain`` (client attribution) is refused: the sandbox does not
  fetch the wallet's stellar.toml.
- ``POST /ap/sep/auth {"transaction"}``: verified with ``read_challenge_transaction``
  (signed by us, our network, our home and web-auth domain, inside its time bounds) and
  the client's signatures: against the account's signers on the sandbox ledger with its
  medium threshold (``verify_challenge_transaction_threshold``), or, for an account that
  does not exist yet, its master key (``..._signed_by_client_master_key``). A challenge
  is accepted once (its hash, remembered in this process until it expires). Answers
  ``{"token"}``: a JWT (HS256, the sandbox's SEP-10 secret, so every SEP endpoint reads
  it) with AP's claims ``iss`` (the WEB_AUTH_ENDPOINT), ``sub`` (the account, or
  ``account:memo``), ``iat``, ``exp`` (+24 h), ``jti`` (the challenge's hash),
  ``home_domain``.
- Refusals: 400 ``{"error": "..."}`` (SEP-10: "400 Bad Request ... error"), for a bad
  account or memo, a foreign home domain, an expired, replayed, re-signed, wrong-network
  or unsigned challenge.

The drivers' shortcut that is not SEP-10 lives at ``POST /ap/sep/sandbox-token``
(sandbox/ap/sep.py ``issue_token``).
"""

from __future__ import annotations

import threading
import time

import jwt
from django.conf import settings
from stellar_sdk import MuxedAccount, StrKey
from stellar_sdk.exceptions import SdkError
from stellar_sdk.sep import stellar_web_authentication as web_auth
from stellar_sdk.sep.ed25519_public_key_signer import Ed25519PublicKeySigner
from stellar_sdk.sep.exceptions import InvalidSep10ChallengeError

from sandbox import keys
from sandbox.ap.sep import SEP10_LIFETIME_S, SepError, _id_memo_ok, _sep10_secret

SIGNING_KEY = keys.sandbox_keypair("ap-sep10-signing")
CHALLENGE_TIMEOUT_S = 900  # AP's default sep10.auth_timeout
_used: dict[str, float] = {}  # challenge hash -> when it may be forgotten
_used_lock = threading.Lock()


def home_domain(request) -> str:
    """``host:port`` the wallet reached us on (what its stellar.toml lookup used)."""
    return request.get_host()


def web_auth_domain(request) -> str:
    return request.get_host().rsplit(":", 1)[0]


def endpoint(request) -> str:
    return f"{request.scheme}://{request.get_host()}/ap/sep/auth"


def challenge(request, *, account: str | None, home: str | None, client_domain: str | None,
              memo: str | None) -> dict:
    """The challenge for ``account``. Raises SepError 400."""
    if not account or not (StrKey.is_valid_ed25519_public_key(account)
                           or StrKey.is_valid_med25519_public_key(account)):
        raise SepError(400, "invalid 'account'")
    ours = home_domain(request)
    if home and home != ours:
        raise SepError(400, f"invalid 'home_domain': this server is {ours}")
    if client_domain:
        raise SepError(400, "'client_domain' is not supported by the sandbox")
    if memo is not None:
        if StrKey.is_valid_med25519_public_key(account):
            raise SepError(400, "'memo' cannot be used with a muxed account")
        if not _id_memo_ok(str(memo)):
            raise SepError(400, "invalid 'memo': expected a 64-bit unsigned integer")
    xdr = web_auth.build_challenge_transaction(
        server_secret=SIGNING_KEY.secret, client_account_id=account, home_domain=ours,
        web_auth_domain=web_auth_domain(request),
        network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE, timeout=CHALLENGE_TIMEOUT_S,
        memo=int(memo) if memo is not None else None)
    return {"transaction": xdr, "network_passphrase": settings.STELLAR_NETWORK_PASSPHRASE}


def _signers(account: str) -> tuple[list[Ed25519PublicKeySigner], int] | None:
    """The account's signers and medium threshold on the sandbox ledger (None: no such
    account). The sandbox ledger models the master key only."""
    from sandbox.horizon.models import Account

    row = Account.objects.using("sandbox").filter(account_id=account).first()
    if row is None:
        return None
    signers = [Ed25519PublicKeySigner(account, row.master_weight)] if row.master_weight else []
    return signers, row.med_threshold


def _remember(tx_hash: str, until: float) -> None:
    now = time.time()
    with _used_lock:
        for key in [k for k, expiry in _used.items() if expiry < now]:
            del _used[key]
        if tx_hash in _used:
            raise SepError(400, "the challenge was already used")
        _used[tx_hash] = until


def token(request, xdr: str | None) -> dict:
    """Verify a signed challenge; returns ``{"token"}``. Raises SepError 400."""
    if not xdr or not isinstance(xdr, str):
        raise SepError(400, "'transaction' is required")
    passphrase = settings.STELLAR_NETWORK_PASSPHRASE
    try:
        read = web_auth.read_challenge_transaction(
            challenge_transaction=xdr, server_account_id=SIGNING_KEY.public_key,
            home_domains=home_domain(request), web_auth_domain=web_auth_domain(request),
            network_passphrase=passphrase)
        account = read.client_account_id
        found = _signers(MuxedAccount.from_account(account).account_id)
        if found is None:
            web_auth.verify_challenge_transaction_signed_by_client_master_key(
                challenge_transaction=xdr, server_account_id=SIGNING_KEY.public_key,
                home_domains=home_domain(request), web_auth_domain=web_auth_domain(request),
                network_passphrase=passphrase)
        else:
            signers, threshold = found
            web_auth.verify_challenge_transaction_threshold(
                challenge_transaction=xdr, server_account_id=SIGNING_KEY.public_key,
                home_domains=home_domain(request), web_auth_domain=web_auth_domain(request),
                network_passphrase=passphrase, threshold=threshold, signers=signers)
    except (InvalidSep10ChallengeError, SdkError, ValueError, EOFError) as exc:
        raise SepError(400, f"invalid challenge: {exc}") from None
    envelope = read.transaction
    tx_hash = envelope.hash_hex()
    bounds = envelope.transaction.preconditions.time_bounds
    _remember(tx_hash, float(bounds.max_time) if bounds else time.time() + CHALLENGE_TIMEOUT_S)
    issued = int(time.time())
    memo = read.memo
    claims = {"iss": endpoint(request), "sub": f"{account}:{memo}" if memo else account,
              "iat": issued, "exp": issued + SEP10_LIFETIME_S, "jti": tx_hash,
              "home_domain": read.matched_home_domain}
    return {"token": jwt.encode(claims, _sep10_secret(), algorithm="HS256")}


def stellar_toml(request) -> str:
    """SEP-1 ``stellar.toml`` for the host the request came in on."""
    base = f"{request.scheme}://{request.get_host()}"
    return "\n".join([
        f'NETWORK_PASSPHRASE = "{settings.STELLAR_NETWORK_PASSPHRASE}"',
        f'SIGNING_KEY = "{SIGNING_KEY.public_key}"',
        f'WEB_AUTH_ENDPOINT = "{base}/ap/sep/auth"',
        f'TRANSFER_SERVER_SEP0024 = "{base}/ap/sep"',
        f'KYC_SERVER = "{base}/ap/sep/sep12"',
        f'DIRECT_PAYMENT_SERVER = "{base}/ap/sep/sep31"',
        f'ANCHOR_QUOTE_SERVER = "{base}/ap/sep/sep38"',
        f'HORIZON_URL = "{base}/horizon"',
        "",
        "[DOCUMENTATION]",
        'ORG_NAME = "Corridor sandbox"',
        f'ORG_URL = "{base}"',
        'ORG_DESCRIPTION = "A local stand-in of the Anchor Platform, Horizon and Razorpay '
        'for Corridor; holds nothing real."',
        "",
        "[[CURRENCIES]]",
        f'code = "{settings.STELLAR_USDC_CODE}"',
        f'issuer = "{settings.STELLAR_USDC_ISSUER}"',
        'status = "test"',
        "is_asset_anchored = true",
        'anchor_asset_type = "fiat"',
        'anchor_asset = "USD"',
        "display_decimals = 2",
        'desc = "Sandbox USDC"',
        "",
    ])
