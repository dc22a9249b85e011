"""The agents' API without the project's middleware: a lean ASGI handler in front of Django.

Agents authenticate each request with a bearer token, so a project's browser middleware
(sessions, CSRF, authentication, messages) does nothing for them; under ASGI each such
synchronous middleware still costs two hops between threads per request, and the API pays
them twice per todo (claim, complete). `lean_api(application)` sends the requests under the
API's prefix to Django's own ASGI handler loaded with no middleware, and everything else to
`application` unchanged:

    application = lean_api(get_asgi_application(), prefix="/api/")

The request's Host is still checked against ALLOWED_HOSTS (a 400 otherwise), as
CommonMiddleware would. Middleware the API must keep (a proxy's, say) belongs around the
returned application, or in front of it in the ASGI server. docs/agents.md has the figures.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class APIHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain (URLconf, views and signals as
    always: `request_finished` still gives each request's connection back)."""

    def load_middleware(self, is_async: bool = False) -> None:
        # BaseHandler.load_middleware with an empty MIDDLEWARE: these are its attributes.
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._checked_host)

    async def _checked_host(self, request: HttpRequest) -> HttpResponseBase:
        request.get_host()  # DisallowedHost: a 400, as behind CommonMiddleware
        response: HttpResponseBase = await self._get_response_async(request)  # type: ignore[attr-defined]
        return response


def lean_api(application: ASGIApp, *, prefix: str) -> ASGIApp:
    """`application`, with the HTTP requests whose path starts with `prefix` served by
    `APIHandler` instead."""
    api = APIHandler()

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefix):
            await api(scope, receive, send)
        else:
            await application(scope, receive, send)

    return dispatch
