"""MCP Tasks (protocol 2025-11-25) through the official Python client, against real servers:
streamable HTTP (the example project under uvicorn) and stdio (`manage.py todo_mcp`).

The Python SDK's client has no task API, and holds the answer to any `tools/call` to a
CallToolResult, which a CreateTaskResult is not: the task-augmented call goes through its
dispatcher (`send_raw_request`), the `tasks/*` requests through `send_request` with the SDK's
own task types, which parse our answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connections
from django.db.models.functions import Now
from django.test import override_settings
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    ListTasksRequest,
    ListTasksResult,
    PaginatedRequestParams,
)

from example_project.mcp_agent import connect
from switchboard_todos import queue_settings
from switchboard_todos.agents import long_poll_cap, service
from switchboard_todos.agents.accounts import create_agent
from switchboard_todos.agents.service import TASK_PAGE
from switchboard_todos.claims import long_polls
from switchboard_todos.mcp.server import Tools
from switchboard_todos.mcp.tasks import Tasks
from switchboard_todos.models import Agent, State, Todo, TodoTask
from switchboard_todos.upkeep import retention
from tests import test_mcp
from tests.test_mcp import Opener, on_own_connection, run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _stop_listeners() -> Iterator[None]:
    """The listeners the workers' claims (with a wait) start in this process, stopped."""
    yield
    long_polls.stop()


# test_mcp's servers and sessions.
mcp_url, agent = test_mcp.mcp_url, test_mcp.agent
http_session, open_session = test_mcp.http_session, test_mcp.open_session


async def start(session: ClientSession, tool: str, ttl: int | None = None, **arguments: Any) -> Any:
    """A task-augmented call of `tool`: the task it answers with, raw."""
    task = {} if ttl is None else {"ttl": ttl}
    params = {"name": tool, "arguments": arguments, "task": task}
    answer = await session._dispatcher.send_raw_request("tools/call", params, {})
    return answer["task"]


async def get(session: ClientSession, task_id: str) -> GetTaskResult:
    request = GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, GetTaskResult)


async def result(session: ClientSession, task_id: str) -> CallToolResult:
    request = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id))
    return await session.send_request(request, CallToolResult)


async def cancel(session: ClientSession, task_id: str) -> GetTaskResult:
    request = CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))
    return await session.send_request(request, GetTaskResult)


async def listed(session: ClientSession, cursor: str | None = None) -> ListTasksResult:
    request = ListTasksRequest(params=PaginatedRequestParams(cursor=cursor))
    return await session.send_request(request, ListTasksResult)


def report_progress(queue: str, progress: Any) -> Todo:
    """Another worker claims a todo of `queue` and reports how far it got."""
    todo = Todo.objects.claim_next(queue, "worker", 60, wait=10)
    assert todo is not None
    return Todo.objects.heartbeat(todo.id, "worker", 60, progress=progress)


def test_the_server_declares_tasks_and_the_tools_that_run_as_tasks(http_session: Opener) -> None:
    async def scenario(session: ClientSession) -> Any:
        tools = (await session.list_tools()).tools
        return session.server_capabilities, {tool.name: tool.execution for tool in tools}

    capabilities, executions = run(http_session, scenario)
    assert capabilities is not None and capabilities.tasks is not None
    assert capabilities.tasks.list is not None and capabilities.tasks.cancel is not None
    assert capabilities.tasks.requests is not None and capabilities.tasks.requests.tools
    supported = {name for name, execution in executions.items() if execution is not None}
    assert supported == {"create_for", "create_many"}
    assert executions["create_for"].task_support == "optional"


def handed_off() -> list[str]:
    """The ids of the todos in `handoff`, read on a thread of its own: its connection closed,
    not left for the garbage collector to find open in some later test."""
    try:
        return list(Todo.objects.filter(queue="handoff").values_list("id", flat=True))
    finally:
        connections.close_all()


def test_delegate_wait_and_read_the_result(open_session: Opener) -> None:
    """create_for as a task answers at once, working; the holder's progress note is the status
    message; tasks/result waits until another agent completes it, and is the tool's result:
    the todo as it ended, in create_for's output shape. The ttl asked for is kept."""

    async def scenario(session: ClientSession) -> list[Any]:
        task = await start(session, "create_for", ttl=60_000, queue="handoff", kind="t.task")
        waiting = asyncio.create_task(result(session, task["taskId"]))
        await asyncio.to_thread(on_own_connection, partial(report_progress, "handoff", "halfway"))
        working = await get(session, task["taskId"])
        [todo] = await asyncio.to_thread(handed_off)
        await asyncio.to_thread(
            on_own_connection, Todo.objects.complete, todo, "worker", {"answer": 42}
        )
        return [task, working, await waiting, await get(session, task["taskId"])]

    task, working, ended, completed = run(open_session, scenario)
    assert task["status"] == "working" and task["taskId"].startswith("tk_")
    assert task["ttl"] == 60_000 and task["pollInterval"] > 0
    assert (working.status, working.status_message) == ("working", "halfway")
    assert not ended.is_error and ended.structured_content is not None
    assert ended.structured_content["created"] is True
    assert ended.structured_content["todo"]["state"] == "done"
    assert ended.structured_content["todo"]["result"] == {"answer": 42}
    assert completed.status == "completed"
    row = TodoTask.objects.get()
    assert row.keep_until - row.created_at == timedelta(seconds=60)


