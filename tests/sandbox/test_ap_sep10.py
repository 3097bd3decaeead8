"""The AP stand-in's wallet-facing surface (issue 14; sandbox/ap/sep10.py): SEP-1's
stellar.toml, SEP-10 challenges and tokens with every refusal SEP-10 names, SEP-24
``/info`` and ``/transactions``, CORS. Over real HTTP against the sandbox; challenges
are read and signed with stellar-sdk, as a wallet would."""

from __future__ import annotations

import time
import tomllib
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from stellar_sdk import Keypair, TransactionEnvelope
from stellar_sdk.sep.stellar_web_authentication import build_challenge_transaction

from sandbox.ap import sep10
from tests.flows import Wallet

pytestmark = pytest.mark.django_db(transaction=True)


def home(sandbox) -> str:
    return urlsplit(sandbox.url).netloc


def challenge(sandbox, account: str, **params) -> httpx.Response:
    return httpx.get(f"{sandbox.url}/ap/sep/auth", params={"account": account, **params},
                     timeout=10)


def signed(xdr: str, *signers: Keypair, passphrase: str | None = None) -> str:
    envelope = TransactionEnvelope.from_xdr(
        xdr, passphrase or settings.STELLAR_NETWORK_PASSPHRASE)
    for keypair in signers:
        envelope.sign(keypair)
    return envelope.to_xdr()


def token(sandbox, xdr: str) -> httpx.Response:
    return httpx.post(f"{sandbox.url}/ap/sep/auth", json={"transaction": xdr}, timeout=10)


def test_stellar_toml_names_this_host_its_signing_key_and_usdc(sandbox):
    response = httpx.get(f"{sandbox.url}/.well-known/stellar.toml", timeout=10)

    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    toml = tomllib.loads(response.text)
    assert toml["NETWORK_PASSPHRASE"] == settings.STELLAR_NETWORK_PASSPHRASE
    assert toml["SIGNING_KEY"] == sep10.SIGNING_KEY.public_key
    assert toml["WEB_AUTH_ENDPOINT"] == f"{sandbox.url}/ap/sep/auth"
    assert toml["TRANSFER_SERVER_SEP0024"] == f"{sandbox.url}/ap/sep"
    assert toml["DOCUMENTATION"]["ORG_NAME"]
    assert len(toml["CURRENCIES"]) == 1
    assert (toml["CURRENCIES"][0]["code"], toml["CURRENCIES"][0]["issuer"]) == (
        settings.STELLAR_USDC_CODE, settings.STELLAR_USDC_ISSUER)


def test_a_challenge_is_built_as_sep10_says(sandbox):
    client = Keypair.random()

    reply = challenge(sandbox, client.public_key)

    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["network_passphrase"] == settings.STELLAR_NETWORK_PASSPHRASE
    tx = TransactionEnvelope.from_xdr(body["transaction"],
                                      settings.STELLAR_NETWORK_PASSPHRASE).transaction
    assert tx.source.account_id == sep10.SIGNING_KEY.public_key and tx.sequence == 0
    bounds = tx.preconditions.time_bounds
    assert 0 < bounds.min_time <= time.time() < bounds.max_time <= time.time() + 901
    first, second = tx.operations
    assert first.data_name == f"{home(sandbox)} auth"
    assert first.source.account_id == client.public_key and len(first.data_value) == 64
    assert (second.data_name, second.data_value) == (
        "web_auth_domain", urlsplit(sandbox.url).hostname.encode())


def test_a_fresh_account_signs_with_its_master_key_and_gets_a_token_once(sandbox):
    import jwt

    client = Keypair.random()
    xdr = signed(challenge(sandbox, client.public_key).json()["transaction"], client)

    first = token(sandbox, xdr)
    again = token(sandbox, xdr)

    assert first.status_code == 200, first.text
    claims = jwt.decode(first.json()["token"], options={"verify_signature": False})
    assert claims["sub"] == client.public_key
    assert claims["iss"] == f"{sandbox.url}/ap/sep/auth"
    assert claims["exp"] - claims["iat"] == 86400 and claims["jti"]
    assert claims["home_domain"] == home(sandbox)
    assert again.status_code == 400 and "already used" in again.json()["error"]


def test_an_existing_account_is_verified_against_its_signers_on_the_ledger(sandbox):
    wallet = Wallet(sandbox, trust=False)
    stranger = Keypair.random()
    xdr = challenge(sandbox, wallet.address).json()["transaction"]

    wrong = token(sandbox, signed(xdr, stranger))
    right = token(sandbox, signed(xdr, wallet.keypair))

    assert wrong.status_code == 400 and "error" in wrong.json()
    assert right.status_code == 200, right.text


def test_a_token_opens_the_sep24_endpoints(sandbox):
    client = Keypair.random()
    value = token(sandbox, signed(challenge(sandbox, client.public_key).json()["transaction"],
                                  client)).json()["token"]

    listed = httpx.get(f"{sandbox.url}/ap/sep/transactions", params={"asset_code": "USDC"},
                       headers={"Authorization": f"Bearer {value}"}, timeout=10)

    assert listed.status_code == 200 and listed.json() == {"transactions": []}


