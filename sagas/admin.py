"""Read-only views of sagas for operators (the manual_review queue is the status filter).
Every change goes through the engine's services; nothing here writes."""

from django.contrib import admin

from sagas.models import Saga, SagaEvent, SagaStep


class _ReadOnly:
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class StepInline(_ReadOnly, admin.TabularInline):
    model = SagaStep
    fields = ("idx", "kind", "status", "attempts", "undo_attempts", "error",
              "next_attempt_at", "fence")
    readonly_fields = fields
    extra = 0


class EventInline(_ReadOnly, admin.TabularInline):
    model = SagaEvent
    fields = ("at", "idx", "event", "detail", "worker", "fence")
    readonly_fields = fields
    extra = 0


@admin.register(Saga)
class SagaAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("id", "kind", "reference", "status", "fence", "recoveries", "lease_owner",
                    "lease_until", "wake_at", "updated_at")
    list_filter = ("status", "kind")
    search_fields = ("reference",)
    inlines = [StepInline, EventInline]
