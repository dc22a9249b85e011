"""A django.tasks backend that keeps each task as a todo: leases, retries and dead letters.

    TASKS = {
        "default": {
            "BACKEND": "switchboard_todos.backends.TodoBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"max_attempts": 5},  # default: the queue's (Queue), else 5
        }
    }

`enqueue` is one `create_todo` in the caller's transaction (so a rollback takes the task with
it: an outbox for free); `manage.py todo_worker` runs the task; `get_result` reads the todo
back. The mapping is in docs/tasks.md.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from switchboard_todos import placement, validation
from switchboard_todos.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from switchboard_todos.exceptions import InvalidTodo, LeaseExpired, TodoCancelled
from switchboard_todos.handlers import TASKS_SOURCE
from switchboard_todos.models import State, Todo
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    # Django's own Task and TaskResult are not generic at run time, only in django-stubs.
    AnyTask = Task[..., Any]
    AnyResult = TaskResult[..., Any]

P = ParamSpec("P")
R = TypeVar("R")

#: OPTIONS and their defaults; a `max_attempts` of None leaves it to each task's queue (Queue),
#: else DEFAULT_MAX_ATTEMPTS. A `fair_key` makes the backend's tasks one tenant of their queues,
#: which takes turns with the others at the claims (docs/queues.md, fairness).
OPTIONS: dict[str, int | str | None] = {"max_attempts": None, "fair_key": None}

STATUS = {
    State.PENDING: TaskResultStatus.READY,
    State.CLAIMED: TaskResultStatus.RUNNING,
    State.DONE: TaskResultStatus.SUCCESSFUL,
    State.FAILED: TaskResultStatus.FAILED,
}

#: The errors the core records by a short name (the reaper's, an operator's cancel), as the
#: classes a TaskError names.
_RECORDED = {
    "LeaseExpired": f"{LeaseExpired.__module__}.{LeaseExpired.__qualname__}",
    "Cancelled": f"{TodoCancelled.__module__}.{TodoCancelled.__qualname__}",
}


class TodoBackend(BaseTaskBackend):
    """Store tasks as todos, run by `manage.py todo_worker` with retries and dead letters."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: AnyTask) -> None:
        """Django's checks, a timedelta `run_after` (which they crash on), and todo limits."""
        run_after: object = task.run_after
        if isinstance(run_after, timedelta):
            if run_after < timedelta(0):
                raise InvalidTask("run_after must not be a negative timedelta.")
            super().validate_task(_rebuilt(task, run_after=None))
        else:
            super().validate_task(task)
        try:
            validation.queue(task.queue_name)
            validation.kind(task.module_path)
        except InvalidTodo as error:
            raise InvalidTask(str(error)) from error

    def enqueue(
        self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[P, R]:
        """Store the task as a pending todo, in the caller's transaction if there is one."""
        self.validate_task(task)
        if _import_task(task.module_path).func is not task.func:
            raise InvalidTask(
                f"Task {task.module_path!r} does not import back as itself: define tasks at "
                "module level, under their own name, so that the worker can find them."
            )
        run_after = _absolute(task.run_after)
        payload = {
            "args": normalize_json(args),
            "kwargs": normalize_json(kwargs),
            "backend": self.alias,
        }
        if run_after is not None:
            # Kept for get_result: next_retry_at means the next retry once the task has failed.
            payload["run_after"] = run_after.isoformat()
        todo, _ = Todo.objects.create_todo(
            queue=task.queue_name,
            kind=task.module_path,
            # Its function's name: the admin's title (its path is the kind).
            title=task.name,
            source=TASKS_SOURCE,
            payload=payload,
            max_attempts=self.options.get("max_attempts", OPTIONS["max_attempts"]),
            priority=task.priority,
            fair_key=self.options.get("fair_key", OPTIONS["fair_key"]),
            run_after=run_after,
        )
        result = cast("TaskResult[P, R]", task_result(todo, _rebuilt(task, run_after=run_after)))
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str, *, wait: float | None = None) -> AnyResult:
        """The task's result as stored now; TaskResultDoesNotExist for ids it did not enqueue.

        With `wait` (seconds), the result once the task has finished (or as it is after `wait`):
        `Todo.objects.wait_for`, woken the moment it ends. With queues in several databases,
        each database its queues live in is asked in turn.
        """
        found = Todo.objects.filter(
            pk=result_id, source=TASKS_SOURCE, payload__backend=self.alias
        ).with_errors()
        aliases = (
            list(placement.by_database(self.queues)) if self.queues else placement.todo_databases()
        )
        todo = next((todo for alias in aliases for todo in found.using(alias)[:1]), None)
        if todo is None:
            raise TaskResultDoesNotExist(result_id)
        if wait is not None:
            todo = Todo.objects.db_manager(todo._state.db).wait_for(todo.id, wait)
        try:
            return task_result(todo, restore_task(todo))
        except InvalidTask as error:
            raise TaskResultDoesNotExist(f"{result_id}: {error}") from error

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """The app is installed; OPTIONS and QUEUES are ones todos accept."""
        where = f"TASKS[{self.alias!r}]"
        errors: list[checks.CheckMessage] = []
        if not apps.is_installed("switchboard_todos"):
            errors.append(
                checks.Error(
                    f"{where} uses TodoBackend, but switchboard_todos is not installed.",
                    hint="Add 'switchboard_todos' to INSTALLED_APPS and run migrate.",
                    id="switchboard_todos.E101",
                )
            )
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            errors.append(
                checks.Error(
                    f"{where}['OPTIONS'] has unknown keys: {', '.join(map(repr, unknown))}.",
                    hint=f"TodoBackend takes {', '.join(map(repr, OPTIONS))}.",
                    id="switchboard_todos.E102",
                )
            )
        max_attempts = self.options.get("max_attempts", OPTIONS["max_attempts"])
        try:
            if max_attempts is not None:
                validation.whole_number(
                    max_attempts, "max_attempts", 1, validation.MAX_ATTEMPTS_LIMIT
                )
        except InvalidTodo as error:
            errors.append(
                checks.Error(
                    f"{where}['OPTIONS']['max_attempts']: {error}",
                    hint=(
                        "Attempts per task before it is dead-lettered; 1 means no retries, None "
                        f"the queue's default (else {DEFAULT_MAX_ATTEMPTS})."
                    ),
                    id="switchboard_todos.E103",
                )
            )
        fair_key = self.options.get("fair_key", OPTIONS["fair_key"])
        try:
            if fair_key is not None:
                validation.fair_key(fair_key)
        except InvalidTodo as error:
            errors.append(
                checks.Error(
                    f"{where}['OPTIONS']['fair_key']: {error}",
                    hint="The tenant this backend's tasks count for, or None for none.",
                    id="switchboard_todos.E105",
                )
            )
        for queue in sorted(self.queues):
            try:
                validation.queue(queue)
            except InvalidTodo as error:
                errors.append(
                    checks.Error(
                        f"{where}['QUEUES']: {error}",
                        hint="Queue names are letters, digits and _ . : -",
                        id="switchboard_todos.E104",
                    )
                )
        return errors


