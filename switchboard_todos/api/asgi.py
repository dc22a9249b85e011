"""The agent loop's verbs served straight from ASGI, in front of Django.

An agent works in a loop of claim, heartbeat and complete (or fail, or release): two requests
per todo at least. Through Django's handler each costs several times the queue's own work (a
thread started per request, two hops between threads per synchronous middleware, the request
signals, an HttpRequest, ninja's parameter machinery), and the API drained at a sixth of the
in-process rate. `AgentsAPIFirst` answers these POSTs itself, in one hop to a thread that
authenticates, parses and validates the body with the API's own schemas, and runs the
service's verb; and the creates (`POST todos/`, `todos/batch/`), which cost three times their
own work through Django's handler, and are what an agent flooding the server sends. Every other
request (list, get, the schema, anything not the API's) goes to the application it wraps, and
api/views.py stays where the whole API is defined and documented.

The token comes first. A verb's request without a well-formed bearer token is answered 401
before its body is even read. Every request of the API with a token, the verbs' and those
passed on to Django alike, is counted among its agent's requests in flight
(agents/request_cap.py) on the event loop, before its token is looked up: past the cap it is
answered 429 there, holding no thread and no connection. An agent's creates, plans, fails and
releases take their turns here, one at a time per token (`Turns`): each would wait on the
agent's row for the one before it (its quotas count every one there, and a create holds the row
until it commits), and waiting there it held a thread and a connection, and one agent's burst
took every thread. A verb's body is read on the event loop
(I/O only, at most DATA_UPLOAD_MAX_MEMORY_SIZE kept) and parsed on the thread, only once the
token was found: no body, whatever its size, is parsed on the event loop, where it would hold up
every long poll this process serves, and no anonymous body is parsed at all.

The answers are the API's: the same schemas, service, error table and problem responses
(tests/test_api_fast.py sends every kind of request both ways and compares). What these
requests skip is the project's MIDDLEWARE and the request signals. They need neither: a bearer
token, no cookie, session or CSRF token; the host is still checked against ALLOWED_HOSTS, and
the project's HTTPS settings are honoured by Django's own SecurityMiddleware, run on the request
and its answer whenever the project installs it or sets SECURE_SSL_REDIRECT (a plain-HTTP
request then gets its redirect to HTTPS, as through Django, and nothing is done). A project
whose middleware must see every request serves Django's application alone, and the API works
there too, at Django's cost (docs/agents.md).

A claim that waits listens for its client's disconnect meanwhile: a client that goes away ends
it, claiming nothing (agents/disconnects.py), as Django's handler cancels the view.

The `threads` take turns between tokens (agents/fair_threads.py): one agent's requests in
flight do not wait in front of every other agent's next one. Each of them keeps its database
connection from one request to the next, as a worker does, and closes it after a database error
(that request answers 503, the next one connects again). A connection of Django's pool goes
back to the pool once its thread has had no request for 0.1 s, or at once when another thread
of the process waits for the pool (thread_connections.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import ExitStack
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import get_script_prefix
from django.db import connections
from django.http import HttpRequest, HttpResponse
from django.urls import get_resolver
from django.urls.exceptions import Resolver404
from pydantic import ValidationError

from switchboard_todos import tracing
from switchboard_todos.agents import disconnects, request_cap, service, tokens
from switchboard_todos.agents.fair_threads import keeping_connections, tenant
from switchboard_todos.agents.https import https_of
from switchboard_todos.agents.serialize import reads_database, todo_json, todos_json
from switchboard_todos.api import problems
from switchboard_todos.api.schemas import (
    ClaimIn,
    ClaimOneIn,
    CompleteIn,
    CreateIn,
    FailIn,
    HeartbeatIn,
    PlanIn,
    ReleaseIn,
    Request,
)
from switchboard_todos.exceptions import TodoError
from switchboard_todos.models import Agent, Todo

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: Any ASGI application (Django's handler types its arguments more narrowly than this one).
ASGIApp = Callable[..., Awaitable[None]]

#: The namespace the API's routes resolve in (api/urls.py).
NAMESPACE = "switchboard_todos_api"
Verb = Callable[[Agent, str, Any], Todo]
#: The verbs on one todo answered here, by route name (api/views.py): the body's schema, and
#: the service call.
BY_ID: dict[str, tuple[type[Request], Verb]] = {
    "claim_todo": (
        ClaimOneIn,
        lambda agent, todo_id, body: service.claim(agent, todo_id=todo_id, ttl=body.ttl)[0],
    ),
    "heartbeat": (
        HeartbeatIn,
        lambda agent, todo_id, body: service.heartbeat(agent, todo_id, body.ttl, body.progress),
    ),
    "complete": (
        CompleteIn,
        lambda agent, todo_id, body: service.complete(agent, todo_id, body.result),
    ),
    "fail": (
        FailIn,
        lambda agent, todo_id, body: service.fail(agent, todo_id, body.error, body.retry_in),
    ),
    "release": (
        ReleaseIn,
        lambda agent, todo_id, body: service.release(agent, todo_id, body.delay),
    ),
}
#: The claim from queues (`POST claim/`).
CLAIM = "claim"
#: The creates answered here, by route name (api/views.py): a todo (a POST to the list's route,
#: `todos/`) and a plan (`todos/batch/`), and the body's schema of each.
CREATES: dict[str, type[Request]] = {"todos": CreateIn, "create_many": PlanIn}
#: The verbs counted on the agent's row every time (agents/service/quotas.py): its creates and
#: plans, its fails and releases. They take their turns per token on the event loop (`Turns`).
COUNTED_ON_THE_AGENTS_ROW = {*CREATES, "fail", "release"}


class Aborted(Exception):
    """The client went away before its answer was ready: nobody to answer."""


class Waiting(NamedTuple):
    """A claim that waits (`_perform`): the event loop waits for it, not the thread."""

    agent: Agent
    arguments: ClaimIn


class Turns:
    """One at a time per key (a token), the others waiting on the event loop in order."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class AgentsAPIFirst:
    """ASGI: the agent loop's verbs and the creates answered directly, every other request
    passed on (each request of the API counted first among its agent's requests in flight).

    `application = AgentsAPIFirst(get_asgi_application())`. Which requests these are is the
    project's URLconf's to say, wherever it mounts `include("switchboard_todos.api.urls")`.
    """

    def __init__(self, application: ASGIApp, *, threads: int = 4) -> None:
        self.application = application
        self.threads = threads
        self._threads = keeping_connections(threads, thread_name_prefix="switchboard-todos-api")
        self._turns = Turns()

    def close(self) -> None:
        """Close the connections the threads keep, and stop the threads.

        One task per thread, held at a barrier until all have started, reaches every thread.
        """
        barrier = threading.Barrier(self.threads)

        def close_this_threads_connections() -> None:
            connections.close_all()
            barrier.wait(timeout=30)

        for done in [
            self._threads.submit(close_this_threads_connections) for _ in range(self.threads)
        ]:
            done.result()
        self._threads.shutdown()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope) if scope["type"] == "http" else None
        if route is None or not _allowed_host(scope):
            await self.application(scope, receive, send)  # Django says what is wrong with a host
            return
        verb, todo_id = route
        https = https_of(scope)
        answer: HttpResponse | bytes | None = None
        if https is not None:
            answer = https.middleware.process_request(https.request)
        if scope["method"] != "POST" or not (verb in BY_ID or verb == CLAIM or verb in CREATES):
            if answer is not None:  # plain HTTP: Django's handler redirects it
                await self.application(scope, receive, send)
                return
            answer = await self._passed_on(scope, receive, send)
            if answer is None:  # Django's handler answered it
                return
        elif answer is None:
            try:
                answer = await self._answer(scope, verb, todo_id, receive)
            except Aborted:
                return
        if https is not None:
            answer = https.middleware.process_response(https.request, _response(answer))
        if isinstance(answer, HttpResponse):
            status, content = answer.status_code, answer.content
            headers = [
                (key.encode("ascii"), value.encode("latin1")) for key, value in answer.items()
            ]
        else:
            status, content, headers = 200, answer, [(b"content-type", b"application/json")]
        if not any(key == b"content-length" for key, _ in headers):
            # Not chunked: the client reads the body in one piece, without parsing chunks.
            headers.append((b"content-length", b"%d" % len(content)))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _passed_on(self, scope: Scope, receive: Receive, send: Send) -> HttpResponse | None:
        """Any other route of the API, passed on to Django's handler counted among its token's
        requests in flight; or, past the cap, the 429 that refuses it on the event loop, having
        taken no thread and no connection. A request without a well-formed token goes on
        uncounted: Django's handler says what is wrong with it (or answers it, where the route
        needs no token)."""
        authorization = _header(scope, b"authorization")
        token = _bearer(authorization)
        if token is None or not tokens.well_formed(token):
            await self.application(scope, receive, send)
            return None
        with ExitStack() as counted:
            try:
                counted.enter_context(request_cap.admitted_early(token))
            except TodoError as error:
                return problems.todo_error_response(error, authorization)
            await self.application(scope, receive, send)
        return None

    async def _answer(
        self, scope: Scope, verb: str, todo_id: str | None, receive: Receive
    ) -> HttpResponse | bytes:
        """As api/views.py answers: authentication first, then the body, then the verb.

        A success is its JSON body (200, application/json).
        """
        authorization = _header(scope, b"authorization")
        token = _bearer(authorization)
        with ExitStack() as counted:
            try:
                service.check_shape(token)
                assert token is not None
                counted.enter_context(request_cap.admitted_early(token))
            except TodoError as error:  # refused before the body is read, on no thread
                return problems.todo_error_response(error, authorization)
            tenant.set(token)  # its work takes turns with other tokens' on the threads
            if verb in COUNTED_ON_THE_AGENTS_ROW:
                async with self._turns.turn(token):
                    return await self._run(scope, verb, token, todo_id, receive)
            return await self._run(scope, verb, token, todo_id, receive)

    async def _run(
        self, scope: Scope, verb: str, token: str, todo_id: str | None, receive: Receive
    ) -> HttpResponse | bytes:
        """The body, then the verb on one of the threads (a long poll on the event loop)."""
        body = await _read_body(receive)
        loop = asyncio.get_running_loop()
        answer: bytes | Waiting | HttpResponse | None
        try:
            # In this request's context: the verb's count of the agent finds it counted already.
            perform = functools.partial(_perform, verb, token, todo_id, body, scope)
            answer = await loop.run_in_executor(
                self._threads, contextvars.copy_context().run, perform
            )
            if isinstance(answer, Waiting):  # suspended, not holding a thread
                with request_cap.admitted(answer.agent):
                    gone = disconnects.disconnected(receive)
                    answer = await disconnects.unless_gone(self._long_poll(answer), gone)
        except TodoError as error:
            return problems.todo_error_response(error, _header(scope, b"authorization"))
        except Exception as error:
            return problems.server_error_response(f"POST {scope['path']}", error)
        if answer is None:
            raise Aborted  # the client went away: its long poll claimed nothing
        return answer

    async def _long_poll(self, waiting: Waiting) -> bytes:
        """A claim that waits, and its answer."""
        claimed = await _wait_and_claim(waiting.agent, waiting.arguments)
        if not reads_database(claimed):
            return _body(claimed)
        # Parents' results, last errors: a query.
        loop = asyncio.get_running_loop()
        answer = loop.run_in_executor(self._threads, _body, claimed)
        return await service.handing_over(waiting.agent, claimed, answer)


