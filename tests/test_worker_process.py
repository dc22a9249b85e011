"""The worker as a real process: SIGTERM drains, a second signal releases, SIGKILL and a
terminated database connection lose nothing."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest
from django.db import connection
from django.db.models.functions import Now

from switchboard_todos.compat import TaskResultStatus
from switchboard_todos.exceptions import LeaseExpired
from switchboard_todos.models import State, Todo
from switchboard_todos.worker import Worker
from tests import tasks
from tests.helpers import OutputLines, open_gate, started_lines, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Spawn = Callable[..., "subprocess.Popen[str]"]


class Child(OutputLines):
    """A `manage.py todo_worker` process whose log lines are collected as they come."""

    def __init__(self, spawn: Spawn, *args: str) -> None:
        self.process = spawn(
            "manage", "todo_worker", "--import-module", "tests.worker_handlers", *args
        )
        super().__init__(self.process.stderr)

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def exit_code(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout)
        self.join_reader(5)
        return code


def stopping(spawn: Spawn, gate: dict[str, str], *args: str) -> tuple[Todo, Child]:
    """A worker sent SIGTERM while its handler runs a gated todo, once it says it is stopping."""
    todo, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    child = Child(spawn, *args)
    wait_until(lambda: started_lines(gate), "the handler to start")
    child.signal(signal.SIGTERM)
    wait_until(lambda: child.said("stopping; the todos in hand finish first"), "the stop")
    return todo, child


def test_first_sigterm_drains_and_exits_zero(spawn: Spawn, gate: dict[str, str]) -> None:
    """SIGTERM: no more claims, the running todo finishes and is stored, exit status 0."""
    running, child = stopping(spawn, gate, "--concurrency", "2")
    later, _ = Todo.objects.create_todo(kind="test.noop")
    open_gate(gate)
    assert child.exit_code() == 0, child.output
    assert Todo.objects.get(pk=running.pk).state == State.DONE
    later.refresh_from_db()
    assert (later.state, later.claimed_at) == (State.PENDING, None)


def test_second_sigterm_releases_the_running_todo(spawn: Spawn, gate: dict[str, str]) -> None:
    """A second signal gives the running todo back (release, not fail) and exits 0 at once."""
    todo, child = stopping(spawn, gate, "--owner", "first")
    child.signal(signal.SIGINT)
    assert child.exit_code() == 0, child.output
    todo.refresh_from_db()
    assert (todo.state, todo.owner, todo.attempt, todo.errors) == (State.PENDING, None, 0, [])
    assert todo.next_retry_at == todo.updated_at  # due at once (release), not later
    open_gate(gate)


def test_the_shutdown_timeout_ends_a_drain_that_would_wait_forever(
    spawn: Spawn, gate: dict[str, str]
) -> None:
    """--shutdown-timeout: past it the first SIGTERM releases what still runs and exits 0."""
    todo, child = stopping(spawn, gate, "--shutdown-timeout", "0.5")
    assert child.exit_code() == 0, child.output
    assert child.said("did not finish within the shutdown timeout"), child.output
    todo.refresh_from_db()
    assert (todo.state, todo.owner, todo.attempt) == (State.PENDING, None, 0)
    open_gate(gate)


def test_sigkill_leaves_a_lease_that_lapses_to_another_worker(
    spawn: Spawn, gate: dict[str, str]
) -> None:
    """kill -9 mid-handler: the lease lapses and the next worker runs the todo again."""
    todo, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    child = Child(spawn, "--owner", "killed")
    wait_until(lambda: started_lines(gate), "the handler to start")
    child.process.kill()
    assert child.exit_code() == -signal.SIGKILL
    held = Todo.objects.get(pk=todo.pk)
    assert (held.state, held.owner) == (State.CLAIMED, "killed")
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now())  # its TTL has passed
    open_gate(gate)
    assert Worker(owner="rescuer", max_todos=1).run().done == 1
    todo.refresh_from_db()
    assert (todo.state, todo.owner, todo.attempt) == (State.DONE, "rescuer", 2)
    assert [(e["owner"], e["error"]["type"]) for e in todo.errors] == [("killed", "LeaseExpired")]
    assert todo.result == {"gated": 2}


def test_sigkill_of_a_task_is_recovered_with_its_history(
    spawn: Spawn, gate: dict[str, str]
) -> None:
    """The same crash for a django.tasks task: it succeeds on attempt 2, and get_result says so."""
    result = tasks.gated.enqueue(gate["started"], gate["gate"])
    child = Child(spawn, "--owner", "killed")
    wait_until(lambda: started_lines(gate), "the task to start")
    child.process.kill()
    child.exit_code()
    assert tasks.gated.get_result(result.id).status == TaskResultStatus.RUNNING
    Todo.objects.filter(pk=result.id).update(lease_expires_at=Now())
    open_gate(gate)
    Worker(owner="rescuer", max_todos=1).run()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "through"
    assert (result.attempts, result.worker_ids) == (2, ["killed", "rescuer"])
    assert [error.exception_class for error in result.errors] == [LeaseExpired]


def test_terminated_connections_are_reopened_and_nothing_is_lost(spawn: Spawn) -> None:
    """pg_terminate_backend on every connection of a busy worker: it reconnects and finishes.

    This stands for a database restart too, which the shared test server cannot do: the
    worker sees the same errors (its connections closed under it) either way.
    """
    first = Todo.objects.create_many(
        [{"kind": "test.sleep", "payload": {"seconds": 0.005}} for _ in range(400)]
    )
    child = Child(spawn, "--concurrency", "2", "--ttl", "2", "--verbosity", "0")
    wait_until(lambda: Todo.objects.filter(state=State.DONE).count() >= 50, "progress")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid), query LIKE 'LISTEN %%' FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        terminated = cursor.fetchall()
    assert len(terminated) >= 3 and any(listening for _, listening in terminated)
    second = Todo.objects.create_many(
        [{"kind": "test.sleep", "payload": {"seconds": 0.005}} for _ in range(100)]
    )
    wait_until(
        lambda: Todo.objects.filter(state=State.DONE).count() == len(first) + len(second),
        "every todo done",
        timeout=90,
    )
    assert child.process.poll() is None, "the worker died"
    assert Todo.objects.exclude(state=State.DONE).count() == 0
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0
    # A line when a fault begins and one when it ends, not one per failed statement: at most
    # one fault per connection terminated (each thread notices at its next statement).
    faults = child.output.count("the database is unavailable")
    assert 1 <= faults <= len(terminated), child.output
    assert child.output.count("the database is back after") == faults, child.output


def test_a_poison_todo_stops_no_worker_of_a_fleet(spawn: Spawn) -> None:
    """Reproduction: an outcome PostgreSQL cannot store (a lone surrogate in the error or the
    result, an exception whose str() raises) used to crash the runner and end the worker with
    status 0; the todo's next worker died too. Now each is that todo's problem only."""
    good = Todo.objects.create_many([{"kind": "test.noop"} for _ in range(1000)])
    message, _ = Todo.objects.create_todo(kind="test.poison_message", max_attempts=2)
    unprintable, _ = Todo.objects.create_todo(kind="test.poison_str", max_attempts=1)
    result, _ = Todo.objects.create_todo(kind="test.poison_result")
    fleet = [Child(spawn, "--concurrency", "2", "--verbosity", "0") for _ in range(3)]
    wait_until(
        lambda: (
            Todo.objects.filter(state=State.DONE).count() == len(good) + 1
            and Todo.objects.filter(state=State.FAILED).count() == 2
        ),
        "every good todo done and both poison todos dead-lettered",
        timeout=90,
    )
    assert [child.process.poll() for child in fleet] == [None] * 3, "a worker exited"
    failed = Todo.objects.get(pk=message.pk)
    assert failed.attempt == 2
    assert [entry["error"]["message"] for entry in failed.errors] == [
        "cannot open report-\\udcff.csv"
    ] * 2
    assert (
        Todo.objects.get(pk=unprintable.pk).errors[0]["error"]["message"] == "Unprintable('hidden')"
    )
    assert Todo.objects.get(pk=result.pk).result == {"file": "report-\\udcff.csv", "nul": "ab"}
    for child in fleet:
        child.signal(signal.SIGTERM)
    assert [child.exit_code() for child in fleet] == [0] * 3


def test_a_worker_whose_runner_dies_exits_non_zero(spawn: Spawn) -> None:
    """A bug in the worker (not in a todo) ends the process with status 1 for systemd to
    restart it, instead of a silent exit 0 that Restart=on-failure ignores."""
    todo, _ = Todo.objects.create_todo(kind="test.noop")
    child = Child(spawn, "--import-module", "tests.crash_runner", "--concurrency", "2")
    assert child.exit_code() == 1, child.output
    assert child.said("runner 0 crashed") or child.said("runner 1 crashed"), child.output
    assert child.said("RuntimeError: a bug in the runner loop"), child.output
    assert Todo.objects.get(pk=todo.pk).state in (State.PENDING, State.CLAIMED)


def test_a_read_only_database_is_waited_out(
    spawn: Spawn, read_only_database: Callable[[bool], None]
) -> None:
    """Reproduction: after a failover to a standby every runner crashed on "cannot execute
    SELECT FOR UPDATE in a read-only transaction" and the worker exited 0. Now it logs once,
    backs off, and resumes when the database is writable again."""
    todos = Todo.objects.create_many([{"kind": "test.noop"} for _ in range(50)])
    read_only_database(True)
    child = Child(spawn, "--concurrency", "2")
    wait_until(lambda: child.said("the database is read-only"), "the worker to notice")
    assert child.process.poll() is None, child.output
    read_only_database(False)
    wait_until(
        lambda: Todo.objects.filter(state=State.DONE).count() == len(todos),
        "every todo done once the database is writable",
    )
    assert child.output.count("the database is read-only") == 1, child.output
    assert child.said("the database is back after"), child.output
    child.signal(signal.SIGTERM)
    assert child.exit_code() == 0


@contextmanager
def frozen_server() -> Iterator[int]:
    """A port where a server accepts connections and then never answers, as a frozen one."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        accepted: list[socket.socket] = []

        def accept() -> None:
            with suppress(OSError):
                while True:
                    accepted.append(server.accept()[0])

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield server.getsockname()[1]
        finally:
            for connection in accepted:
                connection.close()


def test_a_frozen_server_is_noticed_not_waited_on(
    spawn: Spawn, subprocess_env: dict[str, str]
) -> None:
    """Reproduction: a worker (re)connecting to a frozen server hung silently for as long as
    the freeze lasted, and SIGTERM could not stop it. Now connect_timeout ends each try, the
    worker logs the outage once and backs off, and a SIGTERM stops it."""
    with frozen_server() as port:
        subprocess_env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/frozen"
        subprocess_env["SWITCHBOARD_TODOS_DATABASE_OPTIONS"] = '{"connect_timeout": 1}'
        child = Child(spawn, "--no-listen")
        wait_until(lambda: child.said("the database is unavailable"), "the worker to notice")
        assert child.said("timeout expired"), child.output
        child.signal(signal.SIGTERM)
        assert child.exit_code() == 0, child.output
    assert child.output.count("the database is unavailable") == 1, child.output


def test_bad_arguments_are_usage_errors(spawn: Spawn) -> None:
    """Validation happens in argparse: a clear message and exit status 2, nothing claimed."""
    child = Child(spawn, "--concurrency", "0", "--queue", "bad queue")
    assert child.exit_code() == 2
    assert child.said("argument --concurrency: '0' must be 1 or more")
