"""Pure rules of the deposit side: money conversions, quotes, input parsing,
webhook signatures over raw bytes, interactive tokens."""

import json
import time
from decimal import Decimal

import jwt
import pytest

from anchor import deposits, sep24
from anchor import razorpay as rzp
from tests.conftest import reference_path


@pytest.mark.parametrize(("rupees", "paise"), [
    ("0.29", 29), ("1.15", 115), ("4.35", 435), ("19.99", 1999), ("1187", 118700),
])
def test_rupees_to_paise_is_exact_where_float_is_not(rupees, paise):
    # razorpay/NOTES.md §5 bug 10: int(x * 100) on floats gives 28, 114, 434, 1998.
    assert rzp.rupees_to_paise(Decimal(rupees)) == paise
    assert rzp.paise_to_rupees(paise) == Decimal(rupees).quantize(Decimal("0.01"))


def test_fraction_of_a_paisa_is_refused():
    with pytest.raises(ValueError):
        rzp.rupees_to_paise(Decimal("10.005"))


@pytest.mark.parametrize("raw", ["", "abc", "1e3", "-100", "100.001", "1.2.3", "0x10", ".",
                                 "9" * 30, "1000000000000000000000000000.5", "NaN"])
def test_parse_inr_refuses_bad_amounts_with_a_message(raw):
    with pytest.raises(deposits.DepositInputError) as excinfo:
        deposits.parse_inr(raw)
    assert str(excinfo.value)


def test_parse_inr_enforces_limits(settings):
    settings.DEPOSIT_MIN_INR = Decimal("100")
    settings.DEPOSIT_MAX_INR = Decimal("1000")
    with pytest.raises(deposits.DepositInputError, match="minimum"):
        deposits.parse_inr("99.99")
    with pytest.raises(deposits.DepositInputError, match="maximum"):
        deposits.parse_inr("1000.01")
    assert deposits.parse_inr("1,000.00") == Decimal("1000.00")


def test_quote_rounds_fee_half_up_and_usdc_down(settings):
    settings.DEPOSIT_RATE_INR_PER_USDC = Decimal("85.00")
    settings.DEPOSIT_FEE_PERCENT = Decimal("1.0")
    settings.DEPOSIT_FEE_FIXED_INR = Decimal("10.00")

    q = deposits.quote(Decimal("1000.00"))

    assert q.fee == Decimal("20.00")
    assert q.amount_out == Decimal("11.5294117")  # 980 / 85 = 11.52941176... rounded down
    assert q.amount_out * q.rate <= q.amount_in - q.fee


def _webhook_vectors():
    path = reference_path("razorpay", "signature_vectors.json")
    return json.loads(path.read_text())["webhook_signature"], path.parent


def test_webhook_signature_vectors_verify_over_raw_bytes(settings):
    vectors, folder = _webhook_vectors()
    settings.RAZORPAY_WEBHOOK_PREVIOUS_SECRET = ""
    exact = next(v for v in vectors if v["name"] == "sdk_body_exact_bytes")
    body = (folder / exact["body_file"]).read_bytes()
    settings.RAZORPAY_WEBHOOK_SECRET = exact["secret"]

    assert rzp.verify_webhook(body, exact["expected_hex"])
    # Re-serialised or trimmed bodies must not pass with the original signature.
    for name in ("trailing_newline_stripped", "reserialised_compact"):
        other = next(v for v in vectors if v["name"] == name)
        assert not rzp.verify_webhook(other["body"].encode(), exact["expected_hex"]), name
        assert rzp.verify_webhook(other["body"].encode(), other["expected_hex"]), name


def test_non_ascii_bodies_verify_only_with_their_own_signature(settings):
    vectors, _ = _webhook_vectors()
    literal = next(v for v in vectors if v["name"] == "synthetic_utf8_literal")
    escaped = next(v for v in vectors if v["name"] == "synthetic_utf8_escaped")
    settings.RAZORPAY_WEBHOOK_SECRET = literal["secret"]

    assert rzp.verify_webhook(literal["body"].encode("utf-8"), literal["expected_hex"])
    assert rzp.verify_webhook(escaped["body"].encode("utf-8"), escaped["expected_hex"])
    assert not rzp.verify_webhook(escaped["body"].encode("utf-8"), literal["expected_hex"])


def test_previous_webhook_secret_is_accepted_during_rotation(settings):
    import hashlib
    import hmac

    body = b'{"event":"payment.captured"}'
    old = hmac.new(b"old-secret", body, hashlib.sha256).hexdigest()
    settings.RAZORPAY_WEBHOOK_SECRET = "new-secret"
    settings.RAZORPAY_WEBHOOK_PREVIOUS_SECRET = ""
    assert not rzp.verify_webhook(body, old)
    settings.RAZORPAY_WEBHOOK_PREVIOUS_SECRET = "old-secret"
    assert rzp.verify_webhook(body, old)


def _token(secret, **claims):
    base = {"jti": "tx-1", "sub": "GABC", "exp": int(time.time()) + 600}
    base.update(claims)
    return jwt.encode(base, secret, algorithm="HS256")


def test_interactive_token_checks_signature_expiry_and_jti(settings):
    secret = settings.AP_INTERACTIVE_JWT_SECRET
    assert sep24.verify_interactive_token(_token(secret), "tx-1")["sub"] == "GABC"
    with pytest.raises(sep24.TokenError, match="expired"):
        sep24.verify_interactive_token(_token(secret, exp=int(time.time()) - 60), "tx-1")
    with pytest.raises(sep24.TokenError, match="not signed by the anchor"):
        sep24.verify_interactive_token(_token("another-secret-of-32-bytes-xxxxxxxxxx"), "tx-1")
    with pytest.raises(sep24.TokenError, match="another transaction"):
        sep24.verify_interactive_token(_token(secret), "tx-2")
    with pytest.raises(sep24.TokenError):
        sep24.verify_interactive_token(_token(secret, jti=None), "tx-1")
