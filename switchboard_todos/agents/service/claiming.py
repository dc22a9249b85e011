"""What an agent claims: up to a few todos from its claim queues, or one by id, each under a
lease, within its quota of held todos; with a `wait`, a long poll until one is claimable.

A claim from queues of one database is the manager's `claim_batch`; from queues of several, it
takes from each in turn (`_claim_across`). `aclaim` waits on the LISTEN path holding neither a
thread nor a connection (long_polls.py), admitted only while the agent has fewer than
SWITCHBOARD_TODOS_AGENT_MAX_WAITS long polls waiting (long_poll_cap.py).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from asgiref.sync import sync_to_async

from switchboard_todos import placement, validation
from switchboard_todos.agents import long_poll_cap
from switchboard_todos.agents.service import identity, quotas, visibility
from switchboard_todos.claims import long_polls
from switchboard_todos.exceptions import InvalidTodo, TodoConflict, TodoNotFound
from switchboard_todos.managers import TodoManager, run_now
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.validation import Seconds

T = TypeVar("T")

#: Longest wait in one database of a claim from queues of several (see `_claim_across`).
ACROSS_WAIT = 1.0
#: Most todos one claim takes.
MAX_CLAIM_LIMIT = 10


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
    when none became claimable in time. The async twin waits without holding a thread. An
    agent with SWITCHBOARD_TODOS_AGENT_MAX_WAITS long polls waiting already is Throttled.
    """
    if todo_id is not None:
        return [_claim_one(agent, queues, todo_id, ttl, wait, limit)]
    names, seconds, count = _claim_arguments(agent, queues, wait, limit)
    placed = placement.by_database(names)
    quota = quotas.max_held(agent)
    with long_poll_cap.admitted(agent, seconds):
        claimed = _claim_now(agent, placed, ttl, count, quota)
        if claimed or not seconds:
            return claimed
        if len(placed) == 1:
            [alias] = placed
            return Todo.objects.claim_batch(
                names,
                agent.name,
                ttl,
                count,
                wait=seconds,
                max_held=quota,
                credential=identity.credential(agent, alias),
            )
        return run_now(_claim_across(agent, placed, ttl, seconds, count, quota, blocking=True))


async def aclaim(
    agent: Agent,
    *,
    queues: Iterable[str] | None = None,
    todo_id: str | None = None,
    ttl: Seconds | None,
    wait: Seconds = 0,
    limit: int = 1,
) -> list[Todo]:
    """Async twin of `claim`: waits on the LISTEN path, suspended, holding neither a thread nor
    a connection (the request's own is given back before the wait).

    Cancelled (the client went away: agents/disconnects.py), a claim from queues claims
    nothing more, and what a claim running then took is given back as soon as that claim
    returns (`Todo.objects._give_back`).
    """
    if todo_id is not None:
        one = await sync_to_async(_claim_one)(agent, queues, todo_id, ttl, wait, limit)
        return [one]
    names, seconds, count = _claim_arguments(agent, queues, wait, limit)
    placed = placement.by_database(names)
    quota = quotas.max_held(agent)
    give_back = _give_back(agent)
    async with long_poll_cap.awaiting(agent, seconds):
        if not seconds:
            claim = sync_to_async(_claim_now)(agent, placed, ttl, count, quota)
            return await long_polls.cancellable_claim(agent.name, claim, give_back)
        # A long poll claims on the claim threads from the first claim on (long_polls.py).
        claims = long_polls.claim_threads()
        claim = claims.run(agent.name, _claim_now, agent, placed, ttl, count, quota)
        claimed = await long_polls.cancellable_claim(agent.name, claim, give_back)
        if claimed:
            return claimed
        if len(placed) == 1:
            [alias] = placed
            credential = await sync_to_async(identity.credential)(agent, alias)
            return await Todo.objects.aclaim_batch(
                names,
                agent.name,
                ttl,
                count,
                wait=seconds,
                max_held=quota,
                credential=credential,
            )
        return await _claim_across(agent, placed, ttl, seconds, count, quota, blocking=False)


async def handing_over(agent: Agent, todos: list[Todo], answer: Awaitable[T]) -> T:
    """`answer`, a surface's answer made of `todos` just claimed for `agent`. If making it
    fails, or is cancelled (the client went away), the todos are given back: released at once
    on a claim thread, their attempts not counted, rather than left claimed for nobody."""
    try:
        return await answer
    except BaseException:
        if todos:
            long_polls.claim_threads().detach(agent.name, _give_back(agent), todos)
        raise


def _give_back(agent: Agent) -> Callable[[list[Todo]], None]:
    """Gives back todos claimed for `agent` that it never received (`Todo.objects._give_back`)."""
    return functools.partial(Todo.objects._give_back, owner=agent.name)


