"""A long poll whose client has gone claims nothing, on every surface.

A client that dies in the middle of a long poll (a worker restarted, a process killed) leaves
its request waiting on the server: answered, it would claim the next todo for nobody, stranded
for its whole lease. So a long poll stops when its client disconnects, as ASGI tells with an
`http.disconnect` message on `receive()`:

* Django's ASGI handler cancels a view whose client disconnects: the API's `claim` and the
  SQS endpoint routed through Django stop so;
* the surfaces answered in front of Django (api/asgi.py, sqs/mount.py) listen for it
  themselves while a long poll waits (`disconnected`), and cancel it (`unless_gone`);
* the MCP endpoint runs each tool call apart from the request that carried it: the request
  watches for its client's disconnect itself (`watching`, mcp/http.py), whatever the SDK
  reads of it (its event stream listens; a JSON answer would read nothing), for the claim
  tool to stop on it (`unless_client_gone`, mcp/server.py).

A long poll cancelled so claims nothing more; what a claim of it running then took is given
back at once, its attempt not counted (claims/long_polls.py), as is a claim whose answer is
being made when the client goes (service.handing_over). A disconnect seen only once the
answer is sent cannot be told from an answer lost on its way: that todo comes back when its
lease expires, as any an agent received and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

#: While an MCP request is served: its client's disconnect, set when its `receive()` tells it.
_client_gone: ContextVar[asyncio.Event | None] = ContextVar(
    "switchboard_todos_client_gone", default=None
)


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone: its request's body read, `receive()` has nothing more
    to tell but `http.disconnect`."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_gone(work: Awaitable[T], gone: Awaitable[object]) -> T | None:
    """`work`'s result; or None when `gone` completes first (the client went away): `work` is
    then cancelled, and awaited. Cancelled itself, this cancels `work` too."""
    working = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(gone)
    try:
        await asyncio.wait([working, watcher], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        working.cancel()
        raise
    finally:
        watcher.cancel()
    if working.done():
        return working.result()
    working.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await working
    return None


@contextlib.asynccontextmanager
async def watching(receive: Receive) -> AsyncIterator[Receive]:
    """`receive`, and the client's disconnect noted for `unless_client_gone` in this context
    and the tasks it starts meanwhile.

    Once whoever serves the request has read its body (the last `http.request`), a task of
    ours reads `receive()` for the disconnect until the request ends, whether or not anything
    else would (a JSON answer reads nothing more; an event stream listens): a later call of
    the `receive` given waits for that disconnect instead of reading a second time.
    """
    gone = asyncio.Event()
    watchers: list[asyncio.Task[None]] = []

    async def watch() -> None:
        await disconnected(receive)
        gone.set()

    async def receive_watched() -> Message:
        if watchers:
            await gone.wait()
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
        elif not message.get("more_body", False):
            watchers.append(asyncio.create_task(watch()))
        return message

    token = _client_gone.set(gone)
    try:
        yield receive_watched
    finally:
        _client_gone.reset(token)
        for watcher in watchers:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def unless_client_gone(work: Awaitable[T]) -> T | None:
    """`unless_gone`, for a call of a request `watching` its client; else `work`."""
    gone = _client_gone.get()
    if gone is None:
        return await work
    return await unless_gone(work, gone.wait())
