"""The MCP tools through the official MCP client, against real server processes.

Every scenario runs twice: over streamable HTTP against the example project's ASGI application
served by uvicorn (with the agent's bearer token), and over stdio against `manage.py todo_mcp`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.admin.utils import quote
from django.db import connection, connections
from django.db.models.functions import Now
from django.test import override_settings
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.streamable_http_manager import DEFAULT_SESSION_IDLE_TIMEOUT
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from devtools.database import free_port
from example_project.mcp_agent import connect
from switchboard_todos.agents import errors
from switchboard_todos.agents.accounts import create_agent, revoke
from switchboard_todos.claims import long_polls
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import Throttled
from switchboard_todos.mcp.http import HttpsOnly, allowed_hosts, streamable_http
from switchboard_todos.mcp.server import PROBLEM_META, Tools
from switchboard_todos.mcp.threads import close_threads
from switchboard_todos.models import Agent, State, Todo
from tests.asgi import serve_mcp
from tests.conftest import ROOT, child_environment, database_url, run_in_threads
from tests.helpers import wait_until

T = TypeVar("T")

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = "mcp-agent"
#: SECURE_PROXY_SSL_HEADER of a deployment behind a proxy that terminates TLS.
PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")


def status_of(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POST an empty JSON-RPC body to `url`: the status and the response headers."""
    request = urllib.request.Request(url, data=b"{}", headers=headers or {}, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json, text/event-stream")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.headers


@pytest.fixture(scope="module")
def mcp_url(django_db_setup: None) -> Iterator[str]:
    """uvicorn serving the example project's ASGI application; the URL of its /mcp."""
    with serve_mcp() as url:
        yield url


@pytest.fixture
def agent() -> tuple[Agent, str]:
    """An agent that claims from `mcp`, and creates in `mcp` and `handoff`; and its token."""
    return create_agent(AGENT, claim_queues=["mcp"], create_queues=["mcp", "handoff"])


Opener = Callable[[], AbstractAsyncContextManager[ClientSession]]


@pytest.fixture
def http_session(mcp_url: str, agent: tuple[Agent, str]) -> Opener:
    """Opens an initialized MCP session over streamable HTTP, with the agent's token."""
    return lambda: connect(mcp_url, agent[1])


@pytest.fixture(params=["http", "stdio"])
def open_session(request: pytest.FixtureRequest, agent: tuple[Agent, str]) -> Opener:
    """Opens an initialized MCP session acting as the agent, over one transport or the other."""
    if request.param == "http":
        opener: Opener = request.getfixturevalue("http_session")
        return opener
    server = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "todo_mcp", "--agent", agent[0].name],
        env=child_environment(),
        cwd=ROOT,
    )

    @asynccontextmanager
    async def stdio() -> AsyncIterator[ClientSession]:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    return stdio


def run(open_session: Opener, scenario: Callable[[ClientSession], Awaitable[T]]) -> T:
    """Run `scenario` in one MCP session (database checks come after, outside the loop)."""

    async def main() -> T:
        async with open_session() as session:
            return await scenario(session)

    return asyncio.run(main())


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; the test fails if the tool answered an error."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


