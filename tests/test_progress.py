"""A holder reports how far it got with its heartbeats: the todo keeps the latest note."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos.agents.serialize import todo_json
from switchboard_todos.exceptions import InvalidTodo, TodoCancelled
from switchboard_todos.handlers import Running, report_progress, running, todo_cancelled
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo


def test_a_heartbeat_keeps_the_latest_note(make_todo: MakeTodo) -> None:
    """The note is stored by the heartbeat's one statement; a heartbeat without one keeps it."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    with CaptureQueriesContext(connection) as queries:
        beat = Todo.objects.heartbeat(todo.id, "w1", 30, progress={"pages": 3, "of": 10})
    assert len(queries) == 1
    assert beat.progress == {"pages": 3, "of": 10}
    Todo.objects.heartbeat(todo.id, "w1", 30, progress="page 4 of 10")
    assert Todo.objects.heartbeat(todo.id, "w1", 30).progress == "page 4 of 10"
    assert Todo.objects.get(pk=todo.pk).progress == "page 4 of 10"
    assert todo_json(Todo.objects.get(pk=todo.pk))["progress"] == "page 4 of 10"


def test_the_note_stays_with_the_todo_once_it_ends(make_todo: MakeTodo) -> None:
    """How far the last attempt got is still there on the result's page."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.heartbeat(todo.id, "w1", 30, progress="9 of 10")
    assert Todo.objects.complete(todo.id, "w1", "ok").progress == "9 of 10"


@pytest.mark.parametrize(
    ("note", "message"),
    [
        ("x" * 40, "progress is 42 bytes as JSON; the limit is 32"),
        ({"when": object()}, "progress is not JSON-serializable"),
        ("\x00", "progress must not contain NUL"),
    ],
)
def test_a_note_it_cannot_store_is_refused_before_anything_runs(
    make_todo: MakeTodo, settings: Any, note: Any, message: str
) -> None:
    settings.SWITCHBOARD_TODOS_MAX_PROGRESS_BYTES = 32
    todo = make_todo(state=State.CLAIMED, owner="w1")
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTodo, match=message):
        Todo.objects.heartbeat(todo.id, "w1", 30, progress=note)
    assert queries.captured_queries == []
    with pytest.raises(InvalidTodo, match=f"the progress of '{todo.id}'"):
        Todo.objects.heartbeat_many("w1", 30, [todo.id], progress={todo.id: note})
    assert Todo.objects.get(pk=todo.pk).progress is None


def test_heartbeat_many_stores_each_todos_note(make_todo: MakeTodo) -> None:
    """One statement: each todo with a note gets it; one without keeps its own."""
    first, second, quiet = (make_todo(state=State.CLAIMED, owner="w1") for _ in range(3))
    Todo.objects.heartbeat(quiet.id, "w1", 30, progress="earlier")
    with CaptureQueriesContext(connection) as queries:
        beats = Todo.objects.heartbeat_many(
            "w1", 30, [first.id, second.id, quiet.id], progress={first.id: 1, second.id: [2]}
        )
    assert len(queries) == 1 and len(beats.extended) == 3
    notes = dict(Todo.objects.values_list("id", "progress"))
    assert notes == {first.id: 1, second.id: [2], quiet.id: "earlier"}


def test_outside_a_worker_a_handler_may_report_and_ask(db: None) -> None:
    """Called directly (a unit test of a handler), the note is checked and goes nowhere."""
    assert todo_cancelled() is False
    report_progress({"step": 1})
    with pytest.raises(InvalidTodo, match="progress"):
        report_progress(float("nan"))


def test_inside_a_worker_the_note_is_a_snapshot_and_a_cancel_is_raised(db: None) -> None:
    """The worker sends what was reported, not what the handler's object became; once the todo
    is cancelled, `report_progress` raises TodoCancelled, the handler's place to stop."""
    state = Running("td_1")
    note = {"done": [1]}
    with running(state):
        report_progress(note)
        note["done"].append(2)
        assert (state.progress, todo_cancelled()) == ({"done": [1]}, False)
        state.cancelled = True
        assert todo_cancelled() is True
        with pytest.raises(TodoCancelled, match="td_1 was cancelled by an operator"):
            report_progress("more")
    assert todo_cancelled() is False
