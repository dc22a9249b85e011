"""The remote agent of `manage.py demo`: its account, its queue's todos, its client settings.

The demo gives the agent `demo-agent` the queue `agents` (a new token each run), seeds a few
todos there, and runs `example_project.mcp_agent` with the token, which drains the queue over
MCP; the admin shows those todos claimed and completed by `demo-agent`. It also prints the
settings an MCP client (a desktop assistant, a coding agent) needs to act as that agent.
"""

from __future__ import annotations

import json
import os
import sys

from devtools.processes import MANAGE
from switchboard_todos.agents.accounts import create_agent, rotate_token
from switchboard_todos.models import Agent, Todo

AGENT = "demo-agent"
QUEUE = "agents"
TEXTS = (
    "MCP has no server-to-client push, so an agent drains its own list on its own loop.",
    "A lease expires when its holder stops heartbeating; the todo comes back by itself.",
    "An idempotency key turns a duplicate delivery into the todo already there.",
)


def agent_token() -> str:
    """A new token for the demo's agent, made on the first run: the only copy there is."""
    agent = Agent.objects.filter(name=AGENT).first()
    if agent is None:
        return create_agent(AGENT, claim_queues=[QUEUE], create_queues=[QUEUE])[1]
    return rotate_token(agent)


def seed_agent_todos(run_id: str) -> list[Todo]:
    """Todos for the agent: count the words of a sentence."""
    return [
        Todo.objects.create_todo(
            queue=QUEUE,
            kind="agent.count_words",
            title=f"Count the words of sentence {number}",
            payload={"text": text},
            idempotency_key=f"demo-{run_id}-agent-{number}",
        )[0]
        for number, text in enumerate(TEXTS, 1)
    ]


def client_settings(base: str, token: str) -> str:
    """How to point an MCP client at the demo, as the agent: over HTTP, or over stdio."""
    http = {"type": "http", "url": f"{base}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
    stdio = {
        "command": sys.executable,
        "args": [str(MANAGE), "todo_mcp", "--agent", AGENT],
        "env": {"DEBUG": "1", "DATABASE_URL": os.environ.get("DATABASE_URL", "")},
    }
    return "\n".join(
        [
            "MCP client settings (mcpServers of .mcp.json, claude_desktop_config.json...):",
            json.dumps({"mcpServers": {"switchboard-todos": http}}, indent=2),
            "or, on this machine, over stdio:",
            json.dumps({"mcpServers": {"switchboard-todos": stdio}}, indent=2),
        ]
    )
