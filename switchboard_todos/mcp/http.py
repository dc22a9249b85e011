"""The MCP tools over streamable HTTP, behind the agents' bearer tokens.

`streamable_http()` returns the endpoint's ASGI app and the lifespan its session manager needs.
Django's ASGI handler refuses lifespan events, so the application that serves both (see the
example project's asgi.py) runs that lifespan itself and routes the endpoint's path here.
The endpoint answers only the hosts Django's ALLOWED_HOSTS accepts (a DNS-rebinding guard),
only over HTTPS when the project says so (SECURE_SSL_REDIRECT), and holds each agent to
SWITCHBOARD_TODOS_AGENT_MAX_SESSIONS open sessions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from mcp.server.auth.middleware.bearer_auth import (
    AuthorizationContext,
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import REQUEST_CANCELLED, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import (
    DEFAULT_SESSION_IDLE_TIMEOUT,
    StreamableHTTPSessionManager,
)
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import INVALID_REQUEST, ErrorData, JSONRPCError, JSONRPCMessage
from pydantic import ConfigDict
from starlette.authentication import AuthenticationError
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchboard_todos import faults, tracing
from switchboard_todos.agents import disconnects, errors, service
from switchboard_todos.agents.https import https_of
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import NotAuthenticated, Throttled
from switchboard_todos.mcp.server import UNAVAILABLE, build_server, problem_text
from switchboard_todos.mcp.threads import close_threads, request_scope
from switchboard_todos.models import Agent

logger = logging.getLogger(__name__)


class AgentToken(AccessToken):
    """A verified bearer token, and the agent it belongs to."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    agent: Agent


#: Set for a request that is one call of a holder's tool (HolderCalls): its token is recognised.
_holder_call: ContextVar[bool] = ContextVar("holder_call", default=False)


class AgentTokens:
    """The SDK's token verifier: a bearer token is valid when it is an active agent's.

    The agent is read at every request, except for a call of a tool whose own statement checks
    the credential (HolderCalls): that one is recognised (agents/service/identity.py), as the
    HTTP API's fast path does, so that the call is one statement; and, when this process read
    the agent lately, on the event loop, so that the call's one hop to a thread is its verb's.
    """

    async def verify_token(self, token: str) -> AgentToken | None:
        holder_call = _holder_call.get()
        try:
            # A holder's agent read lately is answered here, without a hop to a thread.
            agent = service.recognised(token) if holder_call else None
            if agent is None:
                agent = await self._read(token, holder_call)
        except NotAuthenticated:
            return None
        return AgentToken(token=token, client_id=agent.name, scopes=[], agent=agent)

    async def _read(self, token: str, holder_call: bool) -> Agent:
        read = service.arecognise if holder_call else service.aauthenticate
        async with request_scope():
            try:
                return await read(token)
            except DatabaseError as error:
                if not faults.is_outage(error):
                    raise
                # The server's fault, not the token's: answered 503 (refused), not 401.
                logger.warning("Database unavailable to check an MCP token: %s", error)
                raise DatabaseUnavailable(UNAVAILABLE) from None


class DatabaseUnavailable(AuthenticationError):
    """A token that could not be checked, the database being down: answered 503."""


def refused(connection: HTTPConnection, error: AuthenticationError) -> Response:
    """The answer to a request whose token could not be checked: 503 with Retry-After when the
    database is down, as the HTTP API's `unavailable` problem; 400 otherwise, as Starlette's."""
    if isinstance(error, DatabaseUnavailable):
        return _json_rpc_error(503, str(error), {"Retry-After": "1"})
    return PlainTextResponse(str(error), status_code=400)


async def token_agent() -> Agent:
    """The agent of this request's bearer token, verified when the request came in."""
    token = get_access_token()
    if not isinstance(token, AgentToken):  # only requests that passed RequireAuthMiddleware
        raise NotAuthenticated("No verified token came with this call.")
    return token.agent


#: The W3C headers of a caller's trace context (tracing.remote).
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate", b"baggage"})


