"""Operator console: sagas, the manual-review queue, and the beat schedules.

- Sagas: each with its steps and its event timeline (every transition, operator
  actions included, with the worker or operator and the fence). Actions on a saga in
  ``manual_review`` (thin: the confirmation page, then one service of
  ``sagas.operations``): resume (``sagas.resume_saga``), retry the step it stopped at
  (``sagas.retry_saga_step``), compensate (``sagas.compensate_saga``), close as
  resolved (``sagas.resolve_saga``).
- The manual-review queue (``ReviewItem``, a SQL view): everything waiting for a
  person, oldest first, with age, amount, reason and search; each row links to its
  object's page and to the actions on it.
- django-celery-beat's admin, with its own actions (enable, disable, toggle, run)
  limited to people who may change schedules.
"""

from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince
from django_celery_beat.admin import PeriodicTaskAdmin as BeatPeriodicTaskAdmin
from django_celery_beat.models import PeriodicTask

from common.console import NoteForm, ReadOnlyAdmin, ReadOnlyInline, confirm_action
from sagas import operations
from sagas.models import ReviewItem, Saga, SagaEvent, SagaStep


class CloseForm(NoteForm):
    outcome = forms.ChoiceField(
        choices=[("completed", "completed: its effect happened (settled outside)"),
                 ("compensated", "compensated: the money went back (settled outside)")],
        widget=forms.RadioSelect)
    field_order = ["outcome", "note"]


class StepInline(ReadOnlyInline, admin.TabularInline):
    model = SagaStep
    fields = ("idx", "kind", "status", "attempts", "undo_attempts", "intent", "output",
              "error", "next_attempt_at", "fence")
    readonly_fields = fields


class EventInline(ReadOnlyInline, admin.TabularInline):
    model = SagaEvent
    fields = ("at", "idx", "event", "detail", "worker", "fence")
    readonly_fields = fields
    ordering = ("id",)


@admin.register(Saga)
class SagaAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "reference", "status", "fence", "recoveries", "lease_owner",
                    "lease_until", "wake_at", "updated_at")
    list_filter = ("status", "kind")
    search_fields = ("reference",)
    ordering = ("-id",)
    inlines = [StepInline, EventInline]
    actions = ["resume", "retry_step", "compensate", "close"]

    @admin.action(permissions=["resume"], description="Resume where it stopped")
    def resume(self, request, queryset):
        return confirm_action(
            self, request, queryset, title="Resume a saga",
            preview=lambda s: operations.saga_resume_preview(saga_id=s.pk),
            perform=lambda s, data, user: _ran(operations.saga_resume(
                saga_id=s.pk, operator=user, note=data["note"])),
            confirm_label="Yes, resume it", stale_check=True)

    def has_resume_permission(self, request):
        return request.user.has_perm("sagas.resume_saga")

    @admin.action(permissions=["retry_step"], description="Retry the step it stopped at")
    def retry_step(self, request, queryset):
        return confirm_action(
            self, request, queryset, title="Retry a saga's step",
            preview=lambda s: operations.saga_retry_step_preview(saga_id=s.pk),
            perform=lambda s, data, user: _ran(operations.saga_retry_step(
                saga_id=s.pk, operator=user, note=data["note"])),
            confirm_label="Yes, retry the step", stale_check=True)

    def has_retry_step_permission(self, request):
        return request.user.has_perm("sagas.retry_saga_step")

    @admin.action(permissions=["compensate"], description="Compensate")
    def compensate(self, request, queryset):
        return confirm_action(
            self, request, queryset, title="Compensate a saga",
            preview=lambda s: operations.saga_compensate_preview(saga_id=s.pk),
            perform=lambda s, data, user: _ran(operations.saga_compensate(
                saga_id=s.pk, operator=user, note=data["note"])),
            confirm_label="Yes, compensate", stale_check=True)

    def has_compensate_permission(self, request):
        return request.user.has_perm("sagas.compensate_saga")

    @admin.action(permissions=["close"], description="Close as resolved")
    def close(self, request, queryset):
        return confirm_action(
            self, request, queryset, title="Close a saga as resolved", form_class=CloseForm,
            preview=lambda s: operations.saga_close_preview(saga_id=s.pk),
            perform=lambda s, data, user: _ran(operations.saga_close(
                saga_id=s.pk, outcome=data["outcome"], operator=user, note=data["note"])),
            confirm_label="Yes, close it", stale_check=True)

    def has_close_permission(self, request):
        return request.user.has_perm("sagas.resolve_saga")


def _ran(saga: Saga) -> str:
    return f"Saga {saga.pk} ({saga.reference}) is now {saga.status}."


# --- the manual-review queue ------------------------------------------------------

# kind -> (admin URL name prefix of the object's model)
_TARGETS = {
    "saga": "sagas_saga",
    "release": "anchor_depositrelease",
    "payout": "payouts_withdrawalpayout",
    "withdrawal": "payouts_withdrawalrequest",
    "inbound": "anchor_inboundevent",
    "notify": "anchor_depositpayment",
    "receipt": "payouts_stellarreceipt",
    "refund": "anchor_depositrefund",
    "break": "treasury_break",  # treasury/admin.py (a URL name: no import upward)
}


@admin.register(ReviewItem)
class ReviewItemAdmin(ReadOnlyAdmin):
    """Everything waiting for a person, oldest first (sagas/models.py ``ReviewItem``)."""

    list_display = ("kind", "status", "object_link", "age", "amount", "currency",
                    "short_reason", "act")
    list_display_links = None
    list_filter = ("kind", "status")
    search_fields = ("reference", "reason", "key")
    ordering = ("since", "key")
    actions = None

    @admin.display(description="object", ordering="reference")
    def object_link(self, obj: ReviewItem):
        url = reverse(f"admin:{_TARGETS[obj.kind]}_change", args=[obj.object_id])
        return format_html('<a href="{}">{} {}</a>', url, obj.kind, obj.reference)

    @admin.display(description="waiting for", ordering="since")
    def age(self, obj: ReviewItem) -> str:
        return timesince(obj.since, timezone.now())

    @admin.display(description="reason")
    def short_reason(self, obj: ReviewItem) -> str:
        return obj.reason if len(obj.reason) <= 160 else obj.reason[:157] + "..."

    @admin.display(description="actions")
    def act(self, obj: ReviewItem):
        url = reverse(f"admin:{_TARGETS[obj.kind]}_changelist") + f"?id__exact={obj.object_id}"
        return format_html('<a href="{}">act on it</a>', url)


# --- the beat schedules ----------------------------------------------------------------

class PeriodicTaskAdmin(BeatPeriodicTaskAdmin):
    """django-celery-beat's own admin (the schedules ``setup_periodic_tasks`` writes).
    Its actions (enable, disable, toggle, run now) declare no permission, so anyone who
    may view the schedules would get them: here they need the change permission, which
    neither console group has (auditors and operators read the schedules; changing
    them is for superusers)."""

    def get_actions(self, request):
        if not self.has_change_permission(request):
            return {}
        return super().get_actions(request)


admin.site.unregister(PeriodicTask)
admin.site.register(PeriodicTask, PeriodicTaskAdmin)
