"""The cap on an agent's long polls: each waits at most MAX_WAIT seconds, and at most
SWITCHBOARD_TODOS_AGENT_MAX_WAITS of them wait at once.

Every remote surface's long poll (a claim with a wait, a read waiting for a todo to end) passes
here before anything is claimed or read. Past the cap the agent is told to slow down
(Throttled: HTTP 429 with Retry-After, SQS RequestThrottled, an MCP tool error that says when to
poll again) instead of being given a waiter. The count is of the long polls in this server
process (caps.py): behind a balancer with N processes an agent may have N times the cap
waiting, each process bounding its own. A long poll is also one of the agent's requests in
flight (request_cap.py) for the whole of its wait.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta

from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connections

from switchboard_todos import validation
from switchboard_todos.agents.caps import RETRY_AFTER, AgentCap
from switchboard_todos.conf import conf
from switchboard_todos.models import Agent
from switchboard_todos.validation import Seconds

#: Longest long poll (the `wait` of a claim or a read), in seconds: SQS's limit, and below MCP
#: clients' request timeouts.
MAX_WAIT = 20

_waits = AgentCap(
    lambda: conf.AGENT_MAX_WAITS,
    lambda who, cap: (
        f"{who} already has {cap} long polls waiting on this server "
        "(SWITCHBOARD_TODOS_AGENT_MAX_WAITS): let one of them answer before starting "
        f"another; poll again in {RETRY_AFTER} s at the earliest."
    ),
)


def seconds_of(wait: Seconds) -> float:
    """A long poll's `wait` in seconds, from 0 (no long poll) to MAX_WAIT (InvalidTodo past it)."""
    return validation.duration(
        wait, "wait", maximum=timedelta(seconds=MAX_WAIT), allow_zero=True
    ).total_seconds()


@contextmanager
def admitted(agent: Agent, seconds: float) -> Iterator[None]:
    """Count a long poll of `agent` (a claim waiting up to `seconds`) while it lasts, or raise
    Throttled when the agent has SWITCHBOARD_TODOS_AGENT_MAX_WAITS waiting already. A claim
    without a wait is not counted."""
    if not seconds:
        yield
        return
    with _waits.admitted(agent.name):
        yield


@asynccontextmanager
async def awaiting(agent: Agent, seconds: float) -> AsyncIterator[None]:
    """`admitted`, for a long poll of an async surface, which then gives back the connections
    of its request's own thread: the poll's claims run on the claim threads
    (claims/long_polls.py), and the connection that authenticated the request would otherwise
    be held through the wait.

    A request has a thread of its own under Django's ASGI handler and the MCP endpoint (a
    ThreadSensitiveContext each). Without one (AgentsAPIFirst's verbs, a plain event loop) the
    caller's thread is shared and long-lived, and keeps its connection, as a worker's does.
    """
    with admitted(agent, seconds):
        if seconds and SyncToAsync.thread_sensitive_context.get(None) is not None:
            await sync_to_async(_give_back_connections)()
        yield


def _give_back_connections() -> None:
    """Close this thread's connections (a pooled one goes back to the pool), outside a
    transaction: the request's own thread's, which Django would close when the request ends."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()