class TraceContext:
    """Makes the trace context of a request's `traceparent` header current (tracing.remote):
    the tool calls it carries, and the todos they create, join the caller's trace."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _TRACE_HEADERS
        }
        with tracing.remote(headers):
            await self.app(scope, receive, send)


#: The tools whose statement checks the caller's credential (`credential_holds`, sql/shared.sql),
#: and with them the claim from queues; a claim of one `todo_id` reads the agent.
HOLDER_TOOLS = frozenset({"heartbeat", "complete", "fail", "release"})
#: The largest body HolderCalls reads ahead of the SDK: a holder's call is small (a `complete`
#: result or a `fail` error past it simply reads the agent, as any other call does).
PEEK_MAX = 64 * 1024


class HolderCalls:
    """Tells AgentTokens which requests are one call of a holder's tool, from their JSON-RPC
    body, read here (at most PEEK_MAX bytes, by its Content-Length) and handed on unchanged.

    Such a call acts only through a statement that checks the credential itself, so its
    token is recognised, not read: revocation stays exact (identity.py). Anything else, a
    batch, a task-augmented call, a body whose keys repeat (which another parser might read
    otherwise), or one too long, reads the agent as before.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if not length.isdigit() or int(length) > PEEK_MAX:
            await self.app(scope, receive, send)
            return
        body, messages = b"", []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if len(body) > PEEK_MAX or not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        flag = _holder_call.set(len(body) <= PEEK_MAX and holder_call(body))
        try:
            await self.app(scope, replay, send)
        finally:
            _holder_call.reset(flag)


