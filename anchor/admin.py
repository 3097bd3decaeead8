"""Operator console, deposit side (DESIGN.md §1 "Operators"), and "expire in AP" (the
action a deposit order and a withdrawal request both offer). The pieces every console
action shares are in ``common.console``.

Read views: releases with their chain evidence (the stored envelope and hash, looked up
on Horizon when the page opens) and their audit rows, deposit orders and payments, the
inbound-event log, the release and AP-transaction audit logs.

Actions stay thin (STYLE.md): ``common.console.confirm_action`` shows the confirmation
page (what will happen, the evidence, a refusal if the service would refuse now, and a
form with the operator's note), then calls one service of ``anchor.operations`` /
``payouts.operations`` / ``sagas.operations`` and reports with a message. Each action
handles exactly one row: every case is a decision of its own. Every action declares
its permission (``@admin.action(permissions=[...])``), so a person without it never
sees it and a forged POST is answered "No action selected" without running anything.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from anchor import customers, operations, pii, releases, stellar
from anchor.models import (
    Customer,
    CustomerEvent,
    CustomerFile,
    DepositOrder,
    DepositPayment,
    DepositRefund,
    DepositRelease,
    InboundEvent,
    ReleaseEvent,
    SourceAccount,
)
from common.console import NoteForm, ReadOnlyAdmin, ReadOnlyInline, confirm_action, shown

# --- expire in AP (payouts/admin.py serves the page) -------------------------------

def expire_url(transaction_id: str) -> str:
    """The confirmation page of "expire an AP transaction" (payouts/admin.py serves it:
    the check needs both sides' records)."""
    return reverse("admin:anchor_aptransactionevent_expire") + "?" + urlencode(
        {"transaction_id": transaction_id})


class ExpireInApMixin:
    """An action that opens the "expire in AP" confirmation page for the selected row
    (a model with ``transaction_id``)."""

    @admin.action(permissions=["expire"], description="Expire in AP (no funds arrived)")
    def expire_in_ap(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one row.", messages.WARNING)
            return None
        return HttpResponseRedirect(expire_url(queryset.get().transaction_id))

    def has_expire_permission(self, request):
        return request.user.has_perm("anchor.expire_ap_transaction")


# --- deposit releases -------------------------------------------------------------

class ReleaseEventInline(ReadOnlyInline, admin.TabularInline):
    model = ReleaseEvent
    fields = ("at", "event", "operator", "note", "detail")
    readonly_fields = fields


@admin.register(DepositRelease)
class DepositReleaseAdmin(ReadOnlyAdmin):
    list_display = ("id", "transaction_id", "status", "amount", "asset_code", "destination",
                    "attempts", "tx_hash", "updated_at")
    list_filter = ("status",)
    search_fields = ("transaction_id", "tx_hash", "destination")
    ordering = ("-updated_at",)
    readonly_fields = ("chain_now", "horizon_link")
    inlines = [ReleaseEventInline]
    actions = ["redrive"]

    @admin.display(description="on chain now")
    def chain_now(self, obj: DepositRelease) -> str:
        """Horizon, read when the page opens (DESIGN.md §4 step 3's dead-envelope rule)."""
        try:
            return releases.release_chain_check(obj).reason
        except stellar.HorizonUnavailable as exc:
            return f"Horizon unavailable: {exc}"

    @admin.display(description="Horizon")
    def horizon_link(self, obj: DepositRelease) -> str:
        if not obj.tx_hash:
            return "-"
        url = f"{settings.HORIZON_URL.rstrip('/')}/transactions/{obj.tx_hash}"
        return format_html('<a href="{}">{}</a>', url, obj.tx_hash)

    @admin.action(permissions=["redrive"],
                  description="Re-drive (only when provably not on chain)")
    def redrive(self, request, queryset):
        def perform(release, data, user):
            done = operations.release_redrive(release_id=release.pk, operator=user,
                                              note=data["note"])
            return (f"Release {done.transaction_id} re-driven: attempt {done.attempts}, "
                    f"hash {done.tx_hash}, now {done.status}.")

        return confirm_action(
            self, request, queryset, title="Re-drive a deposit release",
            preview=lambda release: operations.release_redrive_preview(release_id=release.pk),
            perform=perform, confirm_label="Yes, pay it with a new envelope")

    def has_redrive_permission(self, request):
        return request.user.has_perm("anchor.redrive_release")


@admin.register(ReleaseEvent)
class ReleaseEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "release", "event", "operator", "note")
    list_filter = ("event",)
    search_fields = ("release__transaction_id", "operator", "note")
    actions = None


# --- deposits ---------------------------------------------------------------------

@admin.register(DepositOrder)
class DepositOrderAdmin(ExpireInApMixin, ReadOnlyAdmin):
    list_display = ("transaction_id", "order_id", "status", "amount_in", "amount_out",
                    "created_at")
    list_filter = ("status",)
    search_fields = ("transaction_id", "order_id")
    ordering = ("-created_at",)
    actions = ["expire_in_ap"]


@admin.register(DepositPayment)
class DepositPaymentAdmin(ReadOnlyAdmin):
    list_display = ("payment_id", "transaction_id", "order_id", "amount_paise", "currency",
                    "captured_at", "confirmation", "confirmed_at", "confirmation_error",
                    "ap_notified_at")
    list_filter = ("confirmation",)
    search_fields = ("payment_id", "transaction_id", "order_id")
    ordering = ("-captured_at",)
    actions = ["refund_inr"]

    @admin.action(permissions=["refund"],
                  description="Refund the INR through Razorpay (no USDC will be released)")
    def refund_inr(self, request, queryset):
        def perform(payment, data, user):
            done = operations.deposit_refund(transaction_id=payment.transaction_id,
                                             operator=user, note=data["note"])
            return (f"Refund of {done.amount_paise} paise on {done.payment_id} claimed "
                    f"(receipt {done.receipt}); Razorpay is asked next.")

        return confirm_action(
            self, request, queryset, title="Refund a deposit's INR",
            preview=lambda payment: operations.deposit_refund_preview(
                transaction_id=payment.transaction_id),
            perform=perform, confirm_label="Yes, refund the rupees")

    def has_refund_permission(self, request):
        return request.user.has_perm("anchor.refund_deposit")


@admin.register(DepositRefund)
class DepositRefundAdmin(ReadOnlyAdmin):
    """The deposit refund guard (anchor/refunds.py): one row per refunded deposit."""

    list_display = ("id", "transaction_id", "status", "payment_id", "amount_paise",
                    "refund_id", "provider_status", "trigger", "attempts", "last_error",
                    "updated_at")
    list_filter = ("status", "trigger")
    search_fields = ("transaction_id", "payment_id", "refund_id", "receipt")
    ordering = ("-updated_at",)
    actions = None


@admin.register(InboundEvent)
class InboundEventAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "source", "event_type", "event_id", "outcome", "reason")
    list_filter = ("source", "outcome", "event_type")
    search_fields = ("event_id", "reason")
    ordering = ("-received_at",)
    actions = None


