"""The django.tasks backend: enqueue, get_result, validation, checks, signals, and the worker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext, modify_settings, override_settings
from django.utils import timezone

from switchboard_todos.backends import TodoBackend
from switchboard_todos.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from switchboard_todos.exceptions import LeaseExpired, TodoCancelled
from switchboard_todos.handlers import TASKS_SOURCE
from switchboard_todos.models import State, Todo
from switchboard_todos.worker import Worker
from tests import tasks
from tests.helpers import MakeTodo


def with_options(**options: Any) -> override_settings:
    """TASKS with the default backend's OPTIONS replaced."""
    return override_settings(
        TASKS={
            "default": {
                "BACKEND": "switchboard_todos.backends.TodoBackend",
                "QUEUES": ["default", "other"],
                "OPTIONS": options,
            }
        }
    )


@pytest.fixture
def signals() -> Iterator[list[tuple[str, Any, Any]]]:
    """(signal name, sender, status) of every task signal sent while the test runs."""
    seen: list[tuple[str, Any, Any]] = []
    receivers = []
    for name, signal in [
        ("enqueued", task_enqueued),
        ("started", task_started),
        ("finished", task_finished),
    ]:

        def receive(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            seen.append((_name, sender, task_result.status))

        signal.connect(receive, weak=False)
        receivers.append((signal, receive))
    yield seen
    for signal, receive in receivers:
        signal.disconnect(receive)


# enqueue


@pytest.mark.django_db
def test_enqueue_stores_a_pending_todo(signals: list[tuple[str, Any, Any]]) -> None:
    """One create_todo: kind is the module path, title the task's name (the admin's list shows
    it), args and kwargs are JSON, status READY."""
    with CaptureQueriesContext(connection) as queries:
        result = tasks.add.using(queue_name="other").enqueue(2, b=(3,))  # type: ignore[arg-type]
    assert len(queries) == 1
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([2], {"b": [3]})
    assert (result.attempts, result.worker_ids, result.errors) == (0, [], [])
    assert result.backend == "default" and result.task is not None
    todo = Todo.objects.get(pk=result.id)
    assert (todo.kind, todo.queue, todo.source) == ("tests.tasks.add", "other", TASKS_SOURCE)
    assert todo.title == "add"
    assert todo.payload == {"args": [2], "kwargs": {"b": [3]}, "backend": "default"}
    assert todo.max_attempts == 5
    assert result.enqueued_at == todo.created_at
    assert signals == [("enqueued", TodoBackend, TaskResultStatus.READY)]


@pytest.mark.django_db
def test_arguments_that_are_not_json_are_refused() -> None:
    """A TypeError at enqueue, and nothing stored."""
    with pytest.raises(TypeError):
        tasks.add.enqueue(datetime(2024, 1, 1), 1)  # type: ignore[arg-type]
    assert not Todo.objects.exists()


@pytest.mark.django_db
def test_enqueue_is_atomic_with_the_callers_transaction() -> None:
    """Rolled back with the caller's work: the outbox property, with no extra machinery."""
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise RuntimeError("the caller's work failed")
    assert not Todo.objects.exists()
    with transaction.atomic():
        tasks.add.enqueue(1, 2)
    assert Todo.objects.count() == 1


@pytest.mark.django_db
@with_options(max_attempts=1)
def test_max_attempts_comes_from_options() -> None:
    """OPTIONS["max_attempts"] is each task's attempt budget."""
    result = tasks.add.enqueue(1, 2)
    assert Todo.objects.get(pk=result.id).max_attempts == 1


@pytest.mark.django_db
@with_options(fair_key="bulk")
def test_fair_key_comes_from_options() -> None:
    """OPTIONS["fair_key"] makes the backend's tasks one tenant of their queues."""
    result = tasks.add.enqueue(1, 2)
    assert Todo.objects.get(pk=result.id).fair_key == "bulk"


@pytest.mark.django_db
def test_run_after_defers_the_todo() -> None:
    """An aware run_after becomes next_retry_at."""
    when = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=when).enqueue(1, 2)
    assert Todo.objects.get(pk=result.id).next_retry_at == when


@pytest.mark.django_db
def test_a_timedelta_run_after_counts_from_enqueue() -> None:
    """Django documents a timedelta run_after but crashes on it; here it means "from now"."""
    before = timezone.now()
    result = tasks.add.using(run_after=timedelta(minutes=5)).enqueue(1, 2)  # type: ignore[arg-type]
    deferred = Todo.objects.get(pk=result.id).next_retry_at
    assert deferred is not None
    assert before + timedelta(minutes=5) <= deferred <= timezone.now() + timedelta(minutes=5)


