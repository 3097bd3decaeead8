"""SEP-38 quotes through AP's ``GET /rate`` callback (anchor/quotes.py, issue 12 §2).

Every answer is checked with :func:`ap_accepts` (the sandbox AP's own check), the
checks AP makes on a ``/rate`` answer before it uses it (AP NOTES SEP31-RECEIVE.md §6.3, from
``RestRateIntegration#validateRateResponse``): an answer that fails them is a 502 for
the client. The firm quotes' use (exactly, once, before expiry) is
``quotes.use_firm_quote``.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta
from decimal import Decimal

import jwt
import pytest
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from stellar_sdk import Keypair

from anchor import quotes
from anchor.models import FirmQuote
from corridor.processes import free_port
from sandbox.ap import assets as ap_assets
from sandbox.ap import sep38
from tests.conftest import reference_path
from tests.factories import FirmQuoteFactory

pytestmark = pytest.mark.django_db(transaction=True)

D = Decimal
INR = "iso4217:INR"


def usdc() -> str:
    return quotes.usdc_asset()


def ap_accepts(rate: dict, asked: dict) -> list[str]:
    """What AP's validation of a ``/rate`` answer refuses (empty: accepted): the
    sandbox AP's own check (sandbox/ap/sep38.py ``rate_problem``). ``asked``: the
    request's parameters."""
    problem = sep38.rate_problem(rate, asked, firm="id" in rate,
                                 lookup=ap_assets.as_configured)
    return [problem] if problem else []


def test_the_check_refuses_what_ap_refuses():
    """SEP31-RECEIVE §6.3's vector: 100 USDC, 1 USDC fee, 84.50 INR per USDC, 8365.50
    INR: a price with 10 decimals misses by 2.2e-7 (AP: 502); 12 decimals pass."""
    asked = {"sell_asset": usdc(), "buy_asset": INR, "sell_amount": "100"}
    answer = {"sell_amount": "100", "buy_amount": "8365.50",
              "fee": {"total": "1", "asset": usdc(), "details": [
                  {"name": "fee", "amount": "1"}]}}

    assert ap_accepts({**answer, "price": "0.011834319527"}, asked) == []
    assert "'rate.price'" in ap_accepts({**answer, "price": "0.0118343195"},
                                                    asked)[0]
    assert ap_accepts({**answer, "price": "0.011834319527", "sell_amount": "100.5"}, asked)
    assert ap_accepts({**answer, "price": "0.011834319527", "buy_amount": "8365.505"},
                      asked)


@pytest.fixture
def rate(settings):
    """GET /callbacks/rate as AP calls it (the callback JWT), on the fixed mid rate."""
    settings.QUOTE_RATE_URL = ""
    token = jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 600},
                       settings.AP_CALLBACK_AUTH_SECRET, algorithm="HS256")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def get(**params):
        return client.get("/callbacks/rate", params)

    return get


def test_selling_100_usdc_for_inr_echoes_the_amount_and_passes_aps_checks(rate):
    asked = {"type": "indicative", "sell_asset": usdc(), "buy_asset": INR,
             "sell_amount": "100"}
    response = rate(**asked)

    assert response.status_code == 200, response.json()
    body = response.json()["rate"]
    # 84.50 less 50 bps = 84.0775 INR per USDC, on 100 less 0.50 and 0.5% in fees.
    assert body == {
        "price": "0.011893789603428122473448", "sell_amount": "100",
        "buy_amount": "8324.09",
        "fee": {"total": "0.9950249", "asset": usdc(), "details": [
            {"name": "Service fee", "description": "fixed fee per exchange",
             "amount": "0.5000000"},
            {"name": "Exchange fee", "description": "0.5% of the amount exchanged",
             "amount": "0.4950249"}]}}
    assert ap_accepts(body, asked) == []
    assert not FirmQuote.objects.exists()  # indicative: nothing stored, no id


