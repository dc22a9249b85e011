"""ASGI entry point of the example project: Django, and the MCP endpoint at /mcp.

A small Starlette router sends /mcp to the MCP tools (bearer tokens of the agents) and
everything else (admin, webhooks, /api/, /sqs/) to Django, with the agent loop's verbs of /api/
answered in front of Django's handler (AgentsAPIFirst, docs/agents.md) and SQS requests
answered at any path (SQSAnywhere, docs/sqs.md). It also runs the MCP
session manager's lifespan, which Django's ASGI handler refuses to. Serve it with any ASGI
server:

    uvicorn example_project.asgi:application
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application
from starlette.routing import Route, Router
from starlette.types import ASGIApp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

django = get_asgi_application()
if settings.DEBUG:  # the admin's CSS and JavaScript, as runserver serves them
    django = ASGIStaticFilesHandler(django)

# Imported once Django is set up: they use the models.
from switchboard_todos.api.asgi import AgentsAPIFirst  # noqa: E402
from switchboard_todos.mcp.http import streamable_http  # noqa: E402
from switchboard_todos.sqs.mount import SQSAnywhere  # noqa: E402

mcp = streamable_http("/mcp")
site = AgentsAPIFirst(django)
# SQS at any path as well as /sqs/: Celery's `sqs://host:port` posts to / (docs/celery.md).
sqs = SQSAnywhere(site)


@asynccontextmanager
async def lifespan(app: object) -> AsyncIterator[None]:
    async with mcp.lifespan():
        try:
            yield
        finally:
            site.close()  # the connections the agents' API threads keep
            sqs.close()  # and the SQS endpoint's


# Everything but /mcp goes to Django as it came, whatever its path: a Mount("/") matches no path
# with a line break inside (Starlette's own text 404, not the API's problem) and mangles the
# root path of one that ends with it, and redirect_slashes would answer some with a redirect.
application = Router(
    routes=[Route(mcp.path, mcp.app)],
    default=cast(ASGIApp, sqs),
    redirect_slashes=False,
    lifespan=lifespan,
)