async def refused(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The problem details of a tool error (isError); the test fails if the tool succeeded.

    The model reads the problem as text. There is no structured content, which a client would
    hold to the tool's output schema; the problem details are in `_meta`.
    """
    result = await session.call_tool(tool, arguments)
    assert result.is_error and result.structured_content is None, result
    problem = dict((result.meta or {})[PROBLEM_META])
    [text] = result.content
    assert text.type == "text" and text.text.startswith(
        f"{problem['title']} ({problem['status']}): {problem['detail']} "
    )
    return problem


def on_own_connection(function: Callable[..., Any], *args: Any) -> None:
    """Run `function` (on a thread that is not the event loop's) and close its connection."""
    try:
        function(*args)
    finally:
        connections.close_all()


def moment(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_claim_heartbeat_complete(open_session: Opener) -> None:
    todo, _ = Todo.objects.create_todo(queue="mcp", kind="t.summarise", title="Summarise")

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        claimed = await call(session, "claim", queues=["mcp"], ttl=30)
        [held] = claimed["todos"]
        beat = await call(session, "heartbeat", todo_id=held["id"], ttl=600)
        done = await call(session, "complete", todo_id=held["id"], result={"words": 3})
        return [held, beat, done]

    held, beat, done = run(open_session, scenario)
    assert held["id"] == todo.id and held["state"] == State.CLAIMED
    assert held["owner"] == AGENT and held["attempt"] == 1
    assert moment(beat["lease_expires_at"]) > moment(held["lease_expires_at"])
    assert done["state"] == State.DONE and done["result"] == {"words": 3}
    row = Todo.objects.get(pk=todo.id)
    assert (row.state, row.owner, row.attempt, row.result) == (
        State.DONE,
        AGENT,
        1,
        {"words": 3},
    )


def test_fail_is_retried_later(open_session: Opener) -> None:
    todo, _ = Todo.objects.create_todo(queue="mcp", kind="t.flaky")

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        await call(session, "claim", ttl=30)
        failed = await call(session, "fail", todo_id=todo.id, error="boom", retry_in=1)
        # Not claimable before its retry time; the long poll picks it up when it is due.
        again = await call(session, "claim", ttl=30, wait=15)
        return [failed, *again["todos"]]

    failed, again = run(open_session, scenario)
    assert failed["state"] == State.PENDING and failed["owner"] is None
    assert moment(failed["next_retry_at"]) > moment(failed["updated_at"])
    assert "boom" in json.dumps(failed["last_error"])
    assert again["id"] == todo.id and again["attempt"] == 2


def test_release_gives_the_todo_back_without_an_attempt(open_session: Opener) -> None:
    todo, _ = Todo.objects.create_todo(queue="mcp", kind="t.any")

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        await call(session, "claim", todo_id=todo.id, ttl=30)
        released = await call(session, "release", todo_id=todo.id)
        listed = await call(session, "list_todos")
        again = await call(session, "claim", todo_id=todo.id, ttl=30)
        return [released, listed, *again["todos"]]

    released, listed, again = run(open_session, scenario)
    assert released["state"] == State.PENDING and released["owner"] is None
    assert [each["id"] for each in listed["todos"]] == [todo.id]
    assert listed["next_cursor"] is None
    assert again["attempt"] == 1  # release refunds the attempt


def test_create_for_with_a_duplicate_idempotency_key(open_session: Opener) -> None:
    arguments = {"kind": "review", "title": "Review", "payload": {"n": 1}}

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        first = await call(session, "create_for", queue="mcp", idempotency_key="k-1", **arguments)
        again = await call(session, "create_for", queue="mcp", idempotency_key="k-1", **arguments)
        handed = await call(
            session, "create_for", queue="handoff", idempotency_key="k-1", **arguments
        )
        taken = await refused(
            session, "create_for", queue="handoff", idempotency_key="k-1", **arguments
        )
        return [first, again, handed, taken]

    first, again, handed, taken = run(open_session, scenario)
    assert first["created"] is True and again["created"] is False
    assert again["todo"]["id"] == first["todo"]["id"]
    assert again["todo"]["idempotency_key"] == "k-1"
    row = Todo.objects.get(queue="mcp")
    assert (row.kind, row.payload, row.source) == ("review", {"n": 1}, f"agent:{AGENT}")
    # A todo of a queue it cannot see is not shown: the key is taken, and that is all.
    assert handed["created"] is True
    assert taken["status"] == 409 and "'k-1' is taken in queue 'handoff'" in taken["detail"]
    assert handed["todo"]["id"] not in taken["detail"]


def test_errors_are_tool_errors_and_the_session_goes_on(open_session: Opener) -> None:
    elsewhere, _ = Todo.objects.create_todo(queue="secret", kind="t.hidden")
    Todo.objects.create_todo(queue="mcp", kind="t.any")
    Todo.objects.claim_next("mcp", "someone-else", 60)

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        return [
            await refused(session, "complete", todo_id=elsewhere.id),
            await refused(session, "claim", queues=["secret"], ttl=30),
            await refused(session, "claim", ttl=-1),
            await refused(session, "claim", ttl=30, wait=21),
            await call(session, "list_todos", state="claimed"),
        ]

    hidden, not_granted, bad_ttl, long_wait, listed = run(open_session, scenario)
    # Another queue's todo answers as an unknown id does, with the HTTP API's problem details.
    assert hidden == errors.problem(errors.TODO_NOT_FOUND, f"Todo {elsewhere.id!r} does not exist.")
    assert not_granted["status"] == 403 and not_granted["type"] == errors.QUEUE_NOT_GRANTED.type
    assert bad_ttl["status"] == 422 and "ttl" in bad_ttl["detail"]
    assert long_wait["status"] == 422 and "wait" in long_wait["detail"]
    assert listed == {"todos": [], "next_cursor": None}
    assert Todo.objects.filter(owner=AGENT).count() == 0


def test_a_lost_lease_is_refused(http_session: Opener) -> None:
    """Lapsed and requeued, then claimed by another agent: a conflict each time, which says so."""
    todo, _ = Todo.objects.create_todo(queue="mcp", kind="t.any")

    def lapse() -> None:
        Todo.objects.filter(pk=todo.id).update(lease_expires_at=Now() - timedelta(seconds=1))
        assert Todo.objects.reap_expired().requeued == 1

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        await call(session, "claim", ttl=30)
        await asyncio.to_thread(on_own_connection, lapse)
        requeued = await refused(session, "complete", todo_id=todo.id, result=1)
        await asyncio.to_thread(on_own_connection, Todo.objects.claim_next, "mcp", "other", 60)
        taken = await refused(session, "heartbeat", todo_id=todo.id, ttl=30)
        return [requeued, taken]

    requeued, taken = run(http_session, scenario)
    assert requeued["status"] == 409 and requeued["type"] == errors.TODO_CONFLICT.type
    assert taken["status"] == 409 and "'other'" in taken["detail"], taken
    row = Todo.objects.get(pk=todo.id)
    assert (row.state, row.owner, row.attempt) == (State.CLAIMED, "other", 2)


def test_progress_and_a_cancel_reach_the_agent(open_session: Opener) -> None:
    """The heartbeat tool stores the agent's progress note, seen in list_todos; once an
    operator cancels the todo, heartbeat and complete are tool errors that tell the model to
    stop now and not complete it."""
    todo, _ = Todo.objects.create_todo(queue="mcp", kind="t.long")

    async def scenario(session: ClientSession) -> list[Any]:
        await call(session, "claim", ttl=30)
        beat = await call(session, "heartbeat", todo_id=todo.id, ttl=30, progress="3 of 10 files")
        listed = await call(session, "list_todos", state="claimed")
        await asyncio.to_thread(on_own_connection, Todo.objects.cancel, todo.id, "wrong repo")
        told = await session.call_tool("heartbeat", {"todo_id": todo.id, "ttl": 30})
        late = await refused(session, "complete", todo_id=todo.id, result="late")
        return [beat, listed, told, late]

    beat, listed, told, late = run(open_session, scenario)
    assert beat["progress"] == "3 of 10 files"
    assert [each["progress"] for each in listed["todos"]] == ["3 of 10 files"]
    assert told.is_error and told.structured_content is None
    assert (told.meta or {})[PROBLEM_META]["type"] == errors.TODO_CANCELLED.type
    assert "stop work on it now and do not complete it" in told.content[0].text
    assert "wrong repo" in told.content[0].text
    assert late["status"] == 409 and late["type"] == errors.TODO_CANCELLED.type
    row = Todo.objects.get(pk=todo.id)
    assert (row.state, row.result) == (State.FAILED, {"type": "Cancelled", "message": "wrong repo"})


def test_an_agent_reads_and_waits_for_the_work_it_handed_out(open_session: Opener) -> None:
    """get_todo reads a todo the agent created in a queue it does not claim from; a bounded
    wait_for_todo answers it still pending; another agent completes it while the agent waits,
    and wait_for_todo answers it done, with its result."""

    def work_it() -> None:
        # With a wait: a claim skips the row a waiter's mark (await_todo) locks for a moment.
        todo = Todo.objects.claim_next("handoff", "worker", 30, wait=10)
        assert todo is not None
        Todo.objects.complete(todo.id, "worker", {"ok": True})

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        made = (await call(session, "create_for", queue="handoff", kind="t.handoff"))["todo"]
        read = await call(session, "get_todo", todo_id=made["id"])
        waited = await call(session, "wait_for_todo", todo_id=made["id"], wait=0.2)
        waiting = asyncio.create_task(call(session, "wait_for_todo", todo_id=made["id"]))
        await asyncio.to_thread(on_own_connection, work_it)
        return [read, waited, await waiting]

    try:
        read, waited, ended = run(open_session, scenario)
    finally:
        long_polls.stop()  # the worker's claim listened in this process
    assert (read["state"], waited["state"]) == ("pending", "pending")
    assert (ended["state"], ended["result"]) == ("done", {"ok": True})


def test_tools_describe_themselves_for_a_model(http_session: Opener) -> None:
    async def scenario(session: ClientSession) -> Any:
        return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in run(http_session, scenario)}
    assert set(tools) == {
        "list_todos",
        "claim",
        "heartbeat",
        "complete",
        "fail",
        "release",
        "get_todo",
        "wait_for_todo",
        "create_for",
        "create_many",
    }
    assert tools["wait_for_todo"].annotations and tools["wait_for_todo"].annotations.read_only_hint
    assert "do not complete" in (tools["heartbeat"].description or "")
    assert "what you have done so far" in (tools["heartbeat"].description or "")
    assert "progress" in tools["heartbeat"].input_schema["properties"]
    assert tools["claim"].output_schema is not None
    assert tools["list_todos"].annotations and tools["list_todos"].annotations.read_only_hint
    planning = tools["create_many"].description or ""
    for advice in ("`ref`", "`after`", "last", "idempotency_key", "run_anyway", "parent_results"):
        assert advice in planning, advice
    assert "parent_results" in (tools["claim"].description or "")
    assert "after" in tools["create_for"].input_schema["properties"]
    output = tools["claim"].output_schema
    assert output is not None
    assert {"parents", "waiting_for", "parent_results"} <= set(
        output["$defs"]["TodoJSON"]["properties"]
    )


@pytest.mark.django_db(transaction=True)
def test_a_tool_calls_thread_keeps_its_connection_for_the_next_call() -> None:
    """Without a pool too: a call no longer opens a connection of its own and closes it. The
    kept threads close theirs as the server ends (close_threads)."""

    async def agent() -> Agent:
        return Agent(name=AGENT)

    def backend() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid: int = cursor.fetchone()[0]
        return pid

    async def which_backend(agent: Agent) -> dict[str, Any]:
        return {"pid": await sync_to_async(backend)()}

    def alive(pid: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return bool(cursor.fetchone()[0])

    first, second = (asyncio.run(Tools(agent)._run(which_backend)) for _ in range(2))
    assert first.structured_content == second.structured_content
    assert first.structured_content is not None
    pid = first.structured_content["pid"]
    assert pid != backend() and alive(pid)
    close_threads()
    wait_until(lambda: not alive(pid), "the kept thread's connection to close")


def test_a_throttled_call_says_how_long_to_wait() -> None:
    async def agent() -> Agent:
        return Agent(name=AGENT)

    async def too_many(agent: Agent) -> dict[str, Any]:
        raise Throttled(f"Agent {agent.name!r} creates too many todos.", retry_after=2.5)

    result = asyncio.run(Tools(agent)._run(too_many))
    assert result.is_error and result.structured_content is None
    assert [block.text for block in result.content if block.type == "text"] == [
        f"Too many requests (429): Agent {AGENT!r} creates too many todos. Retry-After: 3 s. "
        + errors.THROTTLED.advice
    ]
    detail = f"Agent {AGENT!r} creates too many todos."
    assert result.meta == {
        PROBLEM_META: {**errors.problem(errors.THROTTLED, detail), "retry_after": 3}
    }


# Streamable HTTP only: sessions, hosts, HTTPS, tokens

#: The request that opens a session: an initialize without a session id.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "tests", "version": "1"},
    },
}


def headers(token: str, session: str | None = None, **more: str) -> dict[str, str]:
    """A streamable HTTP request's headers: the token, and the session's once it has one."""
    sent = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    if session is not None:
        sent |= {"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"}
    return sent | more


def test_an_agent_holds_at_most_its_sessions_and_others_get_theirs(mcp_url: str) -> None:
    """One token opening sessions as fast as it can, concurrently: it gets the cap, no more."""
    _, hostile = create_agent("hostile", claim_queues=["mcp"])
    _, other = create_agent("other", claim_queues=["mcp"])
    connections.close_all()
    cap = conf.AGENT_MAX_SESSIONS

    def open_one(_: int) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            return client.post(mcp_url, headers=headers(hostile), json=INITIALIZE)

    opened = run_in_threads(3 * cap, open_one)
    assert Counter(response.status_code for response in opened) == {200: cap, 429: 2 * cap}
    refusal = next(response for response in opened if response.status_code == 429)
    assert 1 <= int(refusal.headers["Retry-After"]) <= DEFAULT_SESSION_IDLE_TIMEOUT
    assert refusal.json()["error"]["message"].startswith(
        f"Too many requests (429): Agent 'hostile' has {cap} MCP sessions open, "
    )
    session = next(response for response in opened if response.status_code == 200)
    with httpx.Client(timeout=30) as client:
        assert client.post(mcp_url, headers=headers(other), json=INITIALIZE).status_code == 200
        # An ended session frees its place.
        ended = client.delete(mcp_url, headers=headers(hostile, session.headers["Mcp-Session-Id"]))
        assert ended.status_code == 200
        again = [client.post(mcp_url, headers=headers(hostile), json=INITIALIZE) for _ in "ab"]
        assert [response.status_code for response in again] == [200, 429]


@override_settings(SWITCHBOARD_TODOS_AGENT_MAX_SESSIONS=1)
def test_a_session_that_idles_out_frees_its_place(agent: tuple[Agent, str]) -> None:
    endpoint = streamable_http("/mcp", session_idle_timeout=0.2)

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=endpoint.app)
        async with (
            endpoint.lifespan(),
            httpx.AsyncClient(transport=transport, base_url="http://localhost") as client,
        ):

            async def opening() -> int:
                response = await client.post("/mcp", headers=headers(agent[1]), json=INITIALIZE)
                return response.status_code

            statuses = [await opening(), await opening()]
            deadline = asyncio.get_running_loop().time() + 30
            while (status := await opening()) == 429:  # until the first idles out
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            return [*statuses, status]

    assert asyncio.run(scenario()) == [200, 429, 200]


