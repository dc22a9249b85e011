"""Django's HTTPS settings, applied by the surfaces that answer agents in front of Django's
handler (the API's verbs, SQS, MCP): each decides as the project's SecurityMiddleware would.

Django's own code decides: whether the request is secure (SECURE_PROXY_SSL_HEADER), its
redirect (SECURE_SSL_REDIRECT, SECURE_SSL_HOST, SECURE_REDIRECT_EXEMPT), and the headers of the
answer (SECURE_HSTS_*, and the others the middleware sets).
"""

from __future__ import annotations

import io
from collections.abc import MutableMapping
from typing import Any, NamedTuple

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.middleware.security import SecurityMiddleware

#: The middleware whose presence in MIDDLEWARE asks for its headers on every answer.
SECURITY_MIDDLEWARE = "django.middleware.security.SecurityMiddleware"


class HTTPS(NamedTuple):
    """The request as Django sees it, and the project's SecurityMiddleware."""

    request: HttpRequest
    middleware: SecurityMiddleware


def https_of(scope: MutableMapping[str, Any]) -> HTTPS | None:
    """Django's SecurityMiddleware for this ASGI request, when the project installs it or asks
    for HTTPS (SECURE_SSL_REDIRECT); None otherwise, at no cost. Its `process_request` is the
    redirect of a plain-HTTP request (or None), `process_response` the headers of an answer.
    A Host that ALLOWED_HOSTS refuses raises DisallowedHost, as in Django."""
    if not (settings.SECURE_SSL_REDIRECT or SECURITY_MIDDLEWARE in settings.MIDDLEWARE):
        return None
    return HTTPS(ASGIRequest(scope, io.BytesIO()), SecurityMiddleware(_no_view))


def _no_view(request: HttpRequest) -> HttpResponse:
    raise AssertionError("The middleware's own methods are called, never its view.")
