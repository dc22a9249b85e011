"""Graphs of todos worked by real worker processes: fan-out, fan-in, and a worker killed as it
completes the last parent."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import pytest
from django.db import connection
from django.db.models import Max

from switchboard_todos.models import State, Todo
from tests.helpers import OutputLines, open_gate, started_lines, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Spawn = Callable[..., "subprocess.Popen[str]"]


class Worker(OutputLines):
    """A `manage.py todo_worker` process of one queue, its log lines collected."""

    def __init__(self, spawn: Spawn, *args: str, queue: str = "graph") -> None:
        self.process = spawn(
            "manage",
            "todo_worker",
            "--import-module",
            "tests.worker_handlers",
            "--queue",
            queue,
            *args,
        )
        super().__init__(self.process.stderr)


def test_four_workers_drain_a_fan_out_and_a_fan_in(spawn: Spawn) -> None:
    """One parent of 1,000 children, and 1,000 parents of one child: each todo done once, and
    the merging todo claimed only after its last parent, at once (its notification)."""
    [(root, _), *_] = Todo.objects.create_many(
        [{"queue": "graph", "kind": "test.noop", "ref": "root"}]
        + [
            {"queue": "graph", "kind": "test.noop", "ref": f"part{n}", "after": ["root"]}
            for n in range(1000)
        ]
        + [
            {
                "queue": "graph",
                "kind": "test.noop",
                "ref": "merge",
                "after": [f"part{n}" for n in range(1000)],
            }
        ]
    )
    merge = Todo.objects.get(kind="test.noop", waiting_for=1000)
    workers = [Worker(spawn, "--concurrency", "2") for _ in range(4)]
    done = Todo.objects.filter(queue="graph", state=State.DONE)
    wait_until(lambda: done.count() == 1002, "the graph to drain", timeout=120)
    assert set(done.values_list("attempt", flat=True)) == {1}, workers[0].output
    merge.refresh_from_db()
    last_part = done.exclude(pk__in=[root.id, merge.id]).aggregate(Max("completed_at"))
    assert merge.claimed_at is not None and last_part["completed_at__max"] is not None
    assert merge.claimed_at >= last_part["completed_at__max"]
    assert (merge.claimed_at - last_part["completed_at__max"]).total_seconds() < 1.0


def test_a_worker_killed_as_it_completes_the_last_parent_leaves_no_child_blocked(
    spawn: Spawn, gate: dict[str, str]
) -> None:
    """The completion and the unblock are one statement: no moment shows the parent done and
    the child still waiting; the worker killed right after, a worker of the child's queue
    takes it."""
    parent, _ = Todo.objects.create_todo(queue="graph", kind="test.gate", payload=gate)
    child, _ = Todo.objects.create_todo(queue="next", kind="test.noop", after=[parent.id])
    first = Worker(spawn, "--batch", "1")
    wait_until(lambda: started_lines(gate), "the parent's handler to start")
    open_gate(gate)
    seen: list[tuple[str, int, str]] = []
    with connection.cursor() as cursor:
        while not seen or seen[-1][0] != State.DONE:
            cursor.execute(
                "SELECT parent.state, child.waiting_for, child.state FROM todos AS parent,"
                " todos AS child WHERE parent.id = %s AND child.id = %s",
                [parent.id, child.id],
            )
            seen.append(cursor.fetchone())
    assert all(waiting == 0 for state, waiting, _ in seen if state == State.DONE), seen
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
    Worker(spawn, queue="next")
    wait_until(
        lambda: Todo.objects.filter(pk=child.id, state=State.DONE).exists(),
        "another worker to run the child",
    )