@admin.register(SourceAccount)
class ChannelAccountAdmin(ReadOnlyAdmin):
    """Channel accounts (anchor/channels.py): which have an envelope in flight, their
    XLM for fees as last read from Horizon (``manage.py channels list`` refreshes it),
    and the claims refused for want of a free channel. Seeds are never stored."""

    list_display = ("address", "state", "leased_by", "leased_until", "sequence",
                    "xlm_balance", "balance_checked_at", "retired_at")
    search_fields = ("address", "leased_by")
    ordering = ("id",)

    @admin.display(description="state")
    def state(self, obj):
        from anchor.channels import channel_state

        return channel_state(obj)

    def changelist_view(self, request, extra_context=None):
        refusals = stellar.channel_refusals()
        shown_count = "unknown (Redis unreachable)" if refusals is None else refusals
        self.message_user(request, "Claims refused because every channel was in flight: "
                                   f"{shown_count}", messages.INFO)
        return super().changelist_view(request, extra_context)


# --- customers (SEP-12 KYC: anchor/customers.py) -------------------------------------

class RejectForm(NoteForm):
    message = forms.CharField(
        max_length=500, label="Reason shown to the customer",
        help_text="AP passes it to the sending anchor or wallet (SEP-12 message).")
    field_order = ["message", "note"]


