"""The MCP tools over streamable HTTP, behind the agents' bearer tokens.

`streamable_http()` returns the endpoint's ASGI app and the lifespan its session manager needs.
Django's ASGI handler refuses lifespan events, so the application that serves both (see the
example project's asgi.py) runs that lifespan itself and routes the endpoint's path here.
The endpoint answers only the hosts Django's ALLOWED_HOSTS accepts (a DNS-rebinding guard).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ConfigDict
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from switchboard_todos.agents import service
from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.mcp.server import build_server, request_scope
from switchboard_todos.models import Agent


class AgentToken(AccessToken):
    """A verified bearer token, and the agent it belongs to."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    agent: Agent


class AgentTokens:
    """The SDK's token verifier: a bearer token is valid when it is an active agent's."""

    async def verify_token(self, token: str) -> AgentToken | None:
        async with request_scope():
            try:
                agent = await service.aauthenticate(token)
            except NotAuthenticated:
                return None
        return AgentToken(token=token, client_id=agent.name, scopes=[], agent=agent)


async def token_agent() -> Agent:
    """The agent of this request's bearer token, verified when the request came in."""
    token = get_access_token()
    if not isinstance(token, AgentToken):  # only requests that passed RequireAuthMiddleware
        raise NotAuthenticated("No verified token came with this call.")
    return token.agent


class AllowedHosts:
    """Refuses requests whose Host header Django's ALLOWED_HOSTS does not accept (421)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        domain, _ = split_domain_port(host)
        if not (domain and validate_host(domain, allowed_hosts())):
            response = PlainTextResponse("Invalid Host header", status_code=421)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS as Django applies it: with DEBUG on and none set, the local names."""
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


@dataclass(frozen=True)
class Endpoint:
    """An MCP endpoint: `app` serves `path` while `lifespan()` runs (once per process)."""

    app: ASGIApp
    path: str
    session_manager: StreamableHTTPSessionManager

    def lifespan(self) -> AbstractAsyncContextManager[None]:
        return self.session_manager.run()


def streamable_http(path: str = "/mcp") -> Endpoint:
    """The MCP tools at `path`, each call acting as the agent of the request's bearer token.

    Every request needs `Authorization: Bearer <agent token>` (401 with `WWW-Authenticate:
    Bearer` otherwise), checked at each; a session stays bound to the agent that opened it.
    """
    server = build_server(token_agent)
    # The Host check is AllowedHosts' (Django's semantics); the SDK's would accept only
    # localhost names.
    mcp = server.streamable_http_app(
        streamable_http_path=path,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    app = AuthenticationMiddleware(
        AuthContextMiddleware(RequireAuthMiddleware(mcp, required_scopes=[])),
        backend=BearerAuthBackend(AgentTokens()),
    )
    return Endpoint(AllowedHosts(app), path, server.session_manager)
