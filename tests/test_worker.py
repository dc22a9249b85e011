"""The worker in this process: handlers, outcomes, batching, heartbeats, wake-up, stopping."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.models.functions import Now

from switchboard_todos.exceptions import InvalidTodo, WorkerCrashed
from switchboard_todos.models import State, Todo
from switchboard_todos.worker import Worker, WorkerStats, default_owner
from switchboard_todos.worker.claiming import EXPRESS_GAP
from switchboard_todos.worker.hand import Held, Runner
from tests import worker_handlers  # noqa: F401 (registers the handlers)
from tests.helpers import open_gate, started_lines, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Background:
    """A worker running on a thread, as a test's counterpart."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stats: WorkerStats | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.stats = self.worker.run()
        finally:
            connections.close_all()

    def join(self) -> WorkerStats:
        self.thread.join(60)
        assert self.stats is not None, "the worker did not stop"
        return self.stats


@pytest.fixture
def background() -> Iterator[Callable[[Worker], Background]]:
    started: list[Background] = []

    def start(worker: Worker) -> Background:
        started.append(Background(worker))
        return started[-1]

    yield start
    for running in started:
        running.worker.stop()
        running.thread.join(60)


def test_handlers_results_are_stored_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every todo ends done with its handler's return value, acknowledged many per statement."""
    calls: list[int] = []
    complete_many = Todo.objects.complete_many

    def counting(owner: str, results: Any) -> list[str]:
        calls.append(len(results))
        return complete_many(owner, results)

    monkeypatch.setattr(Todo.objects, "complete_many", counting)
    Todo.objects.create_many([{"kind": "test.echo", "payload": {"n": n}} for n in range(300)])
    stats = Worker(concurrency=2, max_todos=300).run()
    assert (stats.claimed, stats.done, stats.failed) == (300, 300, 0)
    todos = Todo.objects.all()
    assert {todo.state for todo in todos} == {State.DONE}
    assert all(todo.result == todo.payload for todo in todos)
    assert sum(calls) == 300
    assert len(calls) < 300 / 10, f"acknowledged in {len(calls)} statements"


@pytest.fixture
def refusing_table() -> Iterator[None]:
    """A constraint a DBA might add: the database refuses some results and error messages."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "ALTER TABLE todos ADD CONSTRAINT refuses_some CHECK ("
            "coalesce(result->>'x', '') <> 'refuse' "
            "AND coalesce(result->>'message', '') NOT LIKE 'refuse%%')"
        )
    yield
    with connections["default"].cursor() as cursor:
        cursor.execute("ALTER TABLE todos DROP CONSTRAINT refuses_some")


def test_a_refused_result_fails_its_todo_and_no_other(refusing_table: None) -> None:
    """The database refuses one result of a batch: the others are acknowledged, that todo
    fails with the refusal as its error, and the worker goes on."""
    payloads = [{"x": "refuse" if n == 7 else "fine", "n": n} for n in range(20)]
    Todo.objects.create_many([{"kind": "test.echo", "payload": payload} for payload in payloads])
    stats = Worker(max_todos=20, batch_size=20).run()
    assert (stats.done, stats.failed) == (19, 1)
    refused = Todo.objects.get(payload__n=7)
    assert refused.state == State.PENDING
    assert refused.errors[0]["error"]["type"] == "django.db.utils.IntegrityError"
    assert "refuses_some" in refused.errors[0]["error"]["message"]


def test_a_refused_error_detail_is_stored_in_a_fixed_shape(refusing_table: None) -> None:
    """The database refuses the error's own detail: the failure is stored all the same."""
    todo, _ = Todo.objects.create_todo(kind="test.boom", payload={"message": "refuse me"})
    stats = Worker(max_todos=1).run()
    assert stats.failed == 1
    error = Todo.objects.get(pk=todo.pk).errors[0]["error"]
    assert error["type"] == "builtins.ValueError"
    assert error["message"].startswith(
        "The handler failed, and its error could not be stored (IntegrityError:"
    )


