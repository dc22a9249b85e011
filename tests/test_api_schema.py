"""The agents' OpenAPI document states what the server holds a request to, tried by Schemathesis.

Schemathesis generates requests from /api/openapi.json, valid and invalid ones, and sends them
with an agent's token to a live server, every check on: no 5xx; no request the schema allows
refused (the schema used to allow an empty queue, a ttl of 0, a null body, any text as a todo
id); none it forbids taken; every answer, problems included (application/problem+json), as
documented; and, following the schema's links from a claim to the holder's verbs, a real agent
loop. Before, it found a refused valid request on 8 of the 9 operations; later, served by the
example project, a plain-text 404 for a todo id with a line break in it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connections

from switchboard_todos.agents import accounts
from switchboard_todos.models import Agent, Todo
from tests.asgi import serve

pytestmark = pytest.mark.django_db(transaction=True)

#: Test cases per operation and phase: about a minute on two cores.
EXAMPLES = 40


def test_schemathesis_finds_no_failure_with_every_check_on(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    agent, token = accounts.create_agent("fuzzer", claim_queues=["jobs"], create_queues=["jobs"])
    # Todos to claim at once (a claim that finds none long-polls), and quotas that stay out of
    # the way: their answers (429) are allowed, but would cut the runs short.
    Agent.objects.filter(pk=agent.pk).update(
        max_held=1_000_000, max_creates_per_minute=1_000_000, max_attempts_limit=1000
    )
    Todo.objects.enqueue_many(
        {"queue": "jobs", "kind": "job", "payload": {"n": n}} for n in range(2000)
    )
    connections.close_all()
    # The example project's application: the router in front of Django (and MCP) a project
    # serves, where a todo id with a line break in it once met Starlette's plain-text 404.
    served_app = "example_project.asgi:application"
    with serve({**subprocess_env, "DATABASE_POOL_SIZE": "4"}, app=served_app) as (base, process):
        hooks = {**subprocess_env, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks"}
        run = subprocess.run(
            [
                sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json",
                "--checks", "all",
                "--header", f"Authorization: Bearer {token}",
                "--max-examples", str(EXAMPLES),
                # One: Hypothesis parses its lambdas' source (ast.parse) as it draws, and on
                # the CPython 3.11 here two threads parsing at once can raise SystemError ("AST
                # constructor recursion depth mismatch", cpython gh-106905): it failed a run.
                "--workers", "1",
                "--request-timeout", "30",  # a claim's long poll waits up to 20 s
                "--generation-database", "none",
                "--no-color",
            ],
            cwd=tmp_path, env=hooks, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        process.terminate()
        served = process.communicate(timeout=30)[0]
    assert run.returncode == 0, run.stdout[-30_000:] + run.stderr[-5_000:]
    assert "Selected: 10/10" in run.stdout and "Tested: 10" in run.stdout, run.stdout
    assert "Traceback" not in served, served
