"""A worker process whose todo an operator cancels: its handler is told at the next heartbeat,
the worker stops waiting for it, and nothing more is stored for the todo. Its progress notes
reach the todo with the heartbeats."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from switchboard_todos.models import State, Todo
from tests.helpers import open_gate, started_lines, wait_until
from tests.test_worker_process import Child, Spawn

pytestmark = pytest.mark.django_db(transaction=True)

#: The lease of the workers below: a heartbeat every second.
TTL = 3.0
CANCELLED = {"type": "Cancelled", "message": "wrong customer"}


def progress_of(todo: Todo) -> object:
    return Todo.objects.values_list("progress", flat=True).get(pk=todo.pk)


def test_a_cancelled_handler_stops_at_the_next_heartbeat(
    spawn: Spawn, gate: dict[str, str], tmp_path: Path
) -> None:
    """The handler's progress notes reach the todo; once cancelled, the next heartbeat tells
    the handler (todo_cancelled, or TodoCancelled at report_progress), which returns; its
    result is dropped, and the worker goes on with other todos."""
    stopped = tmp_path / "stopped"
    todo, _ = Todo.objects.create_todo(
        kind="test.cancellable", payload={**gate, "stopped": str(stopped)}
    )
    child = Child(spawn, "--ttl", str(TTL), "--owner", "w-cancel")
    wait_until(lambda: started_lines(gate), "the handler to start")
    note = wait_until(lambda: progress_of(todo), "a progress note from a heartbeat")
    assert isinstance(note, dict) and note["step"] >= 1

    Todo.objects.cancel(todo.id, "wrong customer")
    cancelled_at = time.monotonic()
    wait_until(stopped.exists, "the handler to stop", timeout=TTL / 3 + 5)
    assert time.monotonic() - cancelled_at < TTL / 3 + 2  # a beat, and the beat thread's pause
    wait_until(lambda: child.said("cancelled by an operator"), "the worker to say so")

    after, _ = Todo.objects.create_todo(kind="test.noop")
    wait_until(lambda: Todo.objects.get(pk=after.pk).state == State.DONE, "the next todo done")
    dead = Todo.objects.get(pk=todo.pk)
    assert (dead.state, dead.owner, dead.result) == (State.FAILED, "w-cancel", CANCELLED)
    assert [entry["error"] for entry in dead.errors] == [CANCELLED]
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0, child.output
    assert "cancelled=1" in child.output and "lost=0" in child.output, child.output
    assert child.output.count("cancelled by an operator") == 1, child.output


def test_the_worker_stops_waiting_for_a_handler_that_ignores_the_cancel(
    spawn: Spawn, gate: dict[str, str]
) -> None:
    """With one runner, a handler that never asks keeps its thread, not the worker's slot: the
    next todo runs meanwhile, and what the handler returns at last is dropped."""
    todo, _ = Todo.objects.create_todo(kind="test.stubborn", payload=gate)
    child = Child(spawn, "--ttl", str(TTL), "--concurrency", "1")
    wait_until(lambda: started_lines(gate), "the handler to start")
    Todo.objects.cancel(todo.id, "wrong customer")
    after, _ = Todo.objects.create_todo(kind="test.noop")
    wait_until(
        lambda: Todo.objects.get(pk=after.pk).state == State.DONE,
        "the next todo to run beside the cancelled handler",
        timeout=TTL / 3 + 10,
    )
    open_gate(gate)
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0, child.output
    dead = Todo.objects.get(pk=todo.pk)
    assert (dead.state, dead.result) == (State.FAILED, CANCELLED)
    assert "cancelled=1" in child.output and "done=1" in child.output, child.output


def test_a_success_before_a_cancelled_handler_is_stored(spawn: Spawn, gate: dict[str, str]) -> None:
    """A todo that succeeded just before, in the same batch, a handler the worker stops waiting
    for, awaits its acknowledgement on the abandoned runner: the fresh runner stores it, rather
    than the heartbeats keeping its lease while the stuck handler runs on."""
    child = Child(spawn, "--ttl", str(TTL), "--concurrency", "1")
    first, _ = Todo.objects.create_todo(kind="test.noop")
    wait_until(lambda: Todo.objects.get(pk=first.pk).state == State.DONE, "a first todo done")
    (quick, _), (stuck, _) = Todo.objects.create_many(
        [{"kind": "test.noop", "priority": 1}, {"kind": "test.stubborn", "payload": gate}]
    )
    wait_until(lambda: started_lines(gate), "the stuck handler to start")
    # Its success awaits the batch's acknowledgement behind the stuck handler.
    assert Todo.objects.get(pk=quick.pk).state == State.CLAIMED
    Todo.objects.cancel(stuck.id, "wrong customer")
    wait_until(
        lambda: Todo.objects.get(pk=quick.pk).state == State.DONE,
        "the quick todo stored while the stuck handler runs",
        timeout=TTL * 3,
    )
    assert not Path(gate["gate"]).exists()
    open_gate(gate)
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0, child.output
    assert "done=2" in child.output and "cancelled=1" in child.output, child.output
