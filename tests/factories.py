"""factory-boy factories: one per model of anchor, payouts, sagas and ledger
(tests/test_structure.py checks that none is missing). The sandbox's world is made
over HTTP, never here.

Each factory makes a plausible row that satisfies the table's constraints, with unique
values where the table wants them; a test sets the fields its case is about. Use them
for fixture rows; where the code under test is what writes a row, call that code.
Amounts are Decimal (USDC 7 dp, INR 2 dp) or integer paise, as in the models."""

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import factory
from django.utils import timezone

from anchor import pii
from anchor.models import (
    ApTransactionEvent,
    Customer,
    CustomerDenial,
    CustomerEvent,
    CustomerFile,
    CustomerVolume,
    DepositOrder,
    DepositPayment,
    DepositRefund,
    DepositRelease,
    FirmQuote,
    InboundEvent,
    InteractiveSubmission,
    ReleaseEvent,
    SourceAccount,
)
from anchor.quotes import usdc_asset
from ledger.models import Account, BalanceDelta, Entry, Posting
from payouts.models import (
    ChainCursor,
    FundAccountValidation,
    PayoutAttempt,
    PayoutEvent,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from sagas.models import HubPayment, Partner, Saga, SagaEvent, SagaStep
from treasury.models import Break, BreakEvent, ReconRun

ACCOUNT_A = "GBRJQ2TQDQ2MNW7NHYI7CLJVZ45CJA3KRXDUGERNVHWUWUFPNTRSXQXL"
ACCOUNT_B = "GCGNS3DUYOYI6EBQ56NX5RV7VMOWV3RG2ZSRPJA23M3VQ2EU7BYP4WQF"


def _uuid() -> str:
    return str(uuid.uuid4())


def _hash() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


# --- anchor ----------------------------------------------------------------------------

class DepositOrderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DepositOrder

    transaction_id = factory.LazyFunction(_uuid)
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
    transaction_id = factory.LazyFunction(_uuid)
    amount_paise = 100000
    currency = "INR"
    captured_at = factory.LazyFunction(lambda: datetime.now(UTC))


class DepositRefundFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DepositRefund

    transaction_id = factory.LazyFunction(_uuid)
    status = DepositRefund.Status.COMPLETED
    payment_id = factory.Sequence(lambda n: f"pay_{n:014d}")
    amount_paise = 100000
    currency = "INR"
    receipt = factory.LazyAttribute(lambda o: o.transaction_id[:40])
    idempotency_key = factory.LazyFunction(lambda: f"dr-{uuid.uuid4()}")
    refund_id = factory.Sequence(lambda n: f"rfnd_{n:014d}")
    provider_status = "processed"
    trigger = DepositRefund.Trigger.OPERATOR
    reason = "operator: the customer cancelled"
    operator = "operator"


class DepositReleaseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DepositRelease

    transaction_id = factory.LazyFunction(_uuid)
    status = DepositRelease.Status.COMPLETED
    destination = ACCOUNT_A
    asset_code = "USDC"
    asset_issuer = ACCOUNT_A
    amount = Decimal("11.5294117")
    source_account = ACCOUNT_B
    sequence = factory.Sequence(lambda n: 1000 + n)
    envelope_xdr = "AAAA"
    tx_hash = factory.LazyFunction(_hash)
    max_time = factory.LazyFunction(lambda: datetime.now(UTC))


class ReleaseEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ReleaseEvent

    release = factory.SubFactory(DepositReleaseFactory)
    event = "release.redrive"
    operator = "alice"
    note = "ticket OPS-42: checked with the bank"


class InboundEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = InboundEvent

    source = InboundEvent.Source.RAZORPAY
    event_id = factory.Sequence(lambda n: f"evt_{n:014d}")
    event_type = "payment.captured"


class CustomerFactory(factory.django.DjangoModelFactory):
    """A SEP-31 receiver, complete and accepted by the automatic checks."""

    class Meta:
        model = Customer

    account = ACCOUNT_A
    memo = factory.Sequence(str)
    memo_type = "id"
    type = "sep31-receiver"
    data = factory.LazyFunction(lambda: pii.seal_json(
        {"first_name": "Asha", "last_name": "Rao", "bank_account_number": "50100123456789",
         "bank_number": "HDFC0001234"}))
    provided = ["bank_account_number", "bank_number", "first_name", "last_name"]


class CustomerFileFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CustomerFile

    customer = factory.SubFactory(CustomerFactory)
    field = "photo_id_front"
    content_type = "image/jpeg"
    size = 4
    sha256 = "0" * 64
    data = factory.LazyFunction(lambda: pii.seal(b"\xff\xd8\xff\xe0"))


class CustomerEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CustomerEvent

    customer = factory.SubFactory(CustomerFactory)
    event = "created"


class SourceAccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SourceAccount

    address = factory.Sequence(lambda n: "G" + f"{n:055d}")


class ApTransactionEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ApTransactionEvent

    transaction_id = factory.LazyFunction(_uuid)
    kind = "deposit"
    event = "ap.expired"
    operator = "alice"
    note = "ticket OPS-42: checked with the bank"


class InteractiveSubmissionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = InteractiveSubmission

    transaction_id = factory.LazyFunction(_uuid)
    kind = InteractiveSubmission.Kind.DEPOSIT
    lease_until = factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=30))
    amount_in = Decimal("1000.00")


