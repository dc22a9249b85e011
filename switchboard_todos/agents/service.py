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
holding neither a thread nor a connection (waiting.py). A claim with a wait is admitted only
while the agent has fewer than SWITCHBOARD_TODOS_AGENT_MAX_WAITS waiting (waits.py).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections, router, transaction
from django.db.models import Q

from switchboard_todos import cursors, endings, graphs, placement, validation, waiting
from switchboard_todos.agents import errors, tokens, waits
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import (
    InvalidTodo,
    NotAuthenticated,
    QueueNotGranted,
    Throttled,
    TodoConflict,
    TodoNotFound,
)
from switchboard_todos.managers import TodoManager, run_now
from switchboard_todos.models import Agent, State, Todo
from switchboard_todos.sql import agent_queries
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS
from switchboard_todos.validation import Seconds

P = ParamSpec("P")
R = TypeVar("R")

#: Longest claim `wait`, in seconds: SQS's limit, and below MCP clients' request timeouts.
MAX_WAIT = 20
#: Longest wait in one database of a claim from queues of several (see `_claim_across`).
ACROSS_WAIT = 1.0
#: Most todos one claim takes.
MAX_CLAIM_LIMIT = 10
#: Longest Retry-After of a claim refused at the agent's quota of held todos, in seconds.
HELD_RETRY_MAX = 60
#: Longest idempotency or concurrency key an agent gives, as SQS's MessageDeduplicationId: the
#: key scoped to the agent (`_scoped_key`) then fits the core's limit whatever the agent's name.
MAX_KEY_LENGTH = 128
#: Most todos one plan (`create_many_for`) holds.
MAX_PLAN = 1000
#: Most todos one page of `list_todos` holds, and how many without a `limit`.
MAX_PAGE = 100
DEFAULT_PAGE = 50
#: A page's position (`next_cursor`): the microsecond its last todo was created, and its id.
CURSOR_PATTERN = r"^-?[0-9]{1,18}:[^\x00]*$"
_CURSOR = re.compile(CURSOR_PATTERN.removeprefix("^").removesuffix("$"))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)
_MICROSECOND = timedelta(microseconds=1)


class Page(NamedTuple):
    """One page of `list_todos`; pass `next_cursor` back for the next, None at the end."""

    todos: list[Todo]
    next_cursor: str | None


# Identity


def authenticate(token: str | None) -> Agent:
    """The active agent holding `token`, or NotAuthenticated; one statement (two for a token
    that is refused)."""
    check_shape(token)
    assert token is not None
    token_hash = tokens.token_hash(token)
    agent = _agent_by_hash(token_hash)
    if agent is None:
        revoked = Agent.objects.filter(token_hash=tokens.REVOKED + token_hash)
        name = revoked.values_list("name", flat=True).first()
        if name is None:
            raise NotAuthenticated("Unknown token.")
        raise NotAuthenticated(f"The token of agent {name!r} was revoked.")
    if not agent.is_active:
        raise NotAuthenticated(f"The token of agent {agent.name!r} was revoked.")
    return agent


def check_shape(token: str | None) -> None:
    """Refuse a missing or malformed token, without the database (NotAuthenticated)."""
    if not token:
        raise NotAuthenticated(errors.NO_TOKEN)
    if not isinstance(token, str) or not tokens.well_formed(token):
        raise NotAuthenticated("Unknown token.")


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


def get_todo(agent: Agent, todo_id: str, *, wait: Seconds = 0) -> Todo:
    """One todo the agent may see; with `wait` (seconds, at most MAX_WAIT), once it is done or
    failed, or as it is when `wait` has passed (Todo.objects.wait_for: woken the moment it
    ends). A wait counts among the agent's long polls (waits.py)."""
    checked, seconds = _todo_id(todo_id), _wait(wait)
    found = _seen_todo(agent, checked)
    if not seconds or found.state in endings.ENDED:
        return found
    with waits.admitted(agent, seconds):
        return Todo.objects.db_manager(found._state.db).wait_for(checked, seconds)


async def aget_todo(agent: Agent, todo_id: str, *, wait: Seconds = 0) -> Todo:
    """Async twin of `get_todo`: the wait is suspended, holding no thread or connection."""
    checked, seconds = _todo_id(todo_id), _wait(wait)
    found = await sync_to_async(_seen_todo)(agent, checked)
    if not seconds or found.state in endings.ENDED:
        return found
    async with waits.awaiting(agent, seconds):
        return await Todo.objects.db_manager(found._state.db).await_for(checked, seconds)


