"""The queue health page: per-queue counts and a chart of them, and who holds back vacuum.

Below them, the repairs the user may make (transitions.py), each linked to the todos it applies to.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from switchboard_todos import stats, vacuum
from switchboard_todos.admin.actions import may_repair
from switchboard_todos.admin.base import TodoModelAdmin
from switchboard_todos.admin.chart import HealthChart
from switchboard_todos.transitions import REPAIRS, State


class HealthPage(TodoModelAdmin):
    """The todo admin's health page, for anyone who may view todos."""

    def health_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = stats.queue_health()
        health = vacuum.vacuum_health()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue health"),
            "opts": self.opts,
            "back": reverse("admin:switchboard_todos_todo_changelist"),
            "rows": rows,
            "chart": HealthChart(rows),
            "now": health.at,
            "vacuum": health,
            "repairs": [
                (State(state), repair)
                for transition, repair in REPAIRS.values()
                if may_repair(request, repair)
                for state in sorted(transition.from_states)
            ],
        }
        return TemplateResponse(request, "admin/switchboard_todos/todo/health.html", context)