class RequestInfoForm(NoteForm):
    fields = forms.MultipleChoiceField(
        choices=[(name, name) for name in customers.ALL_FIELDS],
        widget=forms.CheckboxSelectMultiple, label="Fields to give again")
    message = forms.CharField(max_length=500, required=False,
                              label="What to tell the customer")
    field_order = ["fields", "message", "note"]


class CustomerFileInline(ReadOnlyInline, admin.TabularInline):
    model = CustomerFile
    fields = ("field", "content_type", "size", "sha256", "uploaded_at")
    readonly_fields = fields


class CustomerEventInline(ReadOnlyInline, admin.TabularInline):
    model = CustomerEvent
    fields = ("at", "event", "operator", "note", "detail")
    readonly_fields = fields


@admin.register(Customer)
class CustomerAdmin(ReadOnlyAdmin):
    """The KYC review queue: filter on review ``pending`` / ``needs_info``; the personal
    data is decrypted for the page only (never listed)."""

    list_display = ("id", "type", "sep12_status", "review", "account", "memo", "updated_at",
                    "deleted_at")
    list_filter = ("review", "type")
    search_fields = ("id", "account", "memo")
    ordering = ("-updated_at",)
    exclude = ("data",)
    readonly_fields = ("sep12_status", "personal_data")
    inlines = [CustomerFileInline, CustomerEventInline]
    actions = ["accept", "reject", "request_info"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The customer's page, which shows the personal data decrypted: each opening is
        audited (``personal_data.viewed``, the operator and the path), as every other
        use of the data is (PMLA record keeping: who saw a customer's identity, when)."""
        if request.method == "GET":
            customer = Customer.objects.filter(pk=unquote(object_id)).first()
            if customer is not None and customer.erased_at is None and \
                    self.has_view_permission(request, customer):
                CustomerEvent.objects.create(customer=customer, event="personal_data.viewed",
                                             operator=request.user.get_username(),
                                             detail={"path": request.path[:200]})
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="SEP-12 status")
    def sep12_status(self, obj: Customer) -> str:
        return "deleted" if obj.deleted_at else customers.answer(obj).status

    @admin.display(description="personal data (decrypted)")
    def personal_data(self, obj: Customer) -> str:
        if obj.erased_at:
            return f"erased at {obj.erased_at:%Y-%m-%d %H:%M:%S}"
        try:
            return shown(customers.personal_data(obj))
        except pii.PiiKeyError as exc:
            return f"cannot decrypt: {exc}"

    def _review(self, request, queryset, decision: str, title: str, form_class, label: str):
        def perform(customer, data, user):
            done = customers.review(customer_id=customer.pk, decision=decision,
                                    operator=user, note=data["note"],
                                    message=data.get("message", ""),
                                    fields=data.get("fields"))
            return f"Customer {done.id} is now {customers.answer(done).status}."

        return confirm_action(
            self, request, queryset, title=title, form_class=form_class,
            preview=lambda c: customers.review_preview(customer_id=c.pk, decision=decision),
            perform=perform, confirm_label=label)

    @admin.action(permissions=["review"], description="Accept the customer")
    def accept(self, request, queryset):
        return self._review(request, queryset, "accept", "Accept a customer", NoteForm,
                            "Yes, accept")

    @admin.action(permissions=["review"], description="Reject with a reason")
    def reject(self, request, queryset):
        return self._review(request, queryset, "reject", "Reject a customer", RejectForm,
                            "Yes, reject")

    @admin.action(permissions=["review"], description="Ask for more information")
    def request_info(self, request, queryset):
        return self._review(request, queryset, "request_info",
                            "Ask a customer for more information", RequestInfoForm,
                            "Yes, ask")

    def has_review_permission(self, request):
        return request.user.has_perm(customers.PERM)


@admin.register(CustomerEvent)
class CustomerEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "customer", "event", "operator", "note")
    list_filter = ("event",)
    search_fields = ("customer__id", "operator")