def test_http_needs_an_active_agents_token(mcp_url: str, agent: tuple[Agent, str]) -> None:
    status, headers = status_of(mcp_url)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer ")
    assert status_of(mcp_url, {"Authorization": "Bearer sbt_unknown"})[0] == 401
    bearer = {"Authorization": f"Bearer {agent[1]}"}
    assert status_of(mcp_url, bearer)[0] not in (401, 421)
    revoke(agent[0])
    assert status_of(mcp_url, bearer)[0] == 401


def test_http_answers_only_allowed_hosts(mcp_url: str, agent: tuple[Agent, str]) -> None:
    """A DNS-rebinding guard: the Host header must be one of Django's ALLOWED_HOSTS."""
    bearer = {"Authorization": f"Bearer {agent[1]}"}
    assert status_of(mcp_url, {**bearer, "Host": "evil.example"})[0] == 421
    assert status_of(mcp_url, {**bearer, "Host": "localhost:1"})[0] not in (401, 421)


@pytest.mark.parametrize(
    ("debug", "configured", "allowed"),
    [
        (False, ["api.example.com"], ["api.example.com"]),
        (True, ["api.example.com"], ["api.example.com"]),
        (True, [], [".localhost", "127.0.0.1", "[::1]"]),  # Django's own default under DEBUG
    ],
)
def test_allowed_hosts_are_djangos(debug: bool, configured: list[str], allowed: list[str]) -> None:
    with override_settings(DEBUG=debug, ALLOWED_HOSTS=configured):
        assert allowed_hosts() == allowed


