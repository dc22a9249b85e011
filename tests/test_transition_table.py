"""The table of transitions agrees with the SQL that is their guards, and with the manager."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from switchboard_todos.exceptions import TodoCancelled, TodoConflict
from switchboard_todos.models import State, Todo
from switchboard_todos.sql import SOURCE, queries, written
from switchboard_todos.transitions import REPAIRS, TRANSITIONS

MakeTodo = Callable[..., Todo]

STATEMENTS, _FRAGMENTS = written(SOURCE)
#: The statements that write todos, found in the file: each one is a transition.
WRITING = sorted(
    name for name, sql in STATEMENTS.items() if re.search(r"\b(INSERT INTO|UPDATE) todos\b", sql)
)

_STATE_TEST = re.compile(r"(?<![\w.])(?:todos\.)?state (?:= '(\w+)'|IN \(([^)]*)\))")
_FRAGMENT = re.compile(r"\{\{[^{}]*\}\}")


def guard(sql: str) -> str:
    """The part of a statement as written that decides which rows it changes.

    Everything before its last RETURNING (what follows reads the changed rows, not the table),
    without what it sets (`SET state = ...`) and without its fragments: a guard is written in
    the statement itself.
    """
    text = sql[: sql.rindex("RETURNING")]
    while _FRAGMENT.search(text):
        text = _FRAGMENT.sub("", text)
    return re.sub(r"\bSET state = '\w+'", "", text)


def guarded_states(sql: str) -> set[str]:
    """The states that the guard's `state = '...'` and `state IN (...)` tests accept."""
    found = set()
    for single, several in _STATE_TEST.findall(guard(sql)):
        found |= {single} if single else set(re.findall(r"'(\w+)'", several))
    return found


def test_every_statement_that_writes_todos_is_a_transition() -> None:
    """A statement that inserts or updates todos has its row, and each row its statement."""
    assert sorted(TRANSITIONS) == WRITING


@pytest.mark.parametrize("name", WRITING)
def test_the_guard_accepts_exactly_the_states_of_the_row(name: str) -> None:
    """The SQL's state tests and the row's from-states are the same set."""
    assert guarded_states(STATEMENTS[name]) == set(TRANSITIONS[name].from_states)


@pytest.mark.parametrize("name", WRITING)
def test_the_guard_tests_the_owner_when_the_row_says_so(name: str) -> None:
    """An owner-guarded row's statement changes only a todo the caller holds."""
    tests_owner = re.search(r"\bowner = %\(owner\)s", guard(STATEMENTS[name])) is not None
    assert tests_owner == TRANSITIONS[name].owner_guarded


def test_the_guard_parser_reads_each_form() -> None:
    """`state = '...'` and `state IN (...)` count; assignments, fragments and output do not."""
    sql = (
        "UPDATE todos SET state = 'done', {{x(state = 'failed')}} "
        "WHERE todos.state = 'claimed' OR state IN ('pending', 'done') AND live.state = 'failed' "
        "RETURNING * ) SELECT * FROM changed WHERE state = 'failed'"
    )
    assert guarded_states(sql) == {"claimed", "pending", "done"}


@pytest.mark.parametrize("name", TRANSITIONS)
def test_each_transition_is_a_manager_method(name: str) -> None:
    """The row, the SQL block and the method share one name (or the row names its method)."""
    assert callable(getattr(Todo.objects, TRANSITIONS[name].method or name))
    assert name in queries


@pytest.mark.parametrize("name", REPAIRS)
def test_each_repair_has_its_permission_and_batch_form(db: None, name: str) -> None:
    """An operator repair is gated by a permission that exists, and has a `_many` form whose
    refusals all have a reason."""
    transition, repair = REPAIRS[name]
    assert Permission.objects.filter(
        content_type__app_label="switchboard_todos", codename=repair.permission
    ).exists()
    assert callable(getattr(Todo.objects, f"{transition.name}_many"))
    assert transition.not_in_state
    assert all(obstacle.refusal for obstacle in transition.obstacles)


def seen(todo: Todo) -> dict[str, Any]:
    """What `classify_miss` reads of `todo`, as the manager explains a miss from it."""
    with connection.cursor() as cursor:
        cursor.execute(queries["classify_miss"], {"ids": [todo.id]})
        columns = [column.name for column in cursor.description or ()]
        return dict(zip(columns, cursor.fetchone(), strict=True))


@pytest.mark.parametrize("state", State.values)
def test_every_message_of_every_row_can_be_said(make_todo: MakeTodo, state: str) -> None:
    """Each template names only columns the miss classification reads (no KeyError at a miss)."""
    row = seen(make_todo(state=state, owner="w1" if state == State.CLAIMED else None))
    for transition in TRANSITIONS.values():
        obstacles = transition.obstacles + transition.ended_by
        templates = [transition.wrong_state] + [item.conflict for item in obstacles]
        for template in filter(None, templates):
            assert row["id"] in template.format(**row, caller="w2", operation=transition.name)
        if transition.not_in_state:
            assert transition.refusal(row).startswith("it ")


def test_a_miss_nothing_explains_says_the_todo_changed(make_todo: MakeTodo) -> None:
    """The guard missed, yet the todo now passes it: it changed in between; try again."""
    row = seen(make_todo(state=State.CLAIMED, owner="w1"))
    heartbeat = TRANSITIONS["heartbeat"]
    assert (
        heartbeat.conflict(row, "w1") == f"Todo {row['id']} changed while heartbeat ran; try again."
    )
    assert (
        TRANSITIONS["expire_lease"].refusal(row) == "it changed while the operation ran; try again"
    )


def test_an_owner_guarded_miss_of_a_cancelled_hold_is_told_as_a_cancel(make_todo: MakeTodo) -> None:
    """The rows of the holder's verbs explain a cancel first, with TodoCancelled."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.cancel(todo.id, "stop")
    row = seen(todo)
    for transition in TRANSITIONS.values():
        if transition.owner_guarded:
            assert transition.error(row, "w1") is TodoCancelled, transition.name
            assert transition.error(row, "w2") is TodoConflict, transition.name
            assert "cancelled by an operator" in transition.conflict(row, "w1")
