"""Read-only ledger views: accounts with their balances, entries with their postings."""

from django.contrib import admin

from ledger.models import Account, Entry, Posting


class _ReadOnly:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Account)
class AccountAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("code", "currency", "balance", "created_at")
    list_filter = ("currency",)
    search_fields = ("code",)


class PostingInline(_ReadOnly, admin.TabularInline):
    model = Posting
    fields = ("account", "amount")
    readonly_fields = fields
    extra = 0


@admin.register(Entry)
class EntryAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("id", "kind", "idempotency_key", "reference", "saga_id", "created_at")
    list_filter = ("kind",)
    search_fields = ("idempotency_key", "reference")
    inlines = [PostingInline]