@pytest.mark.django_db
def test_priority_and_run_after_are_stored_and_read_back() -> None:
    """The task's priority orders the claim; get_result gives back priority and run_after,
    a timedelta run_after as the absolute time it meant at enqueue."""
    before = timezone.now()
    low = tasks.add.using(priority=-5).enqueue(1, 1)
    deferred = tasks.add.using(priority=7, run_after=timedelta(minutes=5)).enqueue(2, 2)  # type: ignore[arg-type]
    high = tasks.add.using(priority=50).enqueue(3, 3)
    assert Todo.objects.get(pk=high.id).priority == 50
    claimed = Todo.objects.claim_batch("default", "w1", 30, limit=10)
    assert [todo.id for todo in claimed] == [high.id, low.id]
    read = tasks.add.get_result(deferred.id)
    assert read.task.priority == 7
    assert read.task.run_after is not None
    assert (
        before + timedelta(minutes=5)
        <= read.task.run_after
        <= timezone.now() + timedelta(minutes=5)
    )
    assert deferred.task.run_after == read.task.run_after
    assert tasks.add.get_result(low.id).task.run_after is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tasks.add.using(run_after=datetime(2030, 1, 1)), "aware"),
        (lambda: tasks.add.using(run_after=-timedelta(1)), "negative timedelta"),  # type: ignore[arg-type]
        (lambda: tasks.add.using(queue_name="unlisted"), "Queue 'unlisted' is not valid"),
    ],
)
def test_invalid_tasks_are_refused_when_built(make: Callable[[], Any], message: str) -> None:
    """Naive or negative run_after, an unlisted queue: InvalidTask."""
    with pytest.raises(InvalidTask, match=message):
        make()


@override_settings(
    TASKS={"default": {"BACKEND": "switchboard_todos.backends.TodoBackend", "QUEUES": []}}
)
def test_queue_names_must_be_todo_queue_names() -> None:
    """With QUEUES=[] any queue is allowed by Django, but it must still be a valid queue name."""
    with pytest.raises(InvalidTask, match="not a valid queue name"):
        tasks.add.using(queue_name="with spaces")


@pytest.mark.django_db
def test_a_task_that_does_not_import_back_is_refused() -> None:
    """The worker finds tasks by module path: a task bound under another name cannot be run."""
    with pytest.raises(InvalidTask, match="is not a Task"):
        tasks.renamed.enqueue()
    assert not Todo.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_async_enqueue_and_get_result() -> None:
    """aenqueue and aget_result round-trip through the same todo."""
    result = async_to_sync(tasks.add.aenqueue)(1, 2)
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert (fetched.id, fetched.status) == (result.id, TaskResultStatus.READY)


@pytest.mark.django_db(transaction=True)
def test_the_async_entry_points_work_inside_a_running_event_loop() -> None:
    """aenqueue, aget_result and arefresh awaited in a running loop (asyncio.run), as an
    async view or an agent's own loop does, with a worker completing the task in between."""

    async def enqueue_then_fetch() -> tuple[Any, Any]:
        result = await tasks.add.aenqueue(2, 3)
        fetched = await task_backends["default"].aget_result(result.id)
        return result, fetched

    async def refresh(result: Any) -> Any:
        await result.arefresh()
        return result

    try:
        result, fetched = asyncio.run(enqueue_then_fetch())
        assert (fetched.id, fetched.status) == (result.id, TaskResultStatus.READY)
        Worker(max_todos=1, listen=False, poll_interval=0.1).run()
        assert asyncio.run(refresh(result)).return_value == 5
    finally:
        # The loop's sync calls ran on asgiref's one thread: close its connection there.
        asyncio.run(sync_to_async(connections.close_all)())


# get_result


def task_todo(make_todo: MakeTodo, **fields: Any) -> Todo:
    payload = {"args": [1], "kwargs": {"b": 2}, "backend": "default"}
    return make_todo(source=TASKS_SOURCE, kind="tests.tasks.add", payload=payload, **fields)


