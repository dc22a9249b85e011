"""Crash safety with real processes: a worker killed with SIGKILL loses nothing."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable

import pytest

from switchboard_todos.models import State, Todo
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Spawn = Callable[..., subprocess.Popen[str]]


def kill_while_holding(spawn: Spawn, todo: Todo) -> None:
    """A separate process claims `todo` with a one-second lease and is killed with SIGKILL."""
    victim = spawn("tests.client", "hold", "--queue", "crash", "--owner", "victim", "--ttl", "1")
    assert victim.stdout is not None
    assert victim.stdout.readline().strip() == todo.id
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)


def test_a_killed_workers_todo_is_requeued_by_the_reaper_and_completed_by_another(
    spawn: Spawn,
) -> None:
    """SIGKILL after claiming → the lease lapses → reap_expired requeues → another completes."""
    todo, _ = Todo.objects.create_todo(queue="crash", kind="k")
    kill_while_holding(spawn, todo)
    assert Todo.objects.get(pk=todo.pk).owner == "victim"

    wait_until(lambda: Todo.objects.reap_expired().requeued == 1, "the reaper to requeue it")
    requeued = Todo.objects.get(pk=todo.pk)
    assert (requeued.state, requeued.owner, requeued.attempt) == (State.PENDING, None, 1)

    rescuer = spawn("tests.client", "drain", "--queue", "crash", "--owner", "rescuer")
    out, err = rescuer.communicate(timeout=60)
    assert rescuer.returncode == 0, err
    assert json.loads(out)["completed"] == [todo.id]
    done = Todo.objects.get(pk=todo.pk)
    assert (done.state, done.owner, done.attempt) == (State.DONE, "rescuer", 2)
    assert [(entry["owner"], entry["error"]["type"]) for entry in done.errors] == [
        ("victim", "LeaseExpired")
    ]


def test_a_killed_workers_todo_is_taken_by_the_next_claim_without_a_reaper(
    spawn: Spawn,
) -> None:
    """With no reaper running, the claim scan itself picks up the lapsed lease."""
    todo, _ = Todo.objects.create_todo(queue="crash", kind="k")
    kill_while_holding(spawn, todo)

    claimed: list[Todo] = []

    def claim() -> bool:
        claimed.extend(Todo.objects.claim_batch("crash", "w2", 30, limit=1))
        return bool(claimed)

    wait_until(claim, "a claim by the rescuer")
    assert (claimed[0].id, claimed[0].attempt) == (todo.id, 2)


def test_a_lease_that_lapses_on_the_last_attempt_is_dead_lettered(spawn: Spawn) -> None:
    """A worker that dies on the final attempt leaves a dead letter, not a lost todo."""
    todo, _ = Todo.objects.create_todo(queue="crash", kind="k", max_attempts=1)
    kill_while_holding(spawn, todo)

    wait_until(lambda: Todo.objects.reap_expired().dead_lettered == 1, "a dead letter")
    dead = Todo.objects.get(pk=todo.pk)
    assert dead.state == State.FAILED
    assert dead.result is not None and dead.result["type"] == "LeaseExpired"
