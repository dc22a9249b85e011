"""Scenario 17: remote agents over MCP, beside the same agents over the HTTP API (issue 36).

One uvicorn process serves the example project's ASGI application, which answers both /mcp and
/api/ (one process: an MCP session lives in the process that opened it, and uvicorn's workers
would each see a share of a session's requests). Each agent is a process with one session of
the official Python MCP client over streamable HTTP (example_project/mcp_agent.py's `connect`),
and a token of its own.

* Drain: 4 agents claim and complete one todo at a time, one tool call each (two calls per
  todo), against scenario 7's HTTP loop (two requests per todo) on the same server.

The note gives each side's cost per call: the wall time an agent waits for one (agents over
calls per second), the CPU of the uvicorn process and of the agents' processes (PostgreSQL's
is left out: on a shared machine it counts every other user's backends too).
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Callable
from functools import partial

from bench.harness import QUEUE, TTL, Bench, Child, Row, Target, plural, process_cpu
from bench.http_agents import AGENTS, http_drain, make_tokens

#: MCP claim + complete should keep this share of the same loop over the HTTP API (issue 36).
TARGET = Target(ratio=0.5)
#: Tool calls (or HTTP requests) per todo: a claim and a complete.
CALLS = 2


def mcp_drain(child: Child, *, owner: str, url: str, tokens: dict[str, str]) -> int:
    """Claim and complete one todo at a time through the MCP tools, until the queue is empty."""
    return asyncio.run(_mcp_drain(child, url, tokens[owner]))


async def _mcp_drain(child: Child, url: str, token: str) -> int:
    from example_project.mcp_agent import call, connect

    done = 0
    async with connect(url, token) as session:
        await call(session, "list_todos", limit=1)  # connected before the clock starts
        child.start()
        while todos := (await call(session, "claim", queues=[QUEUE], ttl=TTL))["todos"]:
            await call(session, "complete", todo_id=todos[0]["id"])
            done += 1
            child.count()
    return done


def run(bench: Bench) -> None:
    agents = min(AGENTS, bench.pool.size)
    backlog = bench.size(full=2000, smoke=40)
    tokens = make_tokens([f"bench-{index}" for index in range(agents)])
    from tests.asgi import serve

    env = {**os.environ, "DATABASE_POOL_SIZE": str(2 * AGENTS)}
    with serve(env, app="example_project.asgi:application") as (base, server):
        url = base.removesuffix("/api") + "/mcp"
        app_cpu: dict[str, list[float]] = {"mcp": [], "http": []}

        def side(name: str, drain: Callable[[], float]) -> float:
            before = process_cpu(server.pid)
            rate = drain()
            app_cpu[name].append((process_cpu(server.pid) - before) / (backlog * CALLS))
            return rate

        figures = bench.interleave(
            {
                "mcp": partial(
                    side,
                    "mcp",
                    partial(bench.drain, mcp_drain, agents, backlog, url=url, tokens=tokens),
                ),
                "http": partial(
                    side,
                    "http",
                    partial(bench.drain, http_drain, agents, backlog, base=base, tokens=tokens),
                ),
            }
        )

        def per_call(name: str) -> str:
            wall = statistics.median(agents / (rate * CALLS) for rate in figures[name]) * 1e3
            app = statistics.median(app_cpu[name]) * 1e3
            client = statistics.median(cost.client for cost in bench.costs[name]) / CALLS * 1e3
            return f"{name} {wall:.1f} ms (CPU: uvicorn {app:.2f} ms, agents {client:.2f} ms)"

        bench.add(
            Row(
                f"MCP agents, claim + complete, {plural(agents, 'agent')}",
                figures["mcp"],
                figures["http"],
                "HTTP agents, same server",
                target=TARGET,
                note=f"per call: {per_call('mcp')}; {per_call('http')}; one uvicorn process",
            )
        )
