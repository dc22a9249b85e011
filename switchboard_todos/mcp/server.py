"""The MCP tools: the queue's verbs for an agent, each one call of the agent service layer.

The tools never check a permission or a value themselves: the service does, for HTTP and MCP
alike, and its typed exceptions come back as MCP tool errors (`isError`), so the session goes
on: the problem of the one error table as text, for the model. Each docstring below is what the
language model reads as the tool's description. A claim whose client went away (over HTTP,
mcp/http.py) ends, claiming nothing (agents/disconnects.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from django.db import DatabaseError
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from switchboard_todos import __version__, faults
from switchboard_todos.agents import disconnects, errors, request_cap, service
from switchboard_todos.agents.serialize import TodoJSON, atodos_json
from switchboard_todos.exceptions import Throttled, TodoError
from switchboard_todos.mcp.threads import request_scope
from switchboard_todos.models import Agent, Todo

logger = logging.getLogger(__name__)

#: What a tool answers when the database cannot be reached, as the HTTP API does (503).
UNAVAILABLE = "The database is unavailable; retry."
#: Finds the agent a tool call acts as: from the bearer token (HTTP) or by name (stdio).
AgentSource = Callable[[], Awaitable[Agent]]

INSTRUCTIONS = (
    "A durable work queue. Loop: claim (with wait, up to 20 s) -> work, calling heartbeat "
    "before the lease (ttl) expires -> complete with a result, or fail with an error. A "
    "lease-lost error means another agent may have the todo now: stop work on it and do not "
    "complete it. Work may be delivered again after a crash, so make each step safe to repeat. "
    "To plan a job for other agents, create its parts and a final merging todo that waits for "
    "them in one create_many call; whoever claims the merging todo finds the parts' results in "
    "its parent_results."
)

TodoId = Annotated[str, Field(description="The todo's id, td_...")]
Ttl = Annotated[
    float, Field(description="Lease length in seconds from now; heartbeat before it expires.")
]


class Todos(BaseModel):
    todos: list[TodoJSON]


class Page(BaseModel):
    todos: list[TodoJSON]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: last.")


class Created(BaseModel):
    todo: TodoJSON
    created: bool = Field(description="False: the idempotency key found a live todo, returned.")


class Plan(BaseModel):
    todos: list[Created] = Field(description="The plan's todos, in the order given.")


class PlannedTodo(BaseModel):
    """One todo of a plan: `create_for`'s arguments, a `ref`, and `after` naming refs or ids."""

    model_config = ConfigDict(extra="forbid")

    queue: str = Field(description="A queue you may create todos in.")
    ref: str | None = Field(
        default=None,
        description="A short name for this todo, unique in the plan (e.g. part-1, merge): the "
        "plan's other todos wait for it by giving it in their `after`.",
    )
    after: list[str] | None = Field(
        default=None,
        description="What this todo waits for: refs of todos of this plan, or ids of existing "
        "todos you can see. It is claimable once each of them is done.",
    )
    on_parent_failure: Literal["cancel", "run_anyway"] = Field(
        default="cancel",
        description='If a todo it waits for fails for good: "cancel" (default) fails this one '
        'too, and what waits for it; "run_anyway" runs it once the others are done, with a '
        "null result for the failed one in parent_results.",
    )
    kind: str = Field(default="", description="What sort of work, e.g. triage.issue.")
    title: str = Field(default="", description="One line a person can read.")
    payload: dict[str, Any] | None = Field(
        default=None, description="A JSON object: what whoever claims it needs to do the work."
    )
    idempotency_key: str | None = Field(
        default=None,
        description="A key unique to this piece of work; give one on every todo of the plan, so "
        "that sending the plan again returns the same todos instead of new ones.",
    )
    assignee: str | None = Field(
        default=None, description="Only the agent of this name may claim it; default: anyone."
    )
    max_attempts: int | None = Field(
        default=None,
        description="Attempts before it becomes a dead letter; default 5, at most your limit.",
    )
    priority: int = Field(default=0, description="-100 to 100; higher is claimed sooner.")
    concurrency_key: str | None = Field(
        default=None, description="One at a time per key: no two todos with it claimed at once."
    )
    fair_key: str | None = Field(
        default=None,
        description="The tenant it counts for: the tenants of a queue take turns at its claims. "
        "Default: you.",
    )
    run_after: str | None = Field(
        default=None,
        description="Not claimable before this time (ISO 8601 with a time zone); not with after.",
    )


