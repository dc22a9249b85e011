"""An MCP call of a holder's tool is one statement, and revocation stays exact.

A call of `claim` (from queues), `heartbeat`, `complete`, `fail` or `release` acts only through
a statement that checks the caller's credential (`credential_holds`, sql/shared.sql), so its
bearer token is recognised (agents/service/identity.py), not read again (mcp/http.py,
HolderCalls): one statement a call, as over the HTTP API's fast path. Every other request reads
the agent. These run the endpoint in process, so that the statements of the calls' threads
can be counted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from django.db import connections
from django.db.backends.utils import CursorWrapper

from switchboard_todos.agents import accounts, long_poll_cap
from switchboard_todos.claims import long_polls
from switchboard_todos.mcp import http, threads
from switchboard_todos.mcp.http import PEEK_MAX, holder_call, streamable_http
from switchboard_todos.models import Agent, State, Todo

pytestmark = pytest.mark.django_db(transaction=True)

ACCEPT = "application/json, text/event-stream"
#: What the statement that reads an agent by its token (`authenticate`, sql/agents.sql) says.
READS_THE_AGENT = "WHERE token_hash = "


@contextmanager
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The SQL every Django cursor runs meanwhile, on any thread."""
    ran: list[str] = []
    execute = CursorWrapper._execute_with_wrappers  # type: ignore[attr-defined]  # private: every statement passes here

    def counted(self: CursorWrapper, sql: str, *args: Any, **kwargs: Any) -> Any:
        ran.append(sql)
        return execute(self, sql, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(CursorWrapper, "_execute_with_wrappers", counted)
        yield ran


def on_own_connection(function: Callable[[], Any]) -> None:
    """Run `function` (on a thread that is not the event loop's) and close its connection."""
    try:
        function()
    finally:
        connections.close_all()


class Session:
    """One MCP session over streamable HTTP, in process, as raw JSON-RPC."""

    def __init__(self, http: httpx.AsyncClient, token: str) -> None:
        self.http = http
        self.token = token
        self.id = ""
        self._ids = iter(range(1, 1_000_000))

    async def post(self, message: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": ACCEPT}
        if self.id:
            headers["Mcp-Session-Id"] = self.id
        return await self.http.post("/mcp", json=message, headers=headers)

    async def open(self) -> None:
        response = await self.post(
            {
                "jsonrpc": "2.0",
                "id": next(self._ids),
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"},
                },
            }
        )
        assert response.status_code == 200, response.text
        self.id = response.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await self.post(initialized)).status_code == 202

    async def call(self, tool: str, **arguments: Any) -> tuple[int, dict[str, Any]]:
        """The HTTP status, and the call's JSON-RPC result (empty when refused before it)."""
        response = await self.post(
            {
                "jsonrpc": "2.0",
                "id": next(self._ids),
                "method": "tools/call",
                "params": {"name": tool, "arguments": arguments},
            }
        )
        if response.status_code != 200:
            return response.status_code, {}
        assert response.headers["content-type"] == "application/json"  # one body, no stream
        return response.status_code, response.json()["result"]


def served(scenario: Callable[[Session], Any], token: str) -> Any:
    """Run `scenario` in one session of a fresh endpoint, its lifespan running."""
    endpoint = streamable_http()

    async def main() -> Any:
        transport = httpx.ASGITransport(app=endpoint.app)
        async with (
            endpoint.lifespan(),
            httpx.AsyncClient(transport=transport, base_url="http://localhost") as http,
        ):
            session = Session(http, token)
            await session.open()
            return await scenario(session)

    return asyncio.run(main())


@pytest.fixture
def token() -> str:
    return accounts.create_agent("fast", claim_queues=["work"])[1]


def test_a_call_its_client_cancels_is_answered_202_without_a_body(token: str) -> None:
    """A claim waiting for work that its client cancels (`notifications/cancelled`): its POST
    is answered 202 with no body, no JSON-RPC response, as the protocol says of a cancelled
    request (the official Python client's close fails on a response it no longer reads)."""

    async def scenario(session: Session) -> tuple[httpx.Response, int]:
        claim = {
            "jsonrpc": "2.0",
            "id": "waiting",
            "method": "tools/call",
            "params": {"name": "claim", "arguments": {"queues": ["work"], "ttl": 30, "wait": 20}},
        }
        waiting = asyncio.ensure_future(session.post(claim))
        for _ in range(3000):  # the state, not a delay: until its long poll is admitted
            if long_poll_cap._waits._counts["fast"]:
                break
            await asyncio.sleep(0.01)
        cancel = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "waiting"},
        }
        cancelled = await session.post(cancel)
        return await waiting, cancelled.status_code

    Todo.objects.create_todo(queue="elsewhere", kind="k")
    try:
        answered, cancelled = served(scenario, token)
    finally:
        long_polls.stop()  # the listener its long poll started
    assert cancelled == 202
    assert (answered.status_code, answered.content) == (202, b"")
    assert Todo.objects.filter(owner="fast").count() == 0


