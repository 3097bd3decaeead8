"""The treasury in the admin (issue 13 §2): reconciliation runs (with "Reconcile now"
and the daily report, page and CSV), the breaks (explain with an adjusting entry, or
mark fixed: treasury/operations.py) and their audit rows. Rows are read only."""

from __future__ import annotations

from datetime import date

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from common.console import (
    NoteForm,
    OperationRefused,
    ReadOnlyAdmin,
    ReadOnlyInline,
    confirm_action,
)
from treasury import floats, operations, report
from treasury.models import Break, BreakEvent, ReconRun

FIRST_DAY = date(2000, 1, 1)  # before any book Corridor can hold


def _day(request) -> tuple[date, str]:
    """``?day=YYYY-MM-DD`` and the refusal to show when it is not a day the books can
    have (malformed, impossible, before FIRST_DAY or after today): then today's."""
    text = request.GET.get("day") or ""
    today = timezone.now().date()
    if not text:
        return today, ""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        return today, f"'{text[:40]}' is not a day (YYYY-MM-DD): today's report is shown."
    if not FIRST_DAY <= day <= today:
        return today, (f"{day} is outside the books ({FIRST_DAY} to today): "
                       "today's report is shown.")
    return day, ""


@admin.register(ReconRun)
class ReconRunAdmin(ReadOnlyAdmin):
    list_display = ("day", "trigger", "operator", "status", "started_at", "finished_at",
                    "breaks", "error")
    list_filter = ("status", "trigger")
    readonly_fields = ("day", "trigger", "operator", "status", "started_at", "finished_at",
                       "counts", "balances", "error")
    change_list_template = "admin/treasury/reconrun/change_list.html"
    actions = None

    @admin.display(description="breaks seen")
    def breaks(self, obj):
        return (obj.counts or {}).get("breaks", "")

    def get_urls(self):
        return [path("reconcile/", self.admin_site.admin_view(self.reconcile_view),
                     name="treasury_reconrun_reconcile"),
                path("report/", self.admin_site.admin_view(self.report_view),
                     name="treasury_reconrun_report"),
                path("treasury/", self.admin_site.admin_view(self.treasury_view),
                     name="treasury_reconrun_treasury"),
                *super().get_urls()]

    def reconcile_view(self, request):
        """POST: an operator's on-demand run of today's reconciliation."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            run = operations.reconcile_now(operator=request.user)
        except OperationRefused as exc:
            raise PermissionDenied(str(exc)) from exc
        level = messages.SUCCESS if run.status == ReconRun.Status.DONE else messages.ERROR
        self.message_user(request, f"Reconciliation {run.day}: {run.status}, "
                          f"{run.counts.get('breaks', 0)} breaks seen. {run.error}", level)
        return redirect("admin:treasury_reconrun_changelist")

    def report_view(self, request):
        """The daily report of ``?day=YYYY-MM-DD`` (default today); ``&format=csv`` for
        the accountant's file."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        day, refused = _day(request)
        if refused and request.GET.get("format") == "csv":
            return HttpResponse(refused, status=400, content_type="text/plain")
        if refused:
            messages.error(request, refused)
        if request.GET.get("format") == "csv":
            response = HttpResponse(report.report_csv(day), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="corridor-{day}.csv"'
            return response
        context = {**self.admin_site.each_context(request), "title": f"Daily report {day}",
                   "opts": self.model._meta, "day": day, "rows": report.daily_report(day),
                   "runs": ReconRun.objects.filter(day=day)[:5],
                   "breaks": Break.objects.filter(status=Break.Status.OPEN)[:200]}
        return TemplateResponse(request, "admin/treasury/report.html", context)


    def treasury_view(self, request):
        """The treasury page (issue 13 §4): the float per account now (books and the
        outside, read live) against its floor, closing balances over the last 14 days
        (a chart per account) and the flows per day."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        series = floats.history()
        context = {**self.admin_site.each_context(request), "title": "Treasury",
                   "opts": self.model._meta, "floats": floats.floats(live=True),
                   "charts": floats.svg_chart(series),
                   "flows": [(day, [rows.get(key) for key in floats.CHARTED])
                             for day, rows in reversed(series)],
                   "charted": floats.CHARTED,
                   "open_breaks": Break.objects.filter(status=Break.Status.OPEN).count(),
                   "last_run": ReconRun.objects.first()}
        return TemplateResponse(request, "admin/treasury/treasury.html", context)


class ExplainForm(NoteForm):
    amount = forms.DecimalField(
        label="Adjustment", max_digits=24, decimal_places=7,
        help_text="Posted on the break's account (positive: a debit), the other side on "
                  "equity:adjustments. Usually the break's difference.")
    field_order = ["amount", "note"]


class BreakEventInline(ReadOnlyInline, admin.TabularInline):
    model = BreakEvent
    fields = ("created_at", "action", "operator", "note", "detail")
    readonly_fields = fields


@admin.register(Break)
class BreakAdmin(ReadOnlyAdmin):
    list_display = ("key", "source", "kind", "reference", "difference", "currency", "status",
                    "updated_at")
    list_filter = ("status", "source", "kind")
    search_fields = ("key", "reference")
    readonly_fields = ("key", "source", "kind", "reference", "account", "currency",
                       "difference", "books", "outside", "status", "first_run", "last_run",
                       "resolution", "adjusting_key", "resolved_by", "resolved_at",
                       "created_at", "updated_at")
    inlines = [BreakEventInline]
    actions = ["explain", "fix"]

    @admin.action(permissions=["resolve"], description="Explain with an adjusting entry")
    def explain(self, request, queryset):
        def perform(row, data, user):
            done = operations.break_explain(break_id=row.pk, operator=user,
                                            amount=data["amount"], note=data["note"])
            return f"Break {done.key} explained ({done.adjusting_key})."

        return confirm_action(
            self, request, queryset, title="Explain a break", form_class=ExplainForm,
            preview=lambda b: operations.break_explain_preview(b.pk), perform=perform,
            confirm_label="Yes, post it and close the break")

    @admin.action(permissions=["resolve"], description="Mark fixed (cause mended)")
    def fix(self, request, queryset):
        def perform(row, data, user):
            done = operations.break_fix(break_id=row.pk, operator=user, note=data["note"])
            return f"Break {done.key} marked fixed."

        return confirm_action(
            self, request, queryset, title="Mark a break fixed",
            preview=lambda b: operations.break_fix_preview(b.pk), perform=perform,
            confirm_label="Yes, close it")

    def has_resolve_permission(self, request):
        return request.user.has_perm(operations.PERMISSION)
