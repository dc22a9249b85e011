"""The one service layer of the remote surfaces: every verb a remote agent may call.

HTTP and MCP adapters authenticate the caller, pass its Agent and the request's arguments
here, and turn what comes back or is raised into their protocol (errors.py). Permissions are
checked here and nowhere else:

* the owner of every transition is the agent's name, never a value from the request;
* an agent claims from and lists only the queues it was granted (`claim_queues`), and creates
  todos only in `create_queues`: asking for another queue raises QueueNotGranted;
* it sees the todos of its claim queues not assigned to another agent, and the todos it
  holds; any other todo answers exactly as an unknown id does (TodoNotFound), so that an
  agent cannot learn what other queues hold.

With queues in several databases (placement.py), an agent's verbs run in the databases its
claim queues live in: a todo id is looked for in each, a list merges theirs, and a claim takes
from each in turn.

Every function has an `a`-prefixed async twin; `aclaim` waits for work on the LISTEN path
without holding a thread.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import time
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, router
from django.db.models import Q

from switchboard_todos import cursors, placement, validation
from switchboard_todos.agents import errors, tokens
from switchboard_todos.exceptions import (
    InvalidTodo,
    NotAuthenticated,
    QueueNotGranted,
    TodoConflict,
    TodoNotFound,
)
from switchboard_todos.managers import TodoManager, run_now
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sql import agent_queries
from switchboard_todos.validation import Seconds

P = ParamSpec("P")
R = TypeVar("R")

#: Longest claim `wait`, in seconds: SQS's limit, and below MCP clients' request timeouts.
MAX_WAIT = 20
#: Longest wait in one database of a claim from queues of several (see `_claim_across`).
ACROSS_WAIT = 1.0
#: Most todos one claim takes.
MAX_CLAIM_LIMIT = 10
#: Most todos one page of `list_todos` holds, and how many without a `limit`.
MAX_PAGE = 100
DEFAULT_PAGE = 50


class Page(NamedTuple):
    """One page of `list_todos`; pass `next_cursor` back for the next, None at the end."""

    todos: list[Todo]
    next_cursor: str | None


# Identity


def authenticate(token: str | None) -> Agent:
    """The active agent holding `token`, or NotAuthenticated; one statement."""
    if not token:
        raise NotAuthenticated(errors.NO_TOKEN)
    if not isinstance(token, str) or not tokens.well_formed(token):
        raise NotAuthenticated("Unknown token.")
    agent = _agent_by_hash(tokens.token_hash(token))
    if agent is None:
        raise NotAuthenticated("Unknown token.")
    if not agent.is_active:
        raise NotAuthenticated(f"The token of agent {agent.name!r} was revoked.")
    return agent


def _agent_by_hash(token_hash: str) -> Agent | None:
    """Run `authenticate` (agents.sql): the agent, marked seen at most once a minute."""
    alias = router.db_for_write(Agent)
    with cursors.cursor(connections[alias]) as cursor:
        cursor.execute(agent_queries["authenticate"], {"token_hash": token_hash})
        row = cursor.fetchone()
        if row is None:
            return None
        names = [(name or b"").decode() for name in cursors.column_names(cursor)]
    values: dict[str | None, Any] = dict(zip(names, row, strict=True))
    fields = Agent._meta.concrete_fields
    return Agent.from_db(
        alias, [field.attname for field in fields], [values[field.column] for field in fields]
    )


# Reading


def list_todos(
    agent: Agent,
    *,
    queues: Iterable[str] | None = None,
    state: Literal["pending", "claimed"] = "pending",
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> Page:
    """The pending todos the agent may claim, or (`state="claimed"`) the ones it holds.

    Oldest first; `queues` narrows to some of its claim queues (all of them by default).
    """
    size = validation.whole_number(limit, "limit", 1, MAX_PAGE)
    if state == "pending":
        names = _claim_queues(agent, queues)
        todos = Todo.objects.filter(_claimable_by(agent), queue__in=names, state=State.PENDING)
    elif state == "claimed":
        todos = Todo.objects.filter(owner=agent.name, state=State.CLAIMED)
        if queues is not None:
            todos = todos.filter(queue__in=_claim_queues(agent, queues))
    else:
        raise InvalidTodo(f"state must be 'pending' or 'claimed', not {state!r}.")
    if cursor is not None:
        after, after_id = _decode_cursor(cursor)
        todos = todos.filter(Q(created_at__gt=after) | Q(created_at=after, id__gt=after_id))
    todos = todos.order_by("created_at", "id")
    page = sorted(
        (todo for alias in _databases(agent) for todo in todos.using(alias)[: size + 1]),
        key=lambda todo: (todo.created_at, todo.id),
    )
    if len(page) <= size:
        return Page(page, None)
    last = page[size - 1]
    return Page(page[:size], _encode_cursor(last))


def get_todo(agent: Agent, todo_id: str) -> Todo:
    """One todo the agent may see."""
    checked = _todo_id(todo_id)
    for alias in _databases(agent):
        found = list(Todo.objects.using(alias).filter(_visible_to(agent), pk=checked)[:1])
        if found:
            return found[0]
    raise TodoNotFound(checked)


# Claiming


def claim(
    agent: Agent,
    *,
    queues: Iterable[str] | None = None,
    todo_id: str | None = None,
    ttl: Seconds | None,
    wait: Seconds = 0,
    limit: int = 1,
) -> list[Todo]:
    """Claim up to `limit` todos from `queues` (all its claim queues by default), or one by id,
    under a lease of `ttl` (None: each queue's visibility timeout, else DEFAULT_TTL).

    With `wait` (seconds, at most MAX_WAIT), block until a todo is claimable; the list is empty
    when none became claimable in time. The async twin waits without holding a thread.
    """
    if todo_id is not None:
        return [_claim_one(agent, queues, todo_id, ttl, wait, limit)]
    names, seconds, count = _claim_arguments(agent, queues, wait, limit)
    placed = placement.by_database(names)
    if len(placed) == 1:
        return Todo.objects.claim_batch(names, agent.name, ttl, count, wait=seconds)
    return run_now(_claim_across(agent, placed, ttl, seconds, count, blocking=True))


async def aclaim(
    agent: Agent,
    *,
    queues: Iterable[str] | None = None,
    todo_id: str | None = None,
    ttl: Seconds | None,
    wait: Seconds = 0,
    limit: int = 1,
) -> list[Todo]:
    """Async twin of `claim`: waits on the LISTEN path, suspended, not blocking a thread."""
    if todo_id is not None:
        one = await sync_to_async(_claim_one)(agent, queues, todo_id, ttl, wait, limit)
        return [one]
    names, seconds, count = _claim_arguments(agent, queues, wait, limit)
    placed = placement.by_database(names)
    if len(placed) == 1:
        return await Todo.objects.aclaim_batch(names, agent.name, ttl, count, wait=seconds)
    return await _claim_across(agent, placed, ttl, seconds, count, blocking=False)


async def _claim_across(
    agent: Agent,
    placed: dict[str, list[str]],
    ttl: Seconds | None,
    seconds: float,
    count: int,
    *,
    blocking: bool,
) -> list[Todo]:
    """A claim from queues of several databases: from each in turn without waiting; then,
    while `seconds` last, a wait of at most ACROSS_WAIT in each database in turn (woken at once
    by its notifications), so a todo in another one waits at most ACROSS_WAIT.

    `blocking` waits on this thread (run with `run_now`); otherwise suspended, as `aclaim`.
    """
    deadline = time.monotonic() + seconds
    turns = itertools.cycle(placed.items())
    while True:
        if blocking:
            claimed = _claim_each(agent, placed, ttl, count)
        else:
            claimed = await sync_to_async(_claim_each)(agent, placed, ttl, count)
        remaining = deadline - time.monotonic()
        if claimed or remaining <= 0:
            return claimed
        alias, names = next(turns)
        todos, wait = Todo.objects.db_manager(alias), min(remaining, ACROSS_WAIT)
        if blocking:
            claimed = todos.claim_batch(names, agent.name, ttl, count, wait=wait)
        else:
            claimed = await todos.aclaim_batch(names, agent.name, ttl, count, wait=wait)
        if claimed:
            return claimed


def _claim_each(
    agent: Agent, placed: dict[str, list[str]], ttl: Seconds | None, count: int
) -> list[Todo]:
    """Claim up to `count` from each database's queues in turn, until `count` are claimed."""
    claimed: list[Todo] = []
    for alias, names in placed.items():
        if len(claimed) >= count:
            break
        claimed += Todo.objects.db_manager(alias).claim_batch(
            names, agent.name, ttl, count - len(claimed)
        )
    return claimed


def _claim_arguments(
    agent: Agent, queues: Iterable[str] | None, wait: Seconds, limit: int
) -> tuple[list[str], float, int]:
    names = _claim_queues(agent, queues)
    seconds = validation.duration(
        wait, "wait", maximum=timedelta(seconds=MAX_WAIT), allow_zero=True
    ).total_seconds()
    return names, seconds, validation.whole_number(limit, "limit", 1, MAX_CLAIM_LIMIT)


def _claim_one(
    agent: Agent,
    queues: Iterable[str] | None,
    todo_id: str,
    ttl: Seconds | None,
    wait: Seconds,
    limit: int,
) -> Todo:
    """Claim one todo by id, if the agent may see it (another's todo is an unknown id)."""
    if queues is not None:
        raise InvalidTodo("Give queues or todo_id, not both.")
    if wait or limit != 1:
        raise InvalidTodo("wait and limit apply to claims from queues, not to a claim by id.")
    checked = _todo_id(todo_id)
    candidates = Todo.objects.filter(_claimable_by(agent), queue__in=agent.claim_queues)
    for alias in _databases(agent):
        if candidates.using(alias).filter(pk=checked).exists():
            return Todo.objects.db_manager(alias).claim(checked, agent.name, ttl)
    raise TodoNotFound(checked)


# The holder's verbs


def heartbeat(agent: Agent, todo_id: str, ttl: Seconds) -> Todo:
    """Extend the lease on a todo the agent holds to `ttl` from now."""
    return _as_holder(
        agent, todo_id, lambda todos, checked: todos.heartbeat(checked, agent.name, ttl)
    )


def complete(agent: Agent, todo_id: str, result: Any = None) -> Todo:
    """Mark a todo the agent holds done, with `result` (any JSON value)."""
    return _as_holder(
        agent, todo_id, lambda todos, checked: todos.complete(checked, agent.name, result)
    )


def fail(agent: Agent, todo_id: str, error: Any = None, retry_in: Seconds | None = None) -> Todo:
    """Record a failed attempt: retried after a backoff (or `retry_in`), dead letter at the cap."""
    return _as_holder(
        agent, todo_id, lambda todos, checked: todos.fail(checked, agent.name, error, retry_in)
    )


def release(agent: Agent, todo_id: str, delay: Seconds | None = None) -> Todo:
    """Give the lease back, claimable again after `delay`; the attempt is not counted."""
    return _as_holder(
        agent, todo_id, lambda todos, checked: todos.release(checked, agent.name, delay)
    )


def _as_holder(agent: Agent, todo_id: str, transition: Callable[[TodoManager, str], Todo]) -> Todo:
    """Run a holder's transition; a conflict over a todo the agent may not see is a 404.

    With several databases, the todo is first looked for (one query per database).
    """
    checked = _todo_id(todo_id)
    aliases = _databases(agent)
    if len(aliases) > 1:
        found = [
            alias for alias in aliases if Todo.objects.using(alias).filter(pk=checked).exists()
        ]
        if not found:
            raise TodoNotFound(checked)
        aliases = found
    todos = Todo.objects.db_manager(aliases[0])
    try:
        return transition(todos, checked)
    except TodoConflict:
        if not todos.filter(_visible_to(agent), pk=checked).exists():
            raise TodoNotFound(checked) from None
        raise


# Creating


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
    max_attempts: int = 5,
    priority: int = 0,
    concurrency_key: str | None = None,
) -> tuple[Todo, bool]:
    """Enqueue a todo in one of the agent's create queues; returns (todo, created).

    Its source is `agent:<name>`. An idempotency key held by a live todo of that queue
    returns that todo with created=False.
    """
    name = validation.queue(queue)
    if name not in agent.create_queues:
        raise QueueNotGranted(f"Agent {agent.name!r} may not create todos in queue {name!r}.")
    return Todo.objects.create_todo(
        queue=name,
        kind=kind,
        title=title,
        payload=payload,
        source=f"agent:{agent.name}",
        idempotency_key=idempotency_key,
        assignee=assignee,
        max_attempts=max_attempts,
        priority=priority,
        concurrency_key=concurrency_key,
        run_after=_moment(run_after),
    )


