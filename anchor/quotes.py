"""SEP-38 quotes for the Anchor Platform's ``GET /rate`` callback, and the firm quotes
Corridor honours.

AP asks ``GET /rate`` for every SEP-38 ``/prices``, ``/price`` and ``POST /quote`` and
for a SEP-31 transaction created without a quote (AP NOTES SEP31-RECEIVE.md §6.1).
Corridor serves one pair, both ways: ``stellar:USDC:<issuer>`` and ``iso4217:INR``
(SEP-38 "Asset Identification Format").

Pricing (:func:`quote`):

- the mid rate (INR per USDC) comes from the rate source (``QUOTE_RATE_URL``, answering
  ``{"mid": "<decimal>"}``; empty: the fixed ``QUOTE_MID_INR_PER_USDC``); the spread
  (``QUOTE_SPREAD_BPS``) moves it against the customer: selling USDC gets
  ``mid * (1 - spread)`` INR per USDC, buying USDC costs ``mid * (1 + spread)``;
- the fee is charged in the sell asset (SEP31-RECEIVE §6.2: the fee asset becomes the
  transaction's, and ``notify_refund_sent`` demands it): ``QUOTE_FEE_FIXED_USDC`` or
  ``QUOTE_FEE_FIXED_INR`` plus ``QUOTE_FEE_PERCENT`` of the amount exchanged, each a
  ``fee.details`` entry when not zero, rounded to the sell asset's decimals;
- the amount asked for is echoed exactly as its text (AP compares it); the other is
  rounded in Corridor's favour to its asset's decimals (USDC 7, INR 2); ``price``
  (sell units per one buy unit, fees excluded) is computed from the two rounded
  amounts with 24 decimals, so that AP's check
  ``|sell_amount - (price * buy_amount + fee)| < 10^-d`` (SEP31-RECEIVE §6.3 rule 5,
  ``d`` the sell asset's decimals) holds by construction.

A firm quote (``type=firm``) is stored (:class:`anchor.models.FirmQuote`) with an ``id``
of ours and ``expires_at`` (``QUOTE_FIRM_TTL_S``, or later when ``expire_after`` asks,
up to ``QUOTE_FIRM_MAX_TTL_S``); :func:`use_firm_quote` is how a flow takes it: by
the party it was given to, exactly its amounts, once, before it expires.

Errors: :class:`QuoteRefused` (``status`` 400 for a malformed request, 422 for one
understood but not served: AP relays our ``error`` text to the client as a 400) and
:class:`RateUnavailable` (the rate source did not answer: 503).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, ROUND_UP, Context, Decimal, InvalidOperation, localcontext

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from anchor.models import FirmQuote
from common.http import tls_context

INR = "iso4217:INR"
DECIMALS_INR = 2
DECIMALS_USDC = 7
PRICE_DECIMALS = 24
AMOUNT = re.compile(r"(0|[1-9][0-9]{0,14})(\.[0-9]{1,20})?")
MAX_AMOUNT = Decimal("1e12")


class QuoteRefused(Exception):
    """The request cannot be quoted: ``status`` 400 (malformed) or 422 (not served)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


class RateUnavailable(Exception):
    """The rate source did not answer with a usable mid rate."""


def usdc_asset() -> str:
    return f"stellar:{settings.STELLAR_USDC_CODE}:{settings.STELLAR_USDC_ISSUER}"


def decimals(asset: str) -> int:
    return DECIMALS_INR if asset == INR else DECIMALS_USDC