def test_the_answer_has_the_shape_of_aps_example(rate):
    example = json.loads(reference_path(
        "anchor-platform", "examples", "callback-get-rate-indicative.response.json")
        .read_text())
    body = rate(type="indicative", sell_asset=usdc(), buy_asset=INR,
                sell_amount="100").json()

    def shape(value):
        if isinstance(value, dict):
            return {k: shape(v) for k, v in value.items()}
        if isinstance(value, list):
            return [shape(value[0])] if value else []
        return type(value).__name__

    assert shape(body) == {"rate": {**shape(example["rate"]), "fee": {
        **shape(example["rate"]["fee"]), "details": shape(example["rate"]["fee"]["details"])}}}


def test_buying_8000_inr_echoes_the_inr_and_prices_the_usdc_up(rate):
    asked = {"type": "indicative", "sell_asset": usdc(), "buy_asset": INR,
             "buy_amount": "8000"}
    body = rate(**asked).json()["rate"]

    assert (body["buy_amount"], body["sell_amount"]) == ("8000", "96.1260594")
    assert ap_accepts(body, asked) == []


@pytest.mark.parametrize("side", ["sell_amount", "buy_amount"])
def test_inr_for_usdc_both_ways_pass_aps_checks_with_the_fee_in_inr(rate, side):
    amount = "10000.50" if side == "sell_amount" else "100.1234567"
    asked = {"type": "indicative", "sell_asset": INR, "buy_asset": usdc(), side: amount}
    body = rate(**asked).json()["rate"]

    assert body["fee"]["asset"] == INR and body["fee"]["details"][0]["amount"] == "40.00"
    assert D(body["price"]) > D("84.50")  # INR per USDC, the spread against the buyer
    assert ap_accepts(body, asked) == []


AMOUNTS_USDC = st.decimals(min_value=D("0.0000001"), max_value=D("100000000"), places=7)
AMOUNTS_INR = st.decimals(min_value=D("0.01"), max_value=D("9000000000"), places=2)


@hsettings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), inr_first=st.booleans(), side=st.sampled_from(["sell", "buy"]))
def test_every_quote_passes_aps_checks_or_is_refused_with_a_reason(data, inr_first, side):
    sell_asset, buy_asset = (INR, usdc()) if inr_first else (usdc(), INR)
    asset = sell_asset if side == "sell" else buy_asset
    amount = data.draw(AMOUNTS_INR if asset == INR else AMOUNTS_USDC)
    asked = {"sell_asset": sell_asset, "buy_asset": buy_asset,
             f"{side}_amount": f"{amount:f}"}
    try:
        with override_settings(QUOTE_RATE_URL=""):
            q = quotes.quote(**asked)
    except quotes.QuoteRefused as exc:
        assert exc.status == 422 and side == "sell", exc  # only a sale can miss the fee
        return
    assert ap_accepts(q.as_rate(), asked) == []


def test_a_firm_quote_is_stored_with_our_id_and_its_expiry(rate, settings):
    settings.QUOTE_FIRM_TTL_S = 600
    before = timezone.now()
    response = rate(type="firm", sell_asset=usdc(), buy_asset=INR, sell_amount="250.5",
                    client_id="GSENDINGANCHOR", buy_delivery_method="IMPS", country_code="IN")

    body = response.json()["rate"]
    stored = FirmQuote.objects.get(quote_id=body["id"])
    assert (stored.sell_amount, stored.buy_amount) == (D("250.5"), D(body["buy_amount"]))
    assert (stored.client_id, stored.buy_delivery_method) == ("GSENDINGANCHOR", "IMPS")
    expires = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert expires == stored.expires_at
    assert timedelta(seconds=599) < expires - before < timedelta(seconds=601)
    assert stored.price == D(body["price"]) and stored.fee_total == D(body["fee"]["total"])


