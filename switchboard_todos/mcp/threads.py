"""The threads the MCP tool calls run their database work on, one lent to each call.

Django's connections are per thread, and an async tool call reaches the ORM through
`sync_to_async`: `request_scope` gives each call a thread of its own for all of it, as Django's
ASGI handler gives a request, and takes it back when the call ends.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from asgiref.sync import ThreadSensitiveContext
from django.db import connections

from switchboard_todos.agents.fair_threads import FairThreads, keeping_connections

#: Threads kept idle between calls, for the next ones.
KEPT_THREADS = 4


class Threads:
    """Single-thread executors, one lent to each call in flight and taken back when it ends.

    A call's database work stays on one thread (Django's connections are per thread), no call
    queues behind another's, and up to `keep` idle threads outlive their call: a thread started
    and joined per call (a ThreadSensitiveContext of its own) cost a tool call more than the
    call's own work (issue 36). A kept thread keeps its database connection for the next call
    too, as the API's threads do (thread_connections.py); one that is not kept closes its
    connections as it ends.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._idle: list[FairThreads] = []
        self._lock = threading.Lock()

    def lend(self) -> FairThreads:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return keeping_connections(1, thread_name_prefix="switchboard-todos-mcp")

    def take_back(self, thread: FairThreads) -> None:
        """Keep `thread` for the next call, or (`keep` already idle) let it end."""
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(thread)
                return
        _end(thread, wait=False)

    def close(self) -> None:
        """End the idle threads."""
        with self._lock:
            idle, self._idle = self._idle, []
        for thread in idle:
            _end(thread, wait=True)


def _end(thread: FairThreads, *, wait: bool) -> None:
    """End `thread` once it has closed its connections."""
    thread.submit(connections.close_all)
    thread.shutdown(wait=wait)


_threads = Threads(KEPT_THREADS)


@asynccontextmanager
async def request_scope() -> AsyncIterator[None]:
    """Around each call, what Django's ASGI handler does around a request.

    The ORM runs on a thread of the call's own, as under Django's handler (so that agents do
    not queue behind one thread), lent for the call (`Threads`). After each piece of its work,
    a connection a database error left unusable is closed, and the others stay with the thread
    for the next (a pooled one goes back to the pool once the thread is idle, or when
    another thread waits for it: thread_connections.py).
    """
    thread = _threads.lend()
    try:
        async with ThreadSensitiveContext(executor=thread):
            yield
    finally:
        _threads.take_back(thread)


def close_threads() -> None:
    """End the idle threads of the tool calls (at a server's end)."""
    _threads.close()