def _perform(
    verb: str, token: str | None, todo_id: str | None, body: bytes | None, scope: Scope
) -> bytes | Waiting | HttpResponse:
    """On one of the threads: authenticate, then parse the body (or refuse it), then run the
    verb, counted among the agent's requests in flight, and serialize its answer. A claim with
    a `wait` returns Waiting: the event loop waits for it, and counts it.

    The agent is recognised (identity.py): the verbs here check its credential in their own
    statement, so a request is one statement, and a revoked token is still refused at once.
    """
    # The claim by id and the creates read the agent's grants before their statements:
    # read them now.
    reads_grants = verb == "claim_todo" or verb in CREATES
    agent = service.authenticate(token) if reads_grants else service.recognise(token)
    arguments = _arguments(verb, body)
    if isinstance(arguments, HttpResponse):
        return arguments
    if isinstance(arguments, ClaimIn) and arguments.wait:
        return Waiting(agent, arguments)
    with request_cap.admitted(agent):
        if verb in CREATES:
            return _created(agent, arguments, scope)
        if verb != CLAIM:
            assert todo_id is not None
            return _body(BY_ID[verb][1](agent, todo_id, arguments))
        assert isinstance(arguments, ClaimIn)
        return _body(
            service.claim(agent, queues=arguments.queues, ttl=arguments.ttl, limit=arguments.limit)
        )


