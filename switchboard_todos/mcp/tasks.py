"""MCP Tasks (SEP-1686, protocol 2025-11-25) over the todos: `create_for` and `create_many`
called with `task: {ttl}` answer with a task at once; `tasks/get`, `tasks/result`,
`tasks/list` and `tasks/cancel` follow it (agents/service/tasks.py).

The Python SDK 2.3 serves none of this for 2025-11-25 (its method table leaves `tasks/*` out,
and it sieves a `tools/call` answer to a CallToolResult), so it is built on the SDK's public
seams, not a fork:

* `TasksMiddleware`, a `Server.middleware`, declares `capabilities.tasks` in the `initialize`
  answer and `execution.taskSupport: "optional"` on the two tools in `tools/list`, and answers
  a task-augmented `tools/call` itself: it runs the tool through the rest of the chain, without
  `task`, then answers the CreateTaskResult (a middleware's answer is not sieved);
* `TasksExtension` binds the four `tasks/*` methods (`MethodBinding`), for 2025-11-25 only.

When a task ends, `notifications/tasks/status` goes to its creator's connection, where the
transport has a channel for it (stdio; streamable HTTP's standalone stream, once the client
opened it): a watcher per task waits for its todo's end (woken by the ending statement's
NOTIFY, as `wait_for`), at most SWITCHBOARD_TODOS_AGENT_MAX_WAITS of an agent at once in a
process (past that, its tasks are only polled), each until the task's ttl or the connection's
end, whichever comes first.

A task's state is its todo's: pending or claimed is `working` (the holder's latest progress
note as `statusMessage`), done `completed`, a dead letter `failed` (its last error as
`statusMessage`), one cancelled (by an operator, or through `tasks/cancel`) `cancelled`. Its
result (`tasks/result`, once it ended) is the tool's: the todo as it ended in the tool's own
output shape, or its error as a tool error. Before that answer, the status is notified on the
request's stream (`notifications/tasks/status`), where the transport carries it (stdio; not
streamable HTTP, which answers with one JSON body, mcp/http.py). Failures are
JSON-RPC errors: an unknown task, another agent's, or one that ended already (cancel) is
INVALID_PARAMS, as the protocol says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from django.db import DatabaseError
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    CancelTaskRequestParams,
    GetTaskPayloadRequestParams,
    GetTaskRequestParams,
    PaginatedRequestParams,
    TaskStatusNotification,
    TaskStatusNotificationParams,
)

from switchboard_todos import endings, faults
from switchboard_todos.agents import disconnects, errors, request_cap, service
from switchboard_todos.agents.caps import AgentCap
from switchboard_todos.agents.serialize import TodoJSON, atodos_json
from switchboard_todos.agents.service.tasks import AgentTask
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import (
    InvalidTodo,
    Throttled,
    TodoConflict,
    TodoError,
    TodoNotFound,
)
from switchboard_todos.mcp.server import PROBLEM_META, UNAVAILABLE, AgentSource, problem_text
from switchboard_todos.mcp.threads import request_scope
from switchboard_todos.models import Agent, Todo

logger = logging.getLogger(__name__)

#: The protocol revision whose Tasks this serves (the 2026 revision made them an extension).
TASKS_VERSION = "2025-11-25"
#: The tools a client may augment into tasks, and what to wrap the todo in for their output.
TASK_TOOLS = frozenset({"create_for", "create_many"})
#: What the server declares under `capabilities.tasks`.
CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
#: How often a client should poll `tasks/get`, in milliseconds.
POLL_INTERVAL = 1000
#: The `_meta` key that ties a result to its task.
RELATED_TASK = "io.modelcontextprotocol/related-task"
#: The longest one wait of a watcher (the todo is marked awaited again after each).
WATCH_STEP = 3600.0

#: The watchers of the tasks of each agent in this process, at most AGENT_MAX_WAITS.
_watchers = AgentCap(
    lambda: conf.AGENT_MAX_WAITS,
    lambda name, cap: f"Agent {name!r} has {cap} tasks watched here: its others are polled.",
)
#: The running watchers, kept from the garbage collector until they end.
_watching: set[asyncio.Task[None]] = set()


def status_of(todo: TodoJSON) -> tuple[str, str | None]:
    """A todo's state as a task's status, and the status message."""
    if todo["state"] == "done":
        return "completed", None
    if todo["state"] == "failed":
        result = todo["result"]
        if isinstance(result, dict) and result.get("type") == "Cancelled":
            return "cancelled", _text(result.get("message"))
        return "failed", _text(todo["last_error"])
    return "working", _text(todo["progress"])


def task_json(task: AgentTask, todo: TodoJSON) -> dict[str, Any]:
    """The task, as the protocol's Task object."""
    status, message = status_of(todo)
    kept = task.task.keep_until - task.task.created_at
    shaped: dict[str, Any] = {
        "taskId": task.task.id,
        "status": status,
        "createdAt": task.task.created_at.isoformat(),
        "lastUpdatedAt": todo["updated_at"] or task.task.created_at.isoformat(),
        "ttl": kept.days * 86_400_000 + kept.seconds * 1000 + kept.microseconds // 1000,
        "pollInterval": POLL_INTERVAL,
    }
    if message is not None:
        shaped["statusMessage"] = message
    return shaped


