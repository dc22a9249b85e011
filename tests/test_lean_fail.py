"""`fail` of one todo runs fail_leaf first: one statement for a todo that no todo waits for,
with the full fail's outcome in every case, and the full fail for a todo that some todo waits
for, whenever it got that child."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from switchboard_todos.agents import accounts
from switchboard_todos.claims.listen import CHANNEL, ENDED_CHANNEL
from switchboard_todos.exceptions import TodoConflict, TodoError, TodoNotFound
from switchboard_todos.managers.machinery import dependencies
from switchboard_todos.models import Agent, ErrorEntry, State, Todo
from tests.conftest import database_url
from tests.helpers import MakeTodo

#: A CTE only the full fail has, and one both have: which of the two a captured query is.
FULL_ONLY, EITHER = "cancelled_below AS", "held AS MATERIALIZED"

Outcome = tuple[list[str], Any]


class _Undo(Exception):
    """Rolls a savepoint back, so that the other statement can fail the same todo."""


def statements_run(captured: CaptureQueriesContext) -> list[str]:
    """Which statements a fail ran: "full", "leaf", or "miss" (what explains a miss)."""
    return [
        "full" if FULL_ONLY in query["sql"] else "leaf" if EITHER in query["sql"] else "miss"
        for query in captured.captured_queries
    ]


def values(todo: Todo) -> dict[str, Any]:
    return {field.attname: getattr(todo, field.attname) for field in Todo._meta.concrete_fields}


def history(todo_id: str) -> list[tuple[int, Any, int]]:
    entries = ErrorEntry.objects.filter(todo_id=todo_id).order_by("id")
    return list(entries.values_list("attempt", "entry", "size"))


def fail_undone(todo_id: str, owner: str, *, full: bool, **arguments: Any) -> Outcome:
    """Fail a todo by the lean path, or the full one (`full`: as a process that met
    dependencies lately), in a savepoint rolled back after: which statements ran, and what
    came of it (the todo returned, as stored, and its history), or the error raised. Within the
    test's transaction, so that both paths read the same now()."""
    dependencies.forget()
    if full:
        dependencies.met(connection.alias)
    outcome: Any = None
    try:
        with transaction.atomic():
            try:
                with CaptureQueriesContext(connection) as captured:
                    failed = Todo.objects.fail(todo_id, owner, **arguments)
            except TodoError as error:
                seen = Todo.objects.filter(pk=todo_id).first()
                outcome = (type(error), str(error), seen and values(seen))
            else:
                stored = Todo.objects.get(pk=todo_id)
                outcome = (values(failed), values(stored), history(todo_id))
            raise _Undo
    except _Undo:
        pass
    dependencies.forget()
    return statements_run(captured), outcome


def both_paths(todo_id: str, owner: str = "w1", **arguments: Any) -> tuple[Outcome, Outcome]:
    return (
        fail_undone(todo_id, owner, full=False, **arguments),
        fail_undone(todo_id, owner, full=True, **arguments),
    )


def entry(attempt: int, size: int) -> dict[str, Any]:
    return {"attempt": attempt, "owner": "w1", "error": {"type": "E", "message": "m" * size}}


