"""Handlers the worker tests run, in process or in a `todo_worker --import-module` child."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from switchboard_todos.exceptions import TodoCancelled
from switchboard_todos.handlers import handler, report_progress, todo_cancelled
from switchboard_todos.models import Todo

#: A file name as os.fsdecode gives it for bytes that are not UTF-8: with a lone surrogate.
BAD_NAME = os.fsdecode(b"report-\xff.csv")
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
    raise ValueError(todo.payload.get("message", f"boom on attempt {todo.attempt}"))


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


@handler("test.poison_message")
def poison_message(todo: Todo) -> None:
    """Fails with a message PostgreSQL cannot store: a lone surrogate from a bad file name."""
    raise OSError(f"cannot open {BAD_NAME}")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


@handler("test.poison_str")
def poison_str(todo: Todo) -> None:
    """Fails with an exception whose str() raises."""
    raise Unprintable("hidden")


@handler("test.poison_result")
def poison_result(todo: Todo) -> dict[str, Any]:
    """Returns text PostgreSQL cannot store: it is stored escaped."""
    return {"file": BAD_NAME, "nul": "a\x00b"}


@handler("test.hang", timeout=0.5)
def hang(todo: Todo) -> dict[str, Any]:
    """A gated handler with a timeout of half a second: it hangs until the test opens the gate."""
    wait_for_gate(todo.payload["started"], todo.payload["gate"], f"{todo.id} {todo.attempt}")
    return {"late": True}


@handler("test.cancellable")
def cancellable(todo: Todo) -> dict[str, Any]:
    """Report its progress until an operator cancels the todo, then write the last step to the
    file `stopped` and return a result, which the worker must drop."""
    with Path(todo.payload["started"]).open("a") as marker:
        marker.write(f"{todo.id} {todo.attempt}\n")
    deadline = time.monotonic() + GATE_TIMEOUT
    step = 0
    try:
        while not todo_cancelled():
            if time.monotonic() > deadline:
                raise TimeoutError("never cancelled")
            step += 1
            report_progress({"step": step})  # raises TodoCancelled once cancelled
            time.sleep(0.02)
    except TodoCancelled:
        pass
    Path(todo.payload["stopped"]).write_text(str(step))
    return {"late": step}


@handler("test.stubborn")
def stubborn(todo: Todo) -> dict[str, Any]:
    """A gated handler that never asks whether it was cancelled."""
    wait_for_gate(todo.payload["started"], todo.payload["gate"], f"{todo.id} {todo.attempt}")
    return {"late": True}


@handler("test.traced")
def traced(todo: Todo) -> dict[str, Any]:
    """The trace its handler runs in, and the baggage it sees (tests/test_tracing.py)."""
    from opentelemetry import baggage, trace

    span = trace.get_current_span().get_span_context()
    return {"trace_id": f"{span.trace_id:032x}", "baggage": dict(baggage.get_all())}