def _created(agent: Agent, arguments: Request, scope: Scope) -> HttpResponse:
    """A create's answer, as api/views.py's `create_for` and `create_many` give it: 201 when it
    created (a todo's with its Location), 200 when idempotency keys found every todo live."""
    names = {name.decode("latin1") for name, _ in scope["headers"]}
    with tracing.remote({name: _header(scope, name.encode("latin1")) for name in names}):
        if isinstance(arguments, CreateIn):
            todo, created = service.create_for(agent, **arguments.model_dump())
            answer = HttpResponse(
                json.dumps(todo_json(todo)),
                status=201 if created else 200,
                content_type="application/json",
            )
            if created:
                answer["Location"] = f"{_request_path(scope)}{todo.id}/"
            return answer
        assert isinstance(arguments, PlanIn)
        made = service.create_many_for(
            agent, todos=[todo.model_dump(exclude_none=True) for todo in arguments.todos]
        )
    shaped = todos_json([todo for todo, _created in made])
    answers = [{"todo": t, "created": c} for t, (_, c) in zip(shaped, made, strict=True)]
    status = 201 if any(c for _, c in made) else 200
    return HttpResponse(
        json.dumps({"todos": answers}), status=status, content_type="application/json"
    )


def _request_path(scope: Scope) -> str:
    """The request's path as Django's ASGIRequest.path has it."""
    script_name = get_script_prefix(scope)
    path_info = scope["path"].removeprefix(script_name) if script_name else scope["path"]
    return "{}/{}".format(script_name.rstrip("/"), path_info.replace("/", "", 1))