def test_a_failure_stores_type_message_and_traceback() -> None:
    """An exception fails the attempt with its type, message and traceback; backoff applies."""
    todo, _ = Todo.objects.create_todo(kind="test.boom")
    stats = Worker(max_todos=1).run()
    assert (stats.failed, stats.dead_lettered) == (1, 0)
    todo.refresh_from_db()
    assert todo.state == State.PENDING and todo.next_retry_at is not None
    error = todo.errors[0]["error"]
    assert error["type"] == "builtins.ValueError"
    assert error["message"] == "boom on attempt 1"
    assert 'worker_handlers.py", line' in error["traceback"]
    assert error["traceback"].rstrip().endswith("ValueError: boom on attempt 1")
    assert todo.result == error


def test_retries_end_in_a_dead_letter() -> None:
    """Each failure is retried after its backoff until max_attempts, then dead-lettered."""
    todo, _ = Todo.objects.create_todo(kind="test.boom", max_attempts=2)
    assert Worker(max_todos=1).run().failed == 1
    Todo.objects.filter(pk=todo.pk).update(next_retry_at=Now())  # the backoff has passed
    stats = Worker(max_todos=1).run()
    assert stats.dead_lettered == 1
    todo.refresh_from_db()
    assert (todo.state, todo.attempt) == (State.FAILED, 2)
    messages = [entry["error"]["message"] for entry in todo.errors]
    assert messages == ["boom on attempt 1", "boom on attempt 2"]


def test_an_unknown_kind_fails_the_todo_not_the_worker() -> None:
    """No handler for the kind: that todo fails with a clear error, the next one still runs."""
    unknown, _ = Todo.objects.create_todo(kind="nobody.handles.this")
    known, _ = Todo.objects.create_todo(kind="test.echo", payload={"ok": 1})
    stats = Worker(max_todos=2).run()
    assert (stats.failed, stats.done) == (1, 1)
    unknown.refresh_from_db()
    error = unknown.errors[0]["error"]
    assert error["type"] == "switchboard_todos.exceptions.UnknownKind"
    assert "No handler for kind 'nobody.handles.this'" in error["message"]
    assert Todo.objects.get(pk=known.pk).state == State.DONE


def test_a_result_that_is_not_json_fails_the_todo() -> None:
    """A return value JSON cannot hold fails that todo; the rest of its batch is completed."""
    Todo.objects.create_many(
        [{"kind": kind} for kind in ("test.echo", "test.not_json", "test.noop")]
    )
    stats = Worker(max_todos=3).run()
    assert (stats.done, stats.failed) == (2, 1)
    failed = Todo.objects.get(kind="test.not_json")
    assert failed.errors[0]["error"]["type"] == "switchboard_todos.exceptions.InvalidTodo"
    assert "return value is not JSON-serializable" in failed.errors[0]["error"]["message"]


def test_an_async_handler_runs_to_completion() -> None:
    """A coroutine handler is awaited; its result is stored like a plain one's."""
    todo, _ = Todo.objects.create_todo(kind="test.async")
    assert Worker(max_todos=1).run().done == 1
    assert Todo.objects.get(pk=todo.pk).result == {"async": True, "attempt": 1}


def test_heartbeats_keep_a_long_handler_s_lease(
    background: Callable[[Worker], Background], gate: dict[str, str]
) -> None:
    """A handler running past its TTL keeps the lease: heartbeats extend it, nobody steals it."""
    todo, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    # No max_todos: a todo released before it ran (its claim waited past half the TTL on a
    # loaded machine) is claimed again rather than ending the worker.
    running = background(Worker(ttl=1))
    wait_until(lambda: started_lines(gate), "the handler to start")
    first = Todo.objects.get(pk=todo.pk).lease_expires_at
    assert first is not None
    wait_until(
        lambda: Todo.objects.get(pk=todo.pk).lease_expires_at > first,  # type: ignore[operator]
        "a heartbeat",
    )
    assert Todo.objects.claim_next("default", "thief", 30) is None
    open_gate(gate)
    running.worker.stop()  # the running handler finishes first
    assert running.join().done == 1
    done = Todo.objects.get(pk=todo.pk)
    assert (done.state, done.attempt, done.errors) == (State.DONE, 1, [])