def _text(value: Any) -> str | None:
    """A note or an error as a status message: text as is, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


class Tasks:
    """The task requests of one MCP server; `agent` says whom each acts for."""

    def __init__(self, agent: AgentSource) -> None:
        self._agent = agent

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[Agent]:
        """One task request: in a request scope (tools' threads and connections), counted
        among the agent's requests in flight; the service's errors as JSON-RPC errors."""
        async with request_scope():
            try:
                agent = await self._agent()
                with request_cap.admitted(agent):
                    yield agent
            except (TodoNotFound, InvalidTodo, TodoConflict) as error:
                raise MCPError(INVALID_PARAMS, str(error)) from None
            except Throttled as error:
                text = problem_text(errors.THROTTLED, str(error), error.retry_after)
                raise MCPError(INVALID_REQUEST, text, {"retry_after": error.retry_after}) from None
            except TodoError as error:
                raise MCPError(INVALID_REQUEST, str(error)) from None
            except DatabaseError as error:
                if not faults.is_outage(error):
                    raise
                logger.warning("Database unavailable for an MCP task request: %s", error)
                raise MCPError(INTERNAL_ERROR, UNAVAILABLE) from None

    async def start(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """A task-augmented `tools/call` of `create_for` or `create_many`: the tool's call as
        without a task, then the task of the todo it made (a plan's merging todo)."""
        params = dict(ctx.params or {})
        name, requested = params.get("name"), params.pop("task")
        if name not in TASK_TOOLS:
            raise MCPError(METHOD_NOT_FOUND, f"Tool {name!r} cannot run as a task.")
        if not isinstance(requested, Mapping):
            raise MCPError(INVALID_PARAMS, "task must be an object: {ttl}.")
        try:
            ttl = service.ttl_ms(requested.get("ttl"))
            arguments = params.get("arguments")
            if name == "create_many" and isinstance(arguments, Mapping):
                service.check_merging_plan(arguments.get("todos"))
        except InvalidTodo as error:
            raise MCPError(INVALID_PARAMS, str(error)) from None
        answer = _wire(await call_next(replace(ctx, params=params)))
        if answer.get("isError"):
            problem = (answer.get("_meta") or {}).get(PROBLEM_META)
            [content] = answer["content"]
            raise MCPError(INVALID_REQUEST, content["text"], problem)
        made = answer["structuredContent"]
        todo = made["todo"] if name == "create_for" else made["todos"][-1]["todo"]
        created = made["created"] if name == "create_for" else made["todos"][-1]["created"]
        async with self._serving() as agent:
            task = await service.astart_task(agent, todo["id"], ttl, name, created)
        _watch(ctx, agent, task)
        return {"task": task_json(task, todo)}

    async def get(
        self, ctx: ServerRequestContext[Any, Any], params: GetTaskRequestParams
    ) -> dict[str, Any]:
        async with self._serving() as agent:
            task = await service.aget_task(agent, params.task_id)
            [todo] = await atodos_json([task.todo])
        return task_json(task, todo)

    async def result(
        self, ctx: ServerRequestContext[Any, Any], params: GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        """The tool's result once the task ended: blocks (long polls of the todo) till then."""
        async with self._serving() as agent:
            ended = await disconnects.unless_client_gone(service.await_task(agent, params.task_id))
            if ended is None:  # nobody to read it
                raise MCPError(INVALID_REQUEST, "The client went away.")
            [todo] = await atodos_json([ended.todo])
        shaped = task_json(ended, todo)
        await _notify_status(ctx, shaped)
        meta = {RELATED_TASK: {"taskId": ended.task.id}}
        if shaped["status"] != "completed":
            text = f"The task {shaped['status']}: {shaped.get('statusMessage') or 'no error given'}"
            return {"content": [{"type": "text", "text": text}], "isError": True, "_meta": meta}
        made = {"todo": todo, "created": ended.task.created}
        structured = made if ended.task.tool == "create_for" else {"todos": [made]}
        text = json.dumps(structured, separators=(",", ":"))
        return {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": False,
            "_meta": meta,
        }

    async def list(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams
    ) -> dict[str, Any]:
        async with self._serving() as agent:
            page = await service.alist_tasks(agent, params.cursor)
            todos = await atodos_json([each.todo for each in page.tasks])
        listed: dict[str, Any] = {
            "tasks": [task_json(task, todo) for task, todo in zip(page.tasks, todos, strict=True)]
        }
        if page.next_cursor is not None:
            listed["nextCursor"] = page.next_cursor
        return listed

    async def cancel(
        self, ctx: ServerRequestContext[Any, Any], params: CancelTaskRequestParams
    ) -> dict[str, Any]:
        async with self._serving() as agent:
            task = await service.acancel_task(agent, params.task_id)
            [todo] = await atodos_json([task.todo])
        return task_json(task, todo)


async def _notify_status(
    ctx: ServerRequestContext[Any, Any], task: dict[str, Any], *, on_request: bool = True
) -> None:
    """`notifications/tasks/status` on the request's stream (or the connection's), where the
    transport has one: best effort, as every notification."""
    notification = TaskStatusNotification(
        method="notifications/tasks/status", params=TaskStatusNotificationParams(**task)
    )
    related = ctx.request_id if on_request else None
    try:
        await ctx.session.send_notification(notification, related_request_id=related)  # type: ignore[arg-type]
    except Exception:  # a status the client cannot take changes nothing of the task
        logger.debug("No status notification for task %s", task["taskId"], exc_info=True)


def _watch(ctx: ServerRequestContext[Any, Any], agent: Agent, task: AgentTask) -> None:
    """Notify the connection of `task`'s end: a watcher, ended with the connection (the SDK's
    per-connection exit stack, `ServerSession._connection`: it offers no public way to it)."""
    watcher = asyncio.get_running_loop().create_task(_watched(ctx, agent, task))
    _watching.add(watcher)
    watcher.add_done_callback(_watching.discard)

    async def stop() -> None:
        watcher.cancel()

    ctx.session._connection.exit_stack.push_async_callback(stop)


async def _watched(ctx: ServerRequestContext[Any, Any], agent: Agent, task: AgentTask) -> None:
    """Wait for the task's todo to end, within its ttl, and notify its status."""
    try:
        with _watchers.admitted(agent.name):
            kept = (task.task.keep_until - task.task.created_at).total_seconds()
            deadline, todo = time.monotonic() + kept, task.todo
            todos = Todo.objects.db_manager(todo._state.db)
            while todo.state not in endings.ENDED:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                todo = await todos.await_for(todo.id, min(left, WATCH_STEP))
            async with request_scope():
                [shaped] = await atodos_json([todo])
            await _notify_status(
                ctx, task_json(AgentTask(task.task, todo), shaped), on_request=False
            )
    except Throttled:  # as many watchers as the agent may have: this task is polled
        return
    except DatabaseError as error:
        logger.warning("A task's watcher stopped: %s", error)


def _wire(result: HandlerResult) -> dict[str, Any]:
    if result is None:
        return {}
    if isinstance(result, Mapping):
        return dict(result)
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


class TasksMiddleware:
    """The SDK's middleware seam for what its method table does not let a handler say: the
    tasks capability, the tools' task support, and the CreateTaskResult of a task-augmented
    call."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks = tasks

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "tools/call" and "task" in (ctx.params or {}):
            if ctx.protocol_version != TASKS_VERSION:
                raise MCPError(METHOD_NOT_FOUND, f"Tasks need protocol {TASKS_VERSION}.")
            return await self.tasks.start(ctx, call_next)
        result = await call_next(ctx)
        if ctx.method == "initialize":
            answer = _wire(result)
            if answer.get("protocolVersion") == TASKS_VERSION:
                answer.setdefault("capabilities", {})["tasks"] = CAPABILITY
            return answer
        if ctx.method == "tools/list" and ctx.protocol_version == TASKS_VERSION:
            answer = _wire(result)
            for tool in answer.get("tools", []):
                if tool.get("name") in TASK_TOOLS:
                    tool["execution"] = {"taskSupport": "optional"}
            return answer
        return result


class TasksExtension(Extension):
    """The `tasks/*` methods, bound through the SDK's extension API for 2025-11-25 clients."""

    identifier = "io.github.switchboard-todos/tasks"

    def __init__(self, tasks: Tasks) -> None:
        self.tasks = tasks

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset({TASKS_VERSION})
        handlers: list[tuple[str, type[Any], Callable[..., Awaitable[HandlerResult]]]] = [
            ("tasks/get", GetTaskRequestParams, self.tasks.get),
            ("tasks/result", GetTaskPayloadRequestParams, self.tasks.result),
            ("tasks/list", PaginatedRequestParams, self.tasks.list),
            ("tasks/cancel", CancelTaskRequestParams, self.tasks.cancel),
        ]
        return [
            MethodBinding(method, params, handler, protocol_versions=versions)
            for method, params, handler in handlers
        ]


def tasks_of(agent: AgentSource) -> tuple[TasksMiddleware, TasksExtension]:
    """The middleware and the extension that serve MCP Tasks, acting as `agent`."""
    tasks = Tasks(agent)
    return TasksMiddleware(tasks), TasksExtension(tasks)
