"""Periodic todos: each schedule, its next tick and its last todo, and the pause switch.

Schedules are declared in code (schedules.py), so everything but `paused` is read-only here:
pausing and resuming, from the list's actions or the schedule's page, is in its history
(LogEntry). A resumed schedule skips the ticks it missed but the latest (or all, with
`missed="skip"`). A schedule no longer declared stays, inert, until deleted here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cronsim import CronSim
from django.contrib import admin
from django.db import connections
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from switchboard_todos import schedules
from switchboard_todos.admin.base import RefusesNul
from switchboard_todos.admin.display import todo_link
from switchboard_todos.models import Schedule

#: Pause or resume the schedules named; returns those it changed.
SWITCH = """
UPDATE todo_schedules SET paused = %(paused)s, updated_at = now()
 WHERE name = ANY (%(names)s::text[]) AND paused <> %(paused)s
RETURNING name
"""

if TYPE_CHECKING:
    ScheduleModelAdmin = admin.ModelAdmin[Schedule]
else:  # Django's classes take no type parameters at run time.
    ScheduleModelAdmin = admin.ModelAdmin


FIELDS = [
    "name",
    "cron",
    "when",
    "timezone",
    "missed",
    "paused",
    "next_run_at",
    "last_tick_at",
    "last_todo_link",
    "queue",
    "kind",
    "title",
    "payload",
    "priority",
    "max_attempts",
    "concurrency_key",
    "declared",
    "created_at",
    "updated_at",
]


@admin.register(Schedule)
class ScheduleAdmin(RefusesNul, ScheduleModelAdmin):
    """The schedules; operators pause and resume them, the code declares the rest."""

    list_display = [
        "name",
        "when",
        "timezone",
        "queue",
        "kind",
        "next_run_at",
        "last_tick_at",
        "last_todo_link",
        "paused",
        "declared",
    ]
    list_filter = ["paused", "queue"]
    search_fields = ["name", "kind"]
    actions = ["pause_selected", "resume_selected"]
    fields = tuple(FIELDS)

    def get_readonly_fields(self, request: HttpRequest, obj: Schedule | None = None) -> list[str]:
        """Only the pause switch is the operator's."""
        return [name for name in FIELDS if name != "paused"]

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: ModelForm[Schedule], change: bool
    ) -> None:
        """Write the pause switch alone: saving the whole row could set `next_run_at` back
        under a scheduler that just advanced it, and so enqueue a tick twice."""
        Schedule.objects.using(obj._state.db).filter(pk=obj.pk).update(
            paused=obj.paused, updated_at=Now()
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return request.user.has_perm("switchboard_todos.pause_schedule")

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        """Only a schedule the code no longer declares: a declared one would come back."""
        if obj is not None and obj.name in self._declared():
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description=_("when"))
    def when(self, obj: Schedule) -> str:
        return f"{obj.cron} ({CronSim(obj.cron, timezone.now()).explain()})"

    @admin.display(description=_("last todo"))
    def last_todo_link(self, obj: Schedule) -> SafeString | str:
        return todo_link(obj.last_todo_id)

    @admin.display(description=_("in code"), boolean=True)
    def declared(self, obj: Schedule) -> bool:
        return obj.name in self._declared()

    @admin.action(description=_("Pause the selected schedules"), permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._switch(request, queryset, paused=True)

    @admin.action(description=_("Resume the selected schedules"), permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._switch(request, queryset, paused=False)

    def _switch(self, request: HttpRequest, queryset: QuerySet[Schedule], *, paused: bool) -> None:
        """Pause or resume in one guarded statement; each schedule it changed gets a LogEntry."""
        names = list(queryset.values_list("name", flat=True))
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(SWITCH, {"names": names, "paused": paused})
            changed = [name for (name,) in cursor.fetchall()]
        for schedule in Schedule.objects.using(queryset.db).filter(name__in=changed):
            self.log_change(request, schedule, "Paused." if paused else "Resumed.")
        count = len(changed)
        message = (
            ngettext("Paused %(count)d schedule.", "Paused %(count)d schedules.", count)
            if paused
            else ngettext("Resumed %(count)d schedule.", "Resumed %(count)d schedules.", count)
        )
        self.message_user(request, message % {"count": count})

    @staticmethod
    def _declared() -> dict[str, Any]:
        return schedules.declared()
