"""What an agent creates: a todo, or a plan of todos that may wait for each other, in one of
its create queues (QueueNotGranted in any other), counted against its creation quota.

Its todos' source is `agent:<name>` and their keys are the agent's own (`scoped_key`), so an
agent can neither take a key a producer will use nor learn of a todo it may not see.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import router, transaction

from switchboard_todos import graphs, placement, validation
from switchboard_todos.agents.service import quotas, visibility
from switchboard_todos.agents.service.twins import twin
from switchboard_todos.exceptions import (
    InvalidPlan,
    InvalidTodo,
    QueueNotGranted,
    TodoConflict,
    TodoError,
    TodoNotFound,
)
from switchboard_todos.models import Agent, State, Todo

#: Longest idempotency or concurrency key an agent gives, as SQS's MessageDeduplicationId: the
#: key scoped to the agent (`scoped_key`) then fits the core's limit whatever the agent's name.
MAX_KEY_LENGTH = 128
#: Most todos one plan (`create_many_for`) holds.
MAX_PLAN = 1000
#: What an agent says of a todo it creates: create_todo's arguments but `source`, which is the
#: agent's, and `event`.
AGENT_CREATION = frozenset(validation.CREATION_DEFAULTS) - {"source", "event"}
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def create_for(
    agent: Agent,
    *,
    queue: str,
    kind: str = "",
    title: str = "",
    payload: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    assignee: str | None = None,
    run_after: datetime | str | None = None,
    max_attempts: int | None = None,
    priority: int = 0,
    concurrency_key: str | None = None,
    fair_key: str | None = None,
    after: Iterable[str] | None = None,
    on_parent_failure: str = "cancel",
) -> tuple[Todo, bool]:
    """Enqueue a todo in one of the agent's create queues; returns (todo, created).

    Its source is `agent:<name>`, and its keys are the agent's own (`scoped_key`), its fair key
    too: the agent is the tenant it counts for (`agent:<name>`, or `agent:<name>/<fair_key>`),
    so it takes turns with the other tenants of the queue (docs/queues.md, fairness). An
    idempotency key held by a live todo the agent created in that queue returns that todo with
    created=False, or, when the agent may not see that todo, a TodoConflict naming none. Each
    call counts against the agent's creation quota (Throttled past it); `max_attempts` may not
    exceed the agent's limit, and defaults to the lower of 5 and that limit; its payload counts
    against the agent's quota of bytes. With `after`, the todo waits for those todos
    (docs/dependencies.md), each one the agent may see (any other id is TodoNotFound, as an
    unknown one) and not a dead letter. A refused call writes nothing; one refused once it was
    counted (`_counted`) stays counted.
    """
    spec = _creation(
        agent,
        {
            "queue": queue,
            "kind": kind,
            "title": title,
            "payload": payload,
            "idempotency_key": idempotency_key,
            "assignee": assignee,
            "run_after": run_after,
            "max_attempts": max_attempts,
            "priority": priority,
            "concurrency_key": concurrency_key,
            "fair_key": fair_key,
            "after": after,
            "on_parent_failure": on_parent_failure,
        },
    )
    stored = validation.creation(spec)["payload"]  # bad input is refused before anything else
    with _counted(agent, _creations([spec]), validation.json_bytes(stored)):
        if spec["after"] is not None:
            _check_parents(agent, {placement.database_for(spec["queue"]): spec["after"]})
        todo, created = Todo.objects.create_todo(**{**spec, "payload": validation.JsonText(stored)})
        if not created and not visibility.sees(agent, todo):
            raise _hidden_twin(idempotency_key, spec["queue"])
    return todo, created


def create_many_for(agent: Agent, *, todos: Iterable[Mapping[str, Any]]) -> list[tuple[Todo, bool]]:
    """Create a plan, todos that may wait for each other, in one call; (todo, created) each.

    Each mapping takes `create_for`'s arguments, checked as create_for checks them, and a
    `ref`: an entry of `after` is the ref of another todo of the plan, or else the id of a todo
    the agent may see (TodoNotFound otherwise, as an unknown id). A plan with refs or `after`
    is created whole or not at all; a ref named twice, a todo waiting for itself or a cycle is
    InvalidPlan. The plan counts one creation per todo, and its payloads' bytes, against the
    agent's quotas, all at once (one larger than the whole quota is InvalidTodo: it could never
    pass), created or refused once counted (`_counted`). With idempotency keys on its todos, a
    plan sent again while its todos are live returns them (created=False).
    """
    if isinstance(todos, str | bytes | Mapping) or not isinstance(todos, Iterable):
        raise InvalidTodo(f"todos must be a list of todos, not {type(todos).__name__}.")
    given = list(itertools.islice(todos, MAX_PLAN + 1))
    if not given:
        raise InvalidTodo("A plan needs at least one todo.")
    if len(given) > MAX_PLAN:
        raise InvalidTodo(f"A plan holds at most {MAX_PLAN} todos; this one holds more.")
    specs, refs = graphs.split_refs(given)
    named = set(refs)
    checked: list[dict[str, Any]] = []
    waited: dict[str, list[str]] = {}
    for number, spec in enumerate(specs):
        try:
            if not isinstance(spec, Mapping):
                raise InvalidTodo(f"a todo must be an object, not {type(spec).__name__}.")
            checked.append(_creation(agent, spec))
        except (InvalidTodo, QueueNotGranted) as error:
            raise type(error)(f"todo #{number}: {error}") from None
        for parent in checked[-1]["after"] or []:
            if parent not in named:
                waited.setdefault(placement.database_for(checked[-1]["queue"]), []).append(parent)
    # Bad input is refused before anything else.
    payloads = [params["payload"] for params in validation.creations(checked)]
    planned = [
        {**spec, "payload": validation.JsonText(payload), **({} if ref is None else {"ref": ref})}
        for spec, ref, payload in zip(checked, refs, payloads, strict=True)
    ]
    with _counted(agent, _creations(checked), sum(map(validation.json_bytes, payloads))):
        if waited:
            _check_parents(agent, waited)
        if waited or any(refs):
            _refuse_held_keys(checked, specs)
        made = Todo.objects.create_many(planned)
        for (todo, created), spec in zip(made, specs, strict=True):
            if not created and not visibility.sees(agent, todo):
                raise _hidden_twin(spec.get("idempotency_key"), todo.queue)
    return made


def scoped_key(agent: Agent, key: object, name: str) -> str | None:
    """An idempotency, concurrency or fair key as stored for the agent that gave it: its source, a
    slash (which no agent name has) and the key, `agent:<name>/<key>`; serialize.key_as_given
    shows it back as given.

    So an agent's keys deduplicate and serialize only its own todos: it can neither take a key a
    producer will use, nor block the todos of a key it cannot see.
    """
    if key is None:
        return None
    return f"{visibility.source(agent)}/{validation.text(key, name, MAX_KEY_LENGTH, required=True)}"


def _creation(agent: Agent, spec: Mapping[str, Any]) -> dict[str, Any]:
    """create_todo's arguments for a todo the agent creates: in one of its create queues, its
    source the agent, its keys scoped (its fair key, the agent's own when it names none), its
    attempts within the agent's limit. The core checks the rest."""
    unknown = spec.keys() - AGENT_CREATION
    if unknown:
        raise InvalidTodo(f"unknown arguments: {', '.join(sorted(map(repr, unknown)))}.")
    if "queue" not in spec:
        raise InvalidTodo("queue is required: one of the queues you may create todos in.")
    name = validation.queue(spec["queue"])
    if name not in agent.create_queues:
        raise QueueNotGranted(f"Agent {agent.name!r} may not create todos in queue {name!r}.")
    after = spec.get("after")
    return {
        **spec,
        "queue": name,
        "source": visibility.source(agent),
        "idempotency_key": scoped_key(agent, spec.get("idempotency_key"), "idempotency_key"),
        "concurrency_key": scoped_key(agent, spec.get("concurrency_key"), "concurrency_key"),
        "fair_key": scoped_key(agent, spec.get("fair_key"), "fair_key") or visibility.source(agent),
        "max_attempts": quotas.max_attempts(agent, spec.get("max_attempts")),
        "run_after": _moment(spec.get("run_after")),
        "after": None if after is None else validation.parents(after),
    }


def _check_parents(agent: Agent, waited: Mapping[str, list[str]]) -> None:
    """TodoNotFound for the first of the todos to be waited for (by database) that the agent
    may not see, exactly as for an unknown id, and InvalidTodo for one that is a dead letter
    (which the create's statement would refuse once it had locked them all); one read per
    database, which waits for no lock."""
    for alias, ids in waited.items():
        seen = dict(
            Todo.objects.using(alias)
            .filter(visibility.visible_to(agent), pk__in=ids)
            .values_list("pk", "state")
        )
        for todo_id in ids:
            if todo_id not in seen:
                raise TodoNotFound(todo_id)
        for todo_id in ids:
            if seen[todo_id] == State.FAILED:
                raise InvalidTodo(
                    f"after: todo {todo_id!r} is a dead letter; requeue it before waiting for it."
                )


def _creations(specs: list[dict[str, Any]]) -> int:
    """What creating `specs` counts against the agent's quota: a creation per todo, and one
    more per PARENTS_PER_CREATE parents each names (rounded down)."""
    return sum(1 + len(spec["after"] or ()) // quotas.PARENTS_PER_CREATE for spec in specs)


@contextmanager
def _counted(agent: Agent, count: int, size: int) -> Iterator[None]:
    """Count `count` creations of payloads of `size` bytes, then run the block in the same
    transaction (one commit), which commits the count whatever the block answers: a create the
    database refused (a parent it may not see or that is a dead letter, read for it; a key
    held; a parent that ended meanwhile) cost it as much as one it made, so it costs the agent
    the same. Past the quota, Throttled comes first, and the database reads nothing for it."""
    refused: TodoError | None = None
    with transaction.atomic(using=router.db_for_write(Agent)):
        quotas.count_creates(agent, count, size)
        try:
            yield
        except InvalidPlan:  # found before the plan's statement: no more than bad input
            raise
        except (
            InvalidTodo,
            TodoConflict,
            TodoNotFound,
        ) as error:  # after a statement, never inside one
            refused = error
    if refused is not None:
        raise refused


def _refuse_held_keys(checked: list[dict[str, Any]], specs: list[Mapping[str, Any]]) -> None:
    """TodoConflict for a plan created whole or not at all when live todos hold some of its
    idempotency keys but not all (all of them, it answers those todos): one read, before the
    create's statement would insert the plan, lock its parents and roll back."""
    keys = [(spec["queue"], spec["idempotency_key"]) for spec in checked]
    holders = Todo.objects.db_manager(placement.database_for(keys[0][0])).key_holders(checked)
    held = {(todo.queue, todo.idempotency_key) for todo in holders}
    taken = [
        spec.get("idempotency_key") for key, spec in zip(keys, specs, strict=True) if key in held
    ]
    if taken and len(taken) < len(keys):
        raise TodoConflict(
            f"Live todos hold the idempotency keys {', '.join(map(repr, taken))} of this plan: "
            "its todos wait for each other, so they are created all together or not at all; "
            "nothing was created.",
            todo_id="",
        )


def _hidden_twin(key: object, queue: str) -> TodoConflict:
    """The conflict of an idempotency key held by a live todo the agent may not see."""
    return TodoConflict(
        f"Idempotency key {key!r} is taken in queue {queue!r}: a live todo you created with it "
        "is in a queue you do not claim from, or assigned to another agent, so it is not shown.",
        todo_id="",
    )


def _moment(value: datetime | str | None) -> datetime | None:
    """`run_after` as an aware datetime; remote callers send RFC 3339 text (JSON Schema's
    date-time: a date, a time and an offset)."""
    if not isinstance(value, str):
        return value
    try:
        if _RFC3339.fullmatch(value) is None:
            raise ValueError(value)
        return datetime.fromisoformat(value.upper())
    except ValueError:
        raise InvalidTodo(
            f"run_after {value!r} is not an RFC 3339 date and time with an offset "
            "(2030-01-31T09:00:00Z, 2030-01-31T10:00:00+01:00)."
        ) from None


acreate_for = twin(create_for)
acreate_many_for = twin(create_many_for)
