"""Fixed sandbox keypairs:
Keypair.from_raw_ed25519_seed(sha256(b"corridor-sandbox:" + name)).

Valid only against the sandbox (and harmless anywhere else: they hold nothing real).
Corridor's settings default to the same values so ``make run`` needs no configuration.
The derivation is ``common.devkeys.sandbox_keypair``: it refuses a name it does not
list, and production refuses every seed it lists (corridor/checks.py E007).
"""

from common.devkeys import sandbox_keypair

__all__ = ["ANCHOR31", "DISTRIBUTION", "HUB", "PARTNER", "SENDER31", "USDC_ISSUER",
           "sandbox_keypair"]


USDC_ISSUER = sandbox_keypair("usdc-issuer")
DISTRIBUTION = sandbox_keypair("distribution")

# The remittance corridor's accounts (sandbox.anchor31 creates them at reset):
# HUB       GANBGMMVHZ5CFXCQWUZYPAQJ4IUOH27V33I6F46KLRJB3HKL6LVQ2IMB  Corridor's USDC hub
#           (10,000 XLM, a USDC trustline, 0 USDC);
# PARTNER   GBR5EOMXSVA5S3QQGQJXQ6N6XP6CSLSZRHOCB5AG5AZ7KI2Q7X7W3MYK  the partner that funds
#           remittances in USDC (10,000 XLM, 1,000,000 USDC);
# ANCHOR31  GAOXUXDEWYCG3QL2GMHP4ZRFR5KVMPM6KQDR7LLFAZ62VFYR4256ORF2  the SEP-31 receiving
#           anchor's receiving account (10,000 XLM, 1,000,000 USDC for refunds).
# SENDER31  the foreign SEP-31 *sending* anchor that pays Corridor as a receiving anchor
#           (sandbox/sender31.py creates it on first use: friendbot, a USDC trustline,
#           USDC from the issuer).
HUB = sandbox_keypair("hub")
PARTNER = sandbox_keypair("partner")
ANCHOR31 = sandbox_keypair("anchor31")
SENDER31 = sandbox_keypair("sender31")