def test_the_asgi_application_serves_django_beside_mcp(mcp_url: str) -> None:
    admin = mcp_url.removesuffix("/mcp") + "/admin/login/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(admin, timeout=10) as response:
        assert response.status == 200


async def served(scope: Scope, receive: Receive, send: Send) -> None:
    """The application behind HttpsOnly in the tests: it answers 200 "served"."""
    await PlainTextResponse("served")(scope, receive, send)


@pytest.mark.parametrize(
    ("configured", "url", "sent", "answer"),
    [
        ({}, "http://localhost/mcp", {}, 200),
        ({}, "https://localhost/mcp", {}, 200),
        ({"SECURE_SSL_REDIRECT": True}, "https://localhost/mcp", {}, 200),
        (
            {"SECURE_SSL_REDIRECT": True},
            "http://localhost/mcp?a=1",
            {},
            "https://localhost/mcp?a=1",
        ),
        (
            {"SECURE_SSL_REDIRECT": True, "SECURE_SSL_HOST": "secure.example.com"},
            "http://localhost/mcp",
            {},
            "https://secure.example.com/mcp",
        ),
        (
            {"SECURE_SSL_REDIRECT": True, "SECURE_PROXY_SSL_HEADER": PROXY_SSL_HEADER},
            "http://localhost/mcp",
            {"X-Forwarded-Proto": "https"},
            200,
        ),
        (
            {"SECURE_SSL_REDIRECT": True, "SECURE_PROXY_SSL_HEADER": PROXY_SSL_HEADER},
            "http://localhost/mcp",
            {"X-Forwarded-Proto": "http, https"},
            "https://localhost/mcp",
        ),
        (
            {"SECURE_SSL_REDIRECT": True, "SECURE_REDIRECT_EXEMPT": [r"^mcp$"]},
            "http://localhost/mcp",
            {},
            200,
        ),
        (
            {"SECURE_SSL_REDIRECT": True, "USE_X_FORWARDED_HOST": True},
            "http://localhost/mcp",
            {"X-Forwarded-Host": "evil.example"},
            421,
        ),
    ],
)
def test_https_is_required_as_djangos_security_middleware_requires_it(
    configured: dict[str, Any], url: str, sent: dict[str, str], answer: int | str
) -> None:
    """Where SecurityMiddleware would redirect to HTTPS, a refusal that names the HTTPS URL."""

    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=HttpsOnly(served))
        async with httpx.AsyncClient(transport=transport) as client:
            return await client.post(url, headers=sent, json={})

    with override_settings(**configured):
        response = asyncio.run(request())
    if isinstance(answer, int):
        assert response.status_code == answer, response.text
    else:
        assert response.status_code == 403
        assert response.json()["error"]["message"] == (
            f"HTTPS required: this server takes MCP requests over HTTPS only; connect to "
            f"{answer}. This request went in clear, with any token it carried: have that "
            "token rotated."
        )


