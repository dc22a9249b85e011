"""Django's own `tests/tasks` modules, run against TodoBackend: `make django-tasks-tests`.

The modules come from the sdist of the Django installed (devtools/django_tests.py fetches it
from PyPI; the wheel has no tests). They are written for Django's two reference backends, so
each TASKS entry they configure is swapped for a TodoBackend that behaves as the one it
replaces, through public API only:

* DummyBackend (stores, never runs) -> `RecordingTodoBackend`: the todo is the stored result;
  `results` and `clear()`, the dummy's test hooks, read and delete this backend's todos.
* ImmediateBackend (runs at enqueue) -> `ImmediateTodoBackend`: after storing the todo, a real
  `Worker` claims and runs it, one attempt (`max_attempts=1`), before `enqueue` returns.

SimpleTestCase classes are given the default database, which the todos live in. The tests
that cannot apply are skipped with the reason in `CANNOT_APPLY`.
"""

from __future__ import annotations

import unittest
from collections.abc import Iterator
from typing import Any

from django.db import connection
from django.test import SimpleTestCase
from django.test.runner import DiscoverRunner

from switchboard_todos.backends import TodoBackend
from switchboard_todos.compat import TaskResult
from switchboard_todos.handlers import TASKS_SOURCE
from switchboard_todos.models import Todo
from switchboard_todos.worker import Worker

DUMMY = "django.tasks.backends.dummy.DummyBackend"
IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
SWAPS = {
    DUMMY: "tests.django_tasks_suite.RecordingTodoBackend",
    IMMEDIATE: "tests.django_tasks_suite.ImmediateTodoBackend",
}

_CLASS = "asserts the class of the reference backend it configured (here a TodoBackend)"
_SYNC_IN_LOOP = (
    "calls the sync API (results, get_result, refresh) inside an event loop: a database "
    "backend cannot answer there (SynchronousOnlyOperation); tests/test_async.py runs the "
    "async twins in a loop and the sync ones outside"
)
_IMMEDIATE_LACKS = (
    "asserts what ImmediateBackend cannot do (keep results, run_after); TodoBackend does both"
)
#: Test id -> why it cannot apply to TodoBackend. Every other test of the modules runs.
CANNOT_APPLY: dict[str, str] = {
    "tasks.test_tasks.TaskTestCase.test_using_correct_backend": _CLASS,
    "tasks.test_tasks.TaskTestCase.test_get_backend": _CLASS,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_using_correct_backend": _CLASS,
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_using_correct_backend": _CLASS,
    "tasks.test_tasks.TaskTestCase.test_enqueue_task_async": _SYNC_IN_LOOP,
    "tasks.test_tasks.TaskTestCase.test_get_missing_result": _SYNC_IN_LOOP,
    "tasks.test_tasks.TaskTestCase.test_refresh_result": _SYNC_IN_LOOP,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_enqueue_task_async": _SYNC_IN_LOOP,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_get_missing_result": _SYNC_IN_LOOP,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": _SYNC_IN_LOOP,
    "tasks.test_dummy_backend.DummyBackendTestCase.test_refresh_result": (
        "changes DummyBackend's stored result object in memory and expects refresh() to see "
        "it; a TodoBackend result is re-read from its row, which only a worker changes"
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result": (
        _IMMEDIATE_LACKS
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result": (
        _IMMEDIATE_LACKS
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after": (
        _IMMEDIATE_LACKS
    ),
    "tasks.test_immediate_backend.ImmediateBackendTestCase.test_throws_keyboard_interrupt": (
        "expects a task's KeyboardInterrupt to reach the caller; the worker catches it, fails "
        "that todo and goes on, since nothing a task does may stop a worker process"
    ),
}


class RecordingTodoBackend(TodoBackend):
    """TodoBackend with DummyBackend's test hooks, read from and written to the table."""

    def _todos(self) -> Any:
        return Todo.objects.filter(source=TASKS_SOURCE, payload__backend=self.alias)

    @property
    def results(self) -> list[TaskResult[Any, Any]]:
        ids = self._todos().order_by("created_at", "id").values_list("id", flat=True)
        return [self.get_result(todo_id) for todo_id in ids]

    def clear(self) -> None:
        self._todos().delete()


class ImmediateTodoBackend(RecordingTodoBackend):
    """Each task runs once, through a real Worker, before `enqueue` returns its result."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, {**params, "OPTIONS": {"max_attempts": 1}})

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        result: TaskResult[Any, Any] = super().enqueue(task, args, kwargs)
        Worker(task.queue_name, max_todos=1, poll_interval=0.05, listen=False).run()
        return self.get_result(result.id)


def _tests(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _tests(test)
        else:
            yield test


def adapt(test_class: type[unittest.TestCase]) -> None:
    """Swap the reference backends of a class's TASKS for TodoBackends; open the database."""
    overridden: dict[str, Any] = getattr(test_class, "_overridden_settings", None) or {}
    tasks = overridden.get("TASKS")
    if tasks:
        overridden["TASKS"] = {
            alias: {**entry, "BACKEND": SWAPS.get(entry.get("BACKEND"), entry.get("BACKEND"))}
            for alias, entry in tasks.items()
        }
    if issubclass(test_class, SimpleTestCase) and not test_class.databases:
        test_class.databases = {connection.alias}


class Runner(DiscoverRunner):
    """Django's test runner, adapting each test class and skipping what cannot apply."""

    def build_suite(self, *args: Any, **kwargs: Any) -> unittest.TestSuite:
        suite = super().build_suite(*args, **kwargs)
        adapted: set[type[unittest.TestCase]] = set()
        for test in _tests(suite):
            test_class = type(test)
            if test_class not in adapted:
                adapt(test_class)
                adapted.add(test_class)
            reason = CANNOT_APPLY.get(test.id())
            if reason is not None:
                name = test._testMethodName
                setattr(test_class, name, unittest.skip(reason)(getattr(test_class, name)))
        return suite
