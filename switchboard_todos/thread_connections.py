"""What a server process's own threads do with their database connections between requests.

The agents' API (api/asgi.py), the SQS endpoint (sqs/mount.py), the MCP tool calls
(mcp/threads.py) and the long polls' claims (claims/long_polls.py) run their database work on
threads of their own, not Django's request threads, so they tidy their connections themselves.
After each request, one that a database error left unusable is closed, as Django's handler
closes it; the others stay with the thread for its next request, as a worker's do.

A pooled one (Django's `OPTIONS["pool"]`) stays too, while requests keep coming
(`keep_connections`), and goes back to the pool once its thread has been idle for
KEEP_WHILE_IDLE seconds (`finish_with_connections`): handed back and taken again at every
request, it cost the API's process about a seventh of its CPU (docs/benchmarks.md). It goes
back at once whenever another thread waits for that pool, so that what the threads keep never
starves the rest of the process; and docs/operating.md section 11 counts them among the pool's
users.
"""

from __future__ import annotations

from enum import Enum, auto

from django.db import connections

#: How long one of those threads keeps a pooled connection without work to run on it.
KEEP_WHILE_IDLE = 0.1


class Idle(Enum):
    """What a thread's wait for work gives it once it waited its time without any (FairThreads'
    `linger`, ClaimThreads' KEEP_WHILE_IDLE): time to give its connections back."""

    IDLE = auto()


def finish_with_connections() -> None:
    """After a request or claim: close the connections a database error left unusable, and
    give pooled ones back to the pool."""
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred:
            connection.close_if_unusable_or_obsolete()
        if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
            connection.close()


def keep_connections() -> None:
    """Between two requests of a thread that runs many: close the connections a database
    error left unusable, and give back a pooled one only if another thread waits for its
    pool. The thread calls `finish_with_connections` once it goes idle."""
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred:
            connection.close_if_unusable_or_obsolete()
        pool = getattr(connection, "pool", None)
        if (
            pool is not None
            and not connection.in_atomic_block
            and pool.get_stats().get("requests_waiting")
        ):
            connection.close()