def _seen_todo(agent: Agent, todo_id: str) -> Todo:
    """The todo of `todo_id` if the agent may see it, in whichever of its databases."""
    for alias in _databases(agent):
        found = list(Todo.objects.using(alias).filter(_visible_to(agent), pk=todo_id)[:1])
        if found:
            return found[0]
    raise TodoNotFound(todo_id)


def _wait(wait: Seconds) -> float:
    return validation.duration(
        wait, "wait", maximum=timedelta(seconds=MAX_WAIT), allow_zero=True
    ).total_seconds()


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
    when none became claimable in time. The async twin waits without holding a thread. An
    agent with SWITCHBOARD_TODOS_AGENT_MAX_WAITS claims waiting already is Throttled.
    """
    if todo_id is not None:
        return [_claim_one(agent, queues, todo_id, ttl, wait, limit)]
    names, seconds, count = _claim_arguments(agent, queues, wait, limit)
    placed = placement.by_database(names)
    quota = _max_held(agent)
    with waits.admitted(agent, seconds):
        claimed = _claim_now(agent, placed, ttl, count, quota)
        if claimed or not seconds:
            return claimed
        if len(placed) == 1:
            return Todo.objects.claim_batch(
                names, agent.name, ttl, count, wait=seconds, max_held=quota
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
    a connection (the request's own is given back before the wait)."""
    if todo_id is not None:
        one = await sync_to_async(_claim_one)(agent, queues, todo_id, ttl, wait, limit)
        return [one]
    names, seconds, count = _claim_arguments(agent, queues, wait, limit)
    placed = placement.by_database(names)
    quota = _max_held(agent)
    async with waits.awaiting(agent, seconds):
        if not seconds:
            return await sync_to_async(_claim_now)(agent, placed, ttl, count, quota)
        # A long poll claims on the claim threads from the first claim on (waiting.py).
        claims = waiting.claim_threads()
        claimed = await claims.run(agent.name, _claim_now, agent, placed, ttl, count, quota)
        if claimed:
            return claimed
        if len(placed) == 1:
            return await Todo.objects.aclaim_batch(
                names, agent.name, ttl, count, wait=seconds, max_held=quota
            )
        return await _claim_across(agent, placed, ttl, seconds, count, quota, blocking=False)


def _claim_now(
    agent: Agent, placed: dict[str, list[str]], ttl: Seconds | None, count: int, quota: int
) -> list[Todo]:
    """A claim that does not wait, taking only as many as bring the todos the agent holds up to
    its quota; Throttled when it claimed nothing because the agent holds that many already.

    A claim that would wait claims this way first, so that an agent at its quota is answered
    at once rather than at the end of a wait that could bring it nothing.
    """
    claimed = _claim_each(agent, placed, ttl, count, quota)
    if not claimed:
        _refuse_at_held_quota(agent, list(placed), quota)
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
            claims = waiting.claim_threads()
            claimed = await claims.run(agent.name, _claim_each, agent, placed, ttl, count, quota)
        remaining = deadline - time.monotonic()
        if claimed or remaining <= 0:
            return claimed
        alias, names = next(turns)
        todos, wait = Todo.objects.db_manager(alias), min(remaining, ACROSS_WAIT)
        if blocking:
            claimed = todos.claim_batch(names, agent.name, ttl, count, wait=wait, max_held=quota)
        else:
            claimed = await todos.aclaim_batch(
                names, agent.name, ttl, count, wait=wait, max_held=quota
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
            names, agent.name, ttl, count - len(claimed), max_held=quota
        )
    return claimed


def _claim_arguments(
    agent: Agent, queues: Iterable[str] | None, wait: Seconds, limit: int
) -> tuple[list[str], float, int]:
    names = _claim_queues(agent, queues)
    seconds = _wait(wait)
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
            _refuse_at_held_quota(agent, [alias], _max_held(agent))
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
        .exclude(_visible_to(agent))
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


# Quotas


def _quota(own: int | None, setting: int) -> int:
    """One of an agent's quotas: its own value (its Agent field), else the project's setting."""
    return setting if own is None else own


def _max_held(agent: Agent) -> int:
    """The most todos the agent may hold at once (in each database its queues live in)."""
    return _quota(agent.max_held, conf.AGENT_MAX_HELD)