@dataclass
class Quote:
    """One ``rate`` object of the ``GET /rate`` answer (AP's ``GetRateResponse``)."""

    sell_asset: str
    buy_asset: str
    sell_amount: Decimal
    buy_amount: Decimal
    price: Decimal
    fee_total: Decimal
    fee_details: list[dict] = field(default_factory=list)
    mid_rate: Decimal = Decimal(0)
    quote_id: str = ""
    expires_at: datetime | None = None
    # The amount asked for, as its text: echoed verbatim (AP compares it, §6.3 rule 3).
    echo: tuple[str, str] | None = None

    def as_rate(self) -> dict:
        """The JSON ``rate`` object: amounts as strings with their asset's decimals."""
        sell_places, buy_places = decimals(self.sell_asset), decimals(self.buy_asset)
        rate = {"price": _text(self.price, PRICE_DECIMALS),
                "sell_amount": _text(self.sell_amount, sell_places),
                "buy_amount": _text(self.buy_amount, buy_places),
                "fee": {"total": _text(self.fee_total, sell_places),
                        "asset": self.sell_asset,
                        "details": [{**d, "amount": _text(d["amount"], sell_places)}
                                    for d in self.fee_details]}}
        if self.echo is not None:
            rate[self.echo[0]] = self.echo[1]
        if self.quote_id:
            rate["id"] = self.quote_id
            rate["expires_at"] = self.expires_at.isoformat().replace("+00:00", "Z")
        return rate


# Enough digits for any amount below MAX_AMOUNT with PRICE_DECIMALS decimals.
PRECISION = Context(prec=60)


def _text(value: Decimal, places: int) -> str:
    with localcontext(PRECISION):
        return f"{value.quantize(Decimal(10) ** -places):f}"


def parse_amount(text: str | None, asset: str, name: str) -> Decimal:
    """A positive amount of ``asset`` as a request parameter: plain decimal digits, no
    sign, exponent or more decimals than the asset has (AP echoes it and refuses an
    answer with more, SEP31-RECEIVE §6.3 rules 2-3). Raises QuoteRefused."""
    match = AMOUNT.fullmatch(text or "")
    if match is None:
        raise QuoteRefused(f"{name} must be a positive decimal number such as 100.50",
                           status=400)
    amount = Decimal(text)
    if amount <= 0 or amount >= MAX_AMOUNT:
        raise QuoteRefused(f"{name} must be above 0 and below {MAX_AMOUNT:f}", status=400)
    places = decimals(asset)
    # The text's own decimals, trailing zeros included: it is echoed as it came.
    if len(match.group(2) or ".") - 1 > places:
        raise QuoteRefused(f"{name} has more than {places} decimals, the most {asset} has")
    return amount


def mid_rate() -> Decimal:
    """INR per USDC from the rate source (``QUOTE_RATE_URL``; one GET, HTTP_TIMEOUT_S),
    or the fixed ``QUOTE_MID_INR_PER_USDC``. Raises RateUnavailable."""
    url = settings.QUOTE_RATE_URL
    if not url:
        return settings.QUOTE_MID_INR_PER_USDC
    try:
        response = httpx.get(url, timeout=settings.HTTP_TIMEOUT_S, verify=tls_context())
        response.raise_for_status()
        mid = Decimal(str(response.json()["mid"]))
    except (httpx.HTTPError, ValueError, KeyError, TypeError, InvalidOperation) as exc:
        raise RateUnavailable(f"the rate source did not answer: {type(exc).__name__}") \
            from exc
    if not mid.is_finite() or mid <= 0:
        raise RateUnavailable(f"the rate source answered a mid rate of {mid}")
    return mid


def quote(*, sell_asset: str, buy_asset: str, sell_amount: str | None = None,
          buy_amount: str | None = None, country_code: str | None = None) -> Quote:
    """Price one request (the module docstring has the rules). Exactly one of
    ``sell_amount`` / ``buy_amount`` (strings, as AP sends them). Raises QuoteRefused,
    RateUnavailable."""
    with localcontext(PRECISION):
        return _quote(sell_asset=sell_asset, buy_asset=buy_asset, sell_amount=sell_amount,
                      buy_amount=buy_amount, country_code=country_code)


