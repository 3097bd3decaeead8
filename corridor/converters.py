"""URL converters for path parameters that name a row: the value must be storable text
no longer than the column it is looked up in (corridor/inbound.py ``path_text``), or
the URL does not match and the request is a 404 (corridor/views.py ``not_found``:
the SEP-24 error page under ``/sep24/``, JSON elsewhere). Without this a ``%00`` in
``/sep24/checkout/<order_id>`` reached psycopg and became a 500.

Registered once, when this module is imported (the apps' urls.py import it):
``<deposit_id:...>`` (an AP deposit id, ``DepositOrder.transaction_id``),
``<withdrawal_id:...>`` (``WithdrawalRequest.transaction_id``), ``<ap_transaction_id:...>``
(any AP transaction id, ``DepositRelease.transaction_id``) and ``<razorpay_order_id:...>``
(``DepositOrder.order_id``)."""

from __future__ import annotations

from django.apps import apps
from django.urls import register_converter

from corridor import inbound


class FieldConverter:
    """Matches one path segment that fits ``model_label``.``field``."""

    regex = "[^/]+"
    model_label = ""
    field = ""

    def to_python(self, value: str) -> str:
        model = apps.get_model(self.model_label)
        try:
            return inbound.path_text(value, max_length=inbound.max_length(model, self.field))
        except inbound.InboundError as exc:
            raise ValueError(str(exc)) from None  # Django: no match, 404

    def to_url(self, value: str) -> str:
        return str(value)


class DepositIdConverter(FieldConverter):
    model_label = "anchor.DepositOrder"
    field = "transaction_id"


class WithdrawalIdConverter(FieldConverter):
    model_label = "payouts.WithdrawalRequest"
    field = "transaction_id"


class ApTransactionIdConverter(FieldConverter):
    model_label = "anchor.DepositRelease"
    field = "transaction_id"


class RazorpayOrderIdConverter(FieldConverter):
    model_label = "anchor.DepositOrder"
    field = "order_id"


register_converter(DepositIdConverter, "deposit_id")
register_converter(WithdrawalIdConverter, "withdrawal_id")
register_converter(ApTransactionIdConverter, "ap_transaction_id")
register_converter(RazorpayOrderIdConverter, "razorpay_order_id")
