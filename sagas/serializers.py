"""Request validation and response shapes of the remittance API (sagas/api.py).

Amounts are decimal strings (never JSON numbers: a float cannot carry money), plain
digits with at most the asset's decimal places (USDC: 7, Stellar's precision), no sign,
no exponent, above zero and within REMITTANCE_MIN_USDC..REMITTANCE_MAX_USDC."""

from __future__ import annotations

import re
from decimal import Decimal

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from sagas.remittances import CORRIDORS

_PLAIN_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_ACCOUNT_NUMBER = re.compile(r"^[0-9]{9,18}$")
_IFSC = re.compile(r"^[A-Z]{4}0[A-Z0-9]{6}$")


@extend_schema_field({"type": "string", "pattern": _PLAIN_DECIMAL.pattern, "example": "25.50"})
class DecimalString(serializers.Field):
    """A positive amount as a decimal string with at most ``places`` decimals."""

    default_error_messages = {
        "type": "must be a decimal string such as \"25.50\", not a JSON {kind}",
        "format": "must be plain digits with an optional decimal point (no sign, no "
                  "exponent, no spaces)",
        "places": "has more than {places} decimal places",
        "positive": "must be greater than zero",
    }

    def __init__(self, *, places: int, **kwargs):
        self.places = places
        super().__init__(**kwargs)

    def to_internal_value(self, data) -> Decimal:
        if not isinstance(data, str):
            self.fail("type", kind=type(data).__name__)
        if not _PLAIN_DECIMAL.fullmatch(data):
            self.fail("format")
        value = Decimal(data)
        if -value.as_tuple().exponent > self.places:
            self.fail("places", places=self.places)
        if value <= 0:
            self.fail("positive")
        return value

    def to_representation(self, value) -> str:
        return format(value, "f")


class BeneficiarySerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    account_number = serializers.RegexField(
        _ACCOUNT_NUMBER, error_messages={"invalid": "must be 9 to 18 digits"})
    ifsc = serializers.RegexField(
        _IFSC, error_messages={"invalid": "must be an IFSC such as HDFC0001234"})


class RemittanceRequestSerializer(serializers.Serializer):
    """``POST /api/remittances``: pay ``amount`` USDC (sent by the partner on Stellar)
    to ``beneficiary`` in INR, on ``corridor`` ``USDC-INR``."""

    amount = DecimalString(places=7, help_text="USDC the partner sends, e.g. \"25.50\"")
    send_currency = serializers.CharField(max_length=12)
    receive_currency = serializers.CharField(max_length=12)
    corridor = serializers.CharField(max_length=32)
    beneficiary = BeneficiarySerializer()

    def validate(self, attrs):
        corridor = CORRIDORS.get(attrs["corridor"])
        if corridor is None:
            raise serializers.ValidationError(
                {"corridor": f"unknown corridor; known: {', '.join(sorted(CORRIDORS))}"})
        if attrs["send_currency"] != corridor.send:
            raise serializers.ValidationError(
                {"send_currency": f"corridor {corridor.code} sends {corridor.send}"})
        if attrs["receive_currency"] != corridor.receive:
            raise serializers.ValidationError(
                {"receive_currency": f"corridor {corridor.code} pays {corridor.receive}"})
        amount = attrs["amount"]
        if -amount.as_tuple().exponent > corridor.send_places:
            raise serializers.ValidationError(
                {"amount": f"has more than {corridor.send_places} decimal places"})
        if not settings.REMITTANCE_MIN_USDC <= amount <= settings.REMITTANCE_MAX_USDC:
            raise serializers.ValidationError(
                {"amount": f"must be between {settings.REMITTANCE_MIN_USDC} and "
                           f"{settings.REMITTANCE_MAX_USDC} {corridor.send}"})
        return attrs


class QuoteSerializer(serializers.Serializer):
    rate = serializers.CharField(help_text="INR per USDC, locked at creation")
    receive_amount = serializers.CharField()
    receive_currency = serializers.CharField()


class RemittanceCreatedSerializer(serializers.Serializer):
    """The 202 answer: how to fund the remittance."""

    id = serializers.IntegerField()
    status = serializers.CharField()
    reference = serializers.CharField()
    hub_account = serializers.CharField(help_text="pay the USDC to this Stellar account")
    memo_type = serializers.CharField()
    memo = serializers.CharField(help_text="with this memo (the reference)")
    amount = serializers.CharField()
    asset_code = serializers.CharField()
    asset_issuer = serializers.CharField()
    corridor = serializers.CharField()
    quote = QuoteSerializer()
    fund_by = serializers.DateTimeField()
    beneficiary = serializers.DictField()


class StepSerializer(serializers.Serializer):
    idx = serializers.IntegerField()
    kind = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    undo_attempts = serializers.IntegerField()
    error = serializers.CharField()
    output = serializers.DictField(allow_null=True)
    undo_output = serializers.DictField(allow_null=True)


class PostingSerializer(serializers.Serializer):
    account = serializers.CharField()
    currency = serializers.CharField()
    amount = serializers.CharField()


class BookingSerializer(serializers.Serializer):
    kind = serializers.CharField()
    reference = serializers.CharField()
    idempotency_key = serializers.CharField()
    created_at = serializers.DateTimeField()
    postings = PostingSerializer(many=True)


class RemittanceSerializer(RemittanceCreatedSerializer):
    """``GET /api/remittances/{id}``."""

    error = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    steps = StepSerializer(many=True)
    bookings = BookingSerializer(many=True)


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
