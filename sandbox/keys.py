"""Fixed sandbox keypairs:
Keypair.from_raw_ed25519_seed(sha256(b"corridor-sandbox:" + name)).

Valid only against the sandbox (and harmless anywhere else: they hold nothing real).
Corridor's settings default to the same values so ``make run`` needs no configuration.
"""

import hashlib

from stellar_sdk import Keypair


def sandbox_keypair(name: str) -> Keypair:
    seed = hashlib.sha256(f"corridor-sandbox:{name}".encode()).digest()
    return Keypair.from_raw_ed25519_seed(seed)


USDC_ISSUER = sandbox_keypair("usdc-issuer")
DISTRIBUTION = sandbox_keypair("distribution")
