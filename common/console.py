"""The operator console's shared pieces (DESIGN.md §1 "Operators"): what every
operator action of anchor, payouts and sagas uses, in the services and in the admin.

Services (``*/operations.py``): each action is one keyword-only service that owns its
transaction, its locks and its audit row (STYLE.md "one action, one transaction, one
audit row"); it checks the permission itself (``require_permission``), takes the
operator's note (``clean_note``), names the operator in the audit row
(``operator_name``), and refuses with ``OperationRefused`` having written nothing.
Every action has a ``*_preview`` beside it returning a ``Preview``: the same checks,
read only, and the words the confirmation page shows ("what will happen"), so what
the operator confirms is what the service does.

Admin (``*/admin.py``): rows are read only (``ReadOnlyAdmin``, ``ReadOnlyInline``);
changes go through actions, whose body is ``confirm_action``: the confirmation page
(``render_confirmation``, template ``admin/corridor/confirm_action.html``) with the
evidence, a refusal if the service would refuse now, and a form with the note
(``NoteForm``); then one service call and a message. Each action handles exactly one
row: every case is a decision of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.serializers.json import DjangoJSONEncoder
from django.template.response import TemplateResponse
from django.urls import reverse

CONFIRM_TEMPLATE = "admin/corridor/confirm_action.html"


# --- services ---------------------------------------------------------------------

class OperationRefused(Exception):
    """The action may not run now (state, evidence or permission). Nothing was written
    and nothing was sent."""


@dataclass
class Preview:
    """What the confirmation page shows: ``will`` (what the action does to money and
    state, in order), ``evidence`` (label -> value pairs the decision rests on) and
    ``refusal`` (why the service would refuse right now, or "")."""

    will: list[str] = field(default_factory=list)
    evidence: list[tuple[str, Any]] = field(default_factory=list)
    refusal: str = ""


def require_permission(operator, perm: str) -> None:
    """Services check the permission too (the admin already did): a service called from
    elsewhere keeps the same rule. ``perm``: "app_label.codename". Raises
    OperationRefused when ``operator`` is None, inactive or lacks it."""
    if operator is None or not operator.is_active or not operator.has_perm(perm):
        raise OperationRefused(f"{getattr(operator, 'username', operator)} lacks {perm}")


def clean_note(note: str) -> str:
    """The operator's note, stripped and cut to 2000 characters. It is mandatory (it is
    why the audit row exists): fewer than 3 characters raise OperationRefused."""
    note = (note or "").strip()
    if len(note) < 3:
        raise OperationRefused("a note saying why is required")
    return note[:2000]


AUTOMATIC = "corridor (automatic)"


def operator_name(operator) -> str:
    """The name an audit row records for ``operator`` (a user; None: Corridor itself,
    for an action its own rules take, such as an inbound remittance's refund)."""
    return AUTOMATIC if operator is None else operator.get_username()


# --- admin ------------------------------------------------------------------------

class NoteForm(forms.Form):
    """Every action asks why: the note goes into the audit row with the operator."""

    note = forms.CharField(
        label="Note", min_length=3, max_length=2000,
        help_text="Why you are doing this (ticket, evidence). Kept in the audit row.",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}))


class ReadOnlyMixin:
    """For a ModelAdmin or an inline: nothing is added, edited or deleted by hand."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Nothing is added, edited or deleted by hand: changes go through actions."""


class ReadOnlyInline:
    """Mixed into an admin inline: shows the related rows, changes none."""

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


def seen_digest(preview: Preview) -> str:
    """A digest of the evidence ``preview`` shows (hex SHA-256): what the operator read,
    posted back by the confirmation page (hidden field ``seen``)."""
    shown_text = json.dumps([(label, shown(value)) for label, value in preview.evidence],
                            ensure_ascii=False)
    return hashlib.sha256(shown_text.encode()).hexdigest()


def render_confirmation(request, modeladmin, *, title: str, subject: str, preview: Preview,
                        form: forms.Form, action: str = "", selected: list | None = None,
                        confirm_label: str = "Yes, do it", cancel_url: str = ""):
    """The confirmation page of an action on ``modeladmin``'s model: ``preview``'s
    words, evidence and refusal, and ``form``; posting it back repeats ``action`` on
    ``selected`` with ``post=yes`` and ``seen`` (:func:`seen_digest`). Cancel goes to
    ``cancel_url`` (default: the changelist)."""
    opts = modeladmin.model._meta
    context = {
        "seen": seen_digest(preview),
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
                   form_class: type[forms.Form] = NoteForm, confirm_label: str = "Yes, do it",
                   stale_check: bool = False):
    """The body of a console action: first POST (from the changelist) -> the
    confirmation page; second POST (``post=yes``, from that page) -> validate the form,
    ``perform(obj, cleaned_data, user)`` (one service call) and report its message.
    ``OperationRefused`` is reported as an error: the service wrote nothing.

    ``stale_check`` (for actions whose case Corridor itself may change while a person
    reads it, e.g. the late-money sweep rewriting a saga's review reason): a second POST
    whose ``seen`` is not the digest of the evidence as it is now is refused ("the case
    changed since ..."), nothing performed, and the page shown again with the evidence
    of now (found by the attacker: a page read before the sweep closed a saga on
    evidence no longer true). A POST without ``seen`` (not from the page) is not
    checked: the service's own conditions still hold."""
    if queryset.count() != 1:
        modeladmin.message_user(request, "Select exactly one row: each action handles one "
                                "case.", messages.WARNING)
        return None
    obj = queryset.get()
    if request.POST.get("post") == "yes":
        form = form_class(request.POST)
        seen = request.POST.get("seen")
        if stale_check and seen and seen != seen_digest(preview(obj)):
            modeladmin.message_user(
                request, "Refused, nothing changed: the case changed since the page was "
                "shown; read it again below before confirming.", messages.ERROR)
        elif form.is_valid():
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
