"""The one JSON shape of a todo, for every remote surface (HTTP responses, MCP tool output)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async

if sys.version_info >= (3, 12):
    from typing import TypedDict
else:  # pydantic, which makes the MCP tools' output schema of it, needs this one below 3.12
    from typing_extensions import TypedDict

from switchboard_todos.models import Todo, known_history, last_errors_of, parent_results_of


class TodoJSON(TypedDict):
    """A todo as a remote agent sees it; times are ISO 8601 strings in UTC, or null."""

    id: str
    queue: str
    kind: str
    title: str
    source: str
    payload: dict[str, Any]
    state: str
    owner: str | None
    assignee: str | None
    idempotency_key: str | None
    attempt: int
    max_attempts: int
    priority: int
    concurrency_key: str | None
    fair_key: str | None
    lease_expires_at: str | None
    next_retry_at: str | None
    created_at: str | None
    updated_at: str | None
    claimed_at: str | None
    completed_at: str | None
    result: Any
    last_error: Any
    progress: Any
    parents: list[str] | None
    waiting_for: int
    parent_results: dict[str, Any] | None


def todo_json(todo: Todo) -> TodoJSON:
    """`todo` in the shape every remote surface answers with (a query when it has parents)."""
    return todos_json([todo])[0]


def todos_json(todos: Sequence[Todo]) -> list[TodoJSON]:
    """Each of `todos` in that shape; the results of their parents are read in one query,
    none when no todo has parents, and their last errors in one more, none when every failure
    history is known (last_errors_of)."""
    results = parent_results_of(todos)
    errors = last_errors_of(todos)
    return [_shaped(todo, results.get(todo.id), errors.get(todo.id)) for todo in todos]


def reads_database(todos: Sequence[Todo]) -> bool:
    """Whether `todos_json` reads the database for `todos`: the results of a todo's parents, or
    the last error of one whose failure history is not known (known_history). A caller on the
    event loop shapes them off it only then."""
    return any(todo.parents or known_history(todo) is None for todo in todos)


async def atodos_json(todos: Sequence[Todo]) -> list[TodoJSON]:
    """`todos_json` for a caller on the event loop: off it only when it reads the database."""
    if reads_database(todos):
        return await sync_to_async(todos_json)(todos)
    return todos_json(todos)


def _shaped(todo: Todo, parent_results: dict[str, Any] | None, last_error: Any) -> TodoJSON:
    return {
        "id": todo.id,
        "queue": todo.queue,
        "kind": todo.kind,
        "title": todo.title,
        "source": todo.source,
        "payload": todo.payload,
        "state": todo.state,
        "owner": todo.owner,
        "assignee": todo.assignee,
        "idempotency_key": key_as_given(todo, todo.idempotency_key),
        "attempt": todo.attempt,
        "max_attempts": todo.max_attempts,
        "priority": todo.priority,
        "concurrency_key": key_as_given(todo, todo.concurrency_key),
        # The tenant it counts for: as the agent gave it, or None for the agent's own (the
        # default of a todo an agent creates).
        "fair_key": None if todo.fair_key == todo.source else key_as_given(todo, todo.fair_key),
        "lease_expires_at": _time(todo.lease_expires_at),
        "next_retry_at": _time(todo.next_retry_at),
        "created_at": _time(todo.created_at),
        "updated_at": _time(todo.updated_at),
        "claimed_at": _time(todo.claimed_at),
        "completed_at": _time(todo.completed_at),
        "result": todo.result,
        # The error of the last failed or expired attempt, from the todo's history.
        "last_error": last_error,
        # The holder's latest progress note (heartbeat's `progress`).
        "progress": todo.progress,
        # The todos it waits for (`after`), how many are not done yet, and what the done ones
        # returned: a todo that merges the work of others reads its parts' results here.
        "parents": todo.parents,
        "waiting_for": todo.waiting_for,
        "parent_results": parent_results,
    }


def key_as_given(todo: Todo, key: str | None) -> str | None:
    """One of `todo`'s keys as whoever created it gave it: the service stores an agent's keys
    scoped to it (its source, a slash, the key: `agent:<name>/<key>`: service/creating.py)."""
    scope = f"{todo.source}/"
    if key is not None and todo.source.startswith("agent:") and key.startswith(scope):
        return key[len(scope) :]
    return key


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