def _quote(*, sell_asset: str, buy_asset: str, sell_amount: str | None,
           buy_amount: str | None, country_code: str | None) -> Quote:
    usdc = usdc_asset()
    if {sell_asset, buy_asset} != {usdc, INR}:
        raise QuoteRefused(f"Corridor quotes {usdc} against {INR} only, either way")
    if (sell_amount is None) == (buy_amount is None):
        raise QuoteRefused("exactly one of sell_amount and buy_amount is required", status=400)
    if country_code not in (None, "", "IN"):
        raise QuoteRefused(f"INR is paid and collected in IN only, not {country_code!r}")
    mid = mid_rate()
    spread = settings.QUOTE_SPREAD_BPS / Decimal(10000)
    # Buy-asset units per sell-asset unit, the spread taken.
    if sell_asset == usdc:
        per_sell = mid * (1 - spread)
        fixed = settings.QUOTE_FEE_FIXED_USDC
    else:
        per_sell = 1 / (mid * (1 + spread))
        fixed = settings.QUOTE_FEE_FIXED_INR
    percent = settings.QUOTE_FEE_PERCENT / Decimal(100)
    sell_step = Decimal(10) ** -decimals(sell_asset)
    buy_step = Decimal(10) ** -decimals(buy_asset)
    fixed = fixed.quantize(sell_step, ROUND_UP)  # AP: no more decimals than the asset
    if sell_amount is not None:
        sell = parse_amount(sell_amount, sell_asset, "sell_amount")
        # The fee is part of what is sold: sell = net + fixed + percent * net.
        net = ((sell - fixed) / (1 + percent)).quantize(sell_step, ROUND_DOWN)
        if net <= 0:
            raise QuoteRefused(f"sell_amount does not cover the fee ({fixed:f} plus "
                               f"{settings.QUOTE_FEE_PERCENT:f}%)")
        buy = (net * per_sell).quantize(buy_step, ROUND_DOWN)
        if buy <= 0:
            raise QuoteRefused("sell_amount buys less than the smallest unit of "
                               f"{buy_asset}")
        variable = sell - fixed - net
    else:
        buy = parse_amount(buy_amount, buy_asset, "buy_amount")
        net = (buy / per_sell).quantize(sell_step, ROUND_UP)
        variable = (net * percent).quantize(sell_step, ROUND_UP)
        sell = net + fixed + variable
    details = [{"name": name, "description": text, "amount": amount}
               for name, text, amount in (
                   ("Service fee", "fixed fee per exchange", fixed),
                   ("Exchange fee", f"{settings.QUOTE_FEE_PERCENT:f}% of the amount "
                                    "exchanged", variable)) if amount > 0]
    fee = fixed + variable
    price = ((sell - fee) / buy).quantize(Decimal(10) ** -PRICE_DECIMALS)
    echo = ("sell_amount", sell_amount) if sell_amount is not None else \
        ("buy_amount", buy_amount)
    return Quote(sell_asset=sell_asset, buy_asset=buy_asset, sell_amount=sell,
                 buy_amount=buy, price=price, fee_total=fee, fee_details=details,
                 mid_rate=mid, echo=echo)


def firm_expiry(expire_after: str | None) -> datetime:
    """``expires_at`` of a new firm quote: now + QUOTE_FIRM_TTL_S, or ``expire_after``
    (UTC ISO 8601) when later, if within QUOTE_FIRM_MAX_TTL_S (SEP-38: 400 when an
    expiry on or after the requested one cannot be given). Raises QuoteRefused."""
    now = timezone.now()
    expires = now + timedelta(seconds=settings.QUOTE_FIRM_TTL_S)
    if not expire_after:
        return expires
    try:
        wanted = datetime.fromisoformat(expire_after.replace("Z", "+00:00"))
    except ValueError:
        raise QuoteRefused("expire_after must be a UTC ISO 8601 date and time",
                           status=400) from None
    if wanted.tzinfo is None:
        raise QuoteRefused("expire_after must carry its UTC offset (Z)", status=400)
    latest = now + timedelta(seconds=settings.QUOTE_FIRM_MAX_TTL_S)
    if wanted > latest:
        raise QuoteRefused(f"a quote can be held until {latest.isoformat()} at the latest",
                           status=400)
    return max(expires, wanted)


