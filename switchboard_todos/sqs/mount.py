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
ALLOWED_HOSTS (a refused one goes to Django, which answers and logs it), the project's HTTPS
settings are applied by Django's SecurityMiddleware (a plain-HTTP request where HTTPS is asked
for gets its redirect and does nothing), a body past MAX_BODY is refused before more of it is
read, signed or not, and the request is made and the response sent by Django's own ASGI code.
Each request runs its database work on one of `threads` threads, each keeping its connection
from one request to the next as a worker does (a pooled one goes back to the pool once the
thread is idle or another thread waits for the pool, one a database error left unusable is
closed: thread_connections.py). A ReceiveMessage is answered while
its client is connected: one that goes away ends it, its long poll claiming nothing
(agents/disconnects.py). Queue URLs are built on the path posted to (queue_urls.py).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.exceptions import DisallowedHost, RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.exception import response_for_exception
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, get_resolver

from switchboard_todos.agents import disconnects
from switchboard_todos.agents.fair_threads import keeping_connections
from switchboard_todos.agents.https import https_of

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]

#: The namespace of the endpoint's routes (sqs/urls.py).
NAMESPACE = "switchboard_todos_sqs"
#: The header every SQS request of the JSON protocol carries, and its value's prefix.
TARGET = b"x-amz-target"
PREFIX = b"AmazonSQS."
#: The header's value of the action that long-polls.
RECEIVE = PREFIX + b"ReceiveMessage"


class _Requests(ASGIHandler):
    """Django's own reading of an ASGI request's body, making of the request and sending of the
    response (`read_body`, `create_request`, `send_response`), without the middleware its
    handler loads: SQSAnywhere runs none."""

    def __init__(self) -> None:
        pass


_DJANGO = _Requests()


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
            keeping_connections(1, thread_name_prefix="switchboard-todos-sqs")
            for _ in range(threads)
        ]
        self._turns = itertools.cycle(self._slots)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if not (scope["type"] == "http" and scope["method"] == "POST" and _is_sqs(scope)):
            await self.application(scope, receive, send)
            return
        https = https_of(scope)
        head = ASGIRequest(scope, io.BytesIO()) if https is None else https.request
        try:
            head.get_host()
            redirect = None if https is None else https.middleware.process_request(head)
        except DisallowedHost:
            await self.application(scope, receive, send)  # Django answers and logs it
            return
        if redirect is not None:  # plain HTTP where the project asks for HTTPS: Django's answer
            await _DJANGO.send_response(redirect, send)
            return
        # Imported here, as in answer(): the views use the models.
        from switchboard_todos.sqs.views import MAX_BODY, body_too_large

        try:
            body = await _read_at_most(scope, receive, MAX_BODY)
        except RequestAborted:
            return  # the client went away
        if body is None:
            await _DJANGO.send_response(body_too_large(), send)
            return
        request, refused = _DJANGO.create_request(scope, io.BytesIO(body))
        if request is None:  # a body past DATA_UPLOAD_MAX_MEMORY_SIZE, or not UTF-8 headers
            assert refused is not None
            await _DJANGO.send_response(refused, send)
            return
        if _is_receive(scope):  # maybe a long poll: it ends when its client goes
            gone = disconnects.disconnected(receive)
            answered = await disconnects.unless_gone(self.answer(request), gone)
            if answered is None:
                return  # nobody to answer
            response = answered
        else:
            response = await self.answer(request)
        if https is not None:
            response = https.middleware.process_response(request, response)
        await _DJANGO.send_response(response, send)

    async def answer(self, request: HttpRequest) -> HttpResponse:
        """The endpoint's response to `request`, its database work on one slot's thread."""
        # Imported at the first request: the views use the models, and this module is imported
        # by a project's asgi.py before get_asgi_application() has set Django up.
        from switchboard_todos.sqs.views import endpoint

        request.resolver_match = _resolve(request.path_info)
        queue = request.resolver_match.kwargs.get("queue") if request.resolver_match else None
        async with ThreadSensitiveContext(executor=next(self._turns)):
            try:
                response: HttpResponse = await endpoint(request, queue)
            except Exception as error:  # what Django's handler answers: 400, or 500 logged
                response = await sync_to_async(response_for_exception)(request, error)
            return response

    def close(self) -> None:
        """Close the connections the threads keep, and stop the threads."""
        for slot in self._slots:
            slot.submit(connections.close_all).result()
            slot.shutdown()


async def _read_at_most(scope: Scope, receive: Any, limit: int) -> bytes | None:
    """The request's body, or None once it is known to pass `limit` bytes: by its
    Content-Length, before a byte of it is read, else as soon as what came passes it (a body
    sent in chunks). Nothing past the limit is read or kept, signed or not: the signature is
    checked after."""
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestAborted
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _is_sqs(scope: Scope) -> bool:
    return any(key == TARGET and value.startswith(PREFIX) for key, value in scope["headers"])


def _is_receive(scope: Scope) -> bool:
    return any(key == TARGET and value == RECEIVE for key, value in scope["headers"])


def _resolve(path_info: str) -> Any:
    """The URLconf's match of the endpoint or a queue URL, or None for any other path."""
    try:
        match = get_resolver().resolve(path_info)
    except Resolver404:
        return None
    return match if NAMESPACE in match.namespaces else None
