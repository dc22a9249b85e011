"""A small remote agent: drains a queue through the MCP tools, holding nothing but a token.

    SWITCHBOARD_TOKEN=sbt_... python -m example_project.mcp_agent http://127.0.0.1:8000/mcp

It speaks to the server with the official MCP client (no Django here: an agent anywhere runs
the same loop): claim with a long poll, heartbeat while working, complete, or fail on an
error. `make demo` runs it against the demo's queue `agents`, so the admin shows its todos
claimed and completed by the agent. It runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

#: The lease each claim takes, in seconds; the agent heartbeats at a third of it.
TTL = 30.0
#: How long a claim's long poll lasts (the tools' maximum: below MCP clients' request timeouts).
WAIT = 20.0
#: How long the pretend work of one todo takes, in seconds.
WORK = 1.0


class ToolFailed(Exception):
    """A tool answered with an error (isError): its text says what and what to do."""


@asynccontextmanager
async def connect(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with the server at `url`, authenticated by `token`."""
    headers = {"Authorization": f"Bearer {token}"}
    # Reads wait longer than a claim's long poll; the SDK's own default client does the same.
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call one tool; its structured result, or ToolFailed."""
    result: CallToolResult = await session.call_tool(tool, arguments)
    if result.is_error:
        raise ToolFailed(" ".join(block.text for block in result.content if block.type == "text"))
    return result.structured_content or {}


def work(todo: dict[str, Any]) -> dict[str, Any]:
    """The agent's job: here, counting the words of the payload's text."""
    text = str(todo["payload"].get("text", ""))
    return {"words": len(text.split()), "by": "example_project.mcp_agent"}


async def handle(session: ClientSession, todo: dict[str, Any]) -> str:
    """Work on a claimed todo under its lease: heartbeat meanwhile, then complete or fail."""

    async def keep_lease() -> None:
        while True:
            await asyncio.sleep(TTL / 3)
            await call(session, "heartbeat", todo_id=todo["id"], ttl=TTL)

    heartbeats = asyncio.create_task(keep_lease())
    try:
        await asyncio.sleep(WORK)
        try:
            result = work(todo)
        except Exception as error:  # any failure of the work is the todo's, not the agent's
            await call(session, "fail", todo_id=todo["id"], error=repr(error))
            return f"failed {todo['id']}: {error!r}"
    finally:
        heartbeats.cancel()
    if heartbeats.done() and not heartbeats.cancelled() and heartbeats.exception():
        # The lease was lost (the heartbeat said so): someone else may have the todo now.
        return f"lost the lease on {todo['id']}: not completed"
    await call(session, "complete", todo_id=todo["id"], result=result)
    return f"completed {todo['id']} ({todo['title']}): {result}"


async def drain(url: str, token: str, queues: list[str]) -> None:
    """Claim, work, complete: forever (each claim is a long poll of up to WAIT seconds)."""
    async with connect(url, token) as session:
        print(f"connected to {url}; claiming from {', '.join(queues)}", flush=True)
        while True:
            claimed = await call(session, "claim", queues=queues, ttl=TTL, wait=WAIT)
            for todo in claimed["todos"]:
                print(await handle(session, todo), flush=True)


async def main(url: str, token: str, queues: list[str]) -> None:
    """Drain until SIGTERM or SIGINT, which cancel whatever the agent is waiting for."""
    agent = asyncio.current_task()
    assert agent is not None

    def stop() -> None:
        # The answer to a call cancelled in flight arrives after the session closed, which the
        # SDK's client logs as an error with its traceback: here it is not one.
        logging.getLogger("mcp.client.streamable_http").setLevel(logging.CRITICAL)
        agent.cancel()

    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop)
    try:
        await drain(url, token, queues)
    except asyncio.CancelledError:
        print("stopped", flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A remote agent that drains queues over MCP.")
    parser.add_argument("url", help="The MCP endpoint, e.g. http://127.0.0.1:8000/mcp")
    parser.add_argument(
        "--queue", action="append", dest="queues", help="Queue to drain (repeatable)."
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse(sys.argv[1:])
    token = os.environ.get("SWITCHBOARD_TOKEN", "")
    if not token:
        sys.exit("Set SWITCHBOARD_TOKEN to the agent's token (manage.py todo_agent create).")
    asyncio.run(main(options.url, token, options.queues or ["agents"]))