def firm_quote(q: Quote, *, client_id: str, expire_after: str | None,
               sell_delivery_method: str = "", buy_delivery_method: str = "",
               country_code: str = "") -> Quote:
    """Store ``q`` as a firm quote for ``client_id`` (AP sends the sending party's
    SEP-10 account or client name); returns it with its ``id`` and ``expires_at``."""
    if not client_id:
        raise QuoteRefused("a firm quote needs the client_id AP authenticated", status=400)
    for name, value in (("client_id", client_id), ("sell_delivery_method", sell_delivery_method),
                        ("buy_delivery_method", buy_delivery_method),
                        ("country_code", country_code)):
        limit = FirmQuote._meta.get_field(name).max_length
        if len(value) > limit:
            raise QuoteRefused(f"{name} is longer than {limit} characters", status=400)
    expires = firm_expiry(expire_after)
    stored = FirmQuote.objects.create(
        quote_id=str(uuid.uuid4()), client_id=client_id, sell_asset=q.sell_asset,
        buy_asset=q.buy_asset, sell_amount=q.sell_amount, buy_amount=q.buy_amount,
        price=q.price, fee_total=q.fee_total, fee_asset=q.sell_asset,
        fee_details=[{**d, "amount": str(d["amount"])} for d in q.fee_details],
        sell_delivery_method=sell_delivery_method,
        buy_delivery_method=buy_delivery_method, country_code=country_code,
        mid_rate=q.mid_rate.quantize(Decimal("1e-8")), expires_at=expires)
    q.quote_id, q.expires_at = stored.quote_id, stored.expires_at
    return q


def rate_answer(params: dict[str, str]) -> dict:
    """The ``rate`` object answering AP's ``GET /rate`` with query ``params`` (already
    checked to be storable text): :func:`quote`, and for ``type=firm``
    :func:`firm_quote`. Raises QuoteRefused, RateUnavailable."""
    kind = params.get("type")
    if kind not in ("indicative", "firm"):
        raise QuoteRefused("type must be indicative or firm", status=400)
    for name in ("sell_asset", "buy_asset"):
        if not params.get(name):
            raise QuoteRefused(f"{name} is required", status=400)
    q = quote(sell_asset=params["sell_asset"], buy_asset=params["buy_asset"],
              sell_amount=params.get("sell_amount"), buy_amount=params.get("buy_amount"),
              country_code=params.get("country_code"))
    if kind == "firm":
        q = firm_quote(q, client_id=params.get("client_id", ""),
                       expire_after=params.get("expire_after"),
                       sell_delivery_method=params.get("sell_delivery_method", ""),
                       buy_delivery_method=params.get("buy_delivery_method", ""),
                       country_code=params.get("country_code", ""))
    return q.as_rate()


def use_firm_quote(quote_id: str, *, transaction_id: str, owner: str, sell_asset: str,
                   sell_amount: Decimal, buy_asset: str) -> FirmQuote:
    """Take firm quote ``quote_id`` for ``transaction_id``, redeemed by ``owner`` (the
    SEP-10 account that created the transaction, AP's ``creator.account``): only the
    party the quote was given to (its ``client_id``: AP sends the SEP-10 account that
    asked ``POST /quote``, SEP31-RECEIVE.md §9; AP 4.3.0 checks no owner on redemption,
    #2019, §10 item 3), its assets and sell amount exactly, before ``expires_at``, and
    once (row-locked; a second use, even of the same transaction, is refused). Returns
    the quote whose ``buy_amount`` the flow pays. Raises QuoteRefused."""
    with transaction.atomic():
        stored = FirmQuote.objects.select_for_update().filter(quote_id=quote_id).first()
        if stored is None:
            raise QuoteRefused(f"quote {quote_id} is not one of Corridor's")
        if not owner or stored.client_id != owner:
            raise QuoteRefused(f"quote {quote_id} was given to another party")
        if stored.used_at is not None:
            raise QuoteRefused(f"quote {quote_id} was used by {stored.transaction_id}")
        if timezone.now() >= stored.expires_at:
            raise QuoteRefused(f"quote {quote_id} expired at {stored.expires_at.isoformat()}")
        if (stored.sell_asset, stored.buy_asset) != (sell_asset, buy_asset) or \
                stored.sell_amount != sell_amount:
            raise QuoteRefused(f"quote {quote_id} is for {stored.sell_amount:f} "
                               f"{stored.sell_asset} -> {stored.buy_asset}, not "
                               f"{sell_amount:f} {sell_asset} -> {buy_asset}")
        stored.used_at, stored.transaction_id = timezone.now(), transaction_id[:64]
        stored.save(update_fields=["used_at", "transaction_id"])
    return stored