# Shared checks


def _databases(agent: Agent) -> list[str]:
    """The databases the agent's claim queues live in (the router's, if it has none)."""
    return list(placement.by_database(agent.claim_queues)) or [router.db_for_write(Todo)]


def _claimable_by(agent: Agent) -> Q:
    """Todos not assigned to another agent."""
    return Q(assignee__isnull=True) | Q(assignee=agent.name)


def _visible_to(agent: Agent) -> Q:
    """The todos an agent may see: those it may claim from its queues, and those it holds."""
    return Q(owner=agent.name) | _claimable_by(agent) & Q(queue__in=agent.claim_queues)


def _claim_queues(agent: Agent, queues: Iterable[str] | None) -> list[str]:
    """The queues asked for, each granted to the agent for claiming; all of them by default."""
    if queues is None:
        if not agent.claim_queues:
            raise QueueNotGranted(f"Agent {agent.name!r} may not claim from any queue.")
        return list(agent.claim_queues)
    names = validation.queues(queues)
    for name in names:
        if name not in agent.claim_queues:
            raise QueueNotGranted(f"Agent {agent.name!r} may not claim from queue {name!r}.")
    return names


def _todo_id(value: object) -> str:
    return validation.text(value, "todo id", validation.TODO_ID_MAX_LENGTH, required=True)


