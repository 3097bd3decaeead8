"""The assets configured in the sandbox Anchor Platform (AP-4.3.0 ``assets`` config).

AP validates every ``Amount.asset`` of an RPC against this list by exact id
(``AssetValidationUtils.validateAssetAmount``: ``'X' is not a supported asset.``) and
checks ``significant_decimals`` (``'A' has invalid significant decimals. Expected: 'N'``).

Configured here:

- ``stellar:USDC:<sandbox USDC issuer>``: 7 significant decimals, SEP-24 deposit and
  withdrawal enabled, distribution account = ``sandbox.keys.DISTRIBUTION``.
- ``stellar:SRT:<sandbox USDC issuer>``: a second Stellar test asset with only 2
  significant decimals, for the "more decimals than the asset allows" cases of
  NOTES §4.4.
- ``iso4217:INR`` (2 decimals): Corridor's fiat.
- ``iso4217:USD`` (2 decimals): only so the recorded AP examples replay unchanged.

Settings are read at call time, so tests may change ``STELLAR_USDC_CODE``.

Fault switch ``ap.asset_decimals`` (params ``{"asset": "stellar:USDC:<issuer>",
"decimals": 2}``): while it is on, that asset's ``significant_decimals`` is ``decimals``
for every check that looks the asset up by id (``by_id``: RPC amount validation, refund
sums), as if AP ran with that assets config. This reproduces NOTES §4.4 "more decimals
than ``significant_decimals``" on USDC itself. ``times`` is not consumed (a config, not an
event); clear the switch to restore 7.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings

from sandbox import keys
from sandbox.control import faults

FAULT_DECIMALS = "ap.asset_decimals"


@dataclass(frozen=True)
class Asset:
    """One entry of AP's assets config. ``id`` is the SEP-38 form used by the Platform
    API (``stellar:CODE:ISSUER`` or ``iso4217:XXX``)."""

    id: str
    code: str
    issuer: str | None
    significant_decimals: int
    distribution_account: str | None = None
    sep24_enabled: bool = False

    @property
    def is_stellar(self) -> bool:
        return self.id.startswith("stellar:")


def configured() -> list[Asset]:
    """All assets of this AP, in config order."""
    issuer = keys.USDC_ISSUER.public_key
    distribution = keys.DISTRIBUTION.public_key
    usdc = getattr(settings, "STELLAR_USDC_CODE", "USDC")
    return [
        Asset(f"stellar:{usdc}:{issuer}", usdc, issuer, 7, distribution, True),
        Asset(f"stellar:SRT:{issuer}", "SRT", issuer, 2, distribution, True),
        Asset("iso4217:INR", "INR", None, 2),
        Asset("iso4217:USD", "USD", None, 2),
    ]


def as_configured(asset_id: str | None) -> Asset | None:
    """The asset whose id equals ``asset_id`` exactly, as configured (no fault)."""
    return next((a for a in configured() if a.id == asset_id), None)


def by_id(asset_id: str | None) -> Asset | None:
    """The asset whose id equals ``asset_id`` exactly (AP compares ids verbatim), with the
    ``significant_decimals`` of fault ``ap.asset_decimals`` when it names this asset."""
    asset = as_configured(asset_id)
    if asset is None:
        return None
    override = faults.peek(FAULT_DECIMALS)
    if override and override.get("asset") == asset.id and override.get("decimals") is not None:
        return replace(asset, significant_decimals=int(override["decimals"]))
    return asset


def by_code(code: str | None, issuer: str | None = None) -> Asset | None:
    """AP ``AssetService.getAsset(code, issuer)``: match the code, and the issuer when
    given. Only Stellar assets take part in SEP-24."""
    for asset in configured():
        if not asset.is_stellar or asset.code != code:
            continue
        if issuer and asset.issuer != issuer:
            continue
        return asset
    return None


def is_stellar_id(asset_id: str) -> bool:
    """AP ``AssetValidationUtils.isStellarAsset``: a plain prefix test."""
    return asset_id.startswith("stellar:")


def parse_decimal(value) -> Decimal | None:
    """A finite Decimal from an amount string (Java ``new BigDecimal(s)`` accepts the
    same forms), else None."""
    if value is None:
        return None
    try:
        number = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        return None
    if not number.is_finite() or str(value).strip() == "":
        return None
    return number


def scaled(amount: Decimal, decimals: int) -> Decimal:
    """AP ``MathHelper.decimal(amount, asset)``: the amount at the asset's scale."""
    return amount.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)


def plain(amount: Decimal) -> str:
    """``BigDecimal.toPlainString()``: no exponent."""
    return format(amount, "f")


def sep11_name(asset_type: str, code: str | None, issuer: str | None) -> str:
    """SEP-11 asset name as AP puts it in ``stellar_transactions[].payments[].amount
    .asset``: ``CODE:ISSUER`` or ``native`` (no ``stellar:`` prefix; NOTES §1.7)."""
    if asset_type == "native":
        return "native"
    return f"{code}:{issuer}"
