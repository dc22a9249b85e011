"""The cap on an agent's requests in flight: at most SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT at
once per server process, across HTTP, MCP and SQS.

Each request of an agent may hold a database connection while it runs, and each of its creates
waits on the agent's own row for the one before: without a cap, 120 concurrent creates of one
token took every connection of a server's pool, queueing on that row, and another agent's
requests timed out waiting for one. Every surface counts a request here once the agent is known
and before the verb's first statement: an HTTP route (api/views.py, api/asgi.py), an MCP tool
call (mcp/server.py), an SQS action (sqs/views.py). Past the cap, the request is Throttled
(caps.py) and takes no connection for its verb. So one agent holds at most this many of a
process's connections at once, its creates queueing on its row included.

Knowing the agent costs its credential's lookup, one indexed statement, as a request with a
bad token costs. The HTTP API spares even that: while an agent has requests in flight here,
its token is known, and a request carrying it while the agent is at its cap is refused before
the lookup (`refuse_known`), without a statement or a connection.

A long poll is a request in flight for the whole of its wait, though it holds no connection
meanwhile: an agent with its SWITCHBOARD_TODOS_AGENT_MAX_WAITS long polls waiting has the rest
of this cap for everything else, and a cap below that one bounds the long polls too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from switchboard_todos.agents import tokens
from switchboard_todos.agents.caps import RETRY_AFTER, AgentCap
from switchboard_todos.conf import conf
from switchboard_todos.models import Agent

_requests = AgentCap(
    lambda: conf.AGENT_MAX_CONCURRENT,
    lambda who, cap: (
        f"{who} already has {cap} requests in flight on this server "
        "(SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT), long polls included: wait for one of them "
        f"to be answered before sending another; try again in {RETRY_AFTER} s."
    ),
)


def admitted(agent: Agent) -> AbstractContextManager[None]:
    """Count a request of `agent` while it runs, or raise Throttled when the agent has
    SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT in flight already."""
    return _requests.admitted(agent.name, agent.token_hash)


def admitted_early(token: str) -> AbstractContextManager[None]:
    """Count a request carrying `token` while it runs, before the token is looked up (its
    agent's `admitted` inside then counts it no more), or raise Throttled when its agent, or
    the token while its agent is not known here, has SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT in
    flight already."""
    return _requests.admitted_early(tokens.token_hash(token))


def refuse_known(token: str) -> None:
    """Raise Throttled, before `token` is looked up, when it is the token of an agent with
    SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT requests in flight here already."""
    _requests.refuse_known(tokens.token_hash(token))
