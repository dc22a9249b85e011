"""The server's threads keep a pooled connection from one request to the next
(thread_connections.py), on every surface: busy without a pause, they still never starve a
request of the pool. Tried against the example project's ASGI application under uvicorn, its pool
held by the threads of one surface that 8 agents keep busy.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from django.db import connections

from example_project.mcp_agent import call, connect
from switchboard_todos.agents import accounts
from switchboard_todos.models import Agent
from tests import test_long_polls_live as live
from tests.conftest import run_in_threads
from tests.helpers import sqs_client

pytestmark = pytest.mark.django_db(transaction=True)

#: The busy agents: twice the threads of the API and of SQS, so that none of them is ever idle.
AGENTS = 8


#: The example project's application (HTTP API, SQS and MCP) under uvicorn, with the settings
#: given (`start_server(DATABASE_POOL_SIZE=...)`); its base URL once it answers.
start_server = live.start_server


def api_loop(base: str, agent: Agent, token: str, stop: threading.Event) -> int:
    """Claims from an empty queue over the HTTP API, one after another, until `stop`."""
    claims = 0
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{base}/api", headers=headers, timeout=60) as client:
        while not stop.is_set():
            claimed = client.post("/claim/", json={"ttl": 30})
            assert claimed.status_code == 200, claimed.text
            claims += 1
    return claims


def sqs_loop(base: str, agent: Agent, token: str, stop: threading.Event) -> int:
    """ReceiveMessage without a wait on an empty queue, one after another, until `stop`."""
    sqs = sqs_client(base, agent)
    claims = 0
    while not stop.is_set():
        answer = sqs.receive_message(QueueUrl=f"{base}/sqs/empty", WaitTimeSeconds=0)
        assert not answer.get("Messages")
        claims += 1
    return claims


def mcp_loop(base: str, agent: Agent, token: str, stop: threading.Event) -> int:
    """The `claim` tool on an empty queue, one call after another, until `stop`."""

    async def main() -> int:
        claims = 0
        async with connect(f"{base}/mcp", token) as session:
            while not stop.is_set():
                assert (await call(session, "claim", queues=["empty"], ttl=30))["todos"] == []
                claims += 1
        return claims

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("busy", "pool"),
    [(api_loop, 4), (sqs_loop, 4), (mcp_loop, 2)],
    ids=["api", "sqs", "mcp"],
)
def test_a_surface_s_busy_threads_never_starve_the_pool(
    start_server: Callable[..., str],
    busy: Callable[[str, Agent, str, threading.Event], int],
    pool: int,
) -> None:
    """Eight agents keep the surface's threads busy without a pause, each thread keeping its
    pooled connection: every connection of the pool. 4 for the API's and SQS's 4 threads; 2 for
    MCP, whose calls are each lent the kept thread that ended a call last, and which these
    agents, their client sharing the CPUs with the server, keep fewer than 4 calls in flight
    (with 4, this passed without the give-back). A request that Django's handler serves still
    gets a connection at once, given back by the next thread to end a request, not after the
    pool's 30 s timeout (503)."""
    base = start_server(DATABASE_POOL_SIZE=str(pool))
    agents = [accounts.create_agent(f"busy-{n}", claim_queues=["empty"]) for n in range(AGENTS)]
    reader = accounts.create_agent("reader", claim_queues=["empty"])[1]
    connections.close_all()
    stop = threading.Event()
    claims: list[int] = []

    def keep_busy(number: int) -> int:
        agent, token = agents[number]
        return busy(base, agent, token, stop)

    busy_agents = threading.Thread(target=lambda: claims.extend(run_in_threads(AGENTS, keep_busy)))
    busy_agents.start()
    try:
        time.sleep(2)  # the threads hold their connections by now
        headers = {"Authorization": f"Bearer {reader}"}
        with httpx.Client(base_url=f"{base}/api", headers=headers, timeout=60) as client:
            started = time.monotonic()
            listed = client.get("/todos/", params={"limit": 1})
            elapsed = time.monotonic() - started
    finally:
        stop.set()
        busy_agents.join(60)
    assert listed.status_code == 200, listed.text
    assert elapsed < 10, elapsed
    assert len(claims) == AGENTS and all(claims), claims  # every agent kept at it meanwhile