def test_cancel_is_the_creators_and_another_agent_sees_nothing(mcp_url: str, agent: Any) -> None:
    """The creator cancels its task: cancelled, and its todo a dead letter that says so; a
    second cancel is the protocol's error. Another agent's tasks/get, tasks/result and
    tasks/cancel of the same id answer as for an unknown id, and its tasks/list is empty."""
    other = create_agent("other", claim_queues=["handoff"], create_queues=["handoff"])[1]

    async def scenario() -> list[Any]:
        async with connect(mcp_url, agent[1]) as mine, connect(mcp_url, other) as theirs:
            task = await start(mine, "create_for", queue="handoff", kind="t.cancel")
            refused = []
            for request in (get, result, cancel):
                with pytest.raises(MCPError) as error:
                    await request(theirs, task["taskId"])
                refused.append(error.value.error)
            their_list = await listed(theirs)
            cancelled = await cancel(mine, task["taskId"])
            with pytest.raises(MCPError) as again:
                await cancel(mine, task["taskId"])
            ended = await result(mine, task["taskId"])
            return [refused, their_list, cancelled, again.value.error, ended]

    refused, their_list, cancelled, again, ended = asyncio.run(scenario())
    assert [error.code for error in refused] == [INVALID_PARAMS] * 3
    assert all("does not exist" in error.message for error in refused)
    assert their_list.tasks == []
    assert cancelled.status == "cancelled" and "mcp-agent" in (cancelled.status_message or "")
    assert again.code == INVALID_PARAMS and "failed already" in again.message
    assert ended.is_error and "cancelled" in ended.content[0].text
    row = Todo.objects.get()
    assert row.state == State.FAILED
    assert isinstance(row.result, dict) and row.result["type"] == "Cancelled"


def test_a_dead_lettered_todo_reads_failed_with_its_error(open_session: Opener) -> None:
    """A todo that used its last attempt: the task is failed, its status message the error,
    and its result a tool error that carries it."""

    def dead_letter() -> None:
        todo = Todo.objects.claim_next("handoff", "worker", 60, wait=10)
        assert todo is not None
        Todo.objects.fail(todo.id, "worker", {"message": "disk full"})

    async def scenario(session: ClientSession) -> list[Any]:
        task = await start(session, "create_for", queue="handoff", kind="t.dead", max_attempts=1)
        await asyncio.to_thread(on_own_connection, dead_letter)
        return [await get(session, task["taskId"]), await result(session, task["taskId"])]

    failed, ended = run(open_session, scenario)
    assert failed.status == "failed" and "disk full" in (failed.status_message or "")
    assert ended.is_error and "disk full" in ended.content[0].text


def test_a_plan_runs_as_the_task_of_its_merging_todo(http_session: Opener) -> None:
    """create_many as a task follows the plan's last todo, which waits for the others; its
    result is the merge as it ended, with the parts' results. A plan whose last todo does not
    wait for every other is refused before anything is created."""
    plan = [
        {"queue": "handoff", "kind": "part", "ref": "a"},
        {"queue": "handoff", "kind": "part", "ref": "b"},
        {"queue": "handoff", "kind": "merge", "ref": "m", "after": ["a", "b"]},
    ]

    def work_the_plan() -> None:
        for _ in range(3):
            todo = Todo.objects.claim_next("handoff", "worker", 60, wait=10)
            assert todo is not None
            Todo.objects.complete(todo.id, "worker", {"kind": todo.kind})

    async def scenario(session: ClientSession) -> list[Any]:
        with pytest.raises(MCPError) as refused:
            await start(session, "create_many", todos=[*plan, {"queue": "handoff", "kind": "x"}])
        task = await start(session, "create_many", todos=plan)
        await asyncio.to_thread(on_own_connection, work_the_plan)
        return [refused.value.error, await result(session, task["taskId"])]

    refused, ended = run(http_session, scenario)
    assert refused.code == INVALID_PARAMS and "merging todo" in refused.message
    assert ended.structured_content is not None
    [merge] = ended.structured_content["todos"]
    assert merge["todo"]["kind"] == "merge" and merge["todo"]["state"] == "done"
    assert sorted(r["kind"] for r in merge["todo"]["parent_results"].values()) == ["part"] * 2
    assert Todo.objects.count() == 3