def holder_call(body: bytes) -> bool:
    """Whether a request body is a single JSON-RPC call of a holder's tool (HolderCalls)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) != len(pairs):
            raise ValueError("a key repeats")
        return found

    try:
        call = json.loads(body, object_pairs_hook=unique)
    except ValueError:
        return False
    if not isinstance(call, dict) or call.get("method") != "tools/call":
        return False
    params = call.get("params")
    if not isinstance(params, dict) or "task" in params:
        return False
    arguments = params.get("arguments")
    name = params.get("name")
    return name in HOLDER_TOOLS or (
        name == "claim" and isinstance(arguments, dict) and arguments.get("todo_id") is None
    )


class AllowedHosts:
    """Refuses requests whose Host header Django's ALLOWED_HOSTS does not accept (421)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        domain, _ = split_domain_port(host)
        if not (domain and validate_host(domain, allowed_hosts())):
            await _misdirected()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _misdirected() -> Response:
    return PlainTextResponse("Invalid Host header", status_code=421)


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS as Django applies it: with DEBUG on and none set, the local names."""
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


class HttpsOnly:
    """Refuses (403) the plain-HTTP requests that Django's SecurityMiddleware would redirect.

    The decision is that middleware's own, so it honours SECURE_SSL_REDIRECT,
    SECURE_PROXY_SSL_HEADER, SECURE_REDIRECT_EXEMPT and SECURE_SSL_HOST as the rest of the
    project does. Refused rather than redirected: such a request has already sent its bearer
    token in clear, and a redirect would let a misconfigured client go on doing that at every
    call; nor would the redirect work (fetch, under the clients, turns a redirected POST into a
    GET and drops the Authorization header on its way to the other origin, https).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        https = https_of(scope) if settings.SECURE_SSL_REDIRECT else None
        if https is not None:
            try:
                redirect = https.middleware.process_request(https.request)
            except DisallowedHost:  # X-Forwarded-Host, with USE_X_FORWARDED_HOST
                await _misdirected()(scope, receive, send)
                return
            if redirect is not None:
                message = (
                    "HTTPS required: this server takes MCP requests over HTTPS only; connect "
                    f"to {redirect['Location']}. This request went in clear, with any token it "
                    "carried: have that token rotated."
                )
                await _json_rpc_error(403, message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class AgentSessions(StreamableHTTPSessionManager):
    """The SDK's session manager, holding each agent to AGENT_MAX_SESSIONS open sessions.

    The SDK admits each new session (a request without a session id) in `_admit_session`, under
    its creation lock, and keeps whose it is in `_session_owners` until the session ends,
    however it ends: DELETE, the idle timeout, a crash, an opening request it refused. Counted
    there, the cap is exact and cannot be raced. (Both are the SDK's private names, which the
    live tests of the cap hold to the installed SDK.) There too, each session's transport is
    given its answer to a call its client cancelled (`_unless_cancelled`).
    """

    def __init__(self, server: Server[Any], idle_timeout: float) -> None:
        # The Host check is AllowedHosts' (Django's semantics); the SDK's would accept only
        # localhost names. A POST is answered with one JSON body, not an event stream: the
        # stream cost both ends more than the call, and what only it carried (a call's
        # notifications) no tool sends; a client's disconnect is watched in `serve`.
        super().__init__(
            server,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            session_idle_timeout=idle_timeout,
            json_response=True,
        )
        self.idle_timeout = idle_timeout

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request of the endpoint; past the agent's cap, 429 and Retry-After. The
        tool call it carries sees its client's disconnect (agents/disconnects.py)."""
        try:
            async with disconnects.watching(receive) as watched:
                await self.handle_request(scope, watched, send)
        except Throttled as error:
            message = problem_text(errors.THROTTLED, str(error), error.retry_after)
            headers = {"Retry-After": str(error.retry_after)}
            await _json_rpc_error(429, message, headers)(scope, receive, send)

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        if requestor is not None:
            name = requestor["client_id"]
            held = [
                session
                for session, owner in self._session_owners.items()
                if owner["client_id"] == name
            ]
            if len(held) >= conf.AGENT_MAX_SESSIONS:
                raise Throttled(
                    f"Agent {name!r} has {len(held)} MCP sessions open, the most it may have "
                    "(SWITCHBOARD_TODOS_AGENT_MAX_SESSIONS): use one of them, or end one it no "
                    "longer uses (HTTP DELETE with its Mcp-Session-Id) before opening another.",
                    retry_after=self._first_to_idle_out(held),
                )
        transport = super()._admit_session(requestor)
        if transport is not None:  # the SDK's private seam: the JSON answer of each request
            transport._create_json_response = partial(  # type: ignore[method-assign]
                _unless_cancelled, transport._create_json_response
            )
        return transport

    def _first_to_idle_out(self, sessions: list[str]) -> float:
        """Seconds before the first of `sessions` ends of idleness, if none is used meanwhile."""
        now = anyio.current_time()
        ends = [  # a session in use has no deadline (infinity) until its last request ends
            transport.idle_scope.deadline - now
            for transport in map(self._server_instances.get, sessions)
            if transport is not None and transport.idle_scope is not None
        ]
        return min([*ends, self.idle_timeout])


def _unless_cancelled(
    answer: Callable[..., Response], message: JSONRPCMessage | None, *args: Any, **kwargs: Any
) -> Response:
    """The SDK's JSON answer to a request; to a call its client cancelled, 202 and no body.

    The protocol says a cancelled request gets no response, and the SDK answers one with a
    REQUEST_CANCELLED error only to end its POST. The official Python client, closing its
    session with a call in flight, cancels the call and writes that answer to its closed
    stream, which fails its close (its event-stream path, and its handling of a 202, ignore
    it); a 202 ends the POST with nothing for any client to read.
    """
    if isinstance(message, JSONRPCError) and message.error.code == REQUEST_CANCELLED:
        return Response(status_code=202)
    return answer(message, *args, **kwargs)


def _json_rpc_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An HTTP error carrying a JSON-RPC error (as the SDK's own refusals), which clients show."""
    body = JSONRPCError(
        jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message)
    )
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


@dataclass(frozen=True)
class Endpoint:
    """An MCP endpoint: `app` serves `path` while `lifespan()` runs (once per process)."""

    app: ASGIApp
    path: str
    session_manager: StreamableHTTPSessionManager

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """The session manager's run; at its end, the tool calls' idle threads ended."""
        try:
            async with self.session_manager.run():
                yield
        finally:
            close_threads()


def streamable_http(
    path: str = "/mcp", *, session_idle_timeout: float = DEFAULT_SESSION_IDLE_TIMEOUT
) -> Endpoint:
    """The MCP tools at `path`, each call acting as the agent of the request's bearer token.

    Every request needs `Authorization: Bearer <agent token>` (401 with `WWW-Authenticate:
    Bearer` otherwise), checked at each; a session stays bound to the agent that opened it,
    and ends when its client ends it (DELETE) or after `session_idle_timeout` seconds without
    a request.
    """
    server = build_server(token_agent)
    # The low-level server under the tools, which the SDK's own streamable_http_app() would
    # hand its session manager: ours is the SDK's, capped per agent.
    sessions = AgentSessions(server._lowlevel_server, session_idle_timeout)
    app = HolderCalls(
        AuthenticationMiddleware(
            AuthContextMiddleware(RequireAuthMiddleware(sessions.serve, required_scopes=[])),
            backend=BearerAuthBackend(AgentTokens()),
            on_error=refused,
        )
    )
    return Endpoint(AllowedHosts(HttpsOnly(TraceContext(app))), path, sessions)