def history(*entries: tuple[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "attempt": number,
            "owner": owner,
            "claimed_at": f"2024-05-0{number}T10:00:00+00:00",
            "at": f"2024-05-0{number}T10:00:05+00:00",
            "error": {"type": kind, "message": "went wrong", "traceback": f"trace {number}"},
        }
        for number, (owner, kind) in enumerate(entries, start=1)
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("state", "status"),
    [
        (State.PENDING, TaskResultStatus.READY),
        (State.CLAIMED, TaskResultStatus.RUNNING),
        (State.DONE, TaskResultStatus.SUCCESSFUL),
        (State.FAILED, TaskResultStatus.FAILED),
    ],
)
def test_get_result_maps_each_state(make_todo: MakeTodo, state: str, status: str) -> None:
    """pending → READY, claimed → RUNNING, done → SUCCESSFUL, failed → FAILED; one query."""
    todo = task_todo(make_todo, state=state)
    with CaptureQueriesContext(connection) as queries:
        result = tasks.add.get_result(todo.id)
    assert len(queries) == 1
    assert (result.id, result.status) == (todo.id, status)
    assert (result.args, result.kwargs) == ([1], {"b": 2})
    assert result.is_finished == (state in (State.DONE, State.FAILED))


@pytest.mark.django_db
def test_a_successful_result_has_attempts_workers_and_return_value(make_todo: MakeTodo) -> None:
    """Done on attempt 2: a TaskError per failed attempt, a worker id per attempt, the value."""
    todo = task_todo(
        make_todo,
        state=State.DONE,
        owner="w2",
        attempt=2,
        result=3,
        errors=history(("w1", "builtins.ValueError")),
    )
    result = tasks.add.get_result(todo.id)
    assert result.return_value == 3
    assert (result.attempts, result.worker_ids) == (2, ["w1", "w2"])
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert result.errors[0].traceback == "trace 1"
    assert result.started_at == datetime.fromisoformat("2024-05-01T10:00:00+00:00")
    assert (result.last_attempted_at, result.finished_at) == (todo.claimed_at, todo.completed_at)


@pytest.mark.django_db
def test_a_dead_letter_lists_every_error(make_todo: MakeTodo) -> None:
    """FAILED after its budget or a cancel: lapsed leases, cancels and unknown error types map to
    importable classes."""
    todo = task_todo(
        make_todo,
        state=State.FAILED,
        attempt=4,
        errors=history(
            ("w1", "LeaseExpired"),
            ("w2", "Timeout"),
            ("w3", "builtins.KeyError"),
            ("w4", "Cancelled"),
        ),
    )
    result = tasks.add.get_result(todo.id)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [
        LeaseExpired,
        Exception,
        KeyError,
        TodoCancelled,
    ]
    assert result.worker_ids == ["w1", "w2", "w3", "w4"]
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


@pytest.mark.django_db
def test_a_requeued_dead_letter_starts_a_new_attempt_count(make_todo: MakeTodo) -> None:
    """After an operator's requeue, attempts restart at 0; the old errors stay in the history."""
    todo = task_todo(make_todo, state=State.PENDING, attempt=0, errors=history(("w1", "x.Y")))
    result = tasks.add.get_result(todo.id)
    assert (result.attempts, result.started_at, result.last_attempted_at) == (0, None, None)
    assert len(result.errors) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("result_id", ["td_missing", "", "not an id at all", "td_" + "x" * 100])
def test_unknown_ids_do_not_exist(result_id: str) -> None:
    """Unknown or malformed ids raise TaskResultDoesNotExist."""
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


@pytest.mark.django_db
def test_todos_that_are_not_this_backends_tasks_do_not_exist(make_todo: MakeTodo) -> None:
    """A plain todo, or a task of another alias, is not a result of this backend."""
    plain = make_todo(kind="tests.tasks.add")
    other = make_todo(
        source=TASKS_SOURCE, kind="tests.tasks.add", payload={"args": [], "backend": "elsewhere"}
    )
    for todo in (plain, other):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(todo.id)


@pytest.mark.django_db
def test_a_task_that_no_longer_imports_has_no_result(make_todo: MakeTodo) -> None:
    """A stored task whose function was removed cannot be described: TaskResultDoesNotExist."""
    todo = make_todo(source=TASKS_SOURCE, kind="tests.tasks.gone", payload={"backend": "default"})
    with pytest.raises(TaskResultDoesNotExist, match="cannot be imported"):
        task_backends["default"].get_result(todo.id)


@pytest.mark.django_db
def test_get_result_of_another_task_is_a_mismatch() -> None:
    """Task.get_result checks the function, which the rebuilt task shares with the original."""
    result = tasks.add.enqueue(1, 2)
    assert tasks.add.get_result(result.id).task.func is tasks.add.func
    with pytest.raises(TaskResultMismatch):
        tasks.explode.get_result(result.id)


# checks


def test_check_accepts_good_settings() -> None:
    """The test settings' backend is valid."""
    assert task_backends["default"].check() == []


