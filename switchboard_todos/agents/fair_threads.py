"""Threads that take turns between agents: a server process's verbs, run fairly.

A server process runs its agents' verbs on a few threads (api/asgi.py). In one first-come
queue, an agent with its SWITCHBOARD_TODOS_AGENT_MAX_CONCURRENT requests in flight puts that
many in front of every other agent's next one. Measured beside a hostile agent whose 32 long
polls failed what they claimed (1 KiB errors, `retry_in` 0) as fast as it could: the other
agents' requests waited 30-38 ms for a thread at p99. Here each agent (the `tenant` of the
request that submitted the work) has a queue of its own, and a free thread takes the oldest
work of the agent served least recently: another agent's request waits for at most one of the
flood's per thread, not for all of them (5.5-14 ms at p99 in the same flood). Within one
agent, first come, first served.

Each thread calls `after_each` after each work, and `when_idle` once when it has waited
`linger` seconds for work since its last, then waits on: `keeping_connections` makes the
threads of the server's surfaces (the API's, SQS's, the MCP calls'), which keep their database
connection from one work to the next and give a pooled one back once idle
(thread_connections.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from switchboard_todos.lanes import Lanes
from switchboard_todos.thread_connections import (
    KEEP_WHILE_IDLE,
    Idle,
    finish_with_connections,
    keep_connections,
)

logger = logging.getLogger("switchboard_todos.fair_threads")

P = ParamSpec("P")
R = TypeVar("R")

#: Whose work a request submits: its credential, set on the event loop once its token is read.
#: Work submitted without one shares a lane of its own.
tenant: ContextVar[str] = ContextVar("switchboard_todos_tenant", default="")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class FairThreads(Executor):
    """An Executor of `threads` threads, started with its first work, taking turns between
    tenants (the module says why)."""

    def __init__(
        self,
        threads: int,
        *,
        thread_name_prefix: str,
        after_each: Callable[[], object] | None = None,
        when_idle: Callable[[], object] | None = None,
        linger: float = 0.0,
    ) -> None:
        if threads < 1:
            raise ValueError("FairThreads needs at least one thread.")
        self.threads = threads
        self._prefix = thread_name_prefix
        self._after_each = after_each
        self._when_idle = when_idle
        self._linger = linger
        self._condition = threading.Condition()
        #: Each tenant's waiting work, taken in turns.
        self._waiting: Lanes[_Work] = Lanes()
        self._started: list[threading.Thread] = []
        self._shutdown = False

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        future: Future[R] = Future()
        with self._condition:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            if not self._started:
                self._start()
            self._waiting.put(tenant.get(), (future, fn, args, kwargs))
            self._condition.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; the threads finish what waits (or, with `cancel_futures`, cancel
        it) and end."""
        with self._condition:
            self._shutdown = True
            if cancel_futures:
                for future, *_ in self._waiting.clear():
                    future.cancel()
            self._condition.notify_all()
        if wait:
            for thread in self._started:
                thread.join()

    def _start(self) -> None:
        for number in range(self.threads):
            thread = threading.Thread(
                target=self._serve, name=f"{self._prefix}_{number}", daemon=True
            )
            thread.start()
            self._started.append(thread)

    def _next(self, linger: float | None) -> _Work | Idle | None:
        """The oldest work of the tenant served least recently, who goes to the back of the
        line; IDLE after `linger` seconds (None: no limit) without any; None once shut down
        with nothing waiting."""
        with self._condition:
            while not self._waiting:
                if self._shutdown:
                    return None
                if not self._condition.wait(linger) and not self._waiting:
                    return Idle.IDLE
            return self._waiting.take()

    def _serve(self) -> None:
        idle = True
        while (work := self._next(None if idle else self._linger)) is not None:
            if work is Idle.IDLE:
                idle = True
                _hook(self._when_idle, "when_idle")
                continue
            idle = self._when_idle is None
            future, fn, args, kwargs = work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:  # as ThreadPoolExecutor: the caller's to see
                future.set_exception(error)
            else:
                future.set_result(result)
            _hook(self._after_each, "after_each")


def _hook(hook: Callable[[], object] | None, name: str) -> None:
    """`hook`, whose error is logged: it must not end the thread."""
    if hook is None:
        return
    try:
        hook()
    except Exception:
        logger.exception("FairThreads' %s failed", name)


def keeping_connections(threads: int, *, thread_name_prefix: str) -> FairThreads:
    """FairThreads whose threads keep their database connections from one work to the next,
    a pooled one given back once idle or wanted (thread_connections.py)."""
    return FairThreads(
        threads,
        thread_name_prefix=thread_name_prefix,
        after_each=keep_connections,
        when_idle=finish_with_connections,
        linger=KEEP_WHILE_IDLE,
    )
