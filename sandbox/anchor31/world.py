"""The corridor's part of the sandbox's fixed world: the hub, the partner and the
receiving anchor's account (``sandbox.keys.HUB`` / ``PARTNER`` / ``ANCHOR31``).

Built after Horizon's own world (``sandbox.horizon.service.reset``) with one real signed
transaction from a friendbot minion, so the accounts' history shows how they came to be:

- ``create_account`` x3, 10,000 XLM each (friendbot's starting balance);
- ``change_trust`` USDC for each (operation source = the account, which signs);
- the USDC issuer pays 1,000,000 USDC to the partner and 1,000,000 USDC to the anchor
  (its float for refunds); the hub keeps 0 USDC.

It goes through Horizon's own submission path (``service.submit``, no faults) and this
module closes the ledger itself (``service.close_ledger``), because at process start the
reset runs before the ledger-close loop does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.db.models import Max
from stellar_sdk import Account as SdkAccount
from stellar_sdk import Keypair, TransactionBuilder

from sandbox.horizon import core
from sandbox.horizon import models as hmodels
from sandbox.horizon import service as horizon
from sandbox.keys import ANCHOR31, HUB, PARTNER, USDC_ISSUER, sandbox_keypair

DB = "sandbox"
STARTING_XLM = "10000"
FUNDED_USDC = {PARTNER.public_key: "1000000", ANCHOR31.public_key: "1000000"}
ACCOUNTS = (HUB, PARTNER, ANCHOR31)


class WorldError(RuntimeError):
    """The world transaction was refused or did not land in time."""


def missing_accounts() -> list[Keypair]:
    """The corridor accounts that do not exist on the sandbox ledger."""
    present = set(hmodels.Account.objects.using(DB).filter(
        pk__in=[k.public_key for k in ACCOUNTS]).values_list("pk", flat=True))
    return [k for k in ACCOUNTS if k.public_key not in present]


def _operations(missing: list[Keypair]) -> Callable[[TransactionBuilder], None]:
    asset = horizon.usdc()

    def build(builder: TransactionBuilder) -> None:
        for keypair in missing:
            builder.append_create_account_op(keypair.public_key, STARTING_XLM)
        for keypair in missing:
            builder.append_change_trust_op(asset, source=keypair.public_key)
        for keypair in missing:
            amount = FUNDED_USDC.get(keypair.public_key)
            if amount:
                builder.append_payment_op(keypair.public_key, asset, amount,
                                          source=USDC_ISSUER.public_key)

    return build


def _envelope(source: Keypair, missing: list[Keypair]) -> core.Envelope:
    account = hmodels.Account.objects.using(DB).get(pk=source.public_key)
    builder = TransactionBuilder(SdkAccount(source.public_key, account.sequence),
                                 network_passphrase=horizon.passphrase(),
                                 base_fee=core.BASE_FEE).set_timeout(60)
    _operations(missing)(builder)
    envelope = builder.build()
    for keypair in (source, *missing, USDC_ISSUER):
        envelope.sign(keypair)
    return core.parse_envelope(envelope.to_xdr(), horizon.passphrase())


def ensure_accounts(timeout: float | None = None) -> bool:
    """Create whichever of the hub, partner and anchor accounts is missing (with their
    trustlines and USDC), creating Horizon's world first if there is none. Returns True
    when it created something. Raises WorldError when the transaction is refused or does
    not land within ``timeout`` seconds (default ``SANDBOX_SUBMISSION_TIMEOUT_S``)."""
    horizon.ensure_world()
    missing = missing_accounts()
    if not missing:
        return False
    limit = float(timeout if timeout is not None else settings.SANDBOX_SUBMISSION_TIMEOUT_S)
    deadline = time.monotonic() + limit
    minions = [sandbox_keypair(name) for name in horizon.MINIONS]
    while time.monotonic() < deadline:
        for source in minions:
            env = _envelope(source, missing)
            outcome = horizon.submit(env, with_faults=False)
            if isinstance(outcome, horizon.Known):
                return True
            if isinstance(outcome, horizon.Refused):
                if outcome.result.code == core.TX.txBAD_SEQ:
                    continue  # the minion's sequence moved: try the next one
                codes = core.result_codes(outcome.result.to_xdr())
                raise WorldError(f"corridor world refused: {codes}")
            if outcome.status in ("queued", "duplicate"):
                horizon.close_ledger()
                landed = horizon.await_transaction(env.hash, outcome.deadline)
                if landed is None or not landed.successful:
                    raise WorldError(f"corridor world transaction {env.hash} did not apply")
                return True
        horizon.close_ledger()  # every minion busy: let their queued transactions land
    raise WorldError("corridor world: no ledger closed in time")


def latest_payment_token(account: str) -> str | None:
    """The paging token of ``account``'s newest operation (payments pages are paged by
    operation id), or None when it has none."""
    newest = (hmodels.Operation.objects.using(DB)
              .filter(participants__account_id=account).aggregate(Max("id"))["id__max"])
    return str(newest) if newest is not None else None