class FirmQuoteFactory(factory.django.DjangoModelFactory):
    """100 USDC sold for INR at 84.0775 (84.50 less 50 bps), 1.00 USDC of fees."""

    class Meta:
        model = FirmQuote

    quote_id = factory.LazyFunction(_uuid)
    client_id = ACCOUNT_A
    sell_asset = factory.LazyFunction(usdc_asset)
    buy_asset = "iso4217:INR"
    sell_amount = Decimal("100")
    buy_amount = Decimal("8323.67")
    price = Decimal("0.011893791009")
    fee_total = Decimal("1.0000000")
    fee_asset = factory.SelfAttribute("sell_asset")
    fee_details = factory.LazyFunction(lambda: [
        {"name": "Service fee", "description": "fixed fee per exchange", "amount": "0.5"}])
    mid_rate = Decimal("84.50")
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=10))


# --- payouts ---------------------------------------------------------------------------

class WithdrawalRequestFactory(factory.django.DjangoModelFactory):
    """10 USDC in, 0.5 fee, at 84 INR: 798.00 INR (79800 paise) to a bank account."""

    class Meta:
        model = WithdrawalRequest

    transaction_id = factory.LazyFunction(_uuid)
    amount_in = Decimal("10")
    fee = Decimal("0.5")
    amount_out = Decimal("798.00")
    amount_out_paise = 79800
    rate = Decimal("84")
    beneficiary_type = "bank_account"
    beneficiary_display = "Asha Verma ****6789"
    contact_id = "cont_1"
    fund_account_id = "fa_1"
    memo = factory.Sequence(lambda n: str(4200 + n))
    memo_type = "id"


class WithdrawalPayoutFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WithdrawalPayout

    transaction_id = factory.LazyFunction(_uuid)
    amount_paise = 79800
    fund_account_id = "fa_1"


class PayoutAttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PayoutAttempt

    payout = factory.SubFactory(WithdrawalPayoutFactory)
    number = 1
    idempotency_key = factory.LazyFunction(uuid.uuid4)
    provider_payout_id = factory.Sequence(lambda n: f"pout_{n:014d}")


class StellarReceiptFactory(factory.django.DjangoModelFactory):
    """10 USDC to ``ACCOUNT_B`` under memo id 4242, just now."""

    class Meta:
        model = StellarReceipt

    paging_token = factory.Sequence(lambda n: str(100000 + n))
    tx_hash = factory.LazyFunction(_hash)
    from_account = ACCOUNT_A
    to_account = ACCOUNT_B
    asset = f"USDC:{ACCOUNT_A}"
    amount = Decimal("10")
    memo_type = "id"
    memo = "4242"
    created_at = factory.LazyFunction(timezone.now)


class ChainCursorFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ChainCursor

    account = factory.Sequence(lambda n: "G" + f"{n:055d}")


class PayoutEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PayoutEvent

    payout = factory.SubFactory(WithdrawalPayoutFactory)
    transaction_id = factory.LazyAttribute(lambda o: o.payout.transaction_id if o.payout
                                           else _uuid())
    event = "payout.confirm_paid"
    operator = "alice"
    note = "ticket OPS-42: checked with the bank"


class WithdrawalRefundFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WithdrawalRefund

    request = factory.SubFactory(WithdrawalRequestFactory)
    transaction_id = factory.LazyAttribute(lambda o: o.request.transaction_id if o.request
                                           else _uuid())
    destination = ACCOUNT_A
    amount = Decimal("9.5")
    source_account = ACCOUNT_B
    sequence = factory.Sequence(lambda n: 7 + n)
    envelope_xdr = "AAAA"
    tx_hash = factory.LazyFunction(_hash)
    max_time = factory.LazyFunction(timezone.now)


# --- sagas -----------------------------------------------------------------------------

class SagaFactory(factory.django.DjangoModelFactory):
    """A saga row as written, not as ``engine.start`` makes one: for fixture rows."""

    class Meta:
        model = Saga

    kind = "testing"
    reference = factory.Sequence(lambda n: f"saga-ref-{n}")
    input = factory.LazyFunction(lambda: {"amount": "10.00"})


class SagaStepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SagaStep

    saga = factory.SubFactory(SagaFactory)
    idx = factory.Sequence(int)
    kind = "test.fill"


class SagaEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = SagaEvent

    saga = factory.SubFactory(SagaFactory)
    event = "saga.started"


class PartnerFactory(factory.django.DjangoModelFactory):
    """A partner whose API key is ``factory_key`` (``{key_prefix}.secret``): pass the
    key to the API as the partner would."""

    class Meta:
        model = Partner
        exclude = ("factory_key",)

    name = factory.Sequence(lambda n: f"partner-{n}")
    key_prefix = factory.Sequence(lambda n: f"pk{n:010d}")
    factory_key = factory.LazyAttribute(lambda o: f"{o.key_prefix}.secret")
    key_hash = factory.LazyAttribute(lambda o: hashlib.sha256(o.factory_key.encode())
                                     .hexdigest())
    stellar_account = ACCOUNT_A


class HubPaymentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = HubPayment

    saga = factory.SubFactory(SagaFactory)
    key = factory.LazyAttribute(lambda o: f"{o.saga.id}:0")
    destination = ACCOUNT_A
    amount = Decimal("10")
    memo_type = "id"
    memo = "4242"
    sequence = factory.Sequence(lambda n: 1000 + n)
    max_time = factory.LazyFunction(lambda: int(timezone.now().timestamp()) + 30)
    envelope_xdr = "AAAA"
    tx_hash = factory.LazyFunction(_hash)


# --- ledger ----------------------------------------------------------------------------

class AccountFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Account

    code = factory.Sequence(lambda n: f"test:{n}")
    currency = "USDC"


class PostingFactory(factory.django.DjangoModelFactory):
    """One posting. An entry must sum to zero per currency at commit (a deferred
    constraint trigger), so a lone posting only stands inside a test transaction that
    rolls back; use ``EntryFactory`` for a balanced entry."""

    class Meta:
        model = Posting

    entry = factory.SubFactory("tests.factories.EntryFactory", postings=False)
    account = factory.SubFactory(AccountFactory)
    amount = Decimal("1")


class BalanceDeltaFactory(factory.django.DjangoModelFactory):
    """A hot account's unrolled delta written directly (the trigger writes the real
    ones): with no posting behind it, the trial balance reports it as drift."""

    class Meta:
        model = BalanceDelta

    account = factory.SubFactory(AccountFactory, hot=True)
    amount = Decimal("1")


class EntryFactory(factory.django.DjangoModelFactory):
    """A balanced entry: ``postings__amount`` (default 1, in the accounts' currency) from
    ``postings__debit`` to ``postings__credit`` (new accounts unless given);
    ``postings=False`` makes it without postings."""

    class Meta:
        model = Entry
        skip_postgeneration_save = True  # entries are immutable (ledger_refuse_change)

    idempotency_key = factory.Sequence(lambda n: f"test-entry-{n}")
    kind = "test"

    @factory.post_generation
    def postings(self, create, extracted, **kwargs):
        if not create or extracted is False:
            return
        amount = Decimal(kwargs.get("amount", "1"))
        debit = kwargs.get("debit") or AccountFactory()
        credit = kwargs.get("credit") or AccountFactory(currency=debit.currency)
        Posting.objects.bulk_create([Posting(entry=self, account=debit, amount=amount),
                                     Posting(entry=self, account=credit, amount=-amount)])


class FundAccountValidationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = FundAccountValidation

    fund_account_id = factory.Sequence(lambda n: f"fa_{n:014d}")
    reference = factory.LazyAttribute(lambda o: f"fav-{o.fund_account_id}")


class CustomerVolumeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CustomerVolume

    transaction_id = factory.Sequence(lambda n: f"tx-{n:08d}")
    customer = factory.SubFactory(CustomerFactory)
    kind = "deposit"
    amount_inr = Decimal("1000.00")


class CustomerDenialFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CustomerDenial

    identity = factory.Sequence(lambda n: f"{n:064x}")
    customer_id = "cus_000000000000000000000000"
    reason = "sanctions"


class ReconRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ReconRun

    day = factory.LazyFunction(lambda: timezone.now().date())
    status = ReconRun.Status.DONE


class BreakFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Break

    key = factory.Sequence(lambda n: f"razorpay:missing_outside:pay_{n:014d}")
    source = Break.Source.RAZORPAY
    kind = Break.Kind.MISSING_OUTSIDE
    reference = factory.Sequence(lambda n: f"pay_{n:014d}")
    account = "razorpay:pending"
    currency = "INR"
    difference = Decimal("-1000.00")
    first_run = factory.SubFactory(ReconRunFactory)
    last_run = factory.SelfAttribute("first_run")


class BreakEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = BreakEvent

    break_row = factory.SubFactory(BreakFactory)
    action = "fix"
    operator = "rita"
    note = "ticket OPS-42"