def test_a_lost_lease_is_not_completed(
    background: Callable[[Worker], Background],
    gate: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When a heartbeat finds the lease taken, the worker logs it and does not complete."""
    todo, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    running = background(Worker(ttl=1))  # no max_todos, as in the test above
    wait_until(lambda: started_lines(gate), "the handler to start")
    # The lease lapses (as if the worker had stalled) and another worker claims the todo.
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now())
    assert Todo.objects.claim(todo.id, "thief", 60).owner == "thief"
    with caplog.at_level(logging.INFO, "switchboard_todos.worker"):
        wait_until(lambda: "lease lost" in caplog.text, "the heartbeat to notice")
        open_gate(gate)
        running.worker.stop()
        stats = running.join()
    assert (stats.done, stats.lost) == (0, 1)
    stolen = Todo.objects.get(pk=todo.pk)
    assert (stolen.state, stolen.owner) == (State.CLAIMED, "thief")
    assert "lost: the lease went to another worker" in caplog.text


def test_a_handler_past_its_timeout_fails_and_a_fresh_runner_goes_on(
    background: Callable[[Worker], Background],
    gate: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reproduction: a handler that never returned kept its lease forever through heartbeats.
    Now, past its timeout, the attempt fails (counted, so it dead-letters at the cap) and a
    fresh runner thread takes the hung one's place: with one runner, the next todo still runs."""
    hung, _ = Todo.objects.create_todo(kind="test.hang", payload=gate, max_attempts=1)
    with caplog.at_level(logging.INFO, "switchboard_todos.worker"):
        running = background(Worker(concurrency=1, max_todos=2, listen=False, poll_interval=0.05))
        wait_until(lambda: started_lines(gate), "the handler to start")
        after, _ = Todo.objects.create_todo(kind="test.noop")
        wait_until(lambda: Todo.objects.get(pk=after.pk).state == State.DONE, "the next todo")
        stats = running.join()
    failed = Todo.objects.get(pk=hung.pk)
    assert (failed.state, failed.attempt) == (State.FAILED, 1)
    error = failed.errors[0]["error"]
    assert error["type"] == "switchboard_todos.exceptions.HandlerTimeout"
    assert error["message"].startswith("The handler ran past its timeout of 0.5s")
    assert (stats.done, stats.failed, stats.dead_lettered) == (1, 1, 1)
    assert "dead-lettered (HandlerTimeout: The handler ran past its timeout" in caplog.text
    open_gate(gate)  # the abandoned thread returns; its outcome is dropped
    wait_until(lambda: len(started_lines(gate)) == 1, "nothing else")
    assert Todo.objects.get(pk=hung.pk).state == State.FAILED


def test_the_worker_goes_on_while_a_fresh_runner_starts(
    background: Callable[[Worker], Background],
    gate: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reproduction: the hung runner's place went to the fresh one before its thread started;
    the supervisor, which returns once no runner's thread is alive, saw none meanwhile and
    ended the worker. A slow thread start stands for the scheduler's delay."""
    start = Worker._start

    def slow_start(worker: Worker, runner: Runner) -> None:
        if worker._hand.abandoned:
            time.sleep(0.5)
        start(worker, runner)

    monkeypatch.setattr(Worker, "_start", slow_start)
    Todo.objects.create_todo(kind="test.hang", payload=gate, max_attempts=1)
    running = background(Worker(concurrency=1, listen=False, poll_interval=0.05))
    wait_until(lambda: started_lines(gate), "the handler to start")
    after, _ = Todo.objects.create_todo(kind="test.noop")
    wait_until(lambda: Todo.objects.get(pk=after.pk).state == State.DONE, "the next todo")
    open_gate(gate)
    assert running.thread.is_alive(), running.stats
    running.worker.stop()
    assert running.join().done == 1


def test_a_success_the_watchdog_gave_up_on_is_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reproduction: a handler that returned just as the watchdog stopped waiting for it (its
    todo cancelled) left its success with the runner, and the next flush told the cancel again
    and counted it twice. The race is set up as it ends: the watchdog has told it, and the
    success waits for the flush."""
    Todo.objects.create_todo(kind="test.noop")
    worker = Worker(concurrency=1, listen=False)
    [todo] = Todo.objects.claim_batch(["default"], worker.owner, worker.ttl, 1)
    Todo.objects.cancel(todo.id, "wrong customer")
    held = Held(todo, time.monotonic())
    held.running.cancelled = held.dropped = held.returned = True
    runner = worker._hand.runners[0]
    runner.acks[todo.id] = (held, {"late": True}, 0.0)
    with caplog.at_level(logging.INFO, "switchboard_todos.worker"):
        worker._executor.cancelled(held, 0.0)
        worker._executor.flush(runner)
    assert (worker.stats.cancelled, worker.stats.done, worker.stats.lost) == (1, 0, 0)
    assert caplog.text.count("cancelled by an operator") == 1
    assert Todo.objects.get(pk=todo.pk).result == {"type": "Cancelled", "message": "wrong customer"}


def test_the_worker_timeout_applies_to_handlers_without_their_own(
    background: Callable[[Worker], Background], gate: dict[str, str]
) -> None:
    todo, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    running = background(Worker(max_todos=1, timeout=0.3, listen=False))
    wait_until(lambda: Todo.objects.get(pk=todo.pk).state == State.PENDING, "the timeout")
    assert running.join().failed == 1
    assert Todo.objects.get(pk=todo.pk).attempt == 1
    open_gate(gate)


def test_more_hung_threads_than_runners_end_the_worker(gate: dict[str, str]) -> None:
    """A thread cannot be killed: past `concurrency` hung ones the worker exits non-zero, so
    that its supervisor restarts the process."""
    Todo.objects.create_many([{"kind": "test.hang", "payload": gate} for _ in range(3)])
    try:
        with pytest.raises(WorkerCrashed, match="2 hung handler threads"):
            Worker(concurrency=1, listen=False, poll_interval=0.05).run()
    finally:
        open_gate(gate)
    assert (
        Todo.objects.filter(
            attempt=1, error_entries__entry__error__type__endswith="HandlerTimeout"
        ).count()
        == 2
    )


def test_a_long_handler_without_a_timeout_is_reported(
    background: Callable[[Worker], Background],
    gate: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    Todo.objects.create_todo(kind="test.gate", payload=gate)
    with caplog.at_level(logging.WARNING, "switchboard_todos.worker"):
        # No max_todos (CI: with max_todos=1, the todo released when its claim had waited past
        # half this short TTL ended the worker before it ran): released, it is claimed again.
        running = background(Worker(ttl=0.3, listen=False))
        wait_until(lambda: "has no timeout" in caplog.text, "the warning")
        open_gate(gate)
        running.worker.stop()  # the running handler finishes first
        assert running.join().done == 1
    assert caplog.text.count("has no timeout") == 1


def test_stop_lets_the_running_todo_finish_and_releases_the_rest(
    background: Callable[[Worker], Background], gate: dict[str, str]
) -> None:
    """stop(): the running handler finishes and is stored; claimed todos not started go back."""
    first, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    running = background(Worker(batch_size=5))
    wait_until(lambda: started_lines(gate), "the handler to start")
    Todo.objects.create_todo(kind="test.noop")
    running.worker.stop()
    open_gate(gate)
    stats = running.join()
    assert stats.done == 1
    assert Todo.objects.get(pk=first.pk).state == State.DONE
    second = Todo.objects.get(kind="test.noop")
    assert (second.state, second.attempt) == (State.PENDING, 0)


def test_a_slow_handler_does_not_hold_the_todos_batched_behind_it(
    background: Callable[[Worker], Background], gate: dict[str, str]
) -> None:
    """Todos claimed behind a handler that overruns go back, and another worker runs them."""
    Todo.objects.create_todo(kind="test.noop")
    slow, _ = Todo.objects.create_todo(kind="test.gate", payload=gate)
    quick = [todo for todo, _ in Todo.objects.create_many([{"kind": "test.noop"}] * 5)]
    # The first claim is a single todo; its speed sizes the next batch: the rest at once.
    first = background(Worker(batch_size=100, owner="first"))
    wait_until(lambda: started_lines(gate), "the slow handler to start")
    assert Todo.objects.filter(owner="first", state=State.CLAIMED).count() == 6
    background(Worker(owner="second", max_todos=5))
    wait_until(
        lambda: Todo.objects.filter(owner="second", state=State.DONE).count() == 5,
        "the second worker to run the quick todos",
        timeout=15,
    )
    assert Todo.objects.get(pk=slow.pk).state == State.CLAIMED
    open_gate(gate)
    wait_until(lambda: Todo.objects.get(pk=slow.pk).state == State.DONE, "the slow todo")
    first.worker.stop()
    assert first.join().released == 5
    assert {todo.attempt for todo in Todo.objects.filter(pk__in=[t.pk for t in quick])} == {1}


def test_a_notification_wakes_an_idle_worker(background: Callable[[Worker], Background]) -> None:
    """An idle listening worker claims new work at once, though it would poll once a minute."""
    running = background(Worker(poll_interval=60, max_todos=1))
    listeners = running.worker._listeners
    wait_until(lambda: listeners and all(each.listening for each in listeners), "LISTEN")
    time.sleep(0.2)  # let the runner make its first, empty claim and go to sleep
    enqueued = time.monotonic()
    Todo.objects.create_todo(kind="test.noop")
    running.join()
    assert time.monotonic() - enqueued < 10


def test_without_listen_the_worker_polls(background: Callable[[Worker], Background]) -> None:
    """--no-listen: no LISTEN connection, and polling still finds the work."""
    running = background(Worker(listen=False, poll_interval=0.1, max_todos=1))
    Todo.objects.create_todo(kind="test.noop")
    assert running.join().done == 1
    assert running.worker._listeners == []


def test_max_seconds_stops_an_idle_worker() -> None:
    """max_seconds bounds a worker's life even when there is nothing to do."""
    started = time.monotonic()
    assert Worker(max_seconds=0.3, poll_interval=0.1).run() == WorkerStats()
    assert 0.3 <= time.monotonic() - started < 30


def test_claims_stop_at_max_todos() -> None:
    """max_todos is a cap on claims: a worker never takes more than that many todos."""
    Todo.objects.create_many([{"kind": "test.noop"} for _ in range(30)])
    assert Worker(concurrency=3, max_todos=7).run().done == 7
    assert Todo.objects.filter(state=State.PENDING).count() == 23


def test_owners_are_unique_per_worker() -> None:
    """The default owner names the host and pid and differs between workers."""
    first, second = default_owner(), default_owner()
    assert first != second
    assert first.split(":")[1] == str(__import__("os").getpid())
    assert Worker(owner="me").owner == "me"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"queues": []}, "at least one queue"),
        ({"concurrency": 0}, "concurrency must be between"),
        ({"ttl": 0}, "ttl must be more than zero"),
        ({"owner": ""}, "owner must not be empty"),
        ({"batch_size": 5000}, "batch_size must be between"),
        ({"max_seconds": -1}, "max_seconds must be more than zero"),
    ],
)
def test_bad_arguments_are_refused(arguments: dict[str, Any], message: str) -> None:
    """A misconfigured worker fails at construction with InvalidTodo."""
    with pytest.raises(InvalidTodo, match=message):
        Worker(**arguments)