def _body(answer: Todo | list[Todo]) -> bytes:
    """A verb's answer as the API's JSON (reading the results of the todos' parents, if any)."""
    if isinstance(answer, list):
        return json.dumps({"todos": todos_json(answer)}).encode()
    return json.dumps(todo_json(answer)).encode()


async def _wait_and_claim(agent: Agent, arguments: Request | HttpResponse) -> list[Todo]:
    """The long poll: its claims run on the process's claim threads (claims/long_polls.py),
    not here."""
    assert isinstance(arguments, ClaimIn)
    return await service.aclaim(
        agent,
        queues=arguments.queues,
        ttl=arguments.ttl,
        wait=arguments.wait,
        limit=arguments.limit,
    )


def _response(answer: HttpResponse | bytes) -> HttpResponse:
    if isinstance(answer, HttpResponse):
        return answer
    return HttpResponse(answer, content_type="application/json")


def _route(scope: Scope) -> tuple[str, str | None] | None:
    """(route name, todo id) if the project's URLconf resolves the path to a route of the API."""
    path = scope["path"].removeprefix(get_script_prefix(scope))  # as ASGIRequest.path_info
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return None
    if NAMESPACE not in match.namespaces:
        return None
    return match.url_name or "", match.kwargs.get("todo_id")


def _header(scope: Scope, name: bytes) -> str:
    """A request header's value; repeated ones joined with commas, as Django joins them."""
    return ",".join(value.decode("latin1") for key, value in scope["headers"] if key == name)


def _bearer(authorization: str) -> str | None:
    """The token of `Authorization: Bearer <token>`, as ninja's HttpBearer reads it."""
    if not authorization:
        return None
    scheme, *rest = authorization.split(" ")
    return " ".join(rest) if scheme.lower() == "bearer" else None


def _allowed_host(scope: Scope) -> bool:
    """Whether Django's `request.get_host()` accepts the request's host (ALLOWED_HOSTS)."""
    server = scope.get("server") or ("unknown", "0")
    return _host_allowed(
        _header(scope, b"host"),
        _header(scope, b"x-forwarded-host"),
        (server[0], str(server[1])),
        (tuple(settings.ALLOWED_HOSTS), settings.DEBUG, settings.USE_X_FORWARDED_HOST),
    )


@functools.lru_cache(maxsize=256)
def _host_allowed(
    host: str, forwarded: str, server: tuple[str, str], checked_by: tuple[Any, ...]
) -> bool:
    """`_allowed_host`, remembered for the hosts seen (`checked_by`: the settings it reads)."""
    request = HttpRequest()
    request.META = {"SERVER_NAME": server[0], "SERVER_PORT": server[1]}
    for key, value in (("HTTP_HOST", host), ("HTTP_X_FORWARDED_HOST", forwarded)):
        if value:
            request.META[key] = value
    try:
        request.get_host()
    except DisallowedHost:
        return False
    return True


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body; None once it passes DATA_UPLOAD_MAX_MEMORY_SIZE (the rest is dropped)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Aborted
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is None or size <= limit:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks) if limit is None or size <= limit else None


def _arguments(verb: str, body: bytes | None) -> Request | HttpResponse:
    """The verb's body, parsed and validated as ninja does; or the problem that refuses it."""
    schema = ClaimIn if verb == CLAIM else CREATES[verb] if verb in CREATES else BY_ID[verb][0]
    if body is None:
        return problems.too_large_response()
    if not body:
        # The views take the body as optional where every field has a default (api/views.py).
        if not any(field.is_required() for field in schema.model_fields.values()):
            return schema()
        return problems.invalid_fields_response([([], "Field required")])
    try:
        return schema.model_validate(problems.parse_json(body))
    except TodoError as error:
        return problems.todo_error_response(error, "")
    except ValidationError as error:
        found = [([str(part) for part in item["loc"]], item["msg"]) for item in error.errors()]
        return problems.invalid_fields_response(found)