def test_claim_and_complete_are_one_statement_each(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Todo.objects.create_many([{"queue": "work", "kind": "k"}] * 2)

    async def scenario(session: Session) -> list[tuple[int, int]]:
        counted = []
        for _ in range(2):
            with statements(monkeypatch) as claim:
                status, result = await session.call("claim", ttl=60, queues=["work"])
            assert status == 200 and not result.get("isError"), result
            [todo] = result["structuredContent"]["todos"]
            with statements(monkeypatch) as complete:
                status, result = await session.call("complete", todo_id=todo["id"])
            assert status == 200 and not result.get("isError"), result
            counted.append((len(claim), len(complete)))
        return counted

    # The first claim reads the agent (identity.recognise): the session's opening read it, but
    # a request that is not a holder's call keeps nothing.
    assert served(scenario, token) == [(2, 1), (1, 1)]
    assert Todo.objects.filter(state=State.DONE).count() == 2


def test_a_holder_call_of_an_agent_read_lately_checks_its_token_without_a_thread(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its token is recognised on the event loop: the call's one hop to a thread is its
    verb's (the tool's own request_scope), none for the token. The first claim reads the agent,
    on a thread, as before."""
    Todo.objects.create_many([{"queue": "work", "kind": "k"}] * 2)
    scopes: list[str] = []
    lend = threads.request_scope

    def counted() -> Any:
        scopes.append("token")
        return lend()

    monkeypatch.setattr(http, "request_scope", counted)  # where the token is read

    async def scenario(session: Session) -> list[int]:
        counts = []
        for _ in range(2):
            scopes.clear()
            status, result = await session.call("claim", ttl=60, queues=["work"])
            [todo] = result["structuredContent"]["todos"]
            counts.append(len(scopes))
            scopes.clear()
            status, result = await session.call("complete", todo_id=todo["id"])
            assert status == 200 and not result.get("isError"), result
            counts.append(len(scopes))
        return counts

    assert served(scenario, token) == [1, 0, 0, 0]
    assert Todo.objects.filter(state=State.DONE).count() == 2


@pytest.mark.parametrize("revoke", [accounts.revoke, accounts.rotate_token])
def test_a_revoked_token_s_very_next_holder_call_is_refused(
    token: str, revoke: Callable[[Agent], Any]
) -> None:
    """Recognised, the agent was read before its revocation: the call's statement refuses it,
    the tool answers 401's problem, nothing changes, and the next request is refused 401."""
    Todo.objects.create_todo(queue="work", kind="k")

    async def scenario(session: Session) -> tuple[dict[str, Any], int]:
        status, result = await session.call("claim", ttl=60, queues=["work"])
        [todo] = result["structuredContent"]["todos"]
        await asyncio.to_thread(on_own_connection, lambda: revoke(Agent.objects.get(name="fast")))
        status, refused = await session.call("complete", todo_id=todo["id"])
        assert status == 200
        return refused, (await session.call("heartbeat", todo_id=todo["id"], ttl=60))[0]

    refused, status = served(scenario, token)
    assert refused["isError"] and refused["_meta"]["switchboard-todos/problem"]["status"] == 401
    assert status == 401
    assert Todo.objects.get().state == State.CLAIMED


def call_body(name: str, **more: Any) -> bytes:
    params = {"name": name, "arguments": more.pop("arguments", {}), **more}
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    ).encode()


@pytest.mark.parametrize(
    ("body", "holder"),
    [
        (call_body("complete", arguments={"todo_id": "td_x"}), True),
        (call_body("heartbeat"), True),
        (call_body("fail"), True),
        (call_body("release"), True),
        (call_body("claim", arguments={"ttl": 60}), True),
        (call_body("claim", arguments={"ttl": 60, "todo_id": "td_x"}), False),
        (call_body("list_todos"), False),
        (call_body("create_for"), False),
        (call_body("complete", task={"ttl": 1000}), False),
        (
            b'{"jsonrpc": "2.0", "method": "tools/call", "method": "tools/list", "params": {}}',
            False,
        ),
        (
            b'{"jsonrpc": "2.0", "method": "tools/call", '
            b'"params": {"name": "complete", "name": "create_for"}}',
            False,
        ),
        (b"[" + call_body("complete") + b"]", False),
        (b"not json", False),
        (json.dumps({"method": "initialize", "params": {}}).encode(), False),
    ],
)
def test_which_requests_are_a_holder_s_call(body: bytes, holder: bool) -> None:
    assert holder_call(body) is holder


def test_a_long_holder_call_reads_its_agent(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body past PEEK_MAX is not read ahead: its call reads the agent, and works."""
    Todo.objects.create_todo(queue="work", kind="k")

    async def scenario(session: Session) -> list[str]:
        status, result = await session.call("claim", ttl=60, queues=["work"])
        [todo] = result["structuredContent"]["todos"]
        with statements(monkeypatch) as complete:
            status, result = await session.call(
                "complete", todo_id=todo["id"], result="x" * PEEK_MAX
            )
        assert status == 200 and not result.get("isError"), result
        return complete

    assert sum(READS_THE_AGENT in sql for sql in served(scenario, token)) == 1
    assert Todo.objects.get().result == "x" * PEEK_MAX