class TaskRunner:
    """The worker's handler for todos TodoBackend enqueued: runs the task as Django's do.

    `task_started` goes out before the call and `task_finished` (from `finished`) once the
    outcome is stored; TaskContext.attempt is the todo's attempt.
    """

    def __call__(self, todo: Todo) -> Any:
        backend = _backend(todo)
        task = restore_task(todo)
        result = task_result(todo, task)
        task_started.send(type(backend), task_result=result)
        args, kwargs = todo.payload["args"], todo.payload["kwargs"]
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        return normalize_json(value)

    def finished(self, todo: Todo) -> None:
        """Send `task_finished` for the outcome just stored (from inside `except` on failure)."""
        try:
            backend = _backend(todo)
            task = restore_task(todo)
        except InvalidTask:
            return  # the task never started: there is nothing it could have finished
        task_finished.send(type(backend), task_result=task_result(todo, task))


def task_result(todo: Todo, task: AnyTask) -> AnyResult:
    """Describe `todo` as django.tasks does: status, attempts, errors, return value.

    `worker_ids` has one owner per attempt of the current attempt budget, so that
    TaskContext.attempt equals `todo.attempt`: an attempt whose entry the history no longer
    keeps (SWITCHBOARD_TODOS_MAX_ERRORS_KEPT) has an empty one. `errors` is the failure
    history, one TaskError per failed or expired attempt it keeps, including those before an
    operator's requeue. `started_at` is the first kept attempt's claim.
    """
    held = todo.state in (State.CLAIMED, State.DONE)
    history: list[dict[str, Any]] = todo.errors or []
    wanted = max(0, todo.attempt - (1 if held else 0))
    earlier = min(len(history), wanted)
    attempts = history[len(history) - earlier :]
    dropped = min(wanted - earlier, todo.errors_dropped)
    worker_ids = [""] * dropped + [str(entry.get("owner") or "") for entry in attempts]
    if held:
        worker_ids.append(todo.owner or "")
    if attempts:
        started_at = _timestamp(attempts[0].get("claimed_at"))
    else:
        started_at = todo.claimed_at if held else None
    result = TaskResult(
        task=task,
        id=todo.id,
        status=STATUS[State(todo.state)],
        enqueued_at=todo.created_at,
        started_at=started_at,
        finished_at=todo.completed_at if todo.state in (State.DONE, State.FAILED) else None,
        last_attempted_at=todo.claimed_at if todo.attempt else None,
        args=todo.payload.get("args", []),
        kwargs=todo.payload.get("kwargs", {}),
        backend=todo.payload.get("backend", task.backend),
        errors=[_task_error(entry) for entry in history],
        worker_ids=worker_ids,
    )
    if todo.state == State.DONE:
        object.__setattr__(result, "_return_value", todo.result)
    return result


