"""Long polls against the example project's ASGI application under uvicorn, as a hostile agent
would send them: 60 at once over HTTP, SQS and MCP, while another agent waits for its work.

The server's database connections are counted in pg_stat_activity by their application_name.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, ExitStack
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from django.db import connection, connections

from example_project.mcp_agent import connect
from switchboard_todos.agents import accounts
from switchboard_todos.claims import long_polls
from switchboard_todos.mcp.threads import KEPT_THREADS
from switchboard_todos.models import Agent, Todo
from tests.asgi import serve
from tests.conftest import database_url
from tests.helpers import sqs_client

pytestmark = pytest.mark.django_db(transaction=True)

#: The application_name of the server's connections.
SERVER = "sw-long-polls-server"
#: Each flooding long poll's wait, in seconds: long enough to count what the waits hold.
WAIT = 8
#: Long polls of the flooding agent on each surface.
PER_SURFACE = 20
#: What "a handful" of connections is: the LISTEN connection, the claim threads, the threads
#: of AgentsAPIFirst and of SQSAnywhere (4 each, the example's) and the MCP tool calls' kept
#: threads, each holding at most one: a number set by the server, not by the polls.
HANDFUL = 1 + long_polls.CLAIM_THREADS + 4 + 4 + KEPT_THREADS


@pytest.fixture
def start_server(subprocess_env: dict[str, str]) -> Iterator[Callable[..., str]]:
    """Starts the example project's application, or `app` (no connection pool, unless the
    settings given ask for one) with settings from the environment; its base URL once it
    answers."""
    with ExitStack() as servers:
        processes: list[subprocess.Popen[str]] = []

        def start(app: str = "example_project.asgi:application", **settings: str) -> str:
            env = {
                **subprocess_env,
                "DATABASE_URL": f"{database_url()}?application_name={SERVER}",
                **settings,
            }
            base, process = servers.enter_context(serve(env, app=app))
            processes.append(process)
            return base.removesuffix("/api")

        yield start
        for process in processes:
            process.terminate()
            output = process.communicate(timeout=30)[0]
            assert "Traceback" not in output, output


def server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [SERVER],
        )
        count: int = cursor.fetchone()[0]
    return count


class Sampler:
    """Counts the server's connections every 50 ms on a thread of its own, until stopped."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.05):
                self.samples.append((time.monotonic(), server_connections()))
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def most(self, start: float, end: float) -> int:
        return max(count for at, count in self.samples if start <= at <= end)


Outcome = tuple[str, list[str]]


