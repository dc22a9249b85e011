"""Handlers the worker tests run, in process or in a `todo_worker --import-module` child."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from switchboard_todos.handlers import handler
from switchboard_todos.models import Todo

#: How long a gated handler waits for its gate before giving up.
GATE_TIMEOUT = 60.0


@handler("test.echo")
def echo(todo: Todo) -> Any:
    return todo.payload


@handler("test.noop")
def noop(todo: Todo) -> None:
    return None


@handler("test.boom")
def boom(todo: Todo) -> None:
    raise ValueError(f"boom on attempt {todo.attempt}")


@handler("test.not_json")
def not_json(todo: Todo) -> dict[str, Any]:
    return {"when": object()}


@handler("test.async")
async def asynchronous(todo: Todo) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"async": True, "attempt": todo.attempt}


@handler("test.sleep")
def sleep(todo: Todo) -> dict[str, Any]:
    time.sleep(todo.payload["seconds"])
    return {"slept": todo.payload["seconds"]}


@handler("test.gate")
def gate(todo: Todo) -> dict[str, Any]:
    """Record the start in the file `started`, then wait until the file `gate` exists."""
    wait_for_gate(todo.payload["started"], todo.payload["gate"], f"{todo.id} {todo.attempt}")
    return {"gated": todo.attempt}


def wait_for_gate(started: str, gate: str, line: str) -> None:
    with Path(started).open("a") as marker:
        marker.write(f"{line}\n")
    deadline = time.monotonic() + GATE_TIMEOUT
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.01)
