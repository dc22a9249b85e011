"""django.tasks tasks the backend and worker tests enqueue (module paths tests.tasks.*)."""

from __future__ import annotations

import asyncio
from typing import Any

from switchboard_todos.compat import TaskContext, task
from tests.worker_handlers import wait_for_gate


@task
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def attempts(context: TaskContext[Any, Any], fail_until: int) -> dict[str, Any]:
    """Fail until attempt `fail_until`, then report what the context said."""
    if context.attempt < fail_until:
        raise ValueError(f"attempt {context.attempt} fails")
    result = context.task_result
    return {"attempt": context.attempt, "worker_ids": result.worker_ids, "id": result.id}


@task
def explode() -> None:
    raise KeyError("always")


@task
async def async_double(value: int) -> int:
    await asyncio.sleep(0)
    return value * 2


@task
def not_json() -> object:
    return object()


@task
def gated(started: str, gate: str) -> str:
    wait_for_gate(started, gate, "task")
    return "through"


def _renamed() -> None:
    """Decorated under another name: its module path does not import back as the Task."""


renamed = task(_renamed)
