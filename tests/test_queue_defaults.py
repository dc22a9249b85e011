"""A queue's default max_attempts reaches the todos created without one, by every path, and
costs nothing to the call that gives its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos import queue_settings, schedules, validation
from switchboard_todos.compat import task_backends
from switchboard_todos.managers.creating import _batch_rows
from switchboard_todos.models import Queue, Schedule, Todo
from switchboard_todos.sql import queries
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS
from tests import tasks
from tests.test_backend import with_options

pytestmark = pytest.mark.django_db


@pytest.fixture
def strict() -> Queue:
    """Queue `strict`, whose todos get 2 attempts unless they say otherwise."""
    return queue_settings.configure("strict", max_attempts=2)


def test_create_todo_without_max_attempts_takes_its_queues(strict: Queue) -> None:
    """Its queue's default, else 5; a given max_attempts wins; one statement each."""
    for queue, given, expected in [
        ("strict", None, 2),
        ("strict", 7, 7),
        ("plain", None, DEFAULT_MAX_ATTEMPTS),
    ]:
        with CaptureQueriesContext(connection) as captured:
            todo, _ = Todo.objects.create_todo(queue=queue, kind="k", max_attempts=given)
        assert len(captured) == 1
        assert todo.max_attempts == expected == Todo.objects.get(pk=todo.pk).max_attempts


def test_a_changed_default_reaches_only_todos_created_after(strict: Queue) -> None:
    """Todos keep the budget they were created with."""
    before, _ = Todo.objects.create_todo(queue="strict", kind="k")
    queue_settings.configure("strict", max_attempts=9)
    after, _ = Todo.objects.create_todo(queue="strict", kind="k")
    queue_settings.configure("strict", max_attempts=None)
    cleared, _ = Todo.objects.create_todo(queue="strict", kind="k")
    assert [Todo.objects.get(pk=t.pk).max_attempts for t in (before, after, cleared)] == [2, 9, 5]


def test_create_many_gives_each_row_its_queues_default(strict: Queue) -> None:
    """One statement for rows of several queues, some with their own max_attempts."""
    with CaptureQueriesContext(connection) as captured:
        made = Todo.objects.create_many(
            [
                {"queue": "strict", "kind": "a"},
                {"queue": "strict", "kind": "b", "max_attempts": 4},
                {"queue": "plain", "kind": "c"},
                {"queue": "strict", "kind": "d", "idempotency_key": "k1"},
            ]
        )
    assert len(captured) == 1
    assert [todo.max_attempts for todo, _ in made] == [2, 4, 5, 2]


def test_enqueue_many_looks_the_defaults_up_once_and_only_when_needed(
    strict: Queue, django_assert_num_queries: Any
) -> None:
    """Rows that all give max_attempts: no lookup (the COPY and its NOTIFY, which COPY does
    not log); rows without: one lookup for every queue of the batch."""
    given = [{"queue": q, "kind": "given", "max_attempts": 3} for q in ("strict", "plain")]
    with django_assert_num_queries(1):  # NOTIFY
        Todo.objects.enqueue_many(given)
    lacking = [{"queue": q, "kind": "lacking"} for q in ("strict", "plain", "strict")]
    with CaptureQueriesContext(connection) as captured:
        Todo.objects.enqueue_many([*lacking, {"queue": "other", "kind": "own", "max_attempts": 8}])
    assert ["FROM todo_queues" in query["sql"] for query in captured] == [True, False]
    found = sorted(Todo.objects.values_list("kind", "queue", "max_attempts"))
    assert found == [
        ("given", "plain", 3),
        ("given", "strict", 3),
        ("lacking", "plain", 5),
        ("lacking", "strict", 2),
        ("lacking", "strict", 2),
        ("own", "other", 8),
    ]


def plan_of(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of the executed plan of statement `name` (rolled back with the test)."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries[name], params)
        (plan,) = cursor.fetchone()
    plan = json.loads(plan) if isinstance(plan, str) else plan
    found, stack = [], [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.get("Plans", []))
    return found


def settings_reads(plan: list[dict[str, Any]]) -> list[int]:
    """How many times each scan of todo_queues in `plan` ran."""
    return [node["Actual Loops"] for node in plan if node.get("Relation Name") == "todo_queues"]


@pytest.mark.parametrize(("given", "reads"), [(3, 0), (None, 1)])
def test_create_todo_reads_the_queue_row_only_without_max_attempts(
    strict: Queue, given: int | None, reads: int
) -> None:
    """The lookup is in the statement, and never runs when the caller gave max_attempts (its
    plan either leaves it out or never executes it)."""
    params = {
        "queue": "strict",
        "source": "",
        "kind": "k",
        "title": "",
        "payload": "{}",
        "event_id": None,
        "idempotency_key": None,
        "assignee": None,
        "max_attempts": given,
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "priority": 0,
        "concurrency_key": None,
        "fair_key": None,
        "run_after": None,
        "notify": False,
        "trace_context": None,
    }
    assert sum(settings_reads(plan_of("create_todo", params))) == reads


@pytest.mark.parametrize(("given", "reads"), [((3, None, 3, None), 1), ((3, 3), 0)])
def test_create_many_reads_the_queue_row_once_a_batch_without_max_attempts(
    strict: Queue, given: tuple[int | None, ...], reads: int
) -> None:
    """Once for the batch, not once per row, and not at all when every row gave max_attempts."""
    batch = [
        validation.creation({"queue": "strict", "kind": "k", "max_attempts": attempts})
        for attempts in given
    ]
    params: dict[str, Any] = {
        **_batch_rows(batch, [f"td_{n}" for n in range(len(batch))]),
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "notify": False,
    }
    assert sum(settings_reads(plan_of("create_many", params))) == reads


def test_the_tasks_backend_leaves_max_attempts_to_the_queue() -> None:
    """Without OPTIONS["max_attempts"] (or with None), a task's todo gets its queue's default;
    with one, that one."""
    queue_settings.configure("other", max_attempts=3)
    cases: list[tuple[dict[str, Any], int]] = [
        ({}, 3),
        ({"max_attempts": None}, 3),
        ({"max_attempts": 4}, 4),
    ]
    for options, expected in cases:
        with with_options(**options):
            assert task_backends["default"].check() == []
            result = tasks.add.using(queue_name="other").enqueue(1, 2)
        assert Todo.objects.get(pk=result.id).max_attempts == expected


def test_a_schedule_without_max_attempts_follows_its_queues_default() -> None:
    """Read at each pass, so a changed default reaches the next tick's todo."""
    schedules.declare("nightly", "0 3 * * *", kind="k", queue="strict")
    schedules.declare("own", "0 3 * * *", kind="k", queue="strict", max_attempts=7)
    try:
        schedules.run_due()
        assert dict(Schedule.objects.values_list("name", "max_attempts")) == {
            "nightly": DEFAULT_MAX_ATTEMPTS,
            "own": 7,
        }
        queue_settings.configure("strict", max_attempts=2)
        schedules.run_due()
        assert dict(Schedule.objects.values_list("name", "max_attempts")) == {
            "nightly": 2,
            "own": 7,
        }
    finally:
        schedules.forget("nightly")
        schedules.forget("own")