@pytest.fixture(scope="module")
def https_mcp_url(django_db_setup: None) -> Iterator[str]:
    """The example project's ASGI application with HTTPS required, behind a TLS proxy."""
    with serve_mcp(
        SECURE_SSL_REDIRECT="1", SECURE_PROXY_SSL_HEADER=",".join(PROXY_SSL_HEADER)
    ) as url:
        yield url


def test_a_plain_http_claim_is_refused_when_https_is_required(
    https_mcp_url: str, agent: tuple[Agent, str]
) -> None:
    todo, _ = Todo.objects.create_todo(queue="mcp", kind="t.any")
    connections.close_all()
    token = agent[1]
    tls = {"X-Forwarded-Proto": "https"}  # what the proxy that terminated TLS says
    claim = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "claim", "arguments": {"ttl": 30}},
    }
    with httpx.Client(timeout=30) as client:
        plain = client.post(https_mcp_url, headers=headers(token), json=INITIALIZE)
        assert plain.status_code == 403
        opened = client.post(https_mcp_url, headers=headers(token, **tls), json=INITIALIZE)
        assert opened.status_code == 200
        session = opened.headers["Mcp-Session-Id"]
        plain = client.post(https_mcp_url, headers=headers(token, session), json=claim)
        assert plain.status_code == 403
        assert Todo.objects.get(pk=todo.id).state == State.PENDING
        claimed = client.post(https_mcp_url, headers=headers(token, session, **tls), json=claim)
        assert claimed.status_code == 200 and todo.id in claimed.text
    assert Todo.objects.get(pk=todo.id).owner == AGENT