def http_poll(
    base: str, token: str, queue: str, wait: float, ready: Callable[[], object] = lambda: None
) -> Outcome:
    """One HTTP long poll, sent once `ready` returns: ("ok", the ids claimed), ("throttled",
    []) for a 429 with Retry-After, or ("unexpected", [what came])."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        ready()
        answer = client.post("/api/claim/", json={"queues": [queue], "ttl": 30, "wait": wait})
    if answer.status_code == 200:
        return "ok", [todo["id"] for todo in answer.json()["todos"]]
    if answer.status_code == 429 and int(answer.headers["Retry-After"]) >= 1:
        return "throttled", []
    return "unexpected", [f"{answer.status_code} {answer.text}"]


def sqs_poll(
    base: str, agent: Agent, queue: str, wait: int, ready: Callable[[], object]
) -> Outcome:
    """One SQS ReceiveMessage with WaitTimeSeconds, never retried by botocore."""
    sqs = sqs_client(base, agent)
    ready()
    try:
        answer = sqs.receive_message(QueueUrl=f"{base}/sqs/{queue}", WaitTimeSeconds=wait)
    except ClientError as error:
        if error.response["Error"]["Code"] == "RequestThrottled":
            return "throttled", []
        return "unexpected", [str(error)]
    return "ok", [message["MessageId"] for message in answer.get("Messages", [])]


def mcp_polls(
    base: str, token: str, queue: str, wait: float, count: int, ready: Callable[[], object]
) -> list[Outcome]:
    """`count` MCP claims with a wait at once, over 4 sessions opened first."""

    async def poll(session: Any) -> Outcome:
        result = await session.call_tool("claim", {"queues": [queue], "ttl": 30, "wait": wait})
        text = " ".join(block.text for block in result.content if block.type == "text")
        if not result.is_error:
            return "ok", [todo["id"] for todo in result.structured_content["todos"]]
        if "(429)" in text:
            return "throttled", []
        return "unexpected", [text]

    async def main() -> list[Outcome]:
        async with AsyncExitStack() as stack:
            sessions = [
                await stack.enter_async_context(connect(f"{base}/mcp", token)) for _ in range(4)
            ]
            await asyncio.to_thread(ready)
            return list(await asyncio.gather(*(poll(sessions[n % 4]) for n in range(count))))

    return asyncio.run(main())


class Flood:
    """PER_SURFACE long polls of one agent on each of HTTP, SQS and MCP: every client is made
    and connected first, then all the polls are sent at once (`start`)."""

    def __init__(self, base: str, agent: Agent, token: str, queue: str) -> None:
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        polls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
            *((http_poll, (base, token, queue, WAIT)) for _ in range(PER_SURFACE)),
            *((sqs_poll, (base, agent, queue, WAIT)) for _ in range(PER_SURFACE)),
            (mcp_polls, (base, token, queue, WAIT, PER_SURFACE)),
        ]
        self._ready = threading.Barrier(len(polls) + 1)
        self._threads = [threading.Thread(target=self._run, args=poll) for poll in polls]
        for thread in self._threads:
            thread.start()

    def start(self) -> float:
        """Send every poll; when they went."""
        self._ready.wait(120)
        return time.monotonic()

    def join(self) -> list[Outcome]:
        for thread in self._threads:
            thread.join(120)
        return self.outcomes

    def _run(self, poll: Callable[..., Any], arguments: tuple[Any, ...]) -> None:
        try:
            found = poll(*arguments, ready=lambda: self._ready.wait(120))
        except Exception as error:  # noqa: BLE001 - any failure is an outcome the test reports
            found = ("unexpected", [repr(error)])
        with self._lock:
            self.outcomes.extend(found if isinstance(found, list) else [found])


def agents() -> tuple[Agent, str, str]:
    """The flooding agent and its token, and the token of a calm one; both claim `shared`."""
    hostile, token = accounts.create_agent("flood", claim_queues=["shared"])
    calm = accounts.create_agent("calm", claim_queues=["shared"])[1]
    connections.close_all()
    return hostile, token, calm


def calm_pickup(base: str, token: str) -> float:
    """The calm agent long-polls `shared`; a todo assigned to it is created while it waits.

    Seconds from the creation's commit to the poll's answer.
    """
    answered: list[tuple[float, tuple[str, list[str]]]] = []

    def poll() -> None:
        outcome = http_poll(base, token, "shared", 15)
        answered.append((time.monotonic(), outcome))

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)  # let it start waiting; the bound below holds either way
    todo, _ = Todo.objects.create_todo(queue="shared", kind="k", assignee="calm")
    created = time.monotonic()
    poller.join(30)
    [(at, outcome)] = answered
    assert outcome == ("ok", [todo.id])
    return at - created


def test_a_flood_of_long_polls_is_capped_and_costs_no_connections(
    start_server: Callable[..., str],
) -> None:
    """60 long polls of one agent: 8 wait (SWITCHBOARD_TODOS_AGENT_MAX_WAITS), the others
    are told to slow down in each surface's words; the server holds a handful of connections,
    and another agent's long poll gets its todo within a second."""
    hostile, token, calm = agents()
    base = start_server()
    flood = Flood(base, hostile, token, "shared")
    sampler = Sampler()
    started = flood.start()
    time.sleep(2)  # the flood is in; the calm agent's poll comes on top of it
    pickup = calm_pickup(base, calm)
    outcomes = flood.join()
    sampler.stop()
    kinds = [kind for kind, _ in outcomes]
    assert len(outcomes) == 3 * PER_SURFACE
    assert set(kinds) <= {"ok", "throttled"}, [o for o in outcomes if o[0] == "unexpected"]
    assert kinds.count("ok") >= 8 and kinds.count("throttled") >= 40, kinds
    assert all(claimed == [] for _, claimed in outcomes)  # the calm agent's todo stayed its own
    assert pickup < 1.0, pickup
    most = sampler.most(started + 2, started + WAIT - 0.5)
    assert most <= HANDFUL, most


def test_waiting_long_polls_hold_no_connection(start_server: Callable[..., str]) -> None:
    """With the cap raised above the flood, all 60 long polls wait at once on one handful of
    connections, and the calm agent's todo still reaches it within a second."""
    hostile, token, calm = agents()
    base = start_server(SWITCHBOARD_TODOS_AGENT_MAX_WAITS="100")
    flood = Flood(base, hostile, token, "shared")
    sampler = Sampler()
    started = flood.start()
    time.sleep(2)
    pickup = calm_pickup(base, calm)
    outcomes = flood.join()
    sampler.stop()
    assert [outcome for outcome in outcomes if outcome != ("ok", [])] == []
    assert len(outcomes) == 3 * PER_SURFACE
    assert pickup < 1.0, pickup
    most = sampler.most(started + 2, started + WAIT - 0.5)
    assert most <= HANDFUL, most
