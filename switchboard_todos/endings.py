"""Waiting for a todo to end: `Todo.objects.wait_for` and its async twin.

A producer that enqueued work and wants its result waits until the todo is done or failed:
first it watches for the todo's end on the process's one LISTEN connection (claims/listen.py), then
marks the todo `awaited` (the `await_todo` statement). Every statement that ends a todo
(complete, complete_many, fail, the reaper, cancel, and the settling of the todos blocked
by a dead letter) sends `NOTIFY switchboard_todos_done, '<id>'` for the awaited todos among
those it ended: the others cost it nothing but a test. The mark and the end take the todo's row
lock in turn, so the end of a todo marked first is always notified, and a todo that ended first
is seen ended by the mark. While it waits, the async twin holds no thread and no connection:
its few statements run on the claim threads (long_polls.py), outside any transaction of its
caller; the blocking one keeps its thread's connection, as a blocking long poll does. Without
LISTEN, or while the listener reconnects, a wait reads the todo once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async

from switchboard_todos.claims import listen, long_polls
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import TodoNotFound
from switchboard_todos.sql import queries
from switchboard_todos.transitions import State

if TYPE_CHECKING:
    from switchboard_todos.managers.machinery import Machinery
    from switchboard_todos.models import Todo

#: The states a todo someone waits for ends in.
ENDED = frozenset({State.DONE, State.FAILED})


class _Signal:
    """An `Ending` that a thread waits on."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def end(self) -> None:
        self.event.set()


class _Future:
    """An `Ending` that resolves a future of an event loop (from the listener's thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[None] = self.loop.create_future()

    def end(self) -> None:
        self.loop.call_soon_threadsafe(_resolve, self.future)

    def again(self) -> None:
        """Wait for the next ending."""
        if self.future.done():
            self.future = self.loop.create_future()


def wait(todos: Machinery, todo_id: str, seconds: float) -> Todo:
    """`wait_for` on this thread: the todo once it ended, or as it is after `seconds`."""
    listener = listen.shared_listener(todos._db_alias) if conf.LISTEN else None
    signal = _Signal()
    listening = listener is not None and listener.watch(todo_id, signal)
    try:
        deadline = time.monotonic() + seconds
        if _mark(todos, todo_id):
            while (remaining := deadline - time.monotonic()) > 0:
                listening = listening or (listener is not None and listener.listening)
                signal.event.wait(remaining if listening else min(remaining, listen.POLL_MAX))
                signal.event.clear()
                if _ended(todos, todo_id):
                    break
        return _read(todos, todo_id)
    finally:
        if listener is not None:
            listener.unwatch(todo_id, signal)


async def await_(todos: Machinery, todo_id: str, seconds: float) -> Todo:
    """`wait` for coroutines: suspended while it waits, holding no thread and no connection."""
    listener = listen.shared_listener(todos._db_alias) if conf.LISTEN else None
    ending = _Future()
    threads, turn = long_polls.claim_threads(), f"wait_for:{todo_id}"
    try:
        listening = listener is not None and await sync_to_async(
            listener.watch, thread_sensitive=False
        )(todo_id, ending)
        deadline = time.monotonic() + seconds
        if await threads.run(turn, _mark, todos, todo_id):
            while (remaining := deadline - time.monotonic()) > 0:
                listening = listening or (listener is not None and listener.listening)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.shield(ending.future),
                        remaining if listening else min(remaining, listen.POLL_MAX),
                    )
                ending.again()
                if await threads.run(turn, _ended, todos, todo_id):
                    break
        return await threads.run(turn, _read, todos, todo_id)
    finally:
        if listener is not None:
            listener.unwatch(todo_id, ending)


def _mark(todos: Machinery, todo_id: str) -> bool:
    """Run `await_todo`: whether the todo was still pending or claimed (and is now awaited)."""
    with todos._cursor() as cursor:
        cursor.execute(queries["await_todo"], {"todo_id": todo_id})
        return cursor.fetchone() is not None


def _ended(todos: Machinery, todo_id: str) -> bool:
    state = todos.using(todos._db_alias).filter(pk=todo_id).values_list("state", flat=True).first()
    return state is None or state in ENDED


def _read(todos: Machinery, todo_id: str) -> Todo:
    found = todos.using(todos._db_alias).filter(pk=todo_id).first()
    if found is None:
        raise TodoNotFound(todo_id)
    return found


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