def _moment(value: datetime | str | None) -> datetime | None:
    """`run_after` as an aware datetime; remote callers may send ISO 8601 text."""
    if not isinstance(value, str):
        return value
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise InvalidTodo(f"run_after {value!r} is not an ISO 8601 date and time.") from None


def _encode_cursor(todo: Todo) -> str:
    position = json.dumps([todo.created_at.isoformat(), todo.id])
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor of `_encode_cursor` stands for; anything else is InvalidTodo."""
    if len(cursor) > 200:
        raise InvalidTodo("cursor is not one that list_todos returned.")
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, todo_id = json.loads(text)
        after = datetime.fromisoformat(created_at)
        if not isinstance(todo_id, str) or after.tzinfo is None:
            raise ValueError(cursor)
    except (binascii.Error, UnicodeError, ValueError, TypeError):
        raise InvalidTodo("cursor is not one that list_todos returned.") from None
    return after, todo_id


# Async twins


def _twin(function: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """The `a`-prefixed twin of a service function: the same code, run off the event loop."""

    async def twin(*args: P.args, **kwargs: P.kwargs) -> R:
        return await sync_to_async(function, thread_sensitive=True)(*args, **kwargs)

    twin.__name__ = twin.__qualname__ = f"a{function.__name__}"
    twin.__doc__ = f"Async twin of `{function.__name__}`."
    return twin


aauthenticate = _twin(authenticate)
alist_todos = _twin(list_todos)
aget_todo = _twin(get_todo)
aheartbeat = _twin(heartbeat)
acomplete = _twin(complete)
afail = _twin(fail)
arelease = _twin(release)
acreate_for = _twin(create_for)
