"""The operator's admin: todos and events to look at, and permission-gated repairs.

One module per role: `todos` (the list and detail pages), `actions` (the repairs), `health` and
`chart` (the queue health page), `queues` (each queue's numbers and settings, paused and
resumed), `filters`, `pagination` and `dates` (what keeps the list fast at
millions of rows), `display` (how stored JSON and histories are shown), `colours` (one colour
per state, for every page), `events`, `agents`
(the remote agents and their tokens) and `schedules` (periodic todos and their pause switch).
"""

from __future__ import annotations

from switchboard_todos.admin.agents import AgentAdmin
from switchboard_todos.admin.dates import AdminTodoQuerySet
from switchboard_todos.admin.events import EventAdmin
from switchboard_todos.admin.pagination import EstimatedCountPaginator
from switchboard_todos.admin.queues import QueueAdmin
from switchboard_todos.admin.schedules import ScheduleAdmin
from switchboard_todos.admin.todos import TodoAdmin

__all__ = [
    "AdminTodoQuerySet",
    "AgentAdmin",
    "EstimatedCountPaginator",
    "EventAdmin",
    "QueueAdmin",
    "ScheduleAdmin",
    "TodoAdmin",
]
