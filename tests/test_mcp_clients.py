"""The MCP tools through a client of another SDK than the server's: the TypeScript SDK's.

That client is the one inside most desktop and IDE agents, and it holds every tool result to
the tool's declared output schema, errors included: an error whose result does not fit is
refused by the client itself as a protocol error, and the model never reads it. Node runs the
client (tests/node/relay.mjs); the SDK installs from tests/node/package-lock.json with
`npm ci`. Without node or npm these tests are skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import pytest
from django.db import connections
from django.db.models.functions import Now

from switchboard_todos.agents.accounts import create_agent
from switchboard_todos.claims import long_polls
from switchboard_todos.models import State, Todo
from tests.asgi import serve_mcp
from tests.conftest import ROOT
from tests.mcp_asgi import RETRY_AFTER, THROTTLED

pytestmark = [pytest.mark.clients, pytest.mark.django_db(transaction=True)]

NODE = ROOT / "tests" / "node"


@pytest.fixture(scope="module")
def relay_script() -> Path:
    """tests/node/relay.mjs, with the TypeScript SDK installed from the lock file."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"The TypeScript MCP SDK's client needs {' and '.join(missing)}: not found.")
    subprocess.run(
        ["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"],
        cwd=NODE,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return NODE / "relay.mjs"


@pytest.fixture(scope="module")
def mcp_url(django_db_setup: None) -> Iterator[str]:
    """uvicorn serving tests/mcp_asgi.py (the example project's application); its /mcp."""
    with serve_mcp("tests.mcp_asgi:application") as url:
        yield url


class Relay:
    """The TypeScript SDK's client, connected: each call answers what the client made of it."""

    def __init__(self, script: Path, url: str, token: str) -> None:
        self.process = subprocess.Popen(
            ["node", str(script), url, token],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.tools: list[str] = self._answer()["tools"]

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """{"result": the CallToolResult}, or {"error": ...} if the client refused it."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        line = _pipe(self.process.stdout).readline()
        assert line, f"the client ended: {_pipe(self.process.stderr).read()}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """Close its stdin: it ends its session and exits."""
        _, stderr = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, stderr


def _pipe(stream: IO[str] | None) -> IO[str]:
    assert stream is not None
    return stream


@pytest.fixture
def relay(relay_script: Path, mcp_url: str) -> Iterator[Relay]:
    """The client, as an agent that claims from `mcp` and creates in `mcp` and `throttled`."""
    _, token = create_agent("ts-agent", claim_queues=["mcp"], create_queues=["mcp", THROTTLED])
    connections.close_all()
    client = Relay(relay_script, mcp_url, token)
    yield client
    client.close()


def structured(answer: dict[str, Any]) -> dict[str, Any]:
    """The structured result of a tool call that succeeded."""
    assert "error" not in answer, answer
    result: dict[str, Any] = answer["result"]
    assert not result.get("isError"), result
    return dict(result["structuredContent"])


def error_text(answer: dict[str, Any]) -> str:
    """The text a model reads of a tool error; fails on a protocol error, or on a success."""
    assert "error" not in answer, f"the client refused the tool's answer: {answer['error']}"
    result: dict[str, Any] = answer["result"]
    assert result.get("isError") is True, result
    return " ".join(block["text"] for block in result["content"] if block["type"] == "text")


def test_the_loop_and_every_tool_error_reach_the_model(relay: Relay) -> None:
    taken, _ = Todo.objects.create_todo(queue="mcp", kind="t.any")
    held_elsewhere = Todo.objects.claim_next("mcp", "someone-else", 60)
    assert held_elsewhere is not None and held_elsewhere.id == taken.id
    work, _ = Todo.objects.create_todo(queue="mcp", kind="t.summarise")
    lapsing, _ = Todo.objects.create_todo(queue="mcp", kind="t.any")
    elsewhere, _ = Todo.objects.create_todo(queue="secret", kind="t.hidden")
    connections.close_all()
    assert "claim" in relay.tools

    [held] = structured(relay.call("claim", queues=["mcp"], ttl=30))["todos"]
    beat = structured(relay.call("heartbeat", todo_id=work.id, ttl=600))
    done = structured(relay.call("complete", todo_id=work.id, result={"words": 3}))
    assert held["id"] == work.id and beat["lease_expires_at"] > held["lease_expires_at"]
    assert done["state"] == State.DONE and done["result"] == {"words": 3}

    conflict = error_text(relay.call("heartbeat", todo_id=taken.id, ttl=30))
    assert conflict.startswith("Conflict (409): ") and "'someone-else'" in conflict
    assert "do not complete it" in conflict

    not_found = error_text(relay.call("complete", todo_id=elsewhere.id))
    assert not_found == (
        f"Todo not found (404): Todo {elsewhere.id!r} does not exist. "
        "Forget this id: no todo of yours has it."
    )

    structured(relay.call("claim", todo_id=lapsing.id, ttl=30))
    Todo.objects.filter(pk=lapsing.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    assert Todo.objects.reap_expired().requeued == 1
    connections.close_all()
    lost = error_text(relay.call("complete", todo_id=lapsing.id, result=1))
    assert lost.startswith("Conflict (409): ") and "stop working on it, do not complete it" in lost

    not_granted = error_text(relay.call("claim", queues=["secret"], ttl=30))
    assert not_granted.startswith("Queue not granted (403): ") and "'secret'" in not_granted

    out_of_range = error_text(relay.call("claim", ttl=-1))
    assert out_of_range.startswith("Invalid input (422): ") and "ttl" in out_of_range
    wrong_type = error_text(relay.call("heartbeat", todo_id=taken.id, ttl="soon"))
    assert "ttl" in wrong_type  # the server SDK's own check of the arguments

    throttled = error_text(relay.call("create_for", queue=THROTTLED, kind="t.any"))
    assert throttled.startswith("Too many requests (429): ")
    assert f"Retry-After: {RETRY_AFTER} s." in throttled and "nothing changed" in throttled

    assert structured(relay.call("list_todos", state="claimed")) == {
        "todos": [],
        "next_cursor": None,
    }
    assert Todo.objects.filter(kind="t.any", owner="ts-agent").count() == 0


def test_a_plan_and_its_merge_fit_the_output_schemas(relay: Relay) -> None:
    """create_many's answer, and a claimed merge with its parents' results, are what the tools
    declare; a plan that can never run reaches the model as a tool error."""
    plan = [
        {"queue": "mcp", "kind": "part", "ref": "part"},
        {"queue": "mcp", "kind": "merge", "after": ["part"]},
    ]
    [part, merge] = [
        each["todo"] for each in structured(relay.call("create_many", todos=plan))["todos"]
    ]
    assert merge["parents"] == [part["id"]] and merge["parent_results"] == {part["id"]: None}
    [held] = structured(relay.call("claim", ttl=30))["todos"]
    assert held["id"] == part["id"] and held["parent_results"] is None
    structured(relay.call("complete", todo_id=part["id"], result={"found": 2}))
    [merging] = structured(relay.call("claim", ttl=30))["todos"]
    assert merging["id"] == merge["id"] and merging["parent_results"] == {part["id"]: {"found": 2}}

    cycle = [{"queue": "mcp", "kind": "a", "ref": "a", "after": ["a"]}]
    assert error_text(relay.call("create_many", todos=cycle)).startswith(
        "The plan cannot run (409): todo #0 waits for itself."
    )


# MCP Tasks: client.experimental.tasks of the TypeScript SDK (tests/node/tasks.mjs).


class TaskClient(Relay):
    """The TypeScript SDK's client using Tasks: each request answers what the SDK made of it."""

    def __init__(self, script: Path, url: str, token: str) -> None:
        self.process = subprocess.Popen(
            ["node", str(script), url, token],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        opening = self._answer()
        self.tools, self.task_tools = opening["tools"], opening["taskTools"]
        self.capabilities: dict[str, Any] = opening["capabilities"]

    def send(self, **request: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()

    def request(self, op: str, **params: Any) -> dict[str, Any]:
        """{"answer": ...}, or {"error": {code, message}}."""
        self.send(op=op, **params)
        return self._answer()

    def next(self) -> dict[str, Any]:
        """The next message of a stream (callToolStream)."""
        return self._answer()

    def rest(self) -> list[dict[str, Any]]:
        """The stream's messages up to its end."""
        messages = []
        while "end" not in (message := self._answer()):
            messages.append(message)
        return messages


@pytest.fixture
def tasks_script(relay_script: Path) -> Path:
    return relay_script.with_name("tasks.mjs")


@pytest.fixture
def delegating(tasks_script: Path, mcp_url: str) -> Iterator[tuple[TaskClient, str]]:
    """The client, as an agent that creates in `handoff`; and its token."""
    _, token = create_agent("ts-delegator", create_queues=["handoff"])
    connections.close_all()
    client = TaskClient(tasks_script, mcp_url, token)
    yield client, token
    client.close()


@pytest.fixture(autouse=True)
def _stop_listeners() -> Iterator[None]:
    """The listeners the workers' claims (with a wait) start in this process, stopped."""
    yield
    long_polls.stop()


def worked(complete: bool, result: Any = None) -> Todo:
    """Another worker claims the todo of `handoff` and completes it, or fails its last attempt."""
    todo = Todo.objects.claim_next("handoff", "worker", 60, wait=10)
    assert todo is not None
    ended = (
        Todo.objects.complete(todo.id, "worker", result)
        if complete
        else Todo.objects.fail(todo.id, "worker", {"message": "disk full"})
    )
    connections.close_all()
    return ended


def test_a_delegated_task_is_streamed_to_its_result(delegating: tuple[TaskClient, str]) -> None:
    """callToolStream of create_for: the task is created, polled while another agent works it,
    and its result is create_for's output, which the SDK holds to the tool's schema: the todo
    as it ended. Its end is notified; getTask, listTasks and getTaskResult agree."""
    client, _ = delegating
    assert client.capabilities["tasks"]["requests"]["tools"]["call"] == {}
    assert set(client.task_tools) == {"create_for", "create_many"}
    client.send(
        op="stream", tool="create_for", arguments={"queue": "handoff", "kind": "t.ts"}, ttl=60_000
    )
    created = client.next()
    assert created["type"] == "taskCreated" and created["task"]["status"] == "working"
    assert created["task"]["ttl"] == 60_000
    worked(True, {"summary": "done by worker"})
    messages = client.rest()
    assert [m["type"] for m in messages][-1] == "result", messages
    result = messages[-1]["result"]
    assert result["structuredContent"]["todo"]["result"] == {"summary": "done by worker"}
    assert messages[-2]["type"] == "taskStatus" and messages[-2]["task"]["status"] == "completed"

    task_id = created["task"]["taskId"]
    notified = client.request("notified", taskId=task_id)["answer"]  # on the standalone stream
    assert notified["status"] == "completed" and notified["taskId"] == task_id
    assert client.request("get", taskId=task_id)["answer"]["status"] == "completed"
    [listed] = client.request("list")["answer"]["tasks"]
    assert listed["taskId"] == task_id
    again = client.request("result", taskId=task_id)["answer"]
    assert again["structuredContent"] == result["structuredContent"]


def test_only_the_creator_cancels_and_sees_its_task(
    delegating: tuple[TaskClient, str], tasks_script: Path, mcp_url: str
) -> None:
    """Another agent's getTask, getTaskResult and cancelTask of the task are the protocol's
    error (invalid params: not found), and its listTasks is empty; the creator's cancelTask
    (from another session of its own) cancels it, and the stream ends in the SDK's error."""
    client, token = delegating
    _, other_token = create_agent("ts-other", claim_queues=["handoff"], create_queues=["handoff"])
    connections.close_all()
    client.send(op="stream", tool="create_for", arguments={"queue": "handoff", "kind": "t.ts"})
    task_id = client.next()["task"]["taskId"]
    other = TaskClient(tasks_script, mcp_url, other_token)
    mine = TaskClient(tasks_script, mcp_url, token)
    try:
        for op in ("get", "result", "cancel"):
            refused = other.request(op, taskId=task_id)["error"]
            assert refused["code"] == -32602 and "does not exist" in refused["message"], refused
        assert other.request("list")["answer"]["tasks"] == []
        cancelled = mine.request("cancel", taskId=task_id)["answer"]
        assert cancelled["status"] == "cancelled" and "ts-delegator" in cancelled["statusMessage"]
        again = mine.request("cancel", taskId=task_id)["error"]
        assert again["code"] == -32602 and "failed already" in again["message"]
    finally:
        other.close()
        mine.close()
    messages = client.rest()
    assert messages[-1]["type"] == "error" and "cancelled" in messages[-1]["error"]["message"]
    assert Todo.objects.get().state == State.FAILED


def test_a_dead_lettered_task_reads_failed_with_its_error(
    delegating: tuple[TaskClient, str],
) -> None:
    client, _ = delegating
    arguments = {"queue": "handoff", "kind": "t.ts", "max_attempts": 1}
    client.send(op="stream", tool="create_for", arguments=arguments)
    task_id = client.next()["task"]["taskId"]
    worked(False)
    messages = client.rest()
    assert messages[-1]["type"] == "error" and "failed" in messages[-1]["error"]["message"]
    failed = client.request("get", taskId=task_id)["answer"]
    assert failed["status"] == "failed" and "disk full" in failed["statusMessage"]
    result = client.request("result", taskId=task_id)["answer"]
    assert result["isError"] is True and "disk full" in result["content"][0]["text"]
