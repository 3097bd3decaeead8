"""The payout provider contract (razorpay/NOTES.md §6.3).

A provider turns "pay N paise to this fund account under this key" into a bank
transfer and reports what became of it. Corridor's guard (payouts/guard.py) owns the
at-most-once rule; a provider only has to say how it treats a repeated key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol


class ProviderError(Exception):
    """The provider refused the request for good (validation, auth): no payout exists
    under this key."""


class PayoutNotFound(ProviderError):
    """The provider holds no payout under this id for our account (a definite answer,
    unlike a 5xx or a timeout)."""


@dataclass
class ProviderPayout:
    """A payout as the provider reports it. ``status`` uses RazorpayX's names
    (queued, pending, processing, processed, reversed, failed, cancelled, rejected)."""

    payout_id: str
    status: str
    amount_paise: int
    reference: str = ""
    utr: str = ""
    reason: str = ""
    raw: dict = field(default_factory=dict)
    # The provider's charge for this payout, integer paise, when it reports one:
    # ``fees`` includes ``tax`` (RazorpayX's payout entity, set from ``processing``).
    fees_paise: int | None = None
    tax_paise: int | None = None


@dataclass
class DisburseResult:
    """kind: ``accepted`` (the provider holds a payout: see ``payout``), ``rejected``
    (refused, nothing created: ``reason``), ``unknown`` (timeout / 5xx: it may exist)."""

    kind: Literal["accepted", "rejected", "unknown"]
    payout: ProviderPayout | None = None
    reason: str = ""


@dataclass
class Beneficiary:
    """Where to pay: bank account (name, IFSC, account number) or UPI VPA."""

    name: str
    kind: Literal["bank_account", "vpa"]
    account_number: str = ""
    ifsc: str = ""
    vpa: str = ""

    def masked(self) -> str:
        if self.kind == "vpa":
            user, _, handle = self.vpa.partition("@")
            return f"{user[:2]}***@{handle}"
        return f"{self.ifsc} XXXX{self.account_number[-4:]}"


@dataclass(frozen=True)
class RegisteredBeneficiary:
    """A contact and one of its fund accounts as the provider holds them: where
    ``register_beneficiary`` registered a withdrawal's payee (its ``reference``)."""

    contact_id: str
    fund_account_id: str
    beneficiary: Beneficiary
    active: bool = True


class PayoutProvider(Protocol):
    name: str
    # What a repeated idempotency key / reference does: "replay" returns the stored
    # payout (RazorpayX, 7 days); "reject" answers "already exists" (Cashfree).
    duplicate_reference: Literal["replay", "reject"]
    amount_unit: Literal["paise", "rupees"]
    # Whether a success can come back later (RazorpayX processed -> reversed, T+3).
    success_can_reverse: bool
    # Final statuses that mean "this key is dead, no money moved or it came back".
    failed_statuses: frozenset[str]

    def register_beneficiary(self, *, beneficiary: Beneficiary, reference: str) -> tuple[str, str]:
        """Create (or find) the contact and fund account; returns their ids."""

    def disburse(self, *, fund_account_id: str, amount_paise: int, reference: str,
                 idempotency_key: str, narration: str, mode: str) -> DisburseResult:
        """Create the payout under ``idempotency_key`` (same key and body on a retry).
        mode: IMPS / NEFT / RTGS for bank accounts, UPI for VPAs (NOTES §2.4)."""

    def find_by_reference(self, reference: str) -> list[ProviderPayout]:
        """Every payout the provider holds under our ``reference``."""

    def beneficiaries_by_reference(self, reference: str) -> list[RegisteredBeneficiary]:
        """Every fund account of every contact registered under our ``reference``."""

    def fetch(self, payout_id: str) -> ProviderPayout:
        """One payout's current state, read from the provider's API. Raises
        PayoutNotFound when it has no such payout, rzp.RazorpayError (or the provider's
        transport error) when it cannot be asked."""

    def verify_webhook(self, body: bytes, signature: str) -> bool:
        """Signature over the raw request bytes."""