@pytest.mark.parametrize(
    ("params", "error_id"),
    [
        ({"OPTIONS": {"max_attempts": 3, "retries": 2}}, "switchboard_todos.E102"),
        ({"OPTIONS": {"max_attempts": 0}}, "switchboard_todos.E103"),
        ({"OPTIONS": {"max_attempts": "3"}}, "switchboard_todos.E103"),
        ({"QUEUES": ["default", "no spaces please"]}, "switchboard_todos.E104"),
        ({"OPTIONS": {"fair_key": " "}}, "switchboard_todos.E105"),
        ({"OPTIONS": {"fair_key": 7}}, "switchboard_todos.E105"),
    ],
)
def test_check_reports_bad_settings(params: dict[str, Any], error_id: str) -> None:
    """Unknown OPTIONS, a bad max_attempts or fair_key, or a queue name todos refuse: one
    error each."""
    backend = TodoBackend("custom", {"BACKEND": "switchboard_todos.backends.TodoBackend", **params})
    assert [error.id for error in backend.check()] == [error_id]


@modify_settings(INSTALLED_APPS={"remove": "switchboard_todos"})
def test_check_requires_the_app() -> None:
    """Without switchboard_todos in INSTALLED_APPS there is no todos table to store tasks in."""
    backend = TodoBackend("custom", {"BACKEND": "switchboard_todos.backends.TodoBackend"})
    assert [error.id for error in backend.check()] == ["switchboard_todos.E101"]


# the worker runs tasks


@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_a_task_and_sends_its_signals(
    signals: list[tuple[str, Any, Any]],
) -> None:
    """SUCCESSFUL with the return value; started then finished, sent by the backend class."""
    result = tasks.add.enqueue(2, b=5)
    assert Worker(max_todos=1).run().done == 1
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 7)
    assert result.finished_at is not None and result.started_at is not None
    assert signals == [
        ("enqueued", TodoBackend, TaskResultStatus.READY),
        ("started", TodoBackend, TaskResultStatus.RUNNING),
        ("finished", TodoBackend, TaskResultStatus.SUCCESSFUL),
    ]


@pytest.mark.django_db(transaction=True)
@with_options(max_attempts=3)
def test_a_failing_task_is_retried_with_its_attempt_in_the_context() -> None:
    """Attempt 1 fails and is READY again with its error; attempt 2 sees context.attempt == 2."""
    result = tasks.attempts.enqueue(fail_until=2)
    assert Worker(owner="w1", max_todos=1).run().failed == 1
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.READY, 1)
    assert [error.exception_class for error in result.errors] == [ValueError]
    assert "attempt 1 fails" in result.errors[0].traceback
    Todo.objects.filter(pk=result.id).update(next_retry_at=Now())  # the backoff has passed
    assert Worker(owner="w2", max_todos=1).run().done == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 2, "worker_ids": ["w1", "w2"], "id": result.id}


@pytest.mark.django_db(transaction=True)
@with_options(max_attempts=2)
def test_a_task_failing_every_time_is_dead_lettered(signals: list[tuple[str, Any, Any]]) -> None:
    """After max_attempts the task is FAILED, with one TaskError per attempt."""
    result = tasks.explode.enqueue()
    Worker(max_todos=1).run()
    Todo.objects.filter(pk=result.id).update(next_retry_at=Now())
    assert Worker(max_todos=1).run().dead_lettered == 1
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [KeyError, KeyError]
    assert "KeyError: 'always'" in result.errors[1].traceback
    finished = [status for name, _, status in signals if name == "finished"]
    assert finished == [TaskResultStatus.READY, TaskResultStatus.FAILED]


@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_async_tasks() -> None:
    """A coroutine task runs to completion on the worker's thread."""
    result = tasks.async_double.enqueue(21)
    Worker(max_todos=1).run()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42  # type: ignore[comparison-overlap]


@pytest.mark.django_db(transaction=True)
@with_options(max_attempts=1)
def test_a_return_value_that_is_not_json_fails_the_task() -> None:
    """The return value must be JSON: otherwise the attempt fails with a TypeError."""
    result = tasks.not_json.enqueue()
    Worker(max_todos=1).run()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [TypeError]


@pytest.mark.django_db(transaction=True)
def test_a_task_for_an_unknown_backend_fails_clearly(make_todo: MakeTodo) -> None:
    """A task todo naming a backend alias that TASKS lacks fails with that reason."""
    todo = make_todo(
        source=TASKS_SOURCE,
        kind="tests.tasks.add",
        payload={"args": [1, 2], "kwargs": {}, "backend": "gone"},
    )
    Worker(max_todos=1).run()
    todo.refresh_from_db()
    error = todo.errors[0]["error"]
    assert error["type"].endswith(InvalidTask.__qualname__)
    assert "names backend 'gone'" in error["message"]
