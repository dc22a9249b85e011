"""The example project's ASGI application, for the MCP clients' tests (tests/test_mcp_clients.py).

One thing differs: creating a todo in the queue `throttled` is refused as too many requests
(`Throttled`, retry after `RETRY_AFTER` seconds), so that a client meets that tool error
whatever limits the agents have.
"""

from __future__ import annotations

from typing import Any

from example_project.asgi import application
from switchboard_todos.agents import service
from switchboard_todos.exceptions import Throttled
from switchboard_todos.models import Agent, Todo

__all__ = ["application"]

THROTTLED = "throttled"
RETRY_AFTER = 7

_create_for = service.acreate_for


async def acreate_for(agent: Agent, **arguments: Any) -> tuple[Todo, bool]:
    if arguments.get("queue") == THROTTLED:
        raise Throttled(f"Agent {agent.name!r} creates too many todos.", retry_after=RETRY_AFTER)
    return await _create_for(agent, **arguments)


service.acreate_for = acreate_for