def test_the_command_runs_a_worker(caplog: pytest.LogCaptureFixture) -> None:
    """`manage.py todo_worker` parses its options into a Worker, which logs each todo."""
    todo, _ = Todo.objects.create_todo(queue="mail", kind="test.echo", payload={"to": "x"})
    with caplog.at_level(logging.INFO, "switchboard_todos.worker"):
        call_command(
            "todo_worker",
            "--queue=mail",
            "--max-todos=1",
            "--no-listen",
            "--poll-interval=0.1",
            "--owner=cli",
            "--import-module=tests.worker_handlers",
        )
    done = Todo.objects.get(pk=todo.pk)
    assert (done.state, done.owner, done.result) == (State.DONE, "cli", {"to": "x"})
    assert f"todo {todo.id} kind=test.echo attempt=1" in caplog.text


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("--concurrency=0", "must be 1 or more"),
        ("--concurrency=5000", "must be 1000 or less"),
        ("--batch-size=many", "is not a whole number"),
        ("--ttl=0", "must be more than zero"),
        ("--ttl=13h", "ttl must be at most 12:00:00"),
        ("--poll-interval=-1", "invalid duration"),
        ("--queue=no spaces", "is not a valid queue name"),
        ("--owner= ", "owner must not be empty"),
    ],
)
def test_the_command_refuses_bad_options(argument: str, message: str) -> None:
    """Each option is checked by argparse, with the reason, before a worker starts."""
    with pytest.raises(CommandError, match=message):
        call_command("todo_worker", argument, "--max-todos=1")


