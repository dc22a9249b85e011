"""The Queues page: every queue with its todos' numbers and its settings; Pause and Resume as
actions, the settings edited on each queue's page.

A queue is listed when it has settings (a row of todo_queues) or todos. One without settings
shows the defaults, and saving its page makes its row. The numbers are the Queue health page's
(stats.queue_health, and its fair keys waiting: stats.fair_shares) for the database chosen with
`?database=` when queues live in several; a queue's settings live, and are written, in its own
database (placement.py). Every write goes through queue_settings.py, which sets only the
columns it names, so an edit never resets the claims' rate counters. Pausing and resuming need
`pause_queue` and are recorded in each queue's History (LogEntry); editing the other settings
needs `change_queue`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import dateparse, timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from switchboard_todos import placement, queue_settings, stats, validation
from switchboard_todos.admin import databases
from switchboard_todos.conf import conf
from switchboard_todos.durations import format_duration, parse_duration
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import Queue
from switchboard_todos.queue_settings import QueueView

if TYPE_CHECKING:
    QueueModelAdmin = admin.ModelAdmin[Queue]
    QueueModelForm = ModelForm[Queue]
else:  # Django's classes take no type parameters at run time.
    QueueModelAdmin = admin.ModelAdmin
    QueueModelForm = ModelForm

#: The settings the form edits besides the pause switch, as the model names them.
SETTINGS_FIELDS = [
    "description",
    "visibility_timeout",
    "max_attempts",
    "rate_limit",
    "rate_period",
    "concurrency_limit",
    "retention",
]
PAUSE_FIELDS = ["paused", "resume_at"]


class DurationText(forms.Field):
    """A duration as the commands take it: `30s`, `5m`, `12h`, `7d`, a plain number (in the
    unit `plain`), or Django's `1 02:00:00`; shown back in its largest exact unit."""

    widget = forms.TextInput(attrs={"size": 10})

    def __init__(self, *, plain: str = "s", **kwargs: Any) -> None:
        self.plain = plain
        super().__init__(required=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        return format_duration(value) if isinstance(value, timedelta) else value

    def to_python(self, value: Any) -> timedelta | None:
        if isinstance(value, timedelta) or value in (None, ""):
            return value or None
        text = str(value).strip()
        try:
            return parse_duration(text, plain=self.plain)
        except ValueError as error:
            parsed = dateparse.parse_duration(text)
            if parsed is None:
                raise ValidationError(str(error).capitalize() + ".") from None
            return parsed


class QueueForm(QueueModelForm):
    """A queue's settings, each checked by queue_settings' rules."""

    visibility_timeout = DurationText(
        label=_("Lease without ttl"),
        help_text=_(
            "How long a claim that gives no ttl holds each todo (SQS's visibility timeout): "
            "seconds (300) or with a unit (5m, 1h), at most 12h. Empty: "
            "SWITCHBOARD_TODOS_DEFAULT_TTL."
        ),
    )
    rate_period = DurationText(
        label=_("Rate period"),
        help_text=_("The rate limit's period: seconds (10) or with a unit (1m, 1h)."),
    )
    retention = DurationText(
        plain="d",
        label=_("Retention"),
        help_text=_(
            "The reaper deletes its done and failed todos completed longer ago than this: days "
            "(30) or with a unit (12h). Empty: kept until purge_todos deletes them."
        ),
    )

    class Meta:
        model = Queue
        fields = ["name", *PAUSE_FIELDS, *SETTINGS_FIELDS]
        labels = {
            "max_attempts": _("Max attempts"),
            "rate_limit": _("Rate limit"),
            "concurrency_limit": _("Concurrency limit"),
            "resume_at": _("Resume at"),
        }
        help_texts = {
            "paused": _(
                "A paused queue's todos are not claimed, by workers, agents or SQS clients; the "
                "todos already claimed finish."
            ),
            "resume_at": _("With the queue paused: it resumes by itself at this time."),
            "max_attempts": _(
                "Attempts a todo created without max_attempts gets (1 to 1000); todos already "
                "enqueued keep theirs. Empty: 5."
            ),
            "rate_limit": _(
                "At most this many claims per rate period, over every worker and agent "
                "together. Empty, with the period: no rate limit."
            ),
            "concurrency_limit": _(
                "At most this many of its todos claimed at once, over every worker and agent "
                "together. Empty: no limit."
            ),
            "description": _("What the queue is for, for the next operator."),
        }
        widgets = {
            "name": forms.TextInput(attrs={"size": 40}),
            "description": forms.Textarea(attrs={"rows": 2, "cols": 60}),
        }

    def _setting(self, name: str) -> Any:
        value = self.cleaned_data.get(name)
        if value is None or value == "":
            return value
        try:
            return queue_settings.SETTINGS[name](value)
        except InvalidTodo as error:
            raise ValidationError(str(error)) from None

    def clean_description(self) -> Any:
        return self._setting("description")

    def clean_visibility_timeout(self) -> Any:
        return self._setting("visibility_timeout")

    def clean_max_attempts(self) -> Any:
        return self._setting("max_attempts")

    def clean_concurrency_limit(self) -> Any:
        return self._setting("concurrency_limit")

    def clean_retention(self) -> Any:
        return self._setting("retention")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "rate_limit" in self.fields and "rate_period" in self.fields:
            limit, period = data.get("rate_limit"), data.get("rate_period")
            if (limit is None) != (period is None):
                missing = "rate_period" if period is None else "rate_limit"
                self.add_error(missing, _("A rate limit needs both a number and a period."))
            elif limit is not None:
                try:
                    queue_settings.checked_rate((limit, period))
                except InvalidTodo as error:
                    self.add_error("rate_limit", str(error))
        resume_at = data.get("resume_at")
        if "paused" in self.fields and resume_at is not None:
            if not data.get("paused"):
                self.add_error(
                    "resume_at", _("Tick “paused” to pause until then, or clear the time.")
                )
            elif resume_at <= timezone.now():
                self.add_error("resume_at", _("This time has passed."))
        return data


@dataclass(frozen=True)
class QueueRow:
    """One line of the Queues page."""

    view: QueueView
    url: str
    """Its page."""
    todos_url: str
    """The todo list, filtered to its todos (in its database)."""
    fair_keys: int
    """Its fair keys (tenants) with pending todos."""


@admin.register(Queue)
class QueueAdmin(QueueModelAdmin):
    """Every queue, its numbers and settings; Pause and Resume, and a page per queue."""

    form = QueueForm
    actions = ["pause_selected", "resume_selected"]
    fieldsets = [
        (None, {"fields": ["name", "description", "todos_now"]}),
        (
            _("Pause"),
            {
                "description": _(
                    "Takes effect at the next claim: a worker finishes the todos it holds and "
                    "takes no more. The Pause and Resume actions of the list do the same."
                ),
                "fields": [*PAUSE_FIELDS],
            },
        ),
        (
            _("Defaults of its todos"),
            {"fields": ["visibility_timeout", "max_attempts"]},
        ),
        (
            _("Limits, over every worker and agent together"),
            {"fields": [("rate_limit", "rate_period"), "concurrency_limit"]},
        ),
        (_("Retention"), {"fields": ["retention"]}),
    ]

    class Media:
        css = {"all": ["switchboard_todos/admin.css"]}

    # Permissions

    def has_view_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        """Who may see the todos (and the Queue health page) sees the queues too."""
        return super().has_view_permission(request, obj) or request.user.has_perm(
            "switchboard_todos.view_todo"
        )

    def has_change_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        return super().has_change_permission(request, obj) or self.has_pause_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        """Deleting a queue's settings gives it the defaults again; without settings, nothing
        to delete."""
        if obj is not None and obj._state.adding:
            return False
        return super().has_delete_permission(request, obj)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("switchboard_todos.pause_queue")

    def get_readonly_fields(self, request: HttpRequest, obj: Queue | None = None) -> list[str]:
        readonly = ["todos_now"]
        if obj is not None:
            readonly.append("name")
        if not request.user.has_perm("switchboard_todos.change_queue"):
            readonly += SETTINGS_FIELDS
        if not self.has_pause_permission(request):
            readonly += PAUSE_FIELDS
        return readonly

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        """Pause and Resume; deleting is on each queue's page. `action_location` is Django
        6.1's (where the actions show), passed on when given; 5.2 has none."""
        located = {} if action_location is None else {"action_location": action_location}
        actions = super().get_actions(request, **located)
        actions.pop("delete_selected", None)
        return actions

    # A queue's page

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Queue | None:
        """Its settings, or the defaults of a queue that has none: any valid queue name."""
        try:
            return queue_settings.settings_of(object_id)
        except InvalidTodo:
            return None

    @admin.display(description=_("todos now"))
    def todos_now(self, obj: Queue) -> str:
        if not obj.name:
            return "—"
        alias = placement.database_for(obj.name)
        return queue_settings.overview([obj.name], using=alias)[0].todos_text

    def save_model(
        self, request: HttpRequest, obj: Queue, form: ModelForm[Queue], change: bool
    ) -> None:
        """Write what the form changed, and no other column, in the queue's database."""
        changed = set(form.changed_data)
        settings: dict[str, Any] = {
            name: getattr(obj, name) for name in changed & set(queue_settings.SETTINGS)
        }
        if changed & {"rate_limit", "rate_period"}:
            settings["rate"] = None if obj.rate_limit is None else (obj.rate_limit, obj.rate_period)
        if not change:
            settings.setdefault("description", obj.description)
        with transaction.atomic(using=placement.database_for(obj.name)):
            if settings:
                saved = queue_settings.configure(obj.name, **settings)
                obj._state.adding, obj._state.db = False, saved._state.db
            if changed & set(PAUSE_FIELDS):
                try:
                    switched = (
                        queue_settings.pause(obj.name, until=obj.resume_at)
                        if obj.paused
                        else queue_settings.resume(obj.name)
                    )
                except InvalidTodo as error:
                    self.message_user(request, str(error), messages.ERROR)
                else:
                    if switched is not None:
                        obj._state.adding, obj._state.db = False, switched._state.db

    # The list

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Every queue of the chosen database, with its numbers and settings; actions on POST."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            self._run_action(request)
            back = request.POST.get("next", "")
            if not url_has_allowed_host_and_scheme(back, {request.get_host()}):
                back = request.get_full_path()
            return HttpResponseRedirect(back)
        alias = databases.chosen(request)
        query = databases.query(request)
        todos = reverse("admin:switchboard_todos_todo_changelist")
        tenants = {shares.queue: shares.keys for shares in stats.fair_shares(top=0, using=alias)}
        rows = [
            QueueRow(
                view,
                reverse("admin:switchboard_todos_queue_change", args=[quote(view.name)]),
                f"{todos}?{query}queue={quote(view.name)}",
                tenants.get(view.name, 0),
            )
            for view in queue_settings.overview(using=alias)
        ]
        aliases = placement.todo_databases()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queues"),
            "subtitle": None,
            "opts": self.opts,
            "rows": rows,
            "database": alias,
            "databases": aliases if len(aliases) > 1 else [],
            "action_choices": self.get_action_choices(request),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "has_add_permission": self.has_add_permission(request),
            "default_ttl": format_duration(timedelta(seconds=conf.DEFAULT_TTL)),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/switchboard_todos/queue/change_list.html", context)

    def _run_action(self, request: HttpRequest) -> None:
        """Run the action picked in the list on the queues ticked, as Django's action bar does."""
        action = request.POST.get("action", "")
        names = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if action not in self.get_actions(request):
            self.message_user(request, _("No action selected."), messages.WARNING)
            return
        if not names:
            self.message_user(
                request,
                _("Tick the queues to act on first; nothing was changed."),
                messages.WARNING,
            )
            return
        try:
            queues = [validation.queue(name) for name in names]
        except InvalidTodo as error:
            self.message_user(request, str(error), messages.ERROR)
            return
        getattr(self, action)(request, queues)

    # Actions: each takes the names of the queues ticked, with or without settings.

    @admin.action(permissions=["pause"], description=_("Pause the selected queues"))
    def pause_selected(self, request: HttpRequest, names: list[str]) -> None:
        self._switch(request, names, paused=True)

    @admin.action(permissions=["pause"], description=_("Resume the selected queues"))
    def resume_selected(self, request: HttpRequest, names: list[str]) -> None:
        self._switch(request, names, paused=False)

    def _switch(self, request: HttpRequest, names: list[str], *, paused: bool) -> None:
        """Pause or resume each queue named; log each one changed, and say which were so
        already."""
        switch = queue_settings.pause if paused else queue_settings.resume
        changed = [queue for name in names if (queue := switch(name))]
        for queue in changed:
            self.log_change(request, queue, "Paused." if paused else "Resumed.")
        count = len(changed)
        done = (
            ngettext("Paused %(count)d queue.", "Paused %(count)d queues.", count)
            if paused
            else ngettext("Resumed %(count)d queue.", "Resumed %(count)d queues.", count)
        )
        self.message_user(request, done % {"count": count}, messages.SUCCESS)
        left = sorted(set(names) - {queue.name for queue in changed})
        if left:
            why = _("Already paused: %(queues)s.") if paused else _("Not paused: %(queues)s.")
            self.message_user(request, why % {"queues": ", ".join(left)}, messages.INFO)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Queue | None = None,
    ) -> HttpResponse:
        """Offer Pause or Resume as a button, to whoever may pause."""
        if obj is not None and obj.name and self.has_pause_permission(request):
            context["switch"] = "resume_selected" if obj.paused else "pause_selected"
            context["switch_label"] = _("Resume now") if obj.paused else _("Pause now")
        return super().render_change_form(request, context, add, change, form_url, obj)
