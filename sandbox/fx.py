"""The sandbox's USDC/INR rate feed: ``GET /fx/rates?pair=USDC-INR[&at=<unix seconds>]``
-> ``{"pair": "USDC-INR", "mid": "84.5123", "as_of": "<UTC ISO 8601>"}``.

A stand-in for a market-data source (Corridor's ``QUOTE_RATE_URL``), moving the way a
rate does within a day: ``SANDBOX_FX_USDC_INR`` (84.50) swung by
``SANDBOX_FX_SWING_PCT`` (0.2%) along a sine of period ``SANDBOX_FX_PERIOD_S`` (300 s),
four decimals. ``at`` asks for the rate of another moment (a test's fixed point). An
unknown pair is a 404 and a bad ``at`` a 400."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.http import HttpResponseNotAllowed, JsonResponse

PAIR = "USDC-INR"


def mid_at(moment: float) -> Decimal:
    """The feed's mid rate (INR per USDC) at unix time ``moment``."""
    base = Decimal(str(getattr(settings, "SANDBOX_FX_USDC_INR", "84.50")))
    swing = float(getattr(settings, "SANDBOX_FX_SWING_PCT", 0.2)) / 100
    period = float(getattr(settings, "SANDBOX_FX_PERIOD_S", 300.0))
    factor = Decimal(str(1 + swing * math.sin(2 * math.pi * moment / period)))
    return (base * factor).quantize(Decimal("0.0001"))


def rates_view(request):
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    pair = request.GET.get("pair", PAIR)
    if pair != PAIR:
        return JsonResponse({"error": f"unknown pair {pair[:20]!r}; the feed has {PAIR}"},
                            status=404)
    try:
        moment = float(request.GET.get("at", time.time()))
        as_of = datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):
        return JsonResponse({"error": "at must be unix seconds between years 1 and 9999"},
                            status=400)
    return JsonResponse({"pair": PAIR, "mid": f"{mid_at(moment):f}", "as_of": as_of})