CASES: dict[str, dict[str, Any]] = {
    "retry after its backoff": {"todo": {"attempt": 2, "max_attempts": 5}},
    "retry at once": {"todo": {"attempt": 1}, "fail": {"retry_in": 0}},
    "retry in a minute": {"todo": {"attempt": 1}, "fail": {"retry_in": 60}},
    "retry at its fair key's turn": {"todo": {"attempt": 1, "fair_key": "tenant"}, "lane": 2},
    "dead letter at the cap": {"todo": {"attempt": 3, "max_attempts": 3}},
    "awaited dead letter": {"todo": {"attempt": 1, "max_attempts": 1, "awaited": True}},
    "awaited retry": {"todo": {"attempt": 1, "awaited": True}},
    "a structured error": {"todo": {}, "fail": {"error": {"type": "Boom", "message": "m"}}},
    "history trimmed by bytes": {
        "todo": {"attempt": 5, "max_attempts": 10, "errors": [entry(n, 1000) for n in range(4)]},
        "settings": {"SWITCHBOARD_TODOS_MAX_ERROR_HISTORY_BYTES": 2500},
    },
    "history trimmed by entries": {
        "todo": {"attempt": 5, "max_attempts": 10, "errors": [entry(n, 5) for n in range(4)]},
        "settings": {"SWITCHBOARD_TODOS_MAX_ERRORS_KEPT": 3},
    },
    "a new entry larger than the bound": {
        "todo": {"errors": [entry(0, 10)]},
        "fail": {"error": "x" * 500},
        "settings": {"SWITCHBOARD_TODOS_MAX_ERROR_HISTORY_BYTES": 100},
    },
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_a_leaf_fail_is_the_full_fail_in_one_statement(
    settings: Any, make_todo: MakeTodo, case: dict[str, Any]
) -> None:
    """The same todo, the same history and the same row returned, whichever statement ran."""
    settings.SWITCHBOARD_TODOS_BACKOFF_JITTER = 0  # the schedule is the same at each call
    for name, value in case.get("settings", {}).items():
        setattr(settings, name, value)
    fields = case["todo"]
    for _ in range(case.get("lane", 0)):  # the fair key's todos waiting already
        make_todo(fair_key=fields["fair_key"])
    todo = make_todo(state=State.CLAIMED, owner="w1", **fields)
    lean, full = both_paths(todo.id, **{"error": "boom", **case.get("fail", {})})
    assert (lean[0], full[0]) == (["leaf"], ["full"])
    assert lean[1] == full[1]
    failed, stored, entries = lean[1]
    assert failed == stored and failed["owner"] is None
    assert entries[-1][1]["owner"] == "w1" and entries[-1][0] == failed["attempt"]


@pytest.mark.django_db
def test_a_leaf_fail_is_one_statement(make_todo: MakeTodo, django_assert_num_queries: Any) -> None:
    todo = make_todo(state=State.CLAIMED, owner="w1", attempt=1, max_attempts=1)
    with django_assert_num_queries(1):
        assert Todo.objects.fail(todo.id, "w1", "boom").state == State.FAILED


def lapsed_credential(
    lapse: Callable[[Agent], object],
) -> Callable[[MakeTodo], tuple[str, dict[str, Any]]]:
    """A todo held by an agent whose credential `lapse` (revoke, rotate_token) ended since its
    surface read it."""

    def held(make_todo: MakeTodo) -> tuple[str, dict[str, Any]]:
        agent, _ = accounts.create_agent("a1")
        todo = make_todo(state=State.CLAIMED, owner=agent.name)
        credential = agent.credential_salt
        lapse(agent)
        return todo.id, {"owner": agent.name, "credential": credential}

    return held


def theirs(make_todo: MakeTodo) -> tuple[str, dict[str, Any]]:
    return make_todo(state=State.CLAIMED, owner="w2").id, {"owner": "w1"}


def pending(make_todo: MakeTodo) -> tuple[str, dict[str, Any]]:
    return make_todo().id, {"owner": "w1"}


def ended(make_todo: MakeTodo) -> tuple[str, dict[str, Any]]:
    return make_todo(state=State.DONE, owner="w1").id, {"owner": "w1"}


def cancelled(make_todo: MakeTodo) -> tuple[str, dict[str, Any]]:
    todo = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.cancel(todo.id, "not needed")
    return todo.id, {"owner": "w1"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "refused",
    [
        theirs,
        pending,
        ended,
        cancelled,
        lapsed_credential(accounts.revoke),
        lapsed_credential(accounts.rotate_token),
    ],
    ids=["another owner's", "pending", "done", "cancelled while held", "revoked", "rotated"],
)
def test_a_refused_fail_is_refused_as_before(
    make_todo: MakeTodo, refused: Callable[[MakeTodo], tuple[str, dict[str, Any]]]
) -> None:
    """The lean statement misses, the full one misses too, and the miss is explained as
    before: the same error, the todo untouched."""
    todo_id, caller = refused(make_todo)
    before = values(Todo.objects.get(pk=todo_id))
    owner = caller.pop("owner")
    lean, full = both_paths(todo_id, owner, error="boom", **caller)
    assert lean[0][:2] == ["leaf", "full"] and full[0][:1] == ["full"]
    assert "leaf" not in full[0] and lean[0][2:] == full[0][1:]
    assert lean[1] == full[1]
    assert issubclass(lean[1][0], TodoConflict) and lean[1][2] == before


def test_a_todo_that_is_not_there_is_not_found_by_either_path(db: None) -> None:
    lean, full = both_paths("todo_missing")
    assert (lean[0][:2], full[0][:1]) == (["leaf", "full"], ["full"])
    assert lean[1] == full[1] and issubclass(lean[1][0], TodoNotFound)


@pytest.mark.django_db
@pytest.mark.parametrize("attempt", [1, 3], ids=["retry", "dead letter"])
def test_a_parent_is_failed_by_the_full_statement(make_todo: MakeTodo, attempt: int) -> None:
    """A todo some todo waits for is left by fail_leaf to fail, which settles the children of a
    dead letter as before: the cancelled ones and theirs cancelled, the one that runs anyway
    unblocked; a retried parent's children wait still."""
    parent = make_todo(state=State.CLAIMED, owner="w1", attempt=attempt, max_attempts=3)
    cancel, _ = Todo.objects.create_todo(kind="c", after=[parent.id], on_parent_failure="cancel")
    below, _ = Todo.objects.create_todo(kind="b", after=[cancel.id])
    anyway, _ = Todo.objects.create_todo(
        kind="r", after=[parent.id], on_parent_failure="run_anyway"
    )
    dependencies.forget()  # a process that did not create the children: say, another worker
    with CaptureQueriesContext(connection) as captured:
        failed = Todo.objects.fail(parent.id, "w1", "boom")
    assert statements_run(captured) == ["leaf", "full"]
    children = [Todo.objects.get(pk=todo.pk) for todo in (cancel, below, anyway)]
    if attempt < 3:
        assert failed.state == State.PENDING
        assert [(todo.state, todo.waiting_for) for todo in children] == [(State.PENDING, 1)] * 3
    else:
        assert failed.state == State.FAILED
        assert [todo.state for todo in children] == [State.FAILED, State.FAILED, State.PENDING]
        assert [(todo.result or {})["parent"] for todo in children[:2]] == [parent.id, cancel.id]
        assert (children[2].waiting_for, children[2].blocked) == (0, False)
    # Met a parent: this process's next fail runs the full statement at once.
    other = make_todo(state=State.CLAIMED, owner="w1")
    with CaptureQueriesContext(connection) as captured:
        Todo.objects.fail(other.id, "w1", "boom")
    assert statements_run(captured) == ["full"]


@pytest.mark.django_db(transaction=True)
def test_a_todo_that_gets_a_child_after_its_claim_is_failed_by_the_full_statement() -> None:
    """The child is created on another connection, committed, after the parent's claim: the
    lean statement of the parent's holder sees its edge and leaves the parent to the full fail,
    which cancels the child."""
    parent, _ = Todo.objects.create_todo(kind="p", max_attempts=1)
    assert Todo.objects.claim(parent.id, "w1", 60).state == State.CLAIMED
    made: list[Todo] = []

    def create_child() -> None:
        try:
            made.append(Todo.objects.create_todo(kind="c", after=[parent.id])[0])
        finally:
            connections.close_all()

    creator = threading.Thread(target=create_child)
    creator.start()
    creator.join()
    [child] = made
    dependencies.forget()  # the holder's process did not create the child
    with CaptureQueriesContext(connection) as captured:
        assert Todo.objects.fail(parent.id, "w1", "boom").state == State.FAILED
    assert statements_run(captured) == ["leaf", "full"]
    child = Todo.objects.get(pk=child.pk)
    assert child.state == State.FAILED and (child.result or {})["parent"] == parent.id


Heard = Callable[[], list[tuple[str, str]]]


@pytest.fixture
def heard() -> Iterator[Heard]:
    """A second connection listening on both channels; call it for what it received so far."""
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        listener.execute(f"LISTEN {ENDED_CHANNEL}")

        def received() -> list[tuple[str, str]]:
            listener.execute("SELECT 1")  # what the committed fail sent has been read
            return [(note.channel, note.payload) for note in listener.notifies(timeout=0.05)]

        yield received


#: (max_attempts, awaited), fail's arguments, and what it sends ("id": the todo's).
NOTIFIED = {
    "awaited dead letter": ((1, True), {}, [(ENDED_CHANNEL, "id")]),
    "dead letter": ((1, False), {}, []),
    "awaited retry later": ((3, True), {"retry_in": 60}, []),
    "retry due at once": ((3, False), {"retry_in": 0}, [(CHANNEL, "mail")]),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("listen", [True, False], ids=["listening", "not listening"])
@pytest.mark.parametrize("case", NOTIFIED.values(), ids=list(NOTIFIED))
def test_a_leaf_fail_notifies_as_the_full_fail(
    settings: Any, heard: Heard, listen: bool, case: tuple[tuple[int, bool], dict[str, Any], Any]
) -> None:
    """Whoever awaits a dead letter is told, and a retry due at once wakes its queue's workers
    (unless SWITCHBOARD_TODOS_LISTEN is off), by either statement, once each."""
    settings.SWITCHBOARD_TODOS_LISTEN = listen
    (attempts, awaited), arguments, expected = case
    said = []
    for full in (False, True):
        todo, _ = Todo.objects.create_todo(queue="mail", kind="k", max_attempts=attempts)
        Todo.objects.claim(todo.id, "w1", 60)
        Todo.objects.filter(pk=todo.pk).update(awaited=awaited)
        heard()
        dependencies.forget()
        if full:
            dependencies.met(connection.alias)
        with CaptureQueriesContext(connection) as captured:
            Todo.objects.fail(todo.id, "w1", "boom", **arguments)
        assert statements_run(captured) == ["full" if full else "leaf"]
        said.append([(channel, "id" if text == todo.id else text) for channel, text in heard()])
    if not listen:
        expected = [(channel, text) for channel, text in expected if channel == ENDED_CHANNEL]
    assert said == [expected, expected]
