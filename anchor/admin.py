"""Operator console, deposit side (DESIGN.md §1 "Operators"), and the pieces every
console action shares.

Read views: releases with their chain evidence (the stored envelope and hash, looked up
on Horizon when the page opens) and their audit rows, deposit orders and payments, the
inbound-event log, the release and AP-transaction audit logs.

Actions stay thin (STYLE.md): ``confirm_action`` shows the confirmation page (what will
happen, the evidence, a refusal if the service would refuse now, and a form with the
operator's note), then calls one service of ``anchor.operations`` /
``payouts.operations`` / ``sagas.operations`` and reports with a message. Each action
handles exactly one row: every case is a decision of its own. Every action declares
its permission (``@admin.action(permissions=[...])``), so a person without it never
sees it and a forged POST is answered "No action selected" without running anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from anchor import operations, releases, stellar
from anchor.models import (
    DepositOrder,
    DepositPayment,
    DepositRelease,
    InboundEvent,
    ReleaseEvent,
)
from anchor.operations import OperationRefused, Preview

CONFIRM_TEMPLATE = "admin/corridor/confirm_action.html"


# --- shared by every console action -----------------------------------------------

class NoteForm(forms.Form):
    """Every action asks why: the note goes into the audit row with the operator."""

    note = forms.CharField(
        label="Note", min_length=3, max_length=2000,
        help_text="Why you are doing this (ticket, evidence). Kept in the audit row.",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}))


class ReadOnlyAdmin(admin.ModelAdmin):
    """Nothing is added, edited or deleted by hand: changes go through actions."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline:
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def shown(value) -> str:
    """An evidence value as text for the page (JSON for dicts and lists)."""
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, indent=2, cls=DjangoJSONEncoder, ensure_ascii=False)
    return "" if value is None else str(value)


def render_confirmation(request, modeladmin, *, title: str, subject: str, preview: Preview,
                        form: forms.Form, action: str = "", selected: list | None = None,
                        confirm_label: str = "Yes, do it", cancel_url: str = ""):
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title, "subject": subject, "opts": opts, "form": form,
        "will": preview.will, "refusal": preview.refusal,
        "evidence": [(label, shown(value)) for label, value in preview.evidence],
        "action": action, "selected": selected or [],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "confirm_label": confirm_label,
        "cancel_url": cancel_url or reverse(f"admin:{opts.app_label}_{opts.model_name}"
                                            "_changelist"),
    }
    return TemplateResponse(request, CONFIRM_TEMPLATE, context)


def confirm_action(modeladmin, request, queryset, *, title: str,
                   preview: Callable[[object], Preview],
                   perform: Callable[[object, dict, object], str],
                   form_class: type[forms.Form] = NoteForm, confirm_label: str = "Yes, do it"):
    """The body of a console action: first POST (from the changelist) -> the
    confirmation page; second POST (``post=yes``, from that page) -> validate the form,
    ``perform(obj, cleaned_data, user)`` (one service call) and report its message.
    ``OperationRefused`` is reported as an error: the service wrote nothing."""
    if queryset.count() != 1:
        modeladmin.message_user(request, "Select exactly one row: each action handles one "
                                "case.", messages.WARNING)
        return None
    obj = queryset.get()
    if request.POST.get("post") == "yes":
        form = form_class(request.POST)
        if form.is_valid():
            try:
                message = perform(obj, form.cleaned_data, request.user)
            except OperationRefused as exc:
                modeladmin.message_user(request, f"Refused, nothing changed: {exc}",
                                        messages.ERROR)
                return None
            modeladmin.message_user(request, message, messages.SUCCESS)
            return None
    else:
        form = form_class()
    return render_confirmation(request, modeladmin, title=title, subject=str(obj),
                               preview=preview(obj), form=form,
                               action=request.POST.get("action", ""), selected=[obj.pk],
                               confirm_label=confirm_label)


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
                    "captured_at", "ap_notified_at")
    search_fields = ("payment_id", "transaction_id", "order_id")
    ordering = ("-captured_at",)
    actions = None


@admin.register(InboundEvent)
class InboundEventAdmin(ReadOnlyAdmin):
    list_display = ("received_at", "source", "event_type", "event_id", "outcome")
    list_filter = ("source", "event_type")
    search_fields = ("event_id",)
    ordering = ("-received_at",)
    actions = None
