"""Where the SQS endpoint is served: at the path the URLconf mounts it, and with `SQSAnywhere`
at every path a client posts SQS to, answered in front of Django's handler.

A client's endpoint is whatever URL it was given, and not every client lets it carry a path:
kombu (Celery's SQS transport) builds its endpoint from the broker URL's host and port only,
so `sqs://host:port` posts to `/`. SQS requests are recognisable by their header alone
(`X-Amz-Target: AmazonSQS.<Action>`, AWS JSON 1.0), so `SQSAnywhere` answers every POST
carrying it with the endpoint's view, whatever its path.

It answers them itself rather than through Django's handler, as `AgentsAPIFirst` answers the
agent loop's verbs (api/asgi.py): a Celery or dramatiq worker makes two requests or more per
task, and Django's handler adds a thread started and stopped per request, the request signals
and the middleware, several times the endpoint's own work. The SQS requests need none of
them: a SigV4 signature, no cookie, session or CSRF token; the host is still checked against
ALLOWED_HOSTS (a refused one goes to Django, which answers and logs it). Each request runs its
database work on one of `threads` threads, each keeping its connection from one request to the
next as a worker does (a pooled one goes back to the pool after each request, one a database
error left unusable is closed).

A queue's URL is the endpoint's URL as the client reached it, followed by the queue's name:
`<endpoint>/jobs`. JSON clients post every action to their endpoint with the queue URL in the
body, and read only the URL's last segment as the queue's name (kombu, dramatiq-sqs).
"""

from __future__ import annotations

import asyncio
import io
import itertools
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.core.handlers.exception import response_for_exception
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, get_resolver
from django.utils.encoding import escape_uri_path

from switchboard_todos.managers import give_back_if_pooled

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]

#: The namespace of the endpoint's routes (sqs/urls.py).
NAMESPACE = "switchboard_todos_sqs"
#: The header every SQS request of the JSON protocol carries, and its value's prefix.
TARGET = b"x-amz-target"
PREFIX = b"AmazonSQS."


class SQSAnywhere:
    """ASGI: every POST with `X-Amz-Target: AmazonSQS.*` answered by the SQS endpoint, at any
    path; every other request passed on unchanged.

    `application = SQSAnywhere(get_asgi_application())`: then `sqs://host:port` (kombu),
    `endpoint_url="http://host:port"` and `endpoint_url="http://host:port/sqs/"` all work.
    Call `close()` at the end of the server's lifespan.
    """

    def __init__(self, application: ASGIApp, *, threads: int = 4) -> None:
        self.application = application
        # One thread per slot, so that the database work of one request stays on one thread
        # (Django's connections are per thread) and a slot's connection can be tidied after.
        self._slots = [
            ThreadPoolExecutor(1, thread_name_prefix="switchboard-todos-sqs")
            for _ in range(threads)
        ]
        self._turns = itertools.cycle(self._slots)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and _is_sqs(scope)):
            await self.application(scope, receive, send)
            return
        request = ASGIRequest(scope, io.BytesIO())
        try:
            request.get_host()
        except DisallowedHost:
            await self.application(scope, receive, send)  # Django answers and logs it
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away
        await _send_response(send, await self.answer(ASGIRequest(scope, io.BytesIO(body))))

    async def answer(self, request: HttpRequest) -> HttpResponse:
        """The endpoint's response to `request`, its database work on one slot's thread."""
        from switchboard_todos.sqs.views import endpoint

        request.resolver_match = _resolve(request.path_info)
        queue = request.resolver_match.kwargs.get("queue") if request.resolver_match else None
        slot = next(self._turns)
        try:
            async with ThreadSensitiveContext(executor=slot):
                try:
                    response: HttpResponse = await endpoint(request, queue)
                except Exception as error:  # what Django's handler answers: 400, or 500 logged
                    response = await sync_to_async(response_for_exception)(request, error)
                return response
        finally:
            await asyncio.get_running_loop().run_in_executor(slot, _finish_with_connections)

    def close(self) -> None:
        """Close the connections the threads keep, and stop the threads."""
        for slot in self._slots:
            slot.submit(connections.close_all).result()
            slot.shutdown()


def _is_sqs(scope: Scope) -> bool:
    return any(key == TARGET and value.startswith(PREFIX) for key, value in scope["headers"])


def _resolve(path_info: str) -> Any:
    """The URLconf's match of the endpoint or a queue URL, or None for any other path."""
    try:
        match = get_resolver().resolve(path_info)
    except Resolver404:
        return None
    return match if NAMESPACE in match.namespaces else None


async def _read_body(receive: Any) -> bytes | None:
    """The body, or None if the client disconnected first. What passes the endpoint's limit is
    read and dropped: the endpoint refuses the body for its length (sqs/views.py)."""
    from switchboard_todos.sqs.views import MAX_BODY

    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size <= MAX_BODY:
            chunks.append(chunk[: MAX_BODY + 1 - size])
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_response(send: Any, response: HttpResponse) -> None:
    headers = [(key.encode("ascii"), value.encode("latin1")) for key, value in response.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


def _finish_with_connections() -> None:
    """What Django does with a thread's connections after a request: close those a database
    error left unusable, and give pooled ones back to the pool."""
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred:
            connection.close_if_unusable_or_obsolete()
        give_back_if_pooled(connection)


def endpoint_url(request: HttpRequest) -> str:
    """The endpoint's URL as the client reached it, ending in a slash: the path it posted to,
    less the queue's name when that was a queue URL of the URLconf (`<endpoint><queue>`)."""
    path = request.path
    match = request.resolver_match
    queue = match.kwargs.get("queue") if match is not None else None
    if isinstance(queue, str):
        path = path.removesuffix(queue)
    return request.build_absolute_uri(escape_uri_path(path.rstrip("/") + "/"))
