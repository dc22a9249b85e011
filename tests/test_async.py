"""The async twins run the same transitions from async code."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from switchboard_todos.exceptions import TodoNotFound
from switchboard_todos.models import State, Todo
from switchboard_todos.sql import queries

pytestmark = pytest.mark.django_db(transaction=True)


def test_async_round_trip() -> None:
    """acreate_todo → aclaim_next → aheartbeat → acomplete, all from an event loop."""
    async_to_sync(round_trip)()


async def round_trip() -> None:
    todo, created = await Todo.objects.acreate_todo(kind="k", idempotency_key="a")
    assert created
    claimed = await Todo.objects.aclaim_next("default", "w1", 30)
    assert claimed is not None and claimed.id == todo.id
    await Todo.objects.aheartbeat(todo.id, "w1", 60)
    done = await Todo.objects.acomplete(todo.id, "w1", {"ok": True})
    assert done.state == State.DONE
    assert (await Todo.objects.areap_expired()).requeued == 0
    with pytest.raises(TodoNotFound):
        await Todo.objects.arequeue("td_missing")


def test_every_transition_has_an_async_twin() -> None:
    """Each public transition has its a-prefixed twin with the same docs."""
    transitions = [name for name in queries if hasattr(Todo.objects, name)] + ["claim_batch"]
    for name in transitions:
        twin = getattr(Todo.objects, f"a{name}")
        assert twin.__name__ == f"a{name}"
        assert name in (twin.__doc__ or "")