def _result(structured: dict[str, Any]) -> CallToolResult:
    text = json.dumps(structured, separators=(",", ":"))
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured
    )


#: The key of an error result's `_meta` that holds the HTTP API's problem details, for programs.
PROBLEM_META = "switchboard-todos/problem"


def problem_text(kind: errors.ErrorKind, detail: str, retry_after: int | None = None) -> str:
    """A problem as the model reads it: what happened, and what to do about it."""
    wait = "" if retry_after is None else f" Retry-After: {retry_after} s."
    return f"{kind.title} ({kind.status}): {detail}{wait} {kind.advice}"


def _problem(kind: errors.ErrorKind, detail: str, retry_after: int | None = None) -> CallToolResult:
    """A tool error that every client hands to the model: the problem as text content.

    No structured content: a client holds that to the tool's output schema, errors included
    (the TypeScript SDK's refuses the whole result as a protocol error when it does not
    match), and the schema is the tool's result. The problem details go in `_meta`.
    """
    problem = errors.problem(kind, detail)
    if retry_after is not None:
        problem["retry_after"] = retry_after
    return CallToolResult(
        content=[TextContent(type="text", text=problem_text(kind, detail, retry_after))],
        is_error=True,
        _meta={PROBLEM_META: problem},
    )


class Tools:
    """The tools of one MCP server; `agent` says whom each call acts for."""

    def __init__(self, agent: AgentSource) -> None:
        self._agent = agent

    async def _run(self, call: Callable[[Agent], Awaitable[dict[str, Any]]]) -> CallToolResult:
        """One tool call, counted among the agent's requests in flight (request_cap.py): past
        the cap, a tool error, and no connection taken."""
        async with request_scope():
            try:
                agent = await self._agent()
                with request_cap.admitted(agent):
                    return _result(await call(agent))
            except Throttled as error:
                return _problem(errors.THROTTLED, str(error), error.retry_after)
            except TodoError as error:
                return _problem(errors.kind_of(error), str(error))
            except DatabaseError as error:
                if not faults.is_outage(error):
                    raise  # any other error is the SDK's to log
                # The server's fault (down, or read-only after a failover), not the agent's.
                logger.warning("Database unavailable for an MCP tool call: %s", error)
                return _problem(errors.UNAVAILABLE, UNAVAILABLE)

    async def list_todos(
        self,
        queues: Annotated[
            list[str] | None,
            Field(description="Queues to look in; default: every queue you may claim from."),
        ] = None,
        state: Annotated[
            Literal["pending", "claimed"],
            Field(description='"pending": todos you may claim; "claimed": todos you hold.'),
        ] = "pending",
        limit: Annotated[int, Field(description="At most this many, up to 100.")] = 50,
        cursor: Annotated[
            str | None, Field(description="`next_cursor` of the previous page.")
        ] = None,
    ) -> Annotated[CallToolResult, Page]:
        """Look at todos without changing anything: the pending ones you could claim, oldest
        first, or (state "claimed") the ones you hold now. To get work, call `claim` instead:
        a todo seen here may be claimed by another agent a moment later. Useful to recover
        the todos you hold after a restart. Errors: a queue you have no grant for is refused;
        fix the queue names, do not retry as is."""

        async def call(agent: Agent) -> dict[str, Any]:
            page = await service.alist_todos(
                agent, queues=queues, state=state, limit=limit, cursor=cursor
            )
            return {"todos": await atodos_json(page.todos), "next_cursor": page.next_cursor}

        return await self._run(call)

    async def claim(
        self,
        ttl: Ttl,
        queues: Annotated[
            list[str] | None,
            Field(description="Claim from these queues; default: every queue you may claim from."),
        ] = None,
        todo_id: Annotated[
            str | None, Field(description="Claim this one todo instead of the oldest.")
        ] = None,
        wait: Annotated[
            float,
            Field(description="Seconds to wait for work when none is ready, at most 20."),
        ] = 0,
        limit: Annotated[int, Field(description="Claim up to this many todos, 1 to 10.")] = 1,
    ) -> Annotated[CallToolResult, Todos]:
        """Take work: claim the oldest ready todos of your queues (or the one `todo_id`) under
        a lease of `ttl` seconds. Only you may heartbeat, complete, fail or release a todo you
        hold. An empty list means no work arrived within `wait`: call claim again (with wait up
        to 20 s) rather than polling fast. While working, call `heartbeat` before the lease
        expires; when done, `complete` or `fail`. A todo's `attempt` above 1 means an earlier
        attempt did not finish: check what it left behind before redoing side effects. A todo
        that waited for others (`parents`) holds what they returned in `parent_results`, by
        id: the parts a merging step merges (null for a part that failed when it runs anyway).
        Errors: not found (no such todo in your queues) or conflict (another agent holds it,
        it is not pending yet): pick other work."""

        async def claimed(agent: Agent) -> list[TodoJSON]:
            todos = await service.aclaim(
                agent, queues=queues, todo_id=todo_id, ttl=ttl, wait=wait, limit=limit
            )
            return await service.handing_over(agent, todos, atodos_json(todos))

        async def call(agent: Agent) -> dict[str, Any]:
            shaped = await disconnects.unless_client_gone(claimed(agent))
            return {"todos": [] if shaped is None else shaped}  # None: nobody to read it

        return await self._run(call)

    async def heartbeat(
        self,
        todo_id: TodoId,
        ttl: Ttl,
        progress: Annotated[
            Any,
            Field(
                description="What you have done so far and what is left, in a few words or "
                "any JSON value; it replaces your last note."
            ),
        ] = None,
    ) -> Annotated[CallToolResult, TodoJSON]:
        """Keep a todo you hold and report how far you got: extend its lease to `ttl` seconds
        from now, with `progress`, a note of what you have done so far (people and other agents
        read it on the todo). Call it well before the lease expires (e.g. every ttl/3) while
        you work on the todo. Errors: "Cancelled" means an operator cancelled the todo: stop
        work on it now, do not complete or fail it. A conflict or not-found means the lease is
        lost (it expired and the todo went back to the queue, perhaps to another agent): stop
        working on it, do not complete it, claim again."""
        return await self._run(
            lambda agent: _todo(service.aheartbeat(agent, todo_id, ttl, progress))
        )

    async def complete(
        self,
        todo_id: TodoId,
        result: Annotated[
            Any, Field(description="Any JSON value: what you did, for whoever reads it.")
        ] = None,
    ) -> Annotated[CallToolResult, TodoJSON]:
        """Finish a todo you hold: it becomes done with `result`, and is never delivered again.
        Call it only when the work is really done. Errors: conflict or not found means the
        lease was lost before you finished (another agent may have the todo): do not retry
        the completion; the todo will be, or was, done by whoever holds it now."""
        return await self._run(lambda agent: _todo(service.acomplete(agent, todo_id, result)))

    async def fail(
        self,
        todo_id: TodoId,
        error: Annotated[
            Any, Field(description="What went wrong: a message or any JSON value.")
        ] = None,
        retry_in: Annotated[
            float | None,
            Field(description="Seconds before a retry; default: the queue's backoff."),
        ] = None,
    ) -> Annotated[CallToolResult, TodoJSON]:
        """Give up this attempt at a todo you hold because it went wrong: it is retried later
        (pending again after a backoff, by you or another agent), or becomes a dead letter
        (state "failed") when it has used its last attempt. Use `release` instead when you did
        not try it (shutting down, not your kind of work). Errors: conflict or not found
        means the lease was already lost: nothing to do; throttled means your quota of fails
        and releases a minute is spent: the todo stays yours, try again when it says."""
        return await self._run(lambda agent: _todo(service.afail(agent, todo_id, error, retry_in)))

    async def release(
        self,
        todo_id: TodoId,
        delay: Annotated[
            float | None,
            Field(description="Seconds before it may be claimed again; default: at once."),
        ] = None,
    ) -> Annotated[CallToolResult, TodoJSON]:
        """Hand back a todo you hold without counting an attempt: it is pending again (after
        `delay` seconds) for any agent. Use it when you stop before trying the work, e.g. you
        are shutting down or cannot handle it. Errors: conflict or not found means the lease
        was already lost: nothing to do; throttled means your quota of fails and releases a
        minute is spent: the todo stays yours, try again when it says."""
        return await self._run(lambda agent: _todo(service.arelease(agent, todo_id, delay)))

    async def get_todo(self, todo_id: TodoId) -> Annotated[CallToolResult, TodoJSON]:
        """Read one todo, as it is now: one you created (to see how the work you handed out is
        going: its state, the holder's `progress` note, its `result` once done, its `errors`
        once failed), one you hold, or one of your queues. To wait for it to end, call
        `wait_for_todo`. Errors: not found means no todo of that id that you may see."""
        return await self._run(lambda agent: _todo(service.aget_todo(agent, todo_id)))

    async def wait_for_todo(
        self,
        todo_id: TodoId,
        wait: Annotated[
            float, Field(description="Seconds to wait for it to end, at most 20; default 20.")
        ] = service.MAX_WAIT,
    ) -> Annotated[CallToolResult, TodoJSON]:
        """Wait until a todo you can read (see `get_todo`) ends, done or failed, and read it:
        the answer comes the moment it ends, or as the todo is when `wait` has passed. Its
        state says which: "done" (its `result`), "failed" (its `errors`), or still "pending" or
        "claimed": call again to go on waiting. Waiting for several todos, wait for the one
        that merges them (create_many's last step). Errors: too many waits at once (throttled):
        let one of your waits answer first."""
        return await self._run(lambda agent: _todo(service.aget_todo(agent, todo_id, wait=wait)))

    async def create_for(
        self,
        queue: Annotated[str, Field(description="A queue you may create todos in.")],
        kind: Annotated[str, Field(description="What sort of work, e.g. review.pr.")] = "",
        title: Annotated[str, Field(description="One line a person can read.")] = "",
        payload: Annotated[
            dict[str, Any] | None,
            Field(description="A JSON object: what whoever claims it needs to do the work."),
        ] = None,
        idempotency_key: Annotated[
            str | None,
            Field(
                description="A key unique to this piece of work: creating again with the same "
                "key returns the live todo instead of a second one. Set it so retries are safe."
            ),
        ] = None,
        assignee: Annotated[
            str | None,
            Field(description="Only the agent of this name may claim it; default: anyone."),
        ] = None,
        run_after: Annotated[
            str | None,
            Field(description="Not claimable before this time: ISO 8601 with a time zone."),
        ] = None,
        max_attempts: Annotated[
            int | None,
            Field(
                description="Attempts before it becomes a dead letter; default 5, and at most "
                "your limit."
            ),
        ] = None,
        priority: Annotated[
            int, Field(description="-100 to 100; higher is claimed sooner; default 0.")
        ] = 0,
        concurrency_key: Annotated[
            str | None,
            Field(
                description="One at a time per key: while a todo with this key is claimed, no "
                "other todo with it is (e.g. one agent per repository)."
            ),
        ] = None,
        fair_key: Annotated[
            str | None,
            Field(
                description="The tenant this todo counts for (e.g. the customer it serves): the "
                "tenants of a queue take turns at its claims, so one's backlog does not hold up "
                "the others. Default: you."
            ),
        ] = None,
        after: Annotated[
            list[str] | None,
            Field(
                description="Ids of todos you can see that this one waits for: it is claimable "
                "once each is done, and its parent_results hold what they returned."
            ),
        ] = None,
        on_parent_failure: Annotated[
            Literal["cancel", "run_anyway"],
            Field(
                description='If a todo in `after` fails for good: "cancel" (default) fails this '
                'one too; "run_anyway" runs it once the others are done.'
            ),
        ] = "cancel",
    ) -> Annotated[CallToolResult, Created]:
        """Create a todo for another agent or worker (or for later): hand off work you found.
        With an `idempotency_key`, calling again after a timeout or crash is safe: the live
        todo with that key comes back with created=false (in a queue you do not claim from, a
        conflict saying the key is taken: your earlier call went through). Your keys are your
        own: they never match another agent's or a producer's. With `after`, it waits for
        those todos; to plan several todos that wait for each other, use `create_many`.
        Errors: a queue you have no grant to create in is refused; a todo id in `after` you
        cannot see is not found; invalid values say which one to fix; too many creations a
        minute: wait as the error says."""

        async def call(agent: Agent) -> dict[str, Any]:
            todo, created = await service.acreate_for(
                agent,
                queue=queue,
                kind=kind,
                title=title,
                payload=payload,
                idempotency_key=idempotency_key,
                assignee=assignee,
                run_after=run_after,
                max_attempts=max_attempts,
                priority=priority,
                concurrency_key=concurrency_key,
                fair_key=fair_key,
                after=after,
                on_parent_failure=on_parent_failure,
            )
            [shaped] = await atodos_json([todo])
            return {"todo": shaped, "created": created}

        return await self._run(call)

    async def create_many(
        self,
        todos: Annotated[
            list[PlannedTodo],
            Field(description="The plan: 1 to 1000 todos, the merging step last."),
        ],
    ) -> Annotated[CallToolResult, Plan]:
        """Plan a job for other agents in one call: its parts, and the steps that wait for
        them. Give each todo a short `ref` (part-1, part-2, merge) and list in its `after` the
        refs of the todos it must wait for (or the ids of existing todos you can see). Put the
        step that merges the parts last, with `after` naming every part: it becomes claimable
        only when the last part is done, exactly once, and whoever claims it reads what each
        part returned in its `parent_results`. Parts with no `after` are claimable at once, by
        any agent of their queue. Give every todo an `idempotency_key`: sending the same plan
        again (after a timeout or crash) then returns the same todos with created=false. When a
        part fails for good (its last attempt, or an operator cancels it), the todos waiting for
        it are cancelled too, unless they say `on_parent_failure: "run_anyway"`, which runs them
        once the other parts are done (the failed part's result is null). Nothing is created
        unless the whole plan is. Errors: "The plan cannot run" (a ref named twice, a todo
        waiting for itself, a cycle): fix the plan; an id in `after` you cannot see is not
        found; a conflict over keys means part of the plan exists already (your earlier call
        went through, and some of its todos are done): do not send it again; too many
        creations a minute: wait as the error says."""

        async def call(agent: Agent) -> dict[str, Any]:
            made = await service.acreate_many_for(
                agent, todos=[todo.model_dump(exclude_none=True) for todo in todos]
            )
            shaped = await atodos_json([todo for todo, _created in made])
            return {
                "todos": [
                    {"todo": todo, "created": created}
                    for todo, (_, created) in zip(shaped, made, strict=True)
                ]
            }

        return await self._run(call)


