"""The queue health page: per-queue counts and a chart of them, the tenants waiting in each queue
(fair keys), and who holds back vacuum; with queues in several databases, one line per database
above them (`?database=` picks the one shown).

Below them, the repairs the user may make (transitions.py), each linked to the todos it applies to.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from switchboard_todos import placement, stats
from switchboard_todos.admin import databases
from switchboard_todos.admin.actions import may_repair
from switchboard_todos.admin.base import TodoModelAdmin
from switchboard_todos.admin.chart import HealthChart
from switchboard_todos.transitions import REPAIRS, State
from switchboard_todos.upkeep import vacuum


class HealthPage(TodoModelAdmin):
    """The todo admin's health page, for anyone who may view todos."""

    def health_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        alias = databases.chosen(request)
        rows = stats.queue_health(using=alias)
        counts = {row.queue: row for row in rows}
        tenants = [
            (shares, shares.unkeyed(counts.get(shares.queue)))
            for shares in stats.fair_shares(using=alias)
        ]
        health = vacuum.vacuum_health(alias)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queue health"),
            "opts": self.opts,
            "back": reverse("admin:switchboard_todos_todo_changelist"),
            "rows": rows,
            "chart": HealthChart(rows),
            "tenants": tenants,
            "top": stats.TOP_KEYS,
            "now": health.at,
            "vacuum": health,
            "database": alias,
            "database_query": databases.query(request),
            "databases": _summaries(alias, rows),
            "repairs": [
                (State(state), repair)
                for transition, repair in REPAIRS.values()
                if may_repair(request, repair)
                for state in sorted(transition.from_states)
            ],
        }
        return TemplateResponse(request, "admin/switchboard_todos/todo/health.html", context)


@dataclass(frozen=True)
class DatabaseSummary:
    """One database's line on the health page: its queues' counts, summed."""

    alias: str
    queues: int
    ready: int
    claimed: int
    lease_expired: int
    dead: int


def _summaries(shown: str, shown_rows: list[stats.QueueHealth]) -> list[DatabaseSummary]:
    """Each database's summary, when todos live in more than one; else none."""
    aliases = placement.todo_databases()
    if len(aliases) < 2:
        return []
    summaries = []
    for alias in aliases:
        rows = shown_rows if alias == shown else stats.queue_health(using=alias)
        summaries.append(
            DatabaseSummary(
                alias,
                len(rows),
                sum(row.ready for row in rows),
                sum(row.claimed for row in rows),
                sum(row.lease_expired for row in rows),
                sum(row.dead for row in rows),
            )
        )
    return summaries
