"""The arguments table: the check of each argument of the manager's transitions, by the
argument's name (ARGUMENTS), and `arguments()`, which applies it.

Apart from the families it draws on, so that an argument means the same in every method that
takes it, and a new method is validated by naming its arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from switchboard_todos.validation.json_values import (
    error,
    progress,
    progress_by_id,
    result,
    results,
)
from switchboard_todos.validation.quantities import (
    CLAIM_BATCH_LIMIT,
    MAX_TIMEOUT,
    delay,
    duration,
    flag,
    instant,
    priority,
    ttl,
    wait,
    whole_number,
)
from switchboard_todos.validation.texts import (
    SCHEDULE_NAME_MAX_LENGTH,
    identifier,
    owner,
    queues,
    reason,
    todo_id,
    todo_ids,
)

R = TypeVar("R")


def optional(check: Callable[[Any], R], default: R | None = None) -> Callable[[Any], R | None]:
    """`check` for an argument that may be None, which stands for `default`."""

    def checked(value: Any) -> R | None:
        return default if value is None else check(value)

    return checked


#: The check of each argument of the manager's transitions, by name: an argument means the same
#: wherever it appears, and a new method is validated by naming its arguments.
ARGUMENTS: dict[str, Callable[[Any], Any]] = {
    "todo_id": todo_id,
    "todo_ids": todo_ids,
    "owner": owner,
    "queues": queues,
    "ttl": optional(ttl),
    "limit": lambda value: whole_number(value, "limit", 1, CLAIM_BATCH_LIMIT),
    "wait": optional(wait, 0.0),
    "max_held": optional(lambda value: whole_number(value, "max_held", 0, 2**31 - 1)),
    "timeout": lambda value: duration(
        value, "timeout", maximum=MAX_TIMEOUT, allow_zero=True
    ).total_seconds(),
    "result": result,
    "results": results,
    "error": error,
    "retry_in": optional(lambda value: delay(value, "retry_in")),
    "delay": optional(lambda value: delay(value, "delay"), timedelta(0)),
    "reason": reason,
    "progress": progress,
    "progress_by_id": progress_by_id,
    "priority": priority,
    "schedule": lambda value: identifier(value, "schedule", SCHEDULE_NAME_MAX_LENGTH),
    "awaited": lambda value: instant(value, "awaited"),
    "tick": lambda value: instant(value, "tick"),
    "next_run_at": lambda value: instant(value, "next_run_at"),
    "enqueue": lambda value: flag(value, "enqueue"),
}


def arguments(**given: Any) -> dict[str, Any]:
    """Check a transition's arguments, each by its name's rule in ARGUMENTS; return them checked.

    The one way into the manager's statements: every public method calls it (or `creations`)
    before it runs anything.
    """
    return {name: ARGUMENTS[name](value) for name, value in given.items()}