def restore_task(todo: Todo) -> AnyTask:
    """The Task a todo was enqueued for, on its backend and queue, without revalidating it.

    Validation is skipped so that a result stays readable, and a task runnable, after the
    backend's QUEUES or the task's decorator changed.
    """
    task = _import_task(todo.kind)
    backend = todo.payload.get("backend", task.backend)
    run_after = todo.payload.get("run_after")
    return _rebuilt(
        task,
        backend=backend,
        queue_name=todo.queue,
        priority=todo.priority,
        run_after=None if run_after is None else datetime.fromisoformat(run_after),
    )


def _import_task(path: str) -> AnyTask:
    try:
        found = import_string(path)
    except ImportError as error:
        raise InvalidTask(f"Task {path!r} cannot be imported: {error}") from error
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is not a Task: it is {type(found).__name__}.")
    return found


def _rebuilt(task: AnyTask, **changes: Any) -> AnyTask:
    """A copy of a frozen Task with `changes`, skipping __post_init__'s validation."""
    copy: AnyTask = object.__new__(type(task))
    for field in dataclasses.fields(task):
        object.__setattr__(copy, field.name, changes.get(field.name, getattr(task, field.name)))
    return copy


def _backend(todo: Todo) -> TodoBackend:
    alias = todo.payload.get("backend")
    try:
        backend = task_backends[alias]
    except ImproperlyConfigured as error:
        raise InvalidTask(f"Todo {todo.id} names backend {alias!r}: {error}") from error
    if not isinstance(backend, TodoBackend):
        raise InvalidTask(
            f"Todo {todo.id} names backend {alias!r}, which is {type(backend).__name__}, "
            "not switchboard_todos.backends.TodoBackend."
        )
    return backend


def _absolute(run_after: object) -> datetime | None:
    """`run_after` as an aware datetime: a timedelta counts from now, naive means local time."""
    if run_after is None:
        return None
    if isinstance(run_after, timedelta):
        return timezone.now() + run_after
    if not isinstance(run_after, datetime):
        raise InvalidTask(f"run_after must be a datetime, not {type(run_after).__name__}.")
    return timezone.make_aware(run_after) if timezone.is_naive(run_after) else run_after


def _task_error(entry: dict[str, Any]) -> TaskError:
    """One entry of `todos.errors` as a TaskError, whose class path must import."""
    error = entry.get("error") or {}
    kind = str(error.get("type") or "")
    if kind in _RECORDED:
        path = _RECORDED[kind]
    elif "." in kind:
        path = kind
    else:
        path = "builtins.Exception"
    trace = error.get("traceback") or f"{kind or 'Error'}: {error.get('message', '')}"
    return TaskError(exception_class_path=path, traceback=str(trace))


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
