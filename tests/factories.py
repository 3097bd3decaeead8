"""factory-boy factories for Corridor's own tables (the sandbox's world is made over
HTTP, never here)."""

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import factory

from anchor.models import DepositOrder, DepositPayment, DepositRelease


class DepositOrderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DepositOrder

    transaction_id = factory.LazyFunction(lambda: str(uuid.uuid4()))
    order_id = factory.Sequence(lambda n: f"order_{n:014d}")
    amount_in = Decimal("1000.00")
    amount_in_paise = 100000
    fee = Decimal("20.00")
    amount_out = Decimal("11.5294117")
    rate = Decimal("85.00")


class DepositPaymentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DepositPayment

    payment_id = factory.Sequence(lambda n: f"pay_{n:014d}")
    order_id = factory.Sequence(lambda n: f"order_{n:014d}")
    transaction_id = factory.LazyFunction(lambda: str(uuid.uuid4()))
    amount_paise = 100000
    currency = "INR"
    captured_at = factory.LazyFunction(lambda: datetime.now(UTC))


class DepositReleaseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DepositRelease

    transaction_id = factory.LazyFunction(lambda: str(uuid.uuid4()))
    status = DepositRelease.Status.COMPLETED
    destination = "GBRJQ2TQDQ2MNW7NHYI7CLJVZ45CJA3KRXDUGERNVHWUWUFPNTRSXQXL"
    asset_code = "USDC"
    asset_issuer = "GBRJQ2TQDQ2MNW7NHYI7CLJVZ45CJA3KRXDUGERNVHWUWUFPNTRSXQXL"
    amount = Decimal("11.5294117")
    source_account = "GCGNS3DUYOYI6EBQ56NX5RV7VMOWV3RG2ZSRPJA23M3VQ2EU7BYP4WQF"
    sequence = factory.Sequence(lambda n: 1000 + n)
    envelope_xdr = "AAAA"
    tx_hash = factory.LazyFunction(lambda: uuid.uuid4().hex + uuid.uuid4().hex)
    max_time = factory.LazyFunction(lambda: datetime.now(UTC))
