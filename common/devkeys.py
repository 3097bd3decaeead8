"""Every Stellar secret seed anyone can derive from this repository, derived in one
place (issue 25 §4: "production refuses every key anyone can derive from this
repository; the list comes from the sandbox's own derivation").

The sandbox derives its accounts with :func:`sandbox_keypair` (sandbox/keys.py
re-exports it; sandbox/horizon/core.py takes the network root from
:func:`network_root_keypair`), development channel accounts come from
:func:`channel_keypair` (anchor/stellar.py), and production refuses every seed of
:func:`derivable_seeds` (corridor/checks.py, E007). A sandbox name missing from
:data:`SANDBOX_ACCOUNT_NAMES` cannot be derived at all (``ValueError``), so the list
production refuses cannot fall behind the sandbox.

On the ground floor: imports no app and no sandbox code, so production settings and
checks can use it without installing the sandbox.
"""

from __future__ import annotations

import hashlib

from stellar_sdk import Keypair

# Every name the sandbox derives an account from: sha256("corridor-sandbox:" + name).
SANDBOX_CHANNEL_NAMES = tuple(f"channel-{n}" for n in range(1, 5))
SANDBOX_MINION_NAMES = tuple(f"friendbot-minion-{n}" for n in range(1, 9))
SANDBOX_ACCOUNT_NAMES = (
    "usdc-issuer", "distribution", "hub", "partner", "anchor31", "sender31",
    "ap-sep10-signing", *SANDBOX_CHANNEL_NAMES, *SANDBOX_MINION_NAMES,
)
# The root account's seed is sha256(passphrase) on every Stellar network (stellar-core
# ``SecretKey::fromSeed(networkID)``).
NETWORK_PASSPHRASES = ("Test SDF Network ; September 2015",
                       "Public Global Stellar Network ; September 2015")
# Development channel seed secrets written in this repository (README's example, the
# release bench, the tests): their channels are derivable by anyone.
# tests/test_production_mode.py finds every such literal in the repository and
# fails when one is missing here.
DEV_CHANNEL_SECRETS = ("my-dev-secret", "bench-releases-dev-secret",
                       "test-channels-dev-secret", "test-channels-create", "anything")
# Channels 1..this of each development secret are refused (``channels create N``).
DEV_CHANNELS_PER_SECRET = 100
# The sandbox SEP-31 receiving anchor's token: this prefix and any G... account.
SANDBOX_ANCHOR31_TOKEN_PREFIX = "sandbox-sep31:"


def sandbox_keypair(name: str) -> Keypair:
    """The sandbox account ``name``: Keypair.from_raw_ed25519_seed(sha256(
    "corridor-sandbox:" + name)). Raises ValueError for a name not in
    :data:`SANDBOX_ACCOUNT_NAMES` (register it there: production then refuses it)."""
    if name not in SANDBOX_ACCOUNT_NAMES:
        raise ValueError(f"sandbox account {name!r} is not in SANDBOX_ACCOUNT_NAMES "
                         "(common/devkeys.py): register it so production refuses it")
    return Keypair.from_raw_ed25519_seed(
        hashlib.sha256(f"corridor-sandbox:{name}".encode()).digest())


def network_root_keypair(passphrase: str) -> Keypair:
    """The root account of the network ``passphrase``: seed = sha256(passphrase)."""
    return Keypair.from_raw_ed25519_seed(hashlib.sha256(passphrase.encode()).digest())


def channel_keypair(secret: str, n: int) -> Keypair:
    """Development channel ``n`` (1-based) of seed secret ``secret``:
    Keypair.from_raw_ed25519_seed(sha256("corridor-channel:" + secret + ":" + n))."""
    return Keypair.from_raw_ed25519_seed(
        hashlib.sha256(f"corridor-channel:{secret}:{n}".encode()).digest())


def derivable_seeds(*passphrases: str) -> dict[str, str]:
    """Secret seed (``S...``) -> what it is, for every seed derivable from this
    repository: each sandbox account, the root of each network in
    :data:`NETWORK_PASSPHRASES` and ``passphrases``, and channels
    1..DEV_CHANNELS_PER_SECRET of each of :data:`DEV_CHANNEL_SECRETS`."""
    seeds = {sandbox_keypair(name).secret: f"sandbox account {name}"
             for name in SANDBOX_ACCOUNT_NAMES}
    for passphrase in (*NETWORK_PASSPHRASES, *passphrases):
        seeds[network_root_keypair(passphrase).secret] = "network root"
    for secret in DEV_CHANNEL_SECRETS:
        for n in range(1, DEV_CHANNELS_PER_SECRET + 1):
            seeds[channel_keypair(secret, n).secret] = f"development channel {secret}:{n}"
    return seeds
