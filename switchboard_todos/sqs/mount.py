"""Where the SQS endpoint is served: at the path the URLconf mounts it, and with `SQSAnywhere`,
at every path a client posts SQS to.

A client's endpoint is whatever URL it was given, and not every client lets it carry a path:
kombu (Celery's SQS transport) builds its endpoint from the broker URL's host and port only,
so `sqs://host:port` posts to `/`. SQS requests are recognisable by their header alone
(`X-Amz-Target: AmazonSQS.<Action>`, AWS JSON 1.0), so `SQSAnywhere` sends every POST carrying
it to the endpoint the URLconf mounts, whatever its path, through Django's handler as any other
request (middleware, connections). The path the client posted to is kept in the scope: the
SigV4 signature covers it, and the queue URLs are built on it.

A queue's URL is the endpoint's URL as the client reached it, followed by the queue's name:
`<endpoint>/jobs`. JSON clients post every action to their endpoint with the queue URL in the
body, and read only the URL's last segment as the queue's name (kombu, dramatiq-sqs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.urls import NoReverseMatch, get_script_prefix, reverse
from django.utils.encoding import escape_uri_path

Scope = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]

#: The URL name of the endpoint (sqs/urls.py).
ENDPOINT = "switchboard_todos_sqs:endpoint"
#: The scope key holding the path a request was posted to, when SQSAnywhere sent it on to the
#: endpoint's path.
POSTED_PATH = "switchboard_todos.sqs.posted_path"
#: The header every SQS request of the JSON protocol carries, and its value's prefix.
TARGET = b"x-amz-target"
PREFIX = b"AmazonSQS."


class SQSAnywhere:
    """ASGI: every POST with `X-Amz-Target: AmazonSQS.*` answered by the SQS endpoint, at any
    path; every other request passed on unchanged.

    `application = SQSAnywhere(get_asgi_application())`, with the URLconf including
    `switchboard_todos.sqs.urls` (at `sqs/` or anywhere): then `sqs://host:port` (kombu),
    `endpoint_url="http://host:port"` and `endpoint_url="http://host:port/sqs/"` all work.
    """

    def __init__(self, application: ASGIApp) -> None:
        self.application = application
        self._endpoint: str | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and _is_sqs(scope):
            root = scope.get("root_path", "")
            endpoint = root + self.endpoint_path()
            if not scope["path"].startswith(endpoint):
                scope = {
                    **scope,
                    "path": endpoint,
                    "raw_path": escape_uri_path(endpoint).encode(),
                    POSTED_PATH: scope["path"],
                }
        await self.application(scope, receive, send)

    def endpoint_path(self) -> str:
        """The endpoint's path in the URLconf, below the script prefix ("/sqs/")."""
        if self._endpoint is None:
            try:
                reversed_path = reverse(ENDPOINT)
            except NoReverseMatch:
                raise ImproperlyConfigured(
                    "SQSAnywhere sends SQS requests to the endpoint the URLconf mounts: add "
                    'path("sqs/", include("switchboard_todos.sqs.urls")) to it.'
                ) from None
            self._endpoint = "/" + reversed_path.removeprefix(get_script_prefix())
        return self._endpoint


def _is_sqs(scope: Scope) -> bool:
    return any(key == TARGET and value.startswith(PREFIX) for key, value in scope["headers"])


def posted_url(request: HttpRequest) -> str:
    """The URL the client posted to, as it signed it."""
    posted = _posted_path(request)
    if posted is None:
        return request.build_absolute_uri()
    query = request.META.get("QUERY_STRING", "")
    return request.build_absolute_uri(escape_uri_path(posted) + (f"?{query}" if query else ""))


def endpoint_url(request: HttpRequest) -> str:
    """The endpoint's URL as the client reached it, ending in a slash: the path it posted to,
    less the queue's name when that was a queue URL of the URLconf (`<endpoint><queue>`)."""
    path = _posted_path(request)
    if path is None:
        path = request.path
        match = request.resolver_match
        queue = match.kwargs.get("queue") if match is not None else None
        if isinstance(queue, str):
            path = path.removesuffix(queue)
    return request.build_absolute_uri(escape_uri_path(path.rstrip("/") + "/"))


def _posted_path(request: HttpRequest) -> str | None:
    scope = getattr(request, "scope", None)  # an ASGIRequest's; WSGI requests have none
    posted = scope.get(POSTED_PATH) if isinstance(scope, Mapping) else None
    return posted if isinstance(posted, str) else None