# stdio only


def test_stdio_refuses_an_unknown_agent() -> None:
    command = [sys.executable, "manage.py", "todo_mcp", "--agent", "ghost"]
    done = subprocess.run(
        command, cwd=ROOT, env=child_environment(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "No agent is named 'ghost'." in done.stderr and done.stdout == ""


def test_stdio_refuses_an_agent_revoked_meanwhile(agent: tuple[Agent, str]) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "todo_mcp", "--agent", AGENT],
        env=child_environment(),
        cwd=ROOT,
    )

    async def scenario() -> dict[str, Any]:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await call(session, "list_todos")
            await asyncio.to_thread(on_own_connection, revoke, agent[0])
            return await refused(session, "list_todos")

    problem = asyncio.run(scenario())
    assert problem["status"] == 401 and problem["detail"] == f"Agent {AGENT!r} was revoked."


class Cuttable:
    """A TCP relay to PostgreSQL that the test cuts and restores: the database, gone for one
    server process and back, while the rest of the test suite goes on."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._relayed: list[socket.socket] = []

    def open(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and break the relayed ones."""
        assert self._listener is not None
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone would not)
        self._listener.close()
        for relayed in self._relayed:
            # Shut down, not only closed: a socket another thread is reading from stays
            # connected through close() alone, and the server's session with it.
            with contextlib.suppress(OSError):
                relayed.shutdown(socket.SHUT_RDWR)
            relayed.close()
        self._relayed.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            server = socket.create_connection(self.target)
            self._relayed += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            sink.close()