async def _todo(transition: Awaitable[Todo]) -> dict[str, Any]:
    [shaped] = await atodos_json([await transition])
    return dict(shaped)


#: The tools, named after the seed's verbs; each is read-only, or changes one todo (or, for
#: create_many, creates a plan of them).
TOOLS = {
    "list_todos": ToolAnnotations(read_only_hint=True),
    "claim": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "heartbeat": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "complete": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "fail": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "release": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "get_todo": ToolAnnotations(read_only_hint=True),
    "wait_for_todo": ToolAnnotations(read_only_hint=True),
    "create_for": ToolAnnotations(read_only_hint=False, destructive_hint=False),
    "create_many": ToolAnnotations(read_only_hint=False, destructive_hint=False),
}


def build_server(agent: AgentSource) -> MCPServer:
    """An MCP server with the queue's tools, each acting as the agent `agent` returns, and MCP
    Tasks over the todos they create (mcp/tasks.py)."""
    from switchboard_todos.mcp.tasks import tasks_of  # it builds on this module's helpers

    middleware, extension = tasks_of(agent)
    server: MCPServer = MCPServer(
        "switchboard-todos",
        version=__version__,
        instructions=INSTRUCTIONS,
        middleware=[middleware],
        extensions=[extension],
    )
    tools = Tools(agent)
    for name, hints in TOOLS.items():
        server.add_tool(getattr(tools, name), name=name, annotations=hints)
    return server