def test_expire_after_is_honoured_up_to_the_longest_hold(rate, settings):
    settings.QUOTE_FIRM_TTL_S, settings.QUOTE_FIRM_MAX_TTL_S = 60, 3600
    later = (timezone.now() + timedelta(minutes=30)).replace(microsecond=0)
    wanted = later.isoformat().replace("+00:00", "Z")
    body = rate(type="firm", sell_asset=usdc(), buy_asset=INR, sell_amount="10",
                client_id="GA", expire_after=wanted).json()["rate"]
    assert body["expires_at"] == wanted

    too_late = (timezone.now() + timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    response = rate(type="firm", sell_asset=usdc(), buy_asset=INR, sell_amount="10",
                    client_id="GA", expire_after=too_late)
    assert response.status_code == 400 and "at the latest" in response.json()["error"]
    assert FirmQuote.objects.count() == 1


@pytest.mark.parametrize(("params", "status", "says"), [
    ({"sell_amount": "10", "buy_amount": "800"}, 400, "exactly one"),
    ({}, 400, "exactly one"),
    ({"sell_amount": "10.12345678"}, 422, "more than 7 decimals"),
    ({"sell_amount": "5.00000000"}, 422, "more than 7 decimals"),  # echoed as sent
    ({"sell_amount": "100\n"}, 400, "positive decimal"),
    ({"sell_amount": "10", "type": "firm", "client_id": "G" * 101}, 400,
     "client_id is longer than 100"),
    ({"sell_amount": "10", "type": "firm", "client_id": "GA",
      "buy_delivery_method": "x" * 41}, 400, "buy_delivery_method is longer than 40"),
    ({"sell_amount": "1e5"}, 400, "positive decimal"),
    ({"sell_amount": "-5"}, 400, "positive decimal"),
    ({"sell_amount": "NaN"}, 400, "positive decimal"),
    ({"sell_amount": "0"}, 400, "above 0"),
    ({"sell_amount": "0.50"}, 422, "does not cover the fee"),
    ({"sell_amount": "10", "country_code": "US"}, 422, "IN only"),
    ({"sell_amount": "10", "buy_asset": "iso4217:EUR"}, 422, "against iso4217:INR only"),
    ({"sell_amount": "10", "type": "firm"}, 400, "client_id"),
    ({"sell_amount": "10", "type": "firm", "client_id": "GA", "expire_after": "soon"}, 400,
     "ISO 8601"),
    ({"sell_amount": "10", "type": "best"}, 400, "indicative or firm"),
    ({"sell_amount": "10", "client_id": "G\x00A"}, 400, "NUL"),
])
def test_a_request_that_cannot_be_quoted_gets_a_clear_error_and_stores_nothing(
        rate, params, status, says):
    asked = {"type": "indicative", "sell_asset": usdc(), "buy_asset": INR, **params}
    response = rate(**asked)

    assert response.status_code == status, response.json()
    assert says in response.json()["error"]
    assert not FirmQuote.objects.exists()


def test_without_aps_token_or_with_another_method_nothing_is_quoted():
    assert Client().get("/callbacks/rate", {"type": "indicative"}).status_code == 401
    forged = jwt.encode({"exp": int(time.time()) + 60}, "not-the-secret-" * 3,
                        algorithm="HS256")
    assert Client(HTTP_AUTHORIZATION=f"Bearer {forged}").get(
        "/callbacks/rate", {"type": "indicative"}).status_code == 401
    assert Client().post("/callbacks/rate").status_code == 405  # not a CSRF page


def test_the_quote_uses_the_rate_feed_and_its_moves(rate, settings, sandbox):
    """The sandbox's feed at a fixed moment (``at``: a quarter period, the top of its
    swing, 84.50 * 1.002 = 84.669) is the mid the firm quote is priced and stored with."""
    settings.QUOTE_RATE_URL = f"{sandbox.url}/fx/rates?pair=USDC-INR&at=75"
    body = rate(type="firm", sell_asset=usdc(), buy_asset=INR, sell_amount="100",
                client_id="GA").json()["rate"]

    stored = FirmQuote.objects.get(quote_id=body["id"])
    assert stored.mid_rate == D("84.669")
    assert D(body["buy_amount"]) == (D("99.0049751") * D("84.669") * D("0.995")).quantize(
        D("0.01"), rounding="ROUND_DOWN")
    feed = sandbox.http.get("/fx/rates", params={"pair": "USDC-INR", "at": 225}).json()
    assert feed["mid"] == "84.3310"  # three quarters: the bottom of the swing
    for at in ("1e20", "-1e12", "nan", "inf", "soon"):
        assert sandbox.http.get("/fx/rates", params={"at": at}).status_code == 400


def test_with_the_rate_source_down_the_answer_is_503_and_nothing_is_stored(rate, settings):
    settings.QUOTE_RATE_URL = f"http://127.0.0.1:{free_port()}/fx/rates"
    settings.HTTP_TIMEOUT_S = 1
    response = rate(type="firm", sell_asset=usdc(), buy_asset=INR, sell_amount="100",
                    client_id="GA")

    assert response.status_code == 503 and "no exchange rate" in response.json()["error"]
    assert not FirmQuote.objects.exists()


# --- a firm quote honoured: exactly, once, before it expires ----------------------------

def _use(quote: FirmQuote, tx: str = "tx-1", amount: Decimal | None = None,
         owner: str | None = None):
    return quotes.use_firm_quote(quote.quote_id, transaction_id=tx,
                                 owner=quote.client_id if owner is None else owner,
                                 sell_asset=quote.sell_asset, buy_asset=quote.buy_asset,
                                 sell_amount=quote.sell_amount if amount is None else amount)


def test_a_firm_quote_is_used_once_for_its_exact_amount():
    quote = FirmQuoteFactory()

    with pytest.raises(quotes.QuoteRefused, match="is for 100"):
        _use(quote, amount=D("100.0000001"))
    used = _use(quote)
    assert (used.transaction_id, used.buy_amount) == ("tx-1", D("8323.67"))
    with pytest.raises(quotes.QuoteRefused, match="was used by tx-1"):
        _use(quote, tx="tx-2")
    with pytest.raises(quotes.QuoteRefused, match="not one of Corridor's"):
        quotes.use_firm_quote("q-unknown", transaction_id="tx-3", owner="GA", sell_asset=usdc(),
                              buy_asset=INR, sell_amount=D("100"))


def test_a_firm_quote_is_redeemed_only_by_the_party_it_was_given_to():
    """SEP31-RECEIVE.md §10 item 3 (AP #2019): the owner is checked when the quote is
    used, not only when AP stored it."""
    quote = FirmQuoteFactory()

    for stranger in ("GSOMEONEELSE", ""):
        with pytest.raises(quotes.QuoteRefused, match="given to another party"):
            _use(quote, owner=stranger)
    assert FirmQuote.objects.get(pk=quote.pk).used_at is None
    assert _use(quote).transaction_id == "tx-1"


def test_an_expired_firm_quote_is_refused():
    quote = FirmQuoteFactory(expires_at=timezone.now() - timedelta(milliseconds=1))

    with pytest.raises(quotes.QuoteRefused, match="expired"):
        _use(quote)
    assert FirmQuote.objects.get(pk=quote.pk).used_at is None


def test_two_flows_racing_for_one_firm_quote_one_wins():
    quote = FirmQuoteFactory()
    barrier, outcomes = threading.Barrier(2), []

    def take(tx):
        try:
            barrier.wait(5)
            outcomes.append(_use(quote, tx=tx).transaction_id)
        except quotes.QuoteRefused as exc:
            outcomes.append(str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(f"tx-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)

    winners = [o for o in outcomes if o.startswith("tx-")]
    assert len(winners) == 1 and len(outcomes) == 2, outcomes
    assert FirmQuote.objects.get(pk=quote.pk).transaction_id == winners[0]


# --- through the sandbox AP: a wallet's SEP-38 calls reach GET /rate ------------------

def _wallet_token(sandbox) -> tuple[str, dict]:
    account = Keypair.random().public_key
    token = sandbox.http.post("/ap/sep/sandbox-token", json={"account": account}).json()["token"]
    return account, {"Authorization": f"Bearer {token}"}


def test_a_wallets_firm_quote_through_ap_is_ours_and_only_its_creators(sandbox):
    account, auth = _wallet_token(sandbox)
    response = sandbox.http.post("/ap/sep/sep38/quote", headers=auth, json={
        "sell_asset": usdc(), "buy_asset": INR, "sell_amount": "100", "context": "sep31"})

    assert response.status_code == 201, response.text
    body = response.json()
    stored = FirmQuote.objects.get(quote_id=body["id"])  # AP keeps the id we gave
    assert stored.client_id == account and stored.sell_amount == D("100")
    assert (body["sell_amount"], body["buy_amount"]) == ("100.0000000",
                                                         f"{stored.buy_amount:.2f}")
    assert D(body["total_price"]) == (D(100) / stored.buy_amount).quantize(D("1e-10"))
    assert body["fee"]["asset"] == usdc()
    assert sandbox.http.get(f"/ap/sep/sep38/quote/{body['id']}", headers=auth).json() == body
    _, other = _wallet_token(sandbox)
    assert sandbox.http.get(f"/ap/sep/sep38/quote/{body['id']}",
                            headers=other).status_code == 404
    # AP publishes quote_created; Corridor records it and has nothing to do.
    from anchor.models import InboundEvent
    from tests.flows import wait_for

    event = wait_for(lambda: InboundEvent.objects.filter(event_type="quote_created").first(),
                     timeout=15, what="quote_created delivered")
    assert event.outcome == "ignored"


def test_prices_and_price_through_ap(sandbox):
    _, auth = _wallet_token(sandbox)
    prices = sandbox.http.get("/ap/sep/sep38/prices", params={
        "sell_asset": usdc(), "sell_amount": "100"}).json()
    assert [(p["asset"], p["decimals"]) for p in prices["buy_assets"]] == [(INR, 2)]

    price = sandbox.http.get("/ap/sep/sep38/price", headers=auth, params={
        "sell_asset": usdc(), "buy_asset": INR, "buy_amount": "8000", "context": "sep31"})
    assert price.status_code == 200, price.text
    assert price.json()["buy_amount"] == "8000.00"
    wrong = sandbox.http.get("/ap/sep/sep38/price", params={
        "sell_asset": usdc(), "buy_asset": INR, "buy_amount": "8000", "context": "sep24"})
    assert (wrong.status_code, wrong.json()["error"]) == (
        400, "Unsupported context. Should be one of [sep6, sep31].")
    assert not FirmQuote.objects.exists()  # indicative all along


def test_ap_refuses_a_long_delivery_method_and_a_nul_quote_id_cleanly(sandbox):
    _, auth = _wallet_token(sandbox)
    response = sandbox.http.post("/ap/sep/sep38/quote", headers=auth, json={
        "sell_asset": usdc(), "buy_asset": INR, "sell_amount": "100", "context": "sep31",
        "buy_delivery_method": "x" * 41})
    assert response.status_code == 400 and "delivery method" in response.json()["error"]
    assert sandbox.http.get("/ap/sep/sep38/quote/a%00b", headers=auth).status_code == 404
    assert not FirmQuote.objects.exists()


def test_our_refusal_reaches_the_wallet_as_a_400_with_our_reason(sandbox):
    _, auth = _wallet_token(sandbox)
    response = sandbox.http.post("/ap/sep/sep38/quote", headers=auth, json={
        "sell_asset": usdc(), "buy_asset": INR, "sell_amount": "0.4", "context": "sep31"})

    assert response.status_code == 400
    assert "does not cover the fee" in response.json()["error"]


def test_with_a_10_decimal_price_ap_refuses_the_answer_with_a_502(sandbox, monkeypatch,
                                                                   settings):
    """The 24 decimals of ``price`` are what makes AP's rule 5 hold: cut to 10 (the
    protection off), the quote of 100 USDC at the feed's 84.669 (pinned: whether 10
    decimals miss depends on the rate) misses by 3.8e-7, over 1e-7, and AP answers 502."""
    settings.QUOTE_RATE_URL = f"{sandbox.url}/fx/rates?pair=USDC-INR&at=75"
    monkeypatch.setattr(quotes, "PRICE_DECIMALS", 10)
    _, auth = _wallet_token(sandbox)
    response = sandbox.http.post("/ap/sep/sep38/quote", headers=auth, json={
        "sell_asset": usdc(), "buy_asset": INR, "sell_amount": "100", "context": "sep31"})

    assert response.status_code == 502, response.text
    assert "rate.price" in response.json()["error"]
