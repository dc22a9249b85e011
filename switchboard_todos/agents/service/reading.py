"""What an agent reads: a page of the todos it may claim or holds, and one todo it may see,
waiting (a long poll) until that todo ends if asked."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple

from asgiref.sync import sync_to_async
from django.db.models import Q

from switchboard_todos import endings, validation
from switchboard_todos.agents import long_poll_cap
from switchboard_todos.agents.service import visibility
from switchboard_todos.agents.service.twins import twin
from switchboard_todos.exceptions import InvalidTodo, TodoNotFound
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.validation import Seconds

#: Most todos one page of `list_todos` holds, and how many without a `limit`.
MAX_PAGE = 100
DEFAULT_PAGE = 50
#: A page's position (`next_cursor`): the microsecond its last todo was created, and its id.
CURSOR_PATTERN = r"^-?[0-9]{1,18}:[^\x00]*$"
_CURSOR = re.compile(CURSOR_PATTERN.removeprefix("^").removesuffix("$"))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class Page(NamedTuple):
    """One page of `list_todos`; pass `next_cursor` back for the next, None at the end."""

    todos: list[Todo]
    next_cursor: str | None


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
        names = visibility.claim_queues(agent, queues)
        todos = Todo.objects.filter(
            visibility.claimable_by(agent), queue__in=names, state=State.PENDING
        )
    elif state == "claimed":
        todos = Todo.objects.filter(owner=agent.name, state=State.CLAIMED)
        if queues is not None:
            todos = todos.filter(queue__in=visibility.claim_queues(agent, queues))
    else:
        raise InvalidTodo(f"state must be 'pending' or 'claimed', not {state!r}.")
    if cursor is not None:
        after, after_id = _decode_cursor(cursor)
        todos = todos.filter(Q(created_at__gt=after) | Q(created_at=after, id__gt=after_id))
    todos = todos.order_by("created_at", "id")
    page = sorted(
        (todo for alias in visibility.databases(agent) for todo in todos.using(alias)[: size + 1]),
        key=lambda todo: (todo.created_at, todo.id),
    )
    if len(page) <= size:
        return Page(page, None)
    last = page[size - 1]
    return Page(page[:size], _encode_cursor(last))


def get_todo(agent: Agent, todo_id: str, *, wait: Seconds = 0) -> Todo:
    """One todo the agent may see or created (visibility.readable_by); with `wait` (seconds, at
    most MAX_WAIT), once it is done or failed, or as it is when `wait` has passed
    (Todo.objects.wait_for: woken the moment it ends). A wait counts among the agent's long
    polls (long_poll_cap.py)."""
    checked, seconds = visibility.todo_id(todo_id), long_poll_cap.seconds_of(wait)
    found = seen_todo(agent, checked)
    if not seconds or found.state in endings.ENDED:
        return found
    with long_poll_cap.admitted(agent, seconds):
        return Todo.objects.db_manager(found._state.db).wait_for(checked, seconds)


async def aget_todo(agent: Agent, todo_id: str, *, wait: Seconds = 0) -> Todo:
    """Async twin of `get_todo`: the wait is suspended, holding no thread or connection."""
    checked, seconds = visibility.todo_id(todo_id), long_poll_cap.seconds_of(wait)
    found = await sync_to_async(seen_todo)(agent, checked)
    if not seconds or found.state in endings.ENDED:
        return found
    async with long_poll_cap.awaiting(agent, seconds):
        return await Todo.objects.db_manager(found._state.db).await_for(checked, seconds)


def seen_todo(agent: Agent, todo_id: str) -> Todo:
    """The todo of `todo_id` if the agent may read it, in whichever of its databases."""
    for alias in visibility.read_databases(agent):
        readable = Todo.objects.using(alias).filter(visibility.readable_by(agent), pk=todo_id)
        found = list(readable[:1])
        if found:
            return found[0]
    raise TodoNotFound(todo_id)


def _encode_cursor(todo: Todo) -> str:
    return f"{(todo.created_at - _EPOCH) // _MICROSECOND}:{todo.id}"


def _decode_cursor(cursor: object) -> tuple[datetime, str]:
    """The position a cursor stands for; a text not of CURSOR_PATTERN's shape is InvalidTodo.

    Any text of that shape is a position (one beyond the dates Python can hold is the first or
    the last), so that a client can send nothing the API's schema allows and the list refuses.
    """
    if not isinstance(cursor, str) or _CURSOR.fullmatch(cursor) is None:
        raise InvalidTodo("cursor is not one that list_todos returned.")
    created, _, todo_id = cursor.partition(":")
    micros = int(created)
    try:
        after = _EPOCH + micros * _MICROSECOND
    except OverflowError:
        after = (datetime.max if micros > 0 else datetime.min).replace(tzinfo=UTC)
    return after, validation.text(todo_id, "cursor", len(todo_id))  # no unpaired surrogate


alist_todos = twin(list_todos)
