"""Exceptions raised by the todo API."""

from __future__ import annotations

import math

from django.core.exceptions import ImproperlyConfigured


class TodoError(Exception):
    """Base class of every switchboard-todos error; do not raise it directly."""


class TodoNotFound(TodoError, LookupError):
    """No todo has the given id."""

    def __init__(self, todo_id: str) -> None:
        self.todo_id = todo_id
        super().__init__(f"Todo {todo_id!r} does not exist.")


class TaskNotFound(TodoNotFound):
    """No MCP task of the calling agent has the given id (another agent's answers the same)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.args = (f"Task {task_id!r} does not exist.",)


class TodoConflict(TodoError):
    """The todo exists but its state or owner does not allow the transition."""

    def __init__(
        self, message: str, *, todo_id: str, state: str | None = None, owner: str | None = None
    ) -> None:
        self.todo_id = todo_id
        self.state = state
        self.owner = owner
        super().__init__(message)


class TodoCancelled(TodoConflict):
    """An operator cancelled the todo: its holder must stop work on it and not complete it.

    Its heartbeat, complete and fail answer this instead of the plain conflict.
    """


class InvalidTodo(TodoError, ValueError):
    """An argument is malformed; raised before anything is written."""


class InvalidPlan(InvalidTodo):
    """The todos of a batch wait for each other in a way that can never run: a ref named
    twice, a todo waiting for itself, a cycle. Raised before anything is written.

    Each todo may be well formed on its own: the parts of the batch conflict, which is why the
    remote surfaces answer it apart from other bad input (409, agents/errors.py).
    """


class UnknownKind(TodoError, LookupError):
    """The worker has no handler for a todo's kind; the todo fails with this error."""


class LeaseExpired(TodoError):
    """Names a lapsed attempt in a todo's error history ("LeaseExpired"); never raised."""


class HandlerTimeout(TodoError):
    """Names an attempt whose handler ran past its timeout in a todo's error history."""


class WorkerCrashed(TodoError, RuntimeError):
    """A worker thread died of a bug rather than of a todo; `todo_worker` then exits 1."""


class NotAuthenticated(TodoError):
    """A remote agent's token is missing, unknown or revoked (HTTP 401)."""


class QueueNotGranted(TodoError, PermissionError):
    """A remote agent asked for a queue it was not granted (HTTP 403)."""


class Throttled(TodoError):
    """A remote agent went past one of its limits (SWITCHBOARD_TODOS_AGENT_*); nothing changed.

    `retry_after` is how many seconds to wait before trying again (HTTP's Retry-After).
    """

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        super().__init__(message)


class PoolerNotConfigured(ImproperlyConfigured):
    """A connection pooler lost what the app left on a server connection (a prepared
    statement): SWITCHBOARD_TODOS_POOLER is unset, or set to the wrong mode. Not a TodoError:
    the project's configuration is wrong, not the caller's input."""