def relayed_database() -> tuple[Cuttable, str]:
    """An open relay to the test database, and the database's URL through it."""
    settings = connections["default"].settings_dict
    relay = Cuttable(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    relay.open()
    url = urlsplit(database_url())
    credentials, _, _ = url.netloc.rpartition("@")
    return relay, url._replace(netloc=f"{credentials}@127.0.0.1:{relay.port}".lstrip("@")).geturl()


def test_stdio_session_outlives_the_database(agent: tuple[Agent, str]) -> None:
    """The database gone: a tool error that says retry (the HTTP API's 503); back: it works."""
    relay, through_relay = relayed_database()
    env = {**child_environment(), "DATABASE_URL": through_relay}
    server = StdioServerParameters(
        command=sys.executable, args=["manage.py", "todo_mcp", "--agent", AGENT], env=env, cwd=ROOT
    )

    async def scenario() -> list[Any]:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            before = await call(session, "list_todos")
            relay.cut()
            gone = await refused(session, "list_todos")
            relay.open()
            after = await call(session, "list_todos")
            return [before, gone, after]

    try:
        before, gone, after = asyncio.run(scenario())
    finally:
        relay.cut()
    assert before == after == {"todos": [], "next_cursor": None}
    assert gone == errors.problem(errors.UNAVAILABLE, "The database is unavailable; retry.")


def test_streamable_http_answers_503_while_the_database_is_down(agent: tuple[Agent, str]) -> None:
    """A token that cannot be checked, the database gone, is the server's fault: 503 with
    Retry-After and a JSON-RPC error saying to retry, not a bare 500 (nor a 401)."""
    relay, through_relay = relayed_database()
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    headers = {
        "Authorization": f"Bearer {agent[1]}",
        "Accept": "application/json, text/event-stream",
    }
    try:
        # Without a pool, whose wait for a connection (30 s) would come first.
        with serve_mcp(DATABASE_URL=through_relay, DATABASE_POOL_SIZE="0") as endpoint:
            relay.cut()
            down = httpx.post(endpoint, json=initialize, headers=headers, timeout=60)
            relay.open()  # the server stops with its database back
    finally:
        relay.cut()
    assert down.status_code == 503 and down.headers["Retry-After"] == "1"
    assert down.json()["error"]["message"] == "The database is unavailable; retry."


# What one agent may take (issue 24 §2): a tool error that says to wait


def test_quotas_are_tool_errors_and_change_nothing(open_session: Opener) -> None:
    Agent.objects.filter(name=AGENT).update(max_held=1, max_creates_per_minute=2, burst_seconds=60)
    for n in range(2):
        Todo.objects.create_todo(queue="mcp", kind="k", payload={"n": n})

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        return [
            await call(session, "claim", ttl=30, limit=5),
            await refused(session, "claim", ttl=30, wait=20),
            await call(session, "create_for", queue="handoff", kind="k"),
            await call(session, "create_for", queue="handoff", kind="k"),
            await refused(session, "create_for", queue="handoff", kind="k"),
            await refused(session, "create_for", queue="mcp", kind="k", max_attempts=26),
        ]

    claimed, held, _, _, flooded, attempts = run(open_session, scenario)
    assert len(claimed["todos"]) == 1
    for throttled in (held, flooded):
        assert throttled["status"] == 429 and throttled["type"] == errors.THROTTLED.type
    assert "holds 1 todos" in held["detail"]
    assert "no room for a todo now" in flooded["detail"]
    assert attempts["status"] == 422 and "at most 25" in attempts["detail"]
    assert Todo.objects.filter(owner=AGENT).count() == 1
    assert Todo.objects.filter(queue="handoff").count() == 2


# Planning work for other agents (issue 27)

PARTS = 6


def test_a_plan_made_on_mcp_is_worked_by_other_agents_and_merged_once(
    mcp_url: str, admin_client: Any
) -> None:
    """A planning agent creates PARTS parts and a merge that waits for them in one create_many
    call; a worker on MCP and one on HTTP claim and complete the parts (half of them assigned
    to each, so that both work whoever is faster); the merge is claimed
    once, by one of them, only after the last part is done, and reads every part's result in
    its parent_results. The admin shows the graph on the merge's page."""
    planner = create_agent("planner", create_queues=["plan"])[1]
    workers = {
        name: create_agent(name, claim_queues=["plan"])[1] for name in ("mcp-worker", "http-worker")
    }
    api = mcp_url.removesuffix("/mcp") + "/api"
    plan = [
        {"queue": "plan", "kind": "part", "ref": f"part-{n}", "idempotency_key": f"part-{n}",
         "payload": {"n": n}, "assignee": list(workers)[n % 2]}
        for n in range(PARTS)
    ] + [
        {"queue": "plan", "kind": "merge", "ref": "merge", "idempotency_key": "merge",
         "after": [f"part-{n}" for n in range(PARTS)]}
    ]  # fmt: skip
    merged: list[dict[str, Any]] = []

    def work(name: str, todo: dict[str, Any]) -> Any:
        if todo["kind"] == "merge":
            merged.append({"by": name, **todo})
            return sum(result["n"] for result in todo["parent_results"].values())
        return {"n": todo["payload"]["n"], "by": name}

    async def on_mcp() -> None:
        async with connect(mcp_url, workers["mcp-worker"]) as session:
            while not merged:
                for todo in (await call(session, "claim", ttl=30, wait=1))["todos"]:
                    result = work("mcp-worker", todo)
                    await call(session, "complete", todo_id=todo["id"], result=result)

    async def on_http() -> None:
        headers = {"Authorization": f"Bearer {workers['http-worker']}"}
        async with httpx.AsyncClient(base_url=api, headers=headers, timeout=30) as client:
            while not merged:
                claimed = await client.post("/claim/", json={"ttl": 30, "wait": 1})
                for todo in claimed.json()["todos"]:
                    result = work("http-worker", todo)
                    done = await client.post(
                        f"/todos/{todo['id']}/complete/", json={"result": result}
                    )
                    assert done.status_code == 200, done.text

    async def main() -> dict[str, Any]:
        async with connect(mcp_url, planner) as session:
            made = await call(session, "create_many", todos=plan)
            # Sent again: its parts are assigned to others, so it may not see them; the
            # conflict says their keys are taken, that is, the first call went through.
            again = await refused(session, "create_many", todos=plan)
        await asyncio.wait_for(asyncio.gather(on_mcp(), on_http()), timeout=120)
        return {"made": made, "again": again}

    answers = asyncio.run(main())
    made = [each["todo"] for each in answers["made"]["todos"]]
    assert [each["created"] for each in answers["made"]["todos"]] == [True] * (PARTS + 1)
    assert answers["again"]["status"] == 409 and "'part-0' is taken" in answers["again"]["detail"]
    assert made[0]["id"] not in answers["again"]["detail"]
    *parts, merge = made
    assert merge["parents"] == [part["id"] for part in parts] and merge["waiting_for"] == PARTS

    [claim] = merged  # claimed exactly once
    rows = {todo.id: todo for todo in Todo.objects.filter(queue="plan")}
    assert claim["parent_results"] == {part["id"]: rows[part["id"]].result for part in parts}
    assert {result["by"] for result in claim["parent_results"].values()} == set(workers)
    finished = [rows[part["id"]].completed_at for part in parts]
    row = rows[merge["id"]]
    assert row.claimed_at is not None and all(
        at is not None and row.claimed_at >= at for at in finished
    )
    assert (row.state, row.attempt, row.result) == (State.DONE, 1, sum(range(PARTS)))
    assert Counter(todo.state for todo in rows.values()) == {State.DONE: PARTS + 1}

    page = admin_client.get(f"/admin/switchboard_todos/todo/{quote(merge['id'])}/change/")
    graph = page.content.decode()
    for part in parts:
        assert f'href="/admin/switchboard_todos/todo/{quote(part["id"])}/change/"' in graph


def test_a_plan_sent_again_returns_the_same_todos(open_session: Opener) -> None:
    plan = [
        {"queue": "mcp", "kind": "part", "ref": "part", "idempotency_key": "part"},
        {"queue": "mcp", "kind": "merge", "after": ["part"], "idempotency_key": "merge",
         "on_parent_failure": "run_anyway"},
    ]  # fmt: skip

    async def scenario(session: ClientSession) -> list[dict[str, Any]]:
        return [await call(session, "create_many", todos=plan) for _ in range(2)]

    first, again = run(open_session, scenario)
    assert [each["created"] for each in first["todos"]] == [True, True]
    assert [each["created"] for each in again["todos"]] == [False, False]
    assert [each["todo"] for each in again["todos"]] == [each["todo"] for each in first["todos"]]
    merge = Todo.objects.get(kind="merge")
    assert (merge.on_parent_failure, merge.waiting_for) == ("run_anyway", 1)


def test_a_plan_that_can_never_run_is_a_tool_error(open_session: Opener) -> None:
    cycle = [
        {"queue": "mcp", "kind": "a", "ref": "a", "after": ["b"]},
        {"queue": "mcp", "kind": "b", "ref": "b", "after": ["a"]},
    ]

    async def scenario(session: ClientSession) -> dict[str, Any]:
        return await refused(session, "create_many", todos=cycle)

    problem = run(open_session, scenario)
    assert problem["status"] == 409 and problem["type"] == errors.INVALID_PLAN.type
    assert problem["title"] == "The plan cannot run" and "cycle" in problem["detail"]
    assert not Todo.objects.exists()
