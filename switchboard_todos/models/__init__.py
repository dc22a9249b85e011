"""The app's tables, one module per family: events, todos (and their dependencies), tasks,
failure history, agents, schedules and queue settings; columns' defaults and the names'
validators beside them. Every name is imported from here (`switchboard_todos.models`), as
Django and the migrations do."""

from __future__ import annotations

from switchboard_todos.models.agents import Agent
from switchboard_todos.models.defaults import new_event_id, new_todo_id, new_todo_ids
from switchboard_todos.models.events import Event
from switchboard_todos.models.history import ErrorEntry, last_errors_of
from switchboard_todos.models.queues import Queue
from switchboard_todos.models.schedules import Schedule
from switchboard_todos.models.tasks import TodoTask
from switchboard_todos.models.todos import (
    BLOCKED_UNTIL,
    ParentFailure,
    Todo,
    TodoEdge,
    known_history,
    parent_results_of,
)
from switchboard_todos.models.validators import (
    AGENT_NAME_MAX_LENGTH,
    agent_name_validator,
    validate_queue_name,
    validate_queue_names,
)
from switchboard_todos.transitions import State

__all__ = [
    "AGENT_NAME_MAX_LENGTH",
    "BLOCKED_UNTIL",
    "Agent",
    "ErrorEntry",
    "Event",
    "ParentFailure",
    "Queue",
    "Schedule",
    "State",
    "Todo",
    "TodoEdge",
    "TodoTask",
    "agent_name_validator",
    "known_history",
    "last_errors_of",
    "new_event_id",
    "new_todo_id",
    "new_todo_ids",
    "parent_results_of",
    "validate_queue_name",
    "validate_queue_names",
]