def _refuse_at_held_quota(agent: Agent, aliases: list[str], quota: int) -> None:
    """Raise Throttled when the agent holds `quota` todos in each of the databases `aliases`.

    Retry-After is the time until the earliest of its leases ends (1 to HELD_RETRY_MAX s):
    by then it has completed, failed or released that todo, or the lease lapsed and the
    reaper takes the todo back; freeing one itself makes room at once.
    """
    ends: list[float] = []
    for alias in aliases:
        with cursors.cursor(connections[alias]) as cursor:
            cursor.execute(agent_queries["held"], {"owner": agent.name})
            held, ends_in = cursor.fetchone()
        if held < quota:
            return
        if ends_in is not None:
            ends.append(ends_in)
    raise _throttled(
        f"Agent {agent.name!r} holds {held} todos, its quota (max_held {quota}): complete, "
        "fail or release one before claiming more.",
        min(HELD_RETRY_MAX, max(1.0, min(ends, default=1.0))),
    )


def _throttled(message: str, seconds: float) -> Throttled:
    """Throttled, its message saying how long to wait: MCP and SQS answers have no Retry-After."""
    wait = Throttled(message, retry_after=seconds).retry_after  # whole seconds, at least 1
    return Throttled(f"{message} Try again in {wait} s.", retry_after=wait)


# The holder's verbs


def heartbeat(agent: Agent, todo_id: str, ttl: Seconds | None, progress: Any = None) -> Todo:
    """Extend the lease on a todo the agent holds to `ttl` from now; `progress` (any JSON
    value) becomes its latest progress note. TodoCancelled: an operator cancelled it."""
    return _as_holder(
        agent,
        todo_id,
        lambda todos, checked: todos.heartbeat(checked, agent.name, ttl, progress=progress),
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
    max_attempts: int | None = None,
    priority: int = 0,
    concurrency_key: str | None = None,
    after: Iterable[str] | None = None,
    on_parent_failure: str = "cancel",
) -> tuple[Todo, bool]:
    """Enqueue a todo in one of the agent's create queues; returns (todo, created).

    Its source is `agent:<name>`, and its keys are the agent's own (`_scoped_key`): an
    idempotency key held by a live todo the agent created in that queue returns that todo with
    created=False, or, when the agent may not see that todo, a TodoConflict naming none. Each
    call counts against the agent's creation quota (Throttled past it); `max_attempts` may not
    exceed the agent's limit, and defaults to the lower of 5 and that limit. With `after`, the
    todo waits for those todos (docs/dependencies.md), each one the agent may see: any other id
    is TodoNotFound, as an unknown one. A refused call writes nothing.
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
            "after": after,
            "on_parent_failure": on_parent_failure,
        },
    )
    if spec["after"] is not None:
        validation.creation(spec)  # bad input is refused before the parents are looked at
        _check_visible(agent, {placement.database_for(spec["queue"]): spec["after"]})
    # The count is undone with the transaction when the create is refused (bad input, 409).
    with transaction.atomic(using=router.db_for_write(Agent)):
        _count_creates(agent, 1)
        todo, created = Todo.objects.create_todo(**spec)
        if not created and not _sees(agent, todo):
            raise _hidden_twin(idempotency_key, spec["queue"])
    return todo, created


def create_many_for(agent: Agent, *, todos: Iterable[Mapping[str, Any]]) -> list[tuple[Todo, bool]]:
    """Create a plan, todos that may wait for each other, in one call; (todo, created) each.

    Each mapping takes `create_for`'s arguments, checked as create_for checks them, and a
    `ref`: an entry of `after` is the ref of another todo of the plan, or else the id of a todo
    the agent may see (TodoNotFound otherwise, as an unknown id). A plan with refs or `after`
    is created whole or not at all; a ref named twice, a todo waiting for itself or a cycle is
    InvalidPlan. The plan counts one creation per todo against the agent's quota, all at once
    (one larger than the whole quota is InvalidTodo: it could never pass). With idempotency keys
    on its todos, a plan sent again while its todos are live returns them (created=False).
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
    if waited:
        validation.creations(checked)  # bad input is refused before the parents are looked at
        _check_visible(agent, waited)
    planned = [
        spec if ref is None else {**spec, "ref": ref}
        for spec, ref in zip(checked, refs, strict=True)
    ]
    with transaction.atomic(using=router.db_for_write(Agent)):
        _count_creates(agent, len(planned))
        made = Todo.objects.create_many(planned)
        for (todo, created), spec in zip(made, specs, strict=True):
            if not created and not _sees(agent, todo):
                raise _hidden_twin(spec.get("idempotency_key"), todo.queue)
    return made


#: What an agent says of a todo it creates: create_todo's arguments but `source`, which is the
#: agent's, and `event`.
AGENT_CREATION = frozenset(validation.CREATION_DEFAULTS) - {"source", "event"}


