"""`manage.py todo_mcp --agent NAME`: the MCP tools over stdio, for an agent on this machine."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

import anyio
from django.core.management.base import BaseCommand, CommandError

from switchboard_todos.exceptions import NotAuthenticated
from switchboard_todos.mcp.server import build_server
from switchboard_todos.mcp.threads import close_threads, request_scope
from switchboard_todos.models import Agent


async def named_agent(name: str) -> Agent:
    """The active agent called `name`; looked up at each call, so a revocation applies at once."""
    agent = await Agent.objects.filter(name=name).afirst()
    if agent is None:
        raise NotAuthenticated(f"No agent is named {name!r}.")
    if not agent.is_active:
        raise NotAuthenticated(f"Agent {name!r} was revoked.")
    return agent


class Command(BaseCommand):
    help = (
        "Serve the queue's MCP tools over stdio as the agent NAME, which must be active: an "
        "MCP client starts this command and speaks to it on stdin and stdout until it closes "
        "stdin. Whoever can run manage.py can act as any agent; remote agents use the HTTP "
        "endpoint and their token instead."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--agent", required=True, metavar="NAME", help="The agent to act as.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            anyio.run(self.serve, options["agent"])
        finally:
            close_threads()  # the connections the tool calls' threads keep, closed as it ends

    async def serve(self, name: str) -> None:
        try:
            async with request_scope():
                await named_agent(name)
        except NotAuthenticated as error:
            raise CommandError(f"{error} `manage.py todo_agent list` shows the agents.") from None
        await build_server(lambda: named_agent(name)).run_stdio_async()
