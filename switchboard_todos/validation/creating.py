"""Creation: `create_todo`'s arguments (CREATION_DEFAULTS) checked into an insert's parameters,
for one todo (`creation`) or a batch (`creations`), and the checks only a new todo needs: the
todos it waits for (`after`), what it does when one of them fails, the event it points back to.

Apart from the transitions' table because a new todo's arguments are checked together (a kind or
a title; `after` or `run_after`), not one name at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.validation.json_values import payload
from switchboard_todos.validation.quantities import (
    MAX_ATTEMPTS_LIMIT,
    priority,
    run_after,
    whole_number,
)
from switchboard_todos.validation.texts import (
    SOURCE_MAX_LENGTH,
    TITLE_MAX_LENGTH,
    assignee,
    concurrency_key,
    fair_key,
    idempotency_key,
    kind,
    queue,
    text,
    todo_id,
)

if TYPE_CHECKING:
    from switchboard_todos.models import Event

#: Most todos one todo may wait for (`after`).
MAX_PARENTS = 1000
#: What a todo that waits for others may do when one of them ends as a dead letter.
PARENT_FAILURE_POLICIES = ("cancel", "run_anyway")


def parents(value: object) -> list[str]:
    """The todos a new todo waits for (`after`): 1 to MAX_PARENTS ids or batch refs, repeats
    dropped, order kept."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidTodo(f"after must be a list of todo ids, not {type(value).__name__}.")
    named = list(dict.fromkeys(todo_id(item, "after") for item in value))
    if not named:
        raise InvalidTodo("after must name at least one todo (or be left out).")
    if len(named) > MAX_PARENTS:
        raise InvalidTodo(
            f"after names {len(named)} todos; a todo waits for at most {MAX_PARENTS}."
        )
    return named


def parent_failure(value: object) -> str:
    """What a todo does when a todo it waits for ends as a dead letter."""
    if value not in PARENT_FAILURE_POLICIES:
        raise InvalidTodo(f"on_parent_failure must be 'cancel' or 'run_anyway', not {value!r}.")
    return str(value)


def event(value: Event | str | None) -> str | None:
    """The event a todo points back to: a saved Event, or an event id (looked up before insert)."""
    if value is None:
        return None
    from switchboard_todos.models import Event

    if isinstance(value, Event):
        if value._state.adding:
            raise InvalidTodo("event must be a saved Event (or its id); this one is not saved.")
        return todo_id(value.pk, "event")
    if isinstance(value, str):
        return todo_id(value, "event")
    raise InvalidTodo(f"event must be an Event or its id (a str), not {type(value).__name__}.")


#: `create_todo`'s arguments and their defaults; each mapping of a batch takes the same keys.
CREATION_DEFAULTS: dict[str, Any] = {
    "queue": "default",
    "kind": "",
    "title": "",
    "payload": None,
    "source": "",
    "idempotency_key": None,
    "assignee": None,
    "max_attempts": None,
    "priority": 0,
    "concurrency_key": None,
    "fair_key": None,
    "event": None,
    "run_after": None,
    "after": None,
    "on_parent_failure": "cancel",
}
_CREATION_ARGUMENTS = frozenset(CREATION_DEFAULTS)


def creation(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one todo's `create_todo` arguments into the insert's parameters.

    Arguments left at their default skip their check: batches call this once per row. A
    `max_attempts` of None stays None: the insert takes the queue's default (Queue), else
    DEFAULT_MAX_ATTEMPTS.
    `event_given_by_id` says whether the event was named by a str id, which the manager looks
    up before inserting (a saved Event needs no lookup), and `event_database` where a saved
    Event was loaded from (a todo must live in its event's database).
    """
    if type(spec) is not dict and not isinstance(spec, Mapping):  # dict first: ABCs are slow
        raise InvalidTodo(f"a todo must be a mapping of arguments, not {type(spec).__name__}.")
    if not _CREATION_ARGUMENTS.issuperset(spec):
        unknown = spec.keys() - _CREATION_ARGUMENTS
        raise InvalidTodo(f"unknown arguments: {', '.join(sorted(map(repr, unknown)))}.")
    get = spec.get
    checked_kind = kind(get("kind", ""))
    title = get("title", "")
    checked_title = title if title == "" else text(title, "title", TITLE_MAX_LENGTH)
    if not checked_kind and not checked_title.strip():
        raise InvalidTodo("A todo needs a kind or a title; both are empty.")
    source, key, holder, attempts, rank, one_at_a_time, given_event, after = (
        get("source", ""),
        get("idempotency_key"),
        get("assignee"),
        get("max_attempts"),
        get("priority", 0),
        get("concurrency_key"),
        get("event"),
        get("run_after"),
    )
    waits_for, policy, tenant = get("after"), get("on_parent_failure", "cancel"), get("fair_key")
    checked_policy = policy if policy == "cancel" else parent_failure(policy)
    if waits_for is not None and after is not None:
        raise InvalidTodo(
            "A todo that waits for others (after) starts when they are done; it cannot also "
            "have a run_after."
        )
    return {
        "queue": queue(get("queue", "default")),
        "kind": checked_kind,
        "title": checked_title,
        "payload": payload(get("payload")),
        "source": source if source == "" else text(source, "source", SOURCE_MAX_LENGTH),
        "idempotency_key": None if key is None else idempotency_key(key),
        "assignee": None if holder is None else assignee(holder),
        "max_attempts": (
            None
            if attempts is None
            else whole_number(attempts, "max_attempts", 1, MAX_ATTEMPTS_LIMIT)
        ),
        "priority": rank if rank == 0 and type(rank) is int else priority(rank),
        "concurrency_key": None if one_at_a_time is None else concurrency_key(one_at_a_time),
        "fair_key": None if tenant is None else fair_key(tenant),
        "event_id": None if given_event is None else event(given_event),
        "event_given_by_id": isinstance(given_event, str),
        "event_database": getattr(getattr(given_event, "_state", None), "db", None),
        "run_after": None if after is None else run_after(after),
        "parents": None if waits_for is None else parents(waits_for),
        "on_parent_failure": None if waits_for is None else checked_policy,
        # Not an argument: the manager sets it from the creator's active trace (tracing.py).
        "trace_context": None,
    }


def creations(todos: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate a batch of todos (`create_many`, `enqueue_many`), naming the first bad one."""
    if isinstance(todos, str | bytes | Mapping) or not isinstance(todos, Iterable):
        raise InvalidTodo(f"todos must be a list of mappings, not {type(todos).__name__}.")
    batch = []
    for number, spec in enumerate(todos):
        try:
            batch.append(creation(spec))
        except InvalidTodo as error:
            raise InvalidTodo(f"todo #{number}: {error}") from error
    return batch
