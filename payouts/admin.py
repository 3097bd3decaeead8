"""Operator console, withdrawal side (DESIGN.md §1 "Operators", §5), and "expire any AP
transaction".

Read views: payouts with their attempts (idempotency keys, provider payout ids and
statuses), the provider's view read when the page opens, and their audit rows;
withdrawal requests with their chain evidence, receipts and refund; refunds; receipts;
the payout and AP-transaction audit logs.

Actions (thin: parse the confirmation form, call one service of
``payouts.operations``, report; ``common.console.confirm_action``):

- payout: confirm paid with a UTR (``payouts.confirm_payout_paid``), mark failed
  (``payouts.mark_payout_failed``), new attempt with a new key, optionally with
  corrected bank details (``payouts.new_payout_attempt``);
- withdrawal request: accept the short amount (``payouts.accept_short_withdrawal``),
  refund the USDC on chain (``payouts.refund_withdrawal``), expire in AP;
- receipts: refund an unconsumed receipt on chain (``payouts.refund_receipt``);
- any AP transaction, by id: expire it while no funds have arrived
  (``anchor.expire_ap_transaction``), from the AP-transaction log's "Expire an AP
  transaction" button, or from a deposit order or withdrawal request.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html

from anchor import razorpay as rzp
from anchor.admin import ExpireInApMixin
from anchor.models import ApTransactionEvent
from common.console import (
    NoteForm,
    OperationRefused,
    Preview,
    ReadOnlyAdmin,
    ReadOnlyInline,
    confirm_action,
    render_confirmation,
    shown,
)
from payouts import guard, operations
from payouts.models import (
    PayoutAttempt,
    PayoutEvent,
    StellarReceipt,
    WithdrawalPayout,
    WithdrawalRefund,
    WithdrawalRequest,
)
from payouts.withdrawals import WithdrawalInputError


class UtrForm(NoteForm):
    utr = forms.CharField(label="UTR", max_length=35,
                          help_text="The bank's reference of the payment (6-35 letters or "
                                    "digits), as on the statement.")
    field_order = ["utr", "note"]


class NewAttemptForm(NoteForm):
    """Optional corrected bank details: a bank account (name, account number, IFSC) or a
    UPI ID (name, VPA). Leave all empty to pay the same fund account again."""

    name = forms.CharField(required=False, max_length=50, label="Account holder")
    account_number = forms.CharField(required=False, max_length=40)
    ifsc = forms.CharField(required=False, max_length=11, label="IFSC")
    vpa = forms.CharField(required=False, max_length=256, label="UPI ID (instead of a bank)")

    def clean(self):
        data = super().clean()
        given = [data.get(k) for k in ("name", "account_number", "ifsc", "vpa")]
        data["beneficiary"] = None
        if any(given):
            try:
                data["beneficiary"] = operations.parse_beneficiary(
                    name=data.get("name", ""), account_number=data.get("account_number", ""),
                    ifsc=data.get("ifsc", ""), vpa=data.get("vpa", ""))
            except WithdrawalInputError as exc:
                for name, message in exc.errors.items():
                    self.add_error(name, message)
        return data


class ExpireForm(NoteForm):
    transaction_id = forms.CharField(max_length=64, widget=forms.HiddenInput)


# --- payouts ------------------------------------------------------------------------

class PayoutAttemptInline(ReadOnlyInline, admin.TabularInline):
    model = PayoutAttempt
    fields = ("number", "idempotency_key", "provider_payout_id", "provider_status",
              "created_at", "updated_at")
    readonly_fields = fields


class PayoutEventInline(ReadOnlyInline, admin.TabularInline):
    model = PayoutEvent
    fields = ("at", "event", "operator", "note", "detail")
    readonly_fields = fields


@admin.register(WithdrawalPayout)
class WithdrawalPayoutAdmin(ReadOnlyAdmin):
    list_display = ("id", "transaction_id", "status", "rupees", "mode", "attempts",
                    "reference", "provider_payout_id", "updated_at")
    list_filter = ("status", "mode")
    search_fields = ("transaction_id", "reference", "provider_payout_id")
    ordering = ("-updated_at",)
    readonly_fields = ("provider_now",)
    inlines = [PayoutAttemptInline, PayoutEventInline]
    actions = ["confirm_paid", "mark_failed", "new_attempt"]

    @admin.display(description="amount (INR)")
    def rupees(self, obj: WithdrawalPayout):
        return rzp.paise_to_rupees(obj.amount_paise)

    @admin.display(description="provider now")
    def provider_now(self, obj: WithdrawalPayout) -> str:
        """Every provider payout under this withdrawal, asked when the page opens."""
        try:
            found = guard.provider().find_by_reference(obj.transaction_id)
        except Exception as exc:  # an unreachable provider must not break the page
            return f"provider unavailable: {exc}"
        return shown([{"id": p.payout_id, "status": p.status, "utr": p.utr,
                       "amount_paise": p.amount_paise, "reason": p.reason} for p in found])

    @admin.action(permissions=["confirm_paid"], description="Confirm paid with a UTR")
    def confirm_paid(self, request, queryset):
        def perform(payout, data, user):
            done = operations.payout_confirm_paid(payout_id=payout.pk, utr=data["utr"],
                                                  operator=user, note=data["note"])
            return f"Payout {done.transaction_id} recorded paid with UTR {done.reference}."

        return confirm_action(
            self, request, queryset, title="Confirm a payout paid", form_class=UtrForm,
            preview=lambda p: operations.payout_confirm_paid_preview(payout_id=p.pk),
            perform=perform, confirm_label="Yes, record it paid")

    def has_confirm_paid_permission(self, request):
        return request.user.has_perm("payouts.confirm_payout_paid")

    @admin.action(permissions=["mark_failed"], description="Mark failed")
    def mark_failed(self, request, queryset):
        def perform(payout, data, user):
            done = operations.payout_mark_failed(payout_id=payout.pk, operator=user,
                                                 note=data["note"])
            return f"Payout {done.transaction_id} marked failed."

        return confirm_action(
            self, request, queryset, title="Mark a payout failed",
            preview=lambda p: operations.payout_mark_failed_preview(payout_id=p.pk),
            perform=perform, confirm_label="Yes, mark it failed")

    def has_mark_failed_permission(self, request):
        return request.user.has_perm("payouts.mark_payout_failed")

    @admin.action(permissions=["new_attempt"],
                  description="New attempt with a new key (after the provider failed it)")
    def new_attempt(self, request, queryset):
        def perform(payout, data, user):
            done = operations.payout_new_attempt(payout_id=payout.pk, operator=user,
                                                 note=data["note"],
                                                 beneficiary=data.get("beneficiary"))
            return (f"Payout {done.transaction_id}: attempt {done.attempts} sent, now "
                    f"{done.status}.")

        return confirm_action(
            self, request, queryset, title="Pay again under a new key",
            form_class=NewAttemptForm,
            preview=lambda p: operations.payout_new_attempt_preview(payout_id=p.pk),
            perform=perform, confirm_label="Yes, pay it again")

    def has_new_attempt_permission(self, request):
        return request.user.has_perm("payouts.new_payout_attempt")


@admin.register(PayoutEvent)
class PayoutEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "transaction_id", "event", "operator", "note")
    list_filter = ("event",)
    search_fields = ("transaction_id", "operator", "note")
    actions = None


# --- withdrawal requests ---------------------------------------------------------------

@admin.register(WithdrawalRequest)
class WithdrawalRequestAdmin(ExpireInApMixin, ReadOnlyAdmin):
    list_display = ("id", "transaction_id", "status", "amount_in", "received_amount",
                    "amount_out", "beneficiary_display", "updated_at")
    list_filter = ("status",)
    search_fields = ("transaction_id", "memo", "source_account")
    ordering = ("-updated_at",)
    exclude = ("contact_id", "fund_account_id")
    readonly_fields = ("receipts", "refund_row")
    inlines = [PayoutEventInline]
    actions = ["accept_short", "refund", "expire_in_ap"]

    @admin.display(description="receipts under its memo")
    def receipts(self, obj: WithdrawalRequest) -> str:
        rows = StellarReceipt.objects.filter(memo=obj.memo, memo_type=obj.memo_type or "id")
        return shown([{"tx_hash": r.tx_hash, "from": r.from_account, "asset": r.asset,
                       "amount": r.amount, "at": r.created_at} for r in rows]) or "-"

    @admin.display(description="refund")
    def refund_row(self, obj: WithdrawalRequest):
        refund = WithdrawalRefund.objects.filter(transaction_id=obj.transaction_id).first()
        if refund is None:
            return "-"
        url = reverse("admin:payouts_withdrawalrefund_change", args=[refund.pk])
        return format_html('<a href="{}">{} {} USDC, {}</a>', url, refund.status,
                           refund.amount, refund.tx_hash)

    @admin.action(permissions=["accept_short"], description="Accept the short amount")
    def accept_short(self, request, queryset):
        def perform(withdrawal, data, user):
            done = operations.withdrawal_accept_short(request_id=withdrawal.pk, operator=user,
                                                      note=data["note"])
            payout = WithdrawalPayout.objects.filter(transaction_id=done.transaction_id).first()
            return (f"Withdrawal {done.transaction_id} accepted at {done.amount_in} USDC: "
                    f"₹{done.amount_out}, payout "
                    f"{payout.status if payout else 'not started (the poller starts it)'}.")

        return confirm_action(
            self, request, queryset, title="Accept a short withdrawal",
            preview=lambda w: operations.withdrawal_accept_short_preview(request_id=w.pk),
            perform=perform, confirm_label="Yes, pay for what arrived")

    def has_accept_short_permission(self, request):
        return request.user.has_perm("payouts.accept_short_withdrawal")

    @admin.action(permissions=["refund"], description="Refund the USDC on chain to the sender")
    def refund(self, request, queryset):
        def perform(withdrawal, data, user):
            done = operations.withdrawal_refund_on_chain(request_id=withdrawal.pk,
                                                         operator=user, note=data["note"])
            return (f"Refund of {done.amount} USDC to {done.destination}: {done.status}"
                    + (f" ({done.last_error})" if done.last_error else "") + ".")

        return confirm_action(
            self, request, queryset, title="Refund a withdrawal's USDC on chain",
            preview=lambda w: operations.withdrawal_refund_preview(request_id=w.pk),
            perform=perform, confirm_label="Yes, send the USDC back")

    def has_refund_permission(self, request):
        return request.user.has_perm("payouts.refund_withdrawal")


@admin.register(WithdrawalRefund)
class WithdrawalRefundAdmin(ReadOnlyAdmin):
    list_display = ("transaction_id", "status", "amount", "destination", "tx_hash",
                    "attempts", "updated_at")
    list_filter = ("status",)
    search_fields = ("transaction_id", "tx_hash", "destination")
    actions = None


@admin.register(StellarReceipt)
class StellarReceiptAdmin(ReadOnlyAdmin):
    """USDC receipts as Corridor's scanner read them; an unconsumed one (in the review
    queue, kind ``receipt``) has the action "refund on chain"."""

    list_display = ("created_at", "tx_hash", "from_account", "asset", "amount",
                    "consumed_amount", "memo_type", "memo", "transaction_id", "settled_at",
                    "review_reason")
    list_filter = (("settled_at", admin.EmptyFieldListFilter),)
    search_fields = ("tx_hash", "from_account", "memo", "transaction_id")
    ordering = ("-created_at",)
    actions = ["refund_on_chain"]

    @admin.action(permissions=["refund_on_chain"],
                  description="Refund the unconsumed USDC on chain to its sender")
    def refund_on_chain(self, request, queryset):
        def perform(receipt, data, user):
            done = operations.receipt_refund_on_chain(receipt_id=receipt.pk, operator=user,
                                                      note=data["note"])
            return (f"Refund of {done.amount} USDC to {done.destination}: {done.status}"
                    + (f" ({done.last_error})" if done.last_error else "") + ".")

        return confirm_action(
            self, request, queryset, title="Refund an unconsumed USDC receipt on chain",
            preview=lambda r: operations.receipt_refund_preview(receipt_id=r.pk),
            perform=perform, confirm_label="Yes, send the USDC back")

    def has_refund_on_chain_permission(self, request):
        return request.user.has_perm("payouts.refund_receipt")


# --- any AP transaction -----------------------------------------------------------------

@admin.register(ApTransactionEvent)
class ApTransactionEventAdmin(ReadOnlyAdmin):
    """The log of operator actions on AP transactions, and the "expire an AP
    transaction" page: a transaction id, then the confirmation page, then the service."""

    list_display = ("at", "transaction_id", "kind", "event", "operator", "note")
    list_filter = ("event", "kind")
    search_fields = ("transaction_id", "operator", "note")
    change_list_template = "admin/anchor/aptransactionevent/change_list.html"
    actions = None

    def get_urls(self):
        view = self.admin_site.admin_view(self.expire_view)
        return [path("expire/", view, name="anchor_aptransactionevent_expire"),
                *super().get_urls()]

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}),
                         "can_expire": request.user.has_perm("anchor.expire_ap_transaction")}
        return super().changelist_view(request, extra_context)

    def expire_view(self, request):
        """GET ?transaction_id= -> the confirmation page; POST -> the service."""
        if not request.user.has_perm("anchor.expire_ap_transaction"):
            raise PermissionDenied
        changelist = reverse("admin:anchor_aptransactionevent_changelist")
        if request.method == "POST":
            form = ExpireForm(request.POST)
            if form.is_valid():
                try:
                    event = operations.ap_transaction_expire(
                        transaction_id=form.cleaned_data["transaction_id"],
                        operator=request.user, note=form.cleaned_data["note"])
                except OperationRefused as exc:
                    self.message_user(request, f"Refused, nothing changed: {exc}",
                                      messages.ERROR)
                    return HttpResponseRedirect(changelist)
                self.message_user(request, f"AP transaction {event.transaction_id} expired.",
                                  messages.SUCCESS)
                return HttpResponseRedirect(changelist)
            transaction_id = request.POST.get("transaction_id", "")
        else:
            transaction_id = request.GET.get("transaction_id", "").strip()
            form = ExpireForm(initial={"transaction_id": transaction_id})
        if not transaction_id:
            return render_confirmation(
                request, self, title="Expire an AP transaction", subject="",
                preview=Preview(), form=None, cancel_url=changelist)
        return render_confirmation(
            request, self, title="Expire an AP transaction", subject=transaction_id,
            preview=operations.ap_transaction_expire_preview(transaction_id=transaction_id),
            form=form, confirm_label="Yes, expire it", cancel_url=changelist)