def test_the_command_refuses_a_module_it_cannot_import() -> None:
    """--import-module of a missing module is a CommandError before anything is claimed."""
    with pytest.raises(CommandError, match="--import-module tests.nowhere"):
        call_command("todo_worker", "--import-module=tests.nowhere", "--max-todos=1")


def test_an_idle_worker_polls_at_its_pace(
    background: Callable[[Worker], Background], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting for the last todo of its budget, a worker backs off instead of spinning."""
    claims: list[int] = []
    claim_batch = Todo.objects.claim_batch

    def counting(*args: Any, **kwargs: Any) -> list[Todo]:
        claimed = claim_batch(*args, **kwargs)
        claims.append(len(claimed))
        return claimed

    monkeypatch.setattr(Todo.objects, "claim_batch", counting)
    Todo.objects.create_todo(kind="test.noop")
    running = background(Worker(listen=False, poll_interval=0.2, max_todos=2))
    wait_until(lambda: Todo.objects.filter(state=State.DONE).exists(), "the first todo")
    time.sleep(1.0)  # idle: about eight polls at most
    Todo.objects.create_todo(kind="test.noop")
    assert running.join().done == 2
    assert len(claims) < 20, f"{len(claims)} claims"


# Which queues


def test_every_queue_but_the_excluded(background: Callable[[Worker], Background]) -> None:
    """--queue '*': every queue with pending work, found without naming it, but the excluded."""
    Todo.objects.create_many(
        [{"queue": queue, "kind": "test.noop"} for queue in ("a", "b", "b", "skip-me")]
    )
    running = background(Worker("*", exclude_queues=["skip-me"], poll_interval=0.1, max_todos=4))
    wait_until(lambda: Todo.objects.filter(state=State.DONE).count() == 3, "three done")
    # A queue born after the worker read the list joins at its notification.
    Todo.objects.create_todo(queue="born-later", kind="test.noop")
    assert running.join().done == 4
    assert Todo.objects.get(queue="skip-me").state == State.PENDING
    assert Todo.objects.get(queue="born-later").state == State.DONE


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"queues": ["*", "a"]}, "'\\*' already means every queue"),
        ({"queues": ["a"], "exclude_queues": ["b"]}, "apply to '\\*'"),
    ],
)
def test_bad_queue_selections_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTodo, match=message):
        Worker(**arguments)


def test_backend_serves_the_queues_of_a_tasks_alias(caplog: pytest.LogCaptureFixture) -> None:
    """--backend default: the QUEUES of TASKS["default"] ("default" and "other"), no other."""
    Todo.objects.create_many(
        [{"queue": queue, "kind": "test.noop"} for queue in ("default", "other", "elsewhere")]
    )
    with caplog.at_level(logging.INFO, "switchboard_todos.worker"):
        call_command("todo_worker", "--backend=default", "--max-todos=2", "--poll-interval=0.1")
    assert "queues default,other" in caplog.text
    states = dict(Todo.objects.values_list("queue", "state"))
    assert states == {"default": State.DONE, "other": State.DONE, "elsewhere": State.PENDING}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--backend=nope"], "--backend nope:"),
        (["--backend=default", "--queue=a"], "Give --queue or --backend, not both"),
        (["--queue=a", "--exclude-queue=b"], "--exclude-queue applies to --queue '\\*'"),
    ],
)
def test_the_command_refuses_bad_queue_options(arguments: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("todo_worker", *arguments)


# The express claim: a fair key's new todo overtakes the batch a busy worker holds. A worker
# claims a batch and runs it; a todo that arrives meanwhile waited for the next claim, up to a
# whole batch's run, though its fair key's turn is at the head of the queue. Told of it
# (NOTIFY), a runner whose batch holds todos of fair keys claims a few todos before its next
# one (worker/claiming.py), and runs them next. A queue without fair keys pays nothing: there
# a new todo is last in line anyway.

#: The batch the runner holds when the newcomer arrives: the gated todo, then these many more.
BEHIND = 5


def run_with_newcomer(
    background: Callable[[Worker], Background], gate: dict[str, str], key: str | None
) -> tuple[list[str], Todo, Background]:
    """A worker takes a batch of `key`'s todos, the first of them held at the gate; a todo of
    another key ("quiet", or none with `key` None) arrives; then the gate opens. Returns the ids
    in the order their handlers started, the newcomer, and the stopped worker."""
    quick = "noisy" if key else None
    Todo.objects.create_todo(kind="test.noop", fair_key=quick)
    batch = [
        todo
        for todo, _ in Todo.objects.create_many(
            [{"kind": "test.gate", "payload": gate, "fair_key": key}] * (1 + BEHIND)
        )
    ]
    # The first claim is a single todo; its speed sizes the next: the whole gated batch.
    running = background(Worker(batch_size=50, poll_interval=60))
    wait_until(lambda: started_lines(gate), "the batch's first todo to start")
    assert Todo.objects.filter(pk__in=[todo.pk for todo in batch], state=State.CLAIMED).count() == (
        1 + BEHIND
    )
    doorbell = running.worker._hand.doorbell
    told = doorbell.news
    newcomer, _ = Todo.objects.create_todo(
        kind="test.gate", payload=gate, fair_key="quiet" if key else None
    )
    wait_until(lambda: doorbell.news > told, "the notification of the newcomer")
    time.sleep(EXPRESS_GAP)  # the least time between two claims of the process: a lower bound
    open_gate(gate)
    wait_until(lambda: not Todo.objects.exclude(state=State.DONE).exists(), "every todo to be done")
    running.worker.stop()
    running.join()
    return [line.split()[0] for line in started_lines(gate)], newcomer, running


def test_a_fair_key_s_new_todo_runs_before_the_rest_of_the_batch(
    background: Callable[[Worker], Background], gate: dict[str, str]
) -> None:
    started, newcomer, running = run_with_newcomer(background, gate, "noisy")
    assert len(started) == 2 + BEHIND
    assert started[1] == newcomer.id, "the newcomer waited for the batch"
    assert running.stats is not None and running.stats.expressed == 1


def test_without_fair_keys_a_busy_worker_claims_nothing_more(
    background: Callable[[Worker], Background], gate: dict[str, str]
) -> None:
    """FIFO: the newcomer is last in line, so a claim ahead of the batch would take the batch's
    neighbours, not it; the worker claims again only when its batch is done."""
    started, newcomer, running = run_with_newcomer(background, gate, None)
    assert started[-1] == newcomer.id
    assert running.stats is not None and running.stats.expressed == 0