def _creation(agent: Agent, spec: Mapping[str, Any]) -> dict[str, Any]:
    """create_todo's arguments for a todo the agent creates: in one of its create queues, its
    source the agent, its keys scoped, its attempts within the agent's limit. The core checks
    the rest."""
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
        "source": _source(agent),
        "idempotency_key": _scoped_key(agent, spec.get("idempotency_key"), "idempotency_key"),
        "concurrency_key": _scoped_key(agent, spec.get("concurrency_key"), "concurrency_key"),
        "max_attempts": _max_attempts(agent, spec.get("max_attempts")),
        "run_after": _moment(spec.get("run_after")),
        "after": None if after is None else validation.parents(after),
    }


def _check_visible(agent: Agent, waited: Mapping[str, list[str]]) -> None:
    """TodoNotFound for the first of the todos to be waited for (by database) that the agent
    may not see, exactly as for an unknown id; one query per database."""
    for alias, ids in waited.items():
        seen = set(
            Todo.objects.using(alias)
            .filter(_visible_to(agent), pk__in=ids)
            .values_list("pk", flat=True)
        )
        for todo_id in ids:
            if todo_id not in seen:
                raise TodoNotFound(todo_id)


def _hidden_twin(key: object, queue: str) -> TodoConflict:
    """The conflict of an idempotency key held by a live todo the agent may not see."""
    return TodoConflict(
        f"Idempotency key {key!r} is taken in queue {queue!r}: a live todo you created with it "
        "is in a queue you do not claim from, or assigned to another agent, so it is not shown.",
        todo_id="",
    )


def _source(agent: Agent) -> str:
    """The source of the todos an agent creates, and the scope of its keys."""
    return f"agent:{agent.name}"


def _scoped_key(agent: Agent, key: object, name: str) -> str | None:
    """An idempotency or concurrency key as stored for the agent that gave it: its source, a
    slash (which no agent name has) and the key, `agent:<name>/<key>`; serialize.key_as_given
    shows it back as given.

    So an agent's keys deduplicate and serialize only its own todos: it can neither take a key a
    producer will use, nor block the todos of a key it cannot see.
    """
    if key is None:
        return None
    return f"{_source(agent)}/{validation.text(key, name, MAX_KEY_LENGTH, required=True)}"


def _max_attempts(agent: Agent, given: int | None) -> int:
    """The `max_attempts` of a todo the agent creates: at most its limit (InvalidTodo above, as
    waiting would never make it acceptable); without one, the default, lowered to the limit."""
    limit = max(1, _quota(agent.max_attempts_limit, conf.AGENT_MAX_ATTEMPTS))
    if given is None:
        return min(DEFAULT_MAX_ATTEMPTS, limit)
    if isinstance(given, int) and not isinstance(given, bool) and given > limit:
        raise InvalidTodo(
            f"max_attempts must be at most {limit} for agent {agent.name!r} (its limit), "
            f"not {given}."
        )
    return given


def _count_creates(agent: Agent, count: int) -> None:
    """Count `count` creations against the agent's quota per minute (count_creates, agents.sql):
    Throttled, and nothing counted, past it; InvalidTodo when `count` is more than the whole
    quota, which waiting would never make room for."""
    quota = _quota(agent.max_creates_per_minute, conf.AGENT_MAX_CREATES_PER_MINUTE)
    if count > quota:
        raise InvalidTodo(
            f"A plan of {count} todos is more than agent {agent.name!r} may create in a minute "
            f"(max_creates_per_minute {quota}): make it smaller; nothing was created."
        )
    with cursors.cursor(connections[router.db_for_write(Agent)]) as cursor:
        cursor.execute(
            agent_queries["count_creates"], {"agent_id": agent.pk, "quota": quota, "count": count}
        )
        row = cursor.fetchone()
    if row is None:
        raise NotAuthenticated("Unknown token.")  # the agent was deleted since the request began
    counted, window_left = row
    if not counted:
        full = f"created {quota} todos within a minute, its quota (max_creates_per_minute)"
        if count > 1:
            full = (
                f"would pass its quota of {quota} todos a minute (max_creates_per_minute) "
                f"with {count} more"
            )
        raise _throttled(f"Agent {agent.name!r} {full}; nothing was created.", window_left)


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


def _sees(agent: Agent, todo: Todo) -> bool:
    """Whether `_visible_to(agent)` takes `todo`, for a todo in hand."""
    return todo.owner == agent.name or (
        todo.assignee in (None, agent.name) and todo.queue in agent.claim_queues
    )


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
aheartbeat = _twin(heartbeat)
acomplete = _twin(complete)
afail = _twin(fail)
arelease = _twin(release)
acreate_for = _twin(create_for)
acreate_many_for = _twin(create_many_for)
