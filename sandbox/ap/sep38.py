"""SEP-38 of the AP stand-in: ``/ap/sep/sep38/info``, ``/prices``, ``/price``, ``POST
/quote`` and ``GET /quote/{id}``, each answered from the anchor's ``GET /rate`` callback
(``SANDBOX_CALLBACK_URL`` + ``/rate``, the callback JWT), as AP 4.x's ``Sep38Service``
does (AP NOTES SEP31-RECEIVE.md §6).

- ``/prices?sell_asset=&sell_amount=``: one ``type=indicative`` call per exchangeable
  asset; only ``rate.price`` is used.
- ``/price?...&context=sep6|sep31`` (other contexts: 400 "Unsupported context. Should be
  one of [sep6, sep31]."): ``type=indicative``, exactly one amount, ``client_id`` = the
  wallet's SEP-10 account when it sent a token.
- ``POST /quote`` (SEP-10 token required; ``context`` sep6, sep24 or sep31; optional
  ``expire_after``, which must parse as an ISO instant): ``type=firm`` with
  ``client_id`` = the account; the answer stored as an :class:`ApQuote` and a
  ``quote_created`` event published after the save; 201 with the SEP-38 quote.
- ``GET /quote/{id}``: from the stored quote, the creator's only (else 404).

Every ``/rate`` answer is checked as ``RestRateIntegration#validateRateResponse`` does
(§6.3, :func:`rate_problem`); one that fails is a 502 with the reason. The anchor's
400/422 reach the wallet as a 400 with its ``error``; a 500 as itself; anything else,
or no answer, as a 502.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal

import httpx
from django.conf import settings
from django.db import transaction

from common.http import tls_context
from sandbox.ap import assets, events
from sandbox.ap.models import ApQuote
from sandbox.ap.objects import instant, now
from sandbox.ap.sep import SepError, WebAuth

DB = "sandbox"
PRICE_CONTEXTS = ("sep6", "sep31")
QUOTE_CONTEXTS = ("sep6", "sep24", "sep31")


def exchangeable(asset_id: str) -> list[str]:
    """The assets ``asset_id`` can be exchanged for here (USDC <-> INR)."""
    usdc = assets.configured()[0].id
    return {usdc: ["iso4217:INR"], "iso4217:INR": [usdc]}.get(asset_id, [])


def info() -> dict:
    usdc = assets.configured()[0].id
    methods = [{"name": "IMPS", "description": "IMPS bank transfer"},
               {"name": "UPI", "description": "UPI to a VPA"}]
    return {"assets": [{"asset": usdc},
                       {"asset": "iso4217:INR", "country_codes": ["IN"],
                        "sell_delivery_methods": methods, "buy_delivery_methods": methods}]}


def _decimals(asset_id: str) -> int:
    asset = assets.by_id(asset_id)
    return asset.significant_decimals if asset else 7


def _amount(value: str | None, name: str) -> Decimal | None:
    if value in (None, ""):
        return None
    number = assets.parse_decimal(value)
    if number is None or number <= 0:
        raise SepError(400, f"{name} is invalid")
    return number


def _checked_request(q: dict, *, contexts: tuple[str, ...] | None) -> None:
    for name in ("sell_asset", "buy_asset"):
        if not q.get(name):
            raise SepError(400, f"{name} cannot be empty")
        if assets.by_id(q[name]) is None:
            raise SepError(400, f"{name} not found")
    if (q.get("sell_amount") in (None, "")) == (q.get("buy_amount") in (None, "")):
        raise SepError(400, "Please provide either sell_amount or buy_amount")
    _amount(q.get("sell_amount"), "sell_amount")
    _amount(q.get("buy_amount"), "buy_amount")
    if contexts is not None and q.get("context") not in contexts:
        raise SepError(400, f"Unsupported context. Should be one of [{', '.join(contexts)}].")
    for name in ("sell_delivery_method", "buy_delivery_method"):
        limit = ApQuote._meta.get_field(name).max_length
        if len(q.get(name) or "") > limit or "\x00" in (q.get(name) or ""):
            raise SepError(400, f"{name} is not a delivery method (at most {limit} "
                                "characters, no NUL)")


def call_rate(params: dict) -> dict:
    """``GET /rate`` on the anchor; the ``rate`` object of a 200. Raises SepError."""
    url = settings.SANDBOX_CALLBACK_URL.rstrip("/") + "/rate"
    try:
        response = httpx.get(url, params={k: v for k, v in params.items() if v},
                             headers={"Authorization": f"Bearer {events.callback_token()}"},
                             timeout=float(getattr(settings, "HTTP_TIMEOUT_S", 10)),
                             verify=tls_context())
    except httpx.HTTPError as exc:
        raise SepError(502, f"the anchor's rate service did not answer: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code in (400, 422):
        raise SepError(400, str((body or {}).get("error") or "the anchor refused the rate"))
    if response.status_code == 500:
        raise SepError(500, str((body or {}).get("error") or "internal error"))
    if response.status_code != 200 or not isinstance(body, dict) or \
            not isinstance(body.get("rate"), dict):
        raise SepError(502, f"the anchor's rate service answered {response.status_code}")
    return body["rate"]


def rate_problem(rate: dict, asked: dict, *, firm: bool,
                 lookup: Callable[[str], assets.Asset | None] = assets.by_id) -> str | None:
    """Why AP refuses this ``/rate`` answer (None: accepted), SEP31-RECEIVE §6.3.
    ``lookup``: the assets config (``assets.as_configured`` reads no fault switch, so
    needs no database)."""

    def _decimals(asset_id: str) -> int:
        asset = lookup(asset_id)
        return asset.significant_decimals if asset else 7

    sell_asset, buy_asset = asked["sell_asset"], asked["buy_asset"]
    for name in ("price", "sell_amount", "buy_amount"):
        if assets.parse_decimal(rate.get(name)) is None:
            return f"'rate.{name}' is missing or not a number"
    if firm and (not rate.get("id") or not rate.get("expires_at")):
        return "'rate.id' and 'rate.expires_at' are required for a firm quote"
    sell, buy = Decimal(str(rate["sell_amount"])), Decimal(str(rate["buy_amount"]))
    price = Decimal(str(rate["price"]))
    if sell <= 0 or buy <= 0:
        return "'rate.sell_amount' and 'rate.buy_amount' must be positive"
    for name, asset in (("sell_amount", sell_asset), ("buy_amount", buy_asset)):
        if -Decimal(str(rate[name])).as_tuple().exponent > _decimals(asset):
            return f"'rate.{name}' has more decimals than {asset} allows"
    for name in ("sell_amount", "buy_amount"):
        if asked.get(name) and Decimal(str(rate[name])) != Decimal(str(asked[name])):
            return f"'rate.{name}' is not the amount requested"
    fee = rate.get("fee") or {"total": "0", "asset": sell_asset}
    total = assets.parse_decimal(fee.get("total"))
    if total is None or total < 0:
        return "'rate.fee.total' must be a non-negative number"
    if lookup(fee.get("asset")) is None:
        return "'rate.fee.asset' is not a supported asset"
    details = fee.get("details") or []
    if total == 0 and details:
        return "'rate.fee.details' must be empty when the total is zero"
    places = _decimals(fee["asset"])
    amounts = [fee["total"], *(d.get("amount") for d in details)]
    if any(assets.parse_decimal(a) is None or -Decimal(str(a)).as_tuple().exponent > places
           for a in amounts):
        return "a fee amount has more decimals than the fee asset allows"
    if any(Decimal(str(d["amount"])) <= 0 or not d.get("name") for d in details):
        return "each 'rate.fee.details' entry needs a name and a positive amount"
    if details and sum(Decimal(str(d["amount"])) for d in details) != total:
        return "'rate.fee.details' do not add up to 'rate.fee.total'"
    expected = price * (buy + total) if fee["asset"] == buy_asset else price * buy + total
    if abs(sell - expected) >= Decimal(10) ** -_decimals(sell_asset):
        return ("'rate.sell_amount' is not 'rate.price' * 'rate.buy_amount' + fee within "
                "the sell asset's decimals")
    return None


def _checked_rate(params: dict, *, firm: bool) -> dict:
    rate = call_rate(params)
    problem = rate_problem(rate, params, firm=firm)
    if problem:
        raise SepError(502, problem)
    return rate


def _formatted(value, asset_id: str) -> str:
    return assets.plain(assets.scaled(Decimal(str(value)), _decimals(asset_id)))


def prices(q: dict, auth: WebAuth | None) -> dict:
    if not q.get("sell_asset") or assets.by_id(q["sell_asset"]) is None:
        raise SepError(400, "sell_asset not found")
    if _amount(q.get("sell_amount"), "sell_amount") is None:
        raise SepError(400, "sell_amount cannot be empty")
    answer = []
    for buy_asset in exchangeable(q["sell_asset"]):
        rate = _checked_rate({"type": "indicative", "sell_asset": q["sell_asset"],
                              "sell_amount": q["sell_amount"], "buy_asset": buy_asset,
                              "country_code": q.get("country_code"),
                              "sell_delivery_method": q.get("sell_delivery_method")},
                             firm=False)
        answer.append({"asset": buy_asset, "price": rate["price"],
                       "decimals": _decimals(buy_asset)})
    return {"buy_assets": answer}


def _quote_fields(rate: dict, q: dict) -> dict:
    sell_amount = _formatted(rate["sell_amount"], q["sell_asset"])
    buy_amount = _formatted(rate["buy_amount"], q["buy_asset"])
    total_price = Decimal(sell_amount) / Decimal(buy_amount)
    return {"total_price": assets.plain(total_price.quantize(Decimal("1e-10"))),
            "price": rate["price"], "sell_asset": q["sell_asset"], "sell_amount": sell_amount,
            "buy_asset": q["buy_asset"], "buy_amount": buy_amount,
            "fee": rate.get("fee") or {"total": "0", "asset": q["sell_asset"]}}


def price(q: dict, auth: WebAuth | None) -> dict:
    _checked_request(q, contexts=PRICE_CONTEXTS)
    rate = _checked_rate({"type": "indicative", "client_id": auth.account if auth else None,
                          **{k: q.get(k) for k in (
                              "sell_asset", "buy_asset", "sell_amount", "buy_amount",
                              "country_code", "sell_delivery_method", "buy_delivery_method")}},
                         firm=False)
    return _quote_fields(rate, q)


def post_quote(q: dict, auth: WebAuth) -> dict:
    _checked_request(q, contexts=QUOTE_CONTEXTS)
    if q.get("expire_after"):
        try:
            datetime.fromisoformat(str(q["expire_after"]).replace("Z", "+00:00"))
        except ValueError:
            raise SepError(400, "expire_after is invalid") from None
    rate = _checked_rate({"type": "firm", "client_id": auth.account,
                          **{k: q.get(k) for k in (
                              "sell_asset", "buy_asset", "sell_amount", "buy_amount",
                              "country_code", "expire_after", "sell_delivery_method",
                              "buy_delivery_method")}}, firm=True)
    try:
        expires = datetime.fromisoformat(str(rate["expires_at"]).replace("Z", "+00:00"))
    except ValueError:
        raise SepError(502, "'rate.expires_at' is not an ISO 8601 instant") from None
    fields = _quote_fields(rate, q)
    with transaction.atomic(using=DB):
        quote = ApQuote.objects.using(DB).create(
            id=str(rate["id"])[:64], context=q["context"], expires_at=expires,
            created_at=now(), creator_account=auth.account, creator_memo=auth.memo or "",
            sell_delivery_method=q.get("sell_delivery_method") or "",
            buy_delivery_method=q.get("buy_delivery_method") or "",
            **{k: fields[k] for k in ("sell_asset", "sell_amount", "buy_asset", "buy_amount",
                                      "price", "total_price", "fee")})
    # Published after the save, as Sep38Service#postQuote does.
    _publish_quote_created(quote)
    return quote_object(quote)


def quote_object(quote: ApQuote) -> dict:
    return {"id": quote.id, "expires_at": instant(quote.expires_at),
            "total_price": quote.total_price, "price": quote.price,
            "sell_asset": quote.sell_asset, "sell_amount": quote.sell_amount,
            "buy_asset": quote.buy_asset, "buy_amount": quote.buy_amount, "fee": quote.fee}


def get_quote(quote_id: str, auth: WebAuth) -> dict:
    quote = None if "\x00" in quote_id else ApQuote.objects.using(DB).filter(
        pk=quote_id[:64], creator_account=auth.account).first()
    if quote is None:
        raise SepError(404, f"quote(id={quote_id[:64]}) was not found.")
    return quote_object(quote)


def _publish_quote_created(quote: ApQuote) -> None:
    events.publish("quote_created", quote_object={
        **quote_object(quote), "created_at": instant(quote.created_at),
        "sell_delivery_method": quote.sell_delivery_method or None,
        "buy_delivery_method": quote.buy_delivery_method or None,
        "creator": {"account": quote.creator_account, "memo": quote.creator_memo or None}})
