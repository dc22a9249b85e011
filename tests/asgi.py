"""The test settings' ASGI application, and `serve()`: uvicorn running it in a subprocess.

The live-server tests and the HTTP benchmark talk to it as remote agents would.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.core.asgi import get_asgi_application

#: Django's own application, and the one served: the agent loop's verbs answered in front of it.
django_application = get_asgi_application()

from switchboard_todos.api.asgi import AgentsAPIFirst  # noqa: E402 (uses the models)
from switchboard_todos.sqs.mount import SQSAnywhere  # noqa: E402

#: SQS at any path (kombu's `sqs://host:port` posts to `/`), and the agent loop's verbs.
application = SQSAnywhere(AgentsAPIFirst(django_application))

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def serve(
    env: dict[str, str], *, workers: int = 1, app: str = "tests.asgi:application"
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """uvicorn serving `app` (this module's `application`) in `workers` processes with
    environment `env`; the API's base URL once it answers, and the process.

    The process is stopped on leaving; its output (warnings and up) is on its `stdout`.
    """
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, "--port", str(port),
         "--workers", str(workers), "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/openapi.json").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"uvicorn did not start: {process.communicate()[0]}")
            time.sleep(0.1)
        yield base, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


@contextmanager
def serve_mcp(app: str = "example_project.asgi:application", **environment: str) -> Iterator[str]:
    """uvicorn serving `app`, which has the MCP endpoint at /mcp, with the test database and
    `environment`; the endpoint's URL once it answers. The server must stop cleanly."""
    from tests.conftest import child_environment

    env = {**child_environment(), "DATABASE_POOL_SIZE": "4", **environment}  # as docs/agents.md
    with serve(env, app=app) as (base, process):
        yield base.removesuffix("/api") + "/mcp"
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0]
    # uvicorn shuts down gracefully, then dies of the signal it got, as a good process does.
    assert process.returncode == -signal.SIGTERM and "Traceback" not in output, output