def _claim_now(
    agent: Agent, placed: dict[str, list[str]], ttl: Seconds | None, count: int, quota: int
) -> list[Todo]:
    """A claim that does not wait, taking only as many as bring the todos the agent holds up to
    its quota; Throttled when it claimed nothing because the agent holds that many already.

    A claim that would wait claims this way first, so that an agent at its quota is answered
    at once rather than at the end of a wait that could bring it nothing. The claims check the
    agent's credential in their statements (identity.credential): nothing claimed, it is
    checked on its own, so that a revoked agent is refused rather than told there is nothing.
    """
    claimed = _claim_each(agent, placed, ttl, count, quota)
    if not claimed:
        identity.check(agent)
        quotas.refuse_at_held_quota(agent, list(placed), quota)
    return claimed


async def _claim_across(
    agent: Agent,
    placed: dict[str, list[str]],
    ttl: Seconds | None,
    seconds: float,
    count: int,
    quota: int,
    *,
    blocking: bool,
) -> list[Todo]:
    """A claim from queues of several databases: from each in turn without waiting; then,
    while `seconds` last, a wait of at most ACROSS_WAIT in each database in turn (woken at once
    by its notifications), so a todo in another one waits at most ACROSS_WAIT.

    `blocking` waits on this thread (run with `run_now`); otherwise suspended, as `aclaim`, its
    claims on the process's claim threads.
    """
    deadline = time.monotonic() + seconds
    turns = itertools.cycle(placed.items())
    while True:
        if blocking:
            claimed = _claim_each(agent, placed, ttl, count, quota)
        else:
            claims = long_polls.claim_threads()
            claim = claims.run(agent.name, _claim_each, agent, placed, ttl, count, quota)
            claimed = await long_polls.cancellable_claim(agent.name, claim, _give_back(agent))
        remaining = deadline - time.monotonic()
        if claimed or remaining <= 0:
            return claimed
        alias, names = next(turns)
        todos, wait = Todo.objects.db_manager(alias), min(remaining, ACROSS_WAIT)
        if blocking:
            credential = identity.credential(agent, alias)
            claimed = todos.claim_batch(
                names, agent.name, ttl, count, wait=wait, max_held=quota, credential=credential
            )
        else:
            credential = await sync_to_async(identity.credential)(agent, alias)
            claimed = await todos.aclaim_batch(
                names, agent.name, ttl, count, wait=wait, max_held=quota, credential=credential
            )
        if claimed:
            return claimed


def _claim_each(
    agent: Agent, placed: dict[str, list[str]], ttl: Seconds | None, count: int, quota: int
) -> list[Todo]:
    """Claim up to `count` from each database's queues in turn, until `count` are claimed; in
    each, only as many as bring the todos the agent holds there up to `quota`."""
    claimed: list[Todo] = []
    for alias, names in placed.items():
        if len(claimed) >= count:
            break
        claimed += Todo.objects.db_manager(alias).claim_batch(
            names,
            agent.name,
            ttl,
            count - len(claimed),
            max_held=quota,
            credential=identity.credential(agent, alias),
        )
    return claimed


def _claim_arguments(
    agent: Agent, queues: Iterable[str] | None, wait: Seconds, limit: int
) -> tuple[list[str], float, int]:
    names = visibility.claim_queues(agent, queues)
    seconds = long_poll_cap.seconds_of(wait)
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
    checked = visibility.todo_id(todo_id)
    candidates = Todo.objects.filter(visibility.claimable_by(agent), queue__in=agent.claim_queues)
    for alias in visibility.databases(agent):
        if candidates.using(alias).filter(pk=checked).exists():
            quotas.refuse_at_held_quota(agent, [alias], quotas.max_held(agent))
            todos = Todo.objects.db_manager(alias)
            try:
                return todos.claim(checked, agent.name, ttl)
            except TodoConflict as conflict:
                raise _without_hidden_key_holder(agent, todos, conflict) from None
    raise TodoNotFound(checked)


def _without_hidden_key_holder(
    agent: Agent, todos: TodoManager, conflict: TodoConflict
) -> TodoConflict:
    """`conflict`, unless it names the claimed todo holding the concurrency key and the agent
    may not see that todo: then one that says what stands in the way without naming it.

    Looked up only on a conflict (one query): the holder of a key may be in any queue.
    """
    key = Todo.objects.using(todos.db).filter(pk=conflict.todo_id).values("concurrency_key")
    hidden = (
        todos.filter(state=State.CLAIMED, concurrency_key__in=key)
        .exclude(pk=conflict.todo_id)
        .exclude(visibility.visible_to(agent))
        .values_list("pk", flat=True)
        .first()
    )
    if hidden is None or hidden not in str(conflict):
        return conflict
    return TodoConflict(
        f"Todo {conflict.todo_id} waits for its concurrency key: another todo holding it is "
        "claimed. Try again later.",
        todo_id=conflict.todo_id,
        state=conflict.state,
        owner=conflict.owner,
    )