def test_tasks_list_pages_the_callers_tasks(http_session: Opener) -> None:
    async def scenario(session: ClientSession) -> list[ListTasksResult]:
        for number in range(TASK_PAGE + 1):
            await start(session, "create_for", queue="handoff", kind=f"t.{number}")
        first = await listed(session)
        return [first, await listed(session, first.next_cursor)]

    first, second = run(http_session, scenario)
    assert len(first.tasks) == TASK_PAGE and len(second.tasks) == 1
    assert second.next_cursor is None
    ids = [task.task_id for task in first.tasks + second.tasks]
    assert len(set(ids)) == TASK_PAGE + 1
    assert set(ids) == set(TodoTask.objects.values_list("id", flat=True))


def test_retention_keeps_a_tasks_todo_for_its_ttl() -> None:
    """A done todo an unexpired task keeps is not purged, by purge_todos or by its queue's
    retention, and a reaper's mark does not pass it; once the task's ttl passed, the todo and
    its task are purged together."""
    keeper = create_agent("keeper", create_queues=["handoff"])[0]
    kept, created = service.create_for(keeper, queue="handoff", kind="t.kept")
    service.start_task(keeper, kept.id, 60_000, "create_for", created)
    later, _ = service.create_for(keeper, queue="handoff", kind="t.later")
    for days in (3, 2):
        claimed = Todo.objects.claim_next("handoff", "worker", 60)
        assert claimed is not None
        Todo.objects.complete(claimed.id, "worker", "ok")
        Todo.objects.filter(pk=claimed.id).update(completed_at=Now() - timedelta(days=days))
    queue_settings.configure("handoff", retention=timedelta(days=1))
    marks: dict[str, Any] = {}
    assert retention.count_purgeable(timedelta(days=1)).total == 1
    assert retention.purge_retained(marks=marks).total == 1  # the later one
    assert retention.purge(timedelta(days=1)).total == 0
    TodoTask.objects.update(keep_until=Now() - timedelta(seconds=1))
    assert retention.purge_retained(marks=marks).total == 1
    assert not Todo.objects.exists() and not TodoTask.objects.exists()


def test_wait_for_todo_counts_against_the_wait_cap_and_tasks_result_too() -> None:
    """With the agent's long polls all waiting, wait_for_todo is a throttled tool error and
    tasks/result the protocol's error that says so; get_todo, which does not wait, answers."""
    waiter = create_agent("waiter", create_queues=["handoff"])[0]
    todo, created = service.create_for(waiter, queue="handoff", kind="t.wait")
    task = service.start_task(waiter, todo.id, 60_000, "create_for", created)

    async def agent() -> Agent:
        return waiter

    async def scenario() -> list[Any]:
        tools, tasks = Tools(agent), Tasks(agent)
        read = await tools.get_todo(todo.id)
        waited = await tools.wait_for_todo(todo.id, wait=5)
        with pytest.raises(MCPError) as refused:
            await tasks.result(None, GetTaskPayloadRequestParams(task_id=task.task.id))  # type: ignore[arg-type]
        return [read, waited, refused.value.error]

    with override_settings(SWITCHBOARD_TODOS_AGENT_MAX_WAITS=1), long_poll_cap.admitted(waiter, 5):
        read, waited, refused = asyncio.run(scenario())
    assert not read.is_error
    assert waited.is_error and "(429)" in waited.content[0].text
    assert "already has 1 long polls waiting" in refused.message


def test_hostile_task_requests_are_the_protocols_errors(http_session: Opener) -> None:
    """A tool that cannot run as a task, a task that is no object, a ttl that is no whole
    number of milliseconds, a plan that is no list, a task id of any shape or a cursor not
    tasks/list's: each a JSON-RPC error, and nothing created."""

    async def scenario(session: ClientSession) -> list[int]:
        send = session._dispatcher.send_raw_request
        requests: list[tuple[str, dict[str, Any]]] = [
            ("tools/call", {"name": "claim", "arguments": {"ttl": 30}, "task": {}}),
            ("tools/call", {"name": "create_for", "arguments": {"queue": "handoff"}, "task": 1}),
            (
                "tools/call",
                {"name": "create_for", "arguments": {"queue": "handoff"}, "task": {"ttl": -1}},
            ),
            ("tools/call", {"name": "create_many", "arguments": [1], "task": {}}),
            ("tasks/get", {"taskId": "tk_" + "x" * 5000}),
            ("tasks/cancel", {"taskId": "td_1"}),
            ("tasks/list", {"cursor": "1:tk_nope"}),
        ]
        codes = []
        for method, params in requests:
            with pytest.raises(MCPError) as refused:
                await send(method, params, {})
            codes.append(refused.value.error.code)
        return codes

    assert run(http_session, scenario) == [-32601, -32602, -32602, -32602, -32602, -32602, -32602]
    assert not Todo.objects.exists() and not TodoTask.objects.exists()
