"""The operator's repairs: requeue, expire a lease, cancel, set a priority, as gated actions.

Every change of state calls the manager's guarded transitions in batches (so "all that match the
filter" works at any size), writes one LogEntry per todo it changed, and tells the operator what
it changed and what it refused, and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.formats import localize
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from switchboard_todos.admin import databases
from switchboard_todos.admin.base import JSON_COLUMNS, TodoModelAdmin
from switchboard_todos.admin.filters import active_filters
from switchboard_todos.admin.pagination import capped_count
from switchboard_todos.bulk import BATCH_SIZE, BulkOutcome, apply_in_batches
from switchboard_todos.managers import BatchResult
from switchboard_todos.models import Todo
from switchboard_todos.transitions import REPAIRS, TRANSITIONS, Repair, Transition
from switchboard_todos.validation import PRIORITY_MAX, PRIORITY_MIN, REASON_MAX_LENGTH

#: Ids named in a refusal message, per reason; the rest are counted.
IDS_SHOWN = 5

# What each repair applies to, who may make it and how it is offered come from its row in
# transitions.py: the same from-states as the guarded statement it runs.


def may_repair(request: HttpRequest, repair: Repair) -> bool:
    """Whether the user holds the permission of `repair`."""
    return request.user.has_perm(f"{Todo._meta.app_label}.{repair.permission}")


@dataclass(frozen=True)
class Operation:
    """An operator action: the batch transition it runs and how it reports and logs."""

    transition: Transition
    """Its row: with "select all", only the todos in its from-states are walked."""
    repair: Repair
    run: Callable[[list[str]], BatchResult]
    log: Callable[[Todo], str]
    """The LogEntry message for one changed todo."""


def _requeue_operation(using: str) -> Operation:
    return Operation(
        *REPAIRS["requeue"],
        run=Todo.objects.db_manager(using).requeue_many,
        log=lambda todo: "Requeued: dead letter back to pending, attempts reset.",
    )


def _expire_operation(using: str) -> Operation:
    return Operation(
        *REPAIRS["expire_lease"],
        run=Todo.objects.db_manager(using).expire_lease_many,
        log=lambda todo: (
            f"Expired the lease held by {todo.owner} "
            f"(attempt {todo.attempt} of {todo.max_attempts})."
        ),
    )


def _cancel_operation(using: str, reason: str) -> Operation:
    return Operation(
        *REPAIRS["cancel"],
        run=lambda ids: Todo.objects.db_manager(using).cancel_many(ids, reason),
        log=lambda todo: (
            f"Cancelled while claimed by {todo.owner} (attempt {todo.attempt} of "
            f"{todo.max_attempts}): {reason}"
            if todo.owner is not None
            else f"Cancelled while pending: {reason}"
        ),
    )


def _set_priority_operation(using: str, priority: int) -> Operation:
    return Operation(
        *REPAIRS["set_priority"],
        run=lambda ids: Todo.objects.db_manager(using).set_priority_many(ids, priority),
        log=lambda todo: f"Priority set to {priority} while pending.",
    )


class SetPriorityForm(forms.Form):
    priority = forms.IntegerField(
        label=_("Priority"),
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        initial=0,
        help_text=_(
            "From -100 to 100; higher is claimed sooner, 0 is the default. Within one priority, "
            "the todo claimable longest goes first."
        ),
    )


class CancelForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=REASON_MAX_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_(
            "Why these todos are cancelled. Kept in each todo's result and failure history, "
            "and told to the worker or agent running one."
        ),
    )


class TodoActions(TodoModelAdmin):
    """The todo admin's actions, the buttons that offer them, and the requeue-all page."""

    #: No new batch starts after this many seconds of one action; the message says what is left.
    action_time_limit = 20.0
    #: Todos per guarded statement (and per LogEntry insert) when an action runs.
    action_batch_size = BATCH_SIZE

    # What `@admin.action(permissions=[name])` asks.

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return may_repair(request, REPAIRS["requeue"][1])

    def has_expire_lease_permission(self, request: HttpRequest) -> bool:
        return may_repair(request, REPAIRS["expire_lease"][1])

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return may_repair(request, REPAIRS["cancel"][1])

    def has_set_priority_permission(self, request: HttpRequest) -> bool:
        return may_repair(request, REPAIRS["set_priority"][1])

    # Actions

    @admin.action(
        permissions=["requeue"],
        description=_("Requeue selected dead letters (back to pending, attempts reset)"),
    )
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[Todo]) -> None:
        self.run_operation(request, queryset, _requeue_operation(queryset.db))

    @admin.action(
        permissions=["expire_lease"],
        description=_("Expire the lease of selected claimed todos (they come back now)"),
    )
    def expire_lease_selected(self, request: HttpRequest, queryset: QuerySet[Todo]) -> None:
        self.run_operation(request, queryset, _expire_operation(queryset.db))

    @admin.action(
        permissions=["cancel"],
        description=_("Cancel selected pending and claimed todos…"),
    )
    def cancel_selected(
        self, request: HttpRequest, queryset: QuerySet[Todo]
    ) -> TemplateResponse | None:
        form = CancelForm(request.POST if "post" in request.POST else None)
        if form.is_valid():
            self.run_operation(
                request, queryset, _cancel_operation(queryset.db, form.cleaned_data["reason"])
            )
            return None
        return self._confirm(request, queryset, form, "cancel", _("Cancel todos"))

    @admin.action(
        permissions=["set_priority"],
        description=_("Set the priority of selected pending todos…"),
    )
    def set_priority_selected(
        self, request: HttpRequest, queryset: QuerySet[Todo]
    ) -> TemplateResponse | None:
        form = SetPriorityForm(request.POST if "post" in request.POST else None)
        if form.is_valid():
            self.run_operation(
                request,
                queryset,
                _set_priority_operation(queryset.db, form.cleaned_data["priority"]),
            )
            return None
        return self._confirm(request, queryset, form, "set_priority", _("Set the priority"))

    def _confirm(
        self,
        request: HttpRequest,
        queryset: QuerySet[Todo],
        form: forms.Form,
        name: str,
        title: Any,
    ) -> TemplateResponse:
        """The page that asks for an action's input, listing the todos it changes."""
        from_states = TRANSITIONS[name].from_states
        applies = queryset.filter(state__in=from_states)
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.opts,
            "back": request.get_full_path(),
            "form": form,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "count": capped_count(applies),
            "other_count": capped_count(queryset.exclude(state__in=from_states)),
            "shown": list(applies.defer(*JSON_COLUMNS)[:100]),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action_name": f"{name}_selected",
        }
        return TemplateResponse(
            request, f"admin/switchboard_todos/todo/{name}_confirmation.html", context
        )

    def run_operation(
        self, request: HttpRequest, queryset: QuerySet[Todo], operation: Operation
    ) -> BulkOutcome:
        """Apply `operation` to `queryset` in batches; log each change; report counts and refusals.

        Picked rows all go to the operation, which says why it refused each one. With "select
        all" (possibly millions), only the todos in the state the operation needs are walked.
        """
        if request.POST.get("select_across") == "1":
            queryset = queryset.filter(state__in=operation.transition.from_states)
        content_type = ContentType.objects.get_for_model(Todo, for_concrete_model=False)
        user_id = cast(int, request.user.pk)

        def log(result: BatchResult) -> None:
            LogEntry.objects.bulk_create(
                [
                    LogEntry(
                        user_id=user_id,
                        content_type_id=content_type.pk,
                        object_id=todo.pk,
                        object_repr=str(todo)[:200],
                        action_flag=CHANGE,
                        change_message=operation.log(todo),
                    )
                    for todo in result.changed
                ]
            )

        outcome = apply_in_batches(
            queryset,
            operation.run,
            batch_size=self.action_batch_size,
            time_limit=self.action_time_limit,
            on_batch=log,
        )
        self.report(request, outcome, operation.repair.done)
        return outcome

    def report(self, request: HttpRequest, outcome: BulkOutcome, done: str) -> None:
        """Tell the operator the counts, each reason for a refusal, and whether todos are left."""
        if outcome.changed:
            message = ngettext(
                "%(count)s todo %(done)s.", "%(count)s todos %(done)s.", outcome.changed
            )
            self.message_user(
                request,
                message % {"count": localize(outcome.changed), "done": done},
                messages.SUCCESS,
            )
        elif not outcome.refused:
            self.message_user(request, f"No todos {done}: none matched.", messages.WARNING)
        for reason, ids in sorted(outcome.refused.items()):
            listed = ", ".join(ids[:IDS_SHOWN])
            if len(ids) > IDS_SHOWN:
                listed += f" and {localize(len(ids) - IDS_SHOWN)} more"
            self.message_user(
                request, f"{localize(len(ids))} not {done}: {reason} ({listed}).", messages.WARNING
            )
        if outcome.unfinished:
            self.message_user(
                request,
                f"Stopped after {self.action_time_limit:g} seconds with todos left: run it again "
                "to go on, or use manage.py requeue_todos for very large sets.",
                messages.WARNING,
            )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().changelist_view(
            request, {**self._permissions(request), **(extra_context or {})}
        )

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Todo | None = None,
    ) -> HttpResponse:
        """Offer, as buttons, the repairs the todo's state allows and the user may make."""
        context["database_query"] = databases.query(request)
        context["repairs"] = [
            (f"{transition.name}_selected", repair.label, repair.explanation)
            for transition, repair in REPAIRS.values()
            if obj is not None and obj.state in transition.from_states
            if may_repair(request, repair)
        ]
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _permissions(self, request: HttpRequest) -> dict[str, bool]:
        """Which repairs the user may make, for the templates' buttons and links."""
        return {f"can_{name}": may_repair(request, repair) for name, (_, repair) in REPAIRS.items()}

    def requeue_all_view(self, request: HttpRequest) -> HttpResponse:
        """Requeue every dead letter matching the list's current filters, after a confirmation.

        Only for who may see that list: requeue_todo alone would requeue todos unseen.
        """
        if not (self.has_view_permission(request) and self.has_requeue_permission(request)):
            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        dead = changelist.get_queryset(request).filter(state__in=TRANSITIONS["requeue"].from_states)
        back = reverse("admin:switchboard_todos_todo_changelist") + changelist.get_query_string()
        if request.method == "POST":
            self.run_operation(request, dead, _requeue_operation(dead.db))
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Requeue all dead letters matching the filter"),
            "opts": self.opts,
            "count": capped_count(dead),
            "filters": active_filters(changelist),
            "back": back,
        }
        return TemplateResponse(request, "admin/switchboard_todos/todo/requeue_all.html", context)
