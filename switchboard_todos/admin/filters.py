"""The todo list's filters, each cheap at millions of rows, and how the active ones read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from switchboard_todos import stats
from switchboard_todos.admin import databases
from switchboard_todos.models import BLOCKED_UNTIL, State


class AttentionFilter(admin.SimpleListFilter):
    """The situations an operator looks for, each served by a partial index."""

    title = _("needs attention")
    parameter_name = "attention"
    conditions = {
        "dead": (_("Dead-lettered"), Q(state=State.FAILED)),
        "lease_expired": (
            _("Lease expired, not yet reaped"),
            Q(state=State.CLAIMED, lease_expires_at__lte=Now()),
        ),
        "waiting": (
            _("Scheduled or retrying: waiting for a time"),
            Q(state=State.PENDING, next_retry_at__gt=Now(), next_retry_at__lt=BLOCKED_UNTIL),
        ),
        # Blocked todos sit at the end of idx_todos_scheduled: no other pending todo is due so late.
        "blocked": (
            _("Blocked: waiting for other todos"),
            Q(state=State.PENDING, next_retry_at=BLOCKED_UNTIL),
        ),
        "ready": (
            _("Ready to claim"),
            Q(state=State.PENDING) & (Q(next_retry_at__isnull=True) | Q(next_retry_at__lte=Now())),
        ),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(key, label) for key, (label, _condition) in self.conditions.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.conditions.get(self.value() or "")
        return queryset if chosen is None else queryset.filter(chosen[1])


class PriorityFilter(admin.SimpleListFilter):
    """Above, at or below the default priority: three ranges, no count over the table."""

    title = _("priority")
    parameter_name = "priority"
    RANGES = {"high": Q(priority__gt=0), "normal": Q(priority=0), "low": Q(priority__lt=0)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("high", _("Above normal (> 0)")),
            ("normal", _("Normal (0)")),
            ("low", _("Below normal (< 0)")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        selected = self.RANGES.get(self.value() or "")
        return queryset if selected is None else queryset.filter(selected)


class ValuesFilter(admin.SimpleListFilter):
    """An exact-match filter whose choices are read cheaply (`values`), plus the chosen one."""

    def values(self, using: str) -> list[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        found = self.values(databases.chosen(request))
        chosen = self.value()
        if chosen and chosen not in found:
            found.append(chosen)
        return [(value, value) for value in found]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.value()
        return queryset if chosen is None else queryset.filter(**{str(self.parameter_name): chosen})


class QueueFilter(ValuesFilter):
    title = _("queue")
    parameter_name = "queue"

    def values(self, using: str) -> list[str]:
        return stats.distinct_values("queue", using=using)


class KindFilter(ValuesFilter):
    title = _("kind (among the newest 10,000 todos)")
    parameter_name = "kind"

    def values(self, using: str) -> list[str]:
        return stats.recent_kinds(using=using)


class AssigneeFilter(ValuesFilter):
    title = _("assignee")
    parameter_name = "assignee"
    UNASSIGNED = "-"

    def values(self, using: str) -> list[str]:
        return stats.distinct_values("assignee", using=using)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (self.UNASSIGNED, str(_("Anyone (unassigned)"))),
            *super().lookups(request, model_admin),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == self.UNASSIGNED:
            return queryset.filter(assignee__isnull=True)
        return super().queryset(request, queryset)


class FairKeyFilter(admin.SimpleListFilter):
    """The pending todos of one fair key, typed in: a list of the keys would read thousands of
    them at every page view. Pending only, because only pending todos are in idx_todos_lane."""

    title = _("fair key (pending todos)")
    parameter_name = "fair_key"
    template = "admin/switchboard_todos/todo/text_filter.html"
    kept: list[tuple[str, str]]

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        chosen = self.value()
        return [(chosen, chosen)] if chosen else []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: ChangeList) -> Any:
        """All and the key chosen; the form keeps the list's other parameters."""
        self.kept = [
            (name, value) for name, value in changelist.params.items() if name != "fair_key"
        ]
        return super().choices(changelist)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        chosen = self.value()
        if not chosen:
            return queryset
        return queryset.filter(state=State.PENDING, fair_key=chosen)


def active_filters(changelist: ChangeList) -> list[str]:
    """The filters the list applies, as the operator reads them in the sidebar."""
    shown = []
    for spec in changelist.filter_specs:
        for choice in spec.choices(changelist):
            if choice.get("selected") and choice.get("display") and not _is_all(choice):
                shown.append(f"{spec.title}: {choice['display']}")
    if changelist.query:
        shown.append(f"search: {changelist.query}")
    for key, value in changelist.params.items():
        if key.startswith(f"{changelist.date_hierarchy}__"):
            shown.append(f"{key.rsplit('__', 1)[1]}: {value}")
    return shown


def _is_all(choice: Mapping[str, object]) -> bool:
    return str(choice["display"]) == str(_("All"))
