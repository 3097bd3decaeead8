"""Read-only ledger views: accounts with their balances, entries with their postings, and
the trial balance (``ledger.services.trial_balance``, DESIGN.md §8 invariant 3), opened
from the accounts list. Nothing here writes: corrections are new entries, posted by a
service."""

from decimal import Decimal

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Sum, Value
from django.db.models.functions import Coalesce
from django.template.response import TemplateResponse
from django.urls import path

from common.console import ReadOnlyMixin
from ledger import chart, services
from ledger.models import Account, Entry, Posting


@admin.register(Account)
class AccountAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("code", "currency", "current_balance", "hot", "created_at")
    list_filter = ("currency",)
    search_fields = ("code",)
    ordering = ("code", "currency")
    change_list_template = "admin/ledger/account/change_list.html"
    actions = None

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            pending=Coalesce(Sum("deltas__amount"), Value(Decimal(0))))

    @admin.display(description="balance", ordering="balance")
    def current_balance(self, obj):
        """Stored balance + unrolled deltas (hot accounts, ledger.services.rollup)."""
        return obj.balance + obj.pending

    def get_urls(self):
        view = self.admin_site.admin_view(self.trial_balance_view)
        return [path("trial-balance/", view, name="ledger_account_trial_balance"),
                *super().get_urls()]

    def trial_balance_view(self, request):
        """Totals per currency (each must be 0), stored balances that differ from the sum
        of their postings, entries that do not sum to zero, and the accounts of the
        deposit and withdrawal books (ledger/chart.py) with what each holds: one
        REPEATABLE READ snapshot."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        trial = services.trial_balance()
        context = {
            **self.admin_site.each_context(request),
            "title": "Trial balance", "opts": self.model._meta, "trial": trial,
            "totals": sorted(trial.totals.items()),
            "accounts": [(code, ccy, amount)
                         for (code, ccy), amount in sorted(trial.accounts.items())],
            "books": [(code, ccy, what, trial.accounts.get((code, ccy), Decimal(0)))
                      for code, ccy, what in chart.ACCOUNTS],
        }
        return TemplateResponse(request, "admin/ledger/trial_balance.html", context)


class PostingInline(ReadOnlyMixin, admin.TabularInline):
    model = Posting
    fields = ("account", "amount")
    readonly_fields = fields
    extra = 0


@admin.register(Entry)
class EntryAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("id", "kind", "idempotency_key", "reference", "saga_id", "created_at")
    list_filter = ("kind",)
    search_fields = ("idempotency_key", "reference")
    inlines = [PostingInline]
    actions = None