@pytest.mark.parametrize("case", ["unsigned", "expired", "wrong_network", "foreign_server",
                                  "re_signed_by_another", "garbage", "truncated", "nul",
                                  "missing"])
def test_every_bad_challenge_is_refused_with_sep10s_error_shape(sandbox, case):
    client = Keypair.random()
    xdr = challenge(sandbox, client.public_key).json()["transaction"]
    if case == "unsigned":
        body = {"transaction": xdr}
    elif case == "expired":
        stale = build_challenge_transaction(
            server_secret=sep10.SIGNING_KEY.secret, client_account_id=client.public_key,
            home_domain=home(sandbox), web_auth_domain=urlsplit(sandbox.url).hostname,
            network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE, timeout=1)
        time.sleep(2)
        body = {"transaction": signed(stale, client)}
    elif case == "wrong_network":
        other = build_challenge_transaction(
            server_secret=sep10.SIGNING_KEY.secret, client_account_id=client.public_key,
            home_domain=home(sandbox), web_auth_domain=urlsplit(sandbox.url).hostname,
            network_passphrase="Public Global Stellar Network ; September 2015")
        body = {"transaction": signed(other, client,
                                      passphrase="Public Global Stellar Network ; September "
                                                 "2015")}
    elif case == "foreign_server":
        forged = build_challenge_transaction(
            server_secret=Keypair.random().secret, client_account_id=client.public_key,
            home_domain=home(sandbox), web_auth_domain=urlsplit(sandbox.url).hostname,
            network_passphrase=settings.STELLAR_NETWORK_PASSPHRASE)
        body = {"transaction": signed(forged, client)}
    elif case == "re_signed_by_another":
        body = {"transaction": signed(xdr, Keypair.random())}
    elif case == "garbage":
        body = {"transaction": "AAAA-not-xdr"}
    elif case == "truncated":  # valid base64, too short an XDR: was a 500 (EOFError)
        body = {"transaction": "AAAAAgAAAA=="}
    elif case == "nul":
        body = {"transaction": "\u0000"}
    else:
        body = {}

    reply = httpx.post(f"{sandbox.url}/ap/sep/auth", json=body, timeout=10)

    assert reply.status_code == 400, reply.text
    assert set(reply.json()) == {"error"} and reply.json()["error"]


@pytest.mark.parametrize("params, says", [
    ({"account": "GNOTANACCOUNT"}, "invalid 'account'"),
    ({"home_domain": "evil.example"}, "invalid 'home_domain'"),
    ({"client_domain": "wallet.example"}, "client_domain"),
    ({"memo": "not-a-number"}, "invalid 'memo'"),
])
def test_a_bad_challenge_request_is_refused(sandbox, params, says):
    reply = challenge(sandbox, params.pop("account", Keypair.random().public_key), **params)

    assert reply.status_code == 400 and says in reply.json()["error"]


def test_sep24_info_transactions_filters_and_cors(sandbox):
    wallet = Wallet(sandbox)
    first, _ = wallet.start_deposit()
    second, _ = wallet.start_withdrawal()
    value = sandbox.http.post("/ap/sep/sandbox-token", json={"account": wallet.address}
                              ).json()["token"]
    auth = {"Authorization": f"Bearer {value}"}

    info = httpx.get(f"{sandbox.url}/ap/sep/info", timeout=10).json()
    both = httpx.get(f"{sandbox.url}/ap/sep/transactions", params={"asset_code": "USDC"},
                     headers=auth, timeout=10).json()["transactions"]
    deposits = httpx.get(f"{sandbox.url}/ap/sep/transactions",
                         params={"asset_code": "USDC", "kind": "deposit"}, headers=auth,
                         timeout=10).json()["transactions"]
    older = httpx.get(f"{sandbox.url}/ap/sep/transactions",
                      params={"asset_code": "USDC", "paging_id": second}, headers=auth,
                      timeout=10).json()["transactions"]
    one = httpx.get(f"{sandbox.url}/ap/sep/transactions",
                    params={"asset_code": "USDC", "limit": 1}, headers=auth,
                    timeout=10).json()["transactions"]
    no_asset = httpx.get(f"{sandbox.url}/ap/sep/transactions", headers=auth, timeout=10)
    no_token = httpx.get(f"{sandbox.url}/ap/sep/transactions", params={"asset_code": "USDC"},
                         timeout=10)
    preflight = httpx.options(f"{sandbox.url}/ap/sep/transactions", timeout=10)

    assert info["deposit"]["USDC"]["enabled"] and info["withdraw"]["USDC"]["enabled"]
    assert info["fee"] == {"enabled": False} and "features" in info
    assert [t["id"] for t in both] == [second, first]  # newest first
    assert [t["id"] for t in deposits] == [first] and [t["id"] for t in older] == [first]
    assert [t["id"] for t in one] == [second]
    # fee_details as AP carries it: present once a fee is set, with amount_fee
    assert all(("fee_details" in t) == ("amount_fee" in t) for t in both)
    assert no_asset.status_code == 400 and "error" in no_asset.json()
    assert no_token.status_code == 403 and no_token.json() == {"error": "forbidden"}
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
