"""Todos that wait for todos (`after`): blocked until every parent is done, unblocked by the
statement that completes the last one, settled by their policy when a parent ends as a dead
letter, brought back when it is requeued."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos.exceptions import InvalidPlan, InvalidTodo, TodoConflict
from switchboard_todos.managers.machinery import DEPENDENCIES_REMEMBERED, dependencies
from switchboard_todos.models import State, Todo, TodoEdge
from switchboard_todos.sql import queries
from tests.conftest import run_in_threads
from tests.helpers import MakeTodo, db_now

pytestmark = pytest.mark.django_db


def refreshed(*todos: Todo) -> list[Todo]:
    return [Todo.objects.get(pk=todo.pk) for todo in todos]


def children_of(todo: Todo) -> list[str]:
    """The ids of the todos that wait for `todo` (its edges), in id order."""
    edges = TodoEdge.objects.filter(parent_id=todo.id).order_by("child_id")
    return list(edges.values_list("child_id", flat=True))


def claim_one(todo: Todo, owner: str = "w1") -> Todo:
    return Todo.objects.claim(todo.id, owner, 30)


def child_of(*parents: Todo, **fields: Any) -> Todo:
    todo, created = Todo.objects.create_todo(
        kind="child", after=[parent.id for parent in parents], **fields
    )
    assert created
    return todo


def test_a_child_waits_for_its_parent_and_is_unblocked_by_its_completion(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    """Blocked while its parent is not done, claimable from the statement completing it."""
    parent = make_todo(state=State.CLAIMED, owner="w1")
    child = child_of(parent)
    assert (child.state, child.waiting_for, child.parents) == (State.PENDING, 1, [parent.id])
    assert child.blocked and child.next_retry_at is not None
    assert children_of(parent) == [child.id]
    assert Todo.objects.claim_next("default", "w2", 30) is None
    with django_assert_num_queries(1):
        Todo.objects.complete(parent.id, "w1", {"found": 3})
    [child] = refreshed(child)
    assert (child.waiting_for, child.blocked) == (0, False)
    assert child.next_retry_at is not None and child.next_retry_at <= db_now()
    assert Todo.objects.claim_next("default", "w2", 30) == child
    assert child.parent_results() == {parent.id: {"found": 3}}


def test_a_blocked_todo_costs_the_claim_nothing(make_todo: MakeTodo) -> None:
    """It waits out of the ready index, past every due time: the claim plan never reads it."""
    parent = make_todo(state=State.CLAIMED, owner="w1")
    child_of(parent)
    ready = make_todo()
    assert Todo.objects.claim_batch("default", "w2", 30, limit=10) == [ready]


def test_a_child_of_done_parents_is_claimable_at_once(make_todo: MakeTodo) -> None:
    done = make_todo(state=State.DONE, result={"n": 1})
    child = child_of(done)
    assert (child.waiting_for, child.next_retry_at, child.blocked) == (0, None, False)
    assert child.parent_results() == {done.id: {"n": 1}}


def test_a_missing_or_dead_parent_is_refused_and_nothing_written(make_todo: MakeTodo) -> None:
    dead = make_todo(state=State.FAILED)
    live = make_todo()
    with pytest.raises(InvalidTodo, match="'td_nope' does not exist"):
        Todo.objects.create_todo(kind="child", after=[live.id, "td_nope"])
    with pytest.raises(InvalidTodo, match="is a dead letter"):
        Todo.objects.create_todo(kind="child", after=[dead.id])
    assert not Todo.objects.filter(kind="child").exists()
    assert not TodoEdge.objects.exists()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"after": "td_x"}, "after must be a list"),
        ({"after": []}, "at least one"),
        ({"after": [""]}, "after"),
        ({"after": ["td_x"] * 2 + [f"td_{n}" for n in range(1000)]}, "at most 1000"),
        ({"after": ["td_x"], "on_parent_failure": "ignore"}, "on_parent_failure"),
        ({"after": ["td_x"], "run_after": "soon"}, "cannot also have a run_after"),
    ],
)
def test_bad_dependencies_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidTodo, match=message):
        Todo.objects.create_todo(kind="child", **arguments)


def test_an_idempotent_child_returns_its_live_twin(make_todo: MakeTodo) -> None:
    parent = make_todo(state=State.CLAIMED, owner="w1")
    first = child_of(parent, idempotency_key="k")
    again, created = Todo.objects.create_todo(kind="child", after=[parent.id], idempotency_key="k")
    assert (again, created) == (first, False)
    assert children_of(parent) == [first.id]


def test_complete_many_unblocks_in_the_same_statement(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    """Two parents of one child completed together: one statement, one unblock."""
    a = make_todo(state=State.CLAIMED, owner="w1")
    b = make_todo(state=State.CLAIMED, owner="w1")
    child = child_of(a, b)
    with django_assert_num_queries(1):
        done = Todo.objects.complete_many("w1", {a.id: 1, b.id: 2})
    assert sorted(done) == sorted([a.id, b.id])
    [child] = refreshed(child)
    assert (child.waiting_for, child.blocked) == (0, False)
    assert child.parent_results() == {a.id: 1, b.id: 2}


def test_a_parent_of_a_thousand_children_unblocks_them_in_one_statement(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    parent = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.create_many(
        [{"kind": "part", "after": [parent.id], "ref": f"p{n}"} for n in range(1000)]
    )
    assert len(children_of(parent)) == 1000
    with django_assert_num_queries(1):
        Todo.objects.complete(parent.id, "w1")
    assert Todo.objects.filter(kind="part", waiting_for=0).count() == 1000
    assert len(Todo.objects.claim_batch("default", "w2", 30, limit=1000)) == 1000


def test_a_graph_is_created_in_one_call_and_runs_in_order() -> None:
    """A diamond: fetch, then analyse and check at once, then report after both."""
    todos = Todo.objects.create_many(
        [
            {"kind": "report", "ref": "report", "after": ["analyse", "check"]},
            {"kind": "analyse", "ref": "analyse", "after": ["fetch"]},
            {"kind": "check", "ref": "check", "after": ["fetch"]},
            {"kind": "fetch", "ref": "fetch"},
        ]
    )
    report, analyse, check, fetch = (todo for todo, created in todos)
    assert all(created for _, created in todos)
    assert (report.waiting_for, analyse.waiting_for, fetch.waiting_for) == (2, 1, 0)
    assert sorted(report.parents or []) == sorted([analyse.id, check.id])
    order = []
    while claimed := Todo.objects.claim_batch("default", "w1", 30, limit=10):
        order.append(sorted(todo.kind for todo in claimed))
        Todo.objects.complete_many("w1", {todo.id: todo.kind for todo in claimed})
    assert order == [["fetch"], ["analyse", "check"], ["report"]]
    assert Todo.objects.get(pk=report.id).parent_results() == {
        analyse.id: "analyse",
        check.id: "check",
    }


@pytest.mark.parametrize(
    ("specs", "error", "message"),
    [
        (
            [{"kind": "a", "ref": "a", "after": ["b"]}, {"kind": "b", "ref": "b", "after": ["a"]}],
            InvalidPlan,
            "in a cycle: a, b",
        ),
        ([{"kind": "a", "ref": "a", "after": ["a"]}], InvalidPlan, "waits for itself"),
        ([{"kind": "a", "ref": "x"}, {"kind": "b", "ref": "x"}], InvalidPlan, "names two todos"),
        ([{"kind": "a", "ref": ""}], InvalidTodo, "ref"),
        ([{"kind": "a", "ref": "r" * 101}], InvalidTodo, "ref is 101 characters"),
    ],
)
def test_a_bad_graph_is_refused_before_anything_is_written(
    specs: list[dict[str, Any]], error: type[InvalidTodo], message: str
) -> None:
    """A plan that can never run is InvalidPlan (an InvalidTodo): its todos conflict, each
    well formed. A ref is as long as an id at most: it stands for one in `after`."""
    with pytest.raises(error, match=message) as refused:
        Todo.objects.create_many(specs)
    assert isinstance(refused.value, InvalidPlan) == (error is InvalidPlan)
    assert not Todo.objects.exists()


def test_the_longest_ref_may_be_waited_for() -> None:
    """A ref stands for an id in `after`, so it may be as long as an id, and no longer."""
    name = "r" * 100
    [(first, _), (second, _)] = Todo.objects.create_many(
        [{"kind": "a", "ref": name}, {"kind": "b", "after": [name]}]
    )
    assert second.parents == [first.id]


def test_a_graph_is_created_whole_or_not_at_all(make_todo: MakeTodo) -> None:
    """A retried graph returns its live todos; a graph of which some keys are taken is refused
    whole, and its existing parents are left as they were."""
    parent = make_todo(state=State.CLAIMED, owner="w1")
    specs = [
        {"kind": "a", "ref": "a", "after": [parent.id], "idempotency_key": "a"},
        {"kind": "b", "ref": "b", "after": ["a"], "idempotency_key": "b"},
    ]
    first = Todo.objects.create_many(specs)
    again = Todo.objects.create_many(specs)
    assert [todo for todo, _ in again] == [todo for todo, _ in first]
    assert [created for _, created in again] == [False, False]
    with pytest.raises(TodoConflict, match="all together or not at all"):
        Todo.objects.create_many([*specs, {"kind": "c", "ref": "c", "after": ["b"]}])
    assert Todo.objects.filter(kind="c").count() == 0
    assert children_of(parent) == [first[0][0].id]


def fail_for_good(todo: Todo, owner: str = "w1") -> None:
    Todo.objects.filter(pk=todo.pk).update(max_attempts=1)
    Todo.objects.fail(todo.id, owner, "broken")


def test_a_failed_parent_cancels_its_descendants(make_todo: MakeTodo) -> None:
    """Policy cancel (the default): the child and, through it, the grandchild end as dead
    letters naming the parent that failed."""
    parent = make_todo(state=State.CLAIMED, owner="w1")
    child = child_of(parent)
    grandchild = child_of(child)
    fail_for_good(parent)
    causes = []
    for todo in refreshed(child, grandchild):
        assert todo.state == State.FAILED
        assert todo.result is not None and todo.result["type"] == "ParentFailed"
        assert todo.errors[-1]["error"]["type"] == "ParentFailed"
        causes.append(todo.result["parent"])
    assert causes == [parent.id, child.id]


def test_a_child_that_runs_anyway_counts_a_failed_parent_as_finished(
    make_todo: MakeTodo,
) -> None:
    failing = make_todo(state=State.CLAIMED, owner="w1")
    other = make_todo(state=State.CLAIMED, owner="w1")
    child = child_of(failing, other, on_parent_failure="run_anyway")
    fail_for_good(failing)
    [child] = refreshed(child)
    assert (child.state, child.waiting_for, child.blocked) == (State.PENDING, 1, True)
    Todo.objects.complete(other.id, "w1", "ok")
    [child] = refreshed(child)
    assert not child.blocked
    assert child.parent_results() == {failing.id: None, other.id: "ok"}


def test_the_reaper_and_an_operator_settle_descendants_too(make_todo: MakeTodo) -> None:
    lapsing = make_todo(
        state=State.CLAIMED,
        owner="w1",
        attempt=1,
        max_attempts=1,
        lease_expires_in=timedelta(seconds=-5),
    )
    cancelled = make_todo()
    under_reaped, under_cancelled = child_of(lapsing), child_of(cancelled)
    assert Todo.objects.reap_expired().dead_lettered == 1
    Todo.objects.cancel(cancelled.id, "not needed")
    assert [todo.state for todo in refreshed(under_reaped, under_cancelled)] == [
        State.FAILED,
        State.FAILED,
    ]


def test_requeueing_the_failed_parent_brings_its_descendants_back(make_todo: MakeTodo) -> None:
    parent = make_todo(state=State.CLAIMED, owner="w1")
    child = child_of(parent)
    grandchild = child_of(child)
    fail_for_good(parent)
    Todo.objects.requeue(parent.id)
    parent, child, grandchild = refreshed(parent, child, grandchild)
    assert parent.state == State.PENDING and not parent.blocked
    assert [(todo.state, todo.waiting_for, todo.blocked) for todo in (child, grandchild)] == [
        (State.PENDING, 1, True),
        (State.PENDING, 1, True),
    ]
    assert child.result is None
    Todo.objects.complete(claim_one(parent).id, "w1")
    Todo.objects.complete(claim_one(Todo.objects.get(pk=child.id)).id, "w1")
    assert not refreshed(grandchild)[0].blocked


@pytest.mark.django_db(transaction=True)
def test_eight_parents_completing_at_once_unblock_their_child_once() -> None:
    parents = [Todo.objects.create_todo(kind="part", idempotency_key=f"p{n}")[0] for n in range(8)]
    for number, parent in enumerate(parents):
        Todo.objects.claim(parent.id, f"w{number}", 60)
    child = child_of(*parents)
    run_in_threads(8, lambda n: Todo.objects.complete(parents[n].id, f"w{n}"))
    [child] = refreshed(child)
    assert (child.waiting_for, child.blocked) == (0, False)


def test_the_state_of_a_blocked_todo_reads_as_python(make_todo: MakeTodo) -> None:
    """Blocked todos wait in the year 9999, which Python reads (not 'infinity')."""
    parent = make_todo(state=State.CLAIMED, owner="w1")
    child = child_of(parent)
    assert child.next_retry_at is not None and child.next_retry_at.year == 9999
    with connection.cursor() as cursor:
        cursor.execute("SELECT next_retry_at FROM todos WHERE id = %s", [child.id])
        assert cursor.fetchone()[0].year == 9999


LEAF = queries["complete_leaf"].splitlines()[0]


def completes(todo: Todo) -> list[str]:
    """Complete `todo` for w1; which statements ran: "leaf" (complete_leaf) or "full"."""
    with CaptureQueriesContext(connection) as statements:
        Todo.objects.complete(todo.id, "w1")
    return ["leaf" if q["sql"].startswith(LEAF) else "full" for q in statements]


def test_a_parent_the_process_has_not_met_is_left_by_the_lean_complete_to_the_full_one(
    make_todo: MakeTodo,
) -> None:
    """complete_leaf never completes a todo that others wait for: the full statement does,
    and unblocks them; then the process's completes in that database run the full statement
    at once for a while (Dependencies), and lean again after."""
    parent, other = (make_todo(state=State.CLAIMED, owner="w1") for _ in range(2))
    child = child_of(parent)
    dependencies.forget()  # a process that did not create the child: say, another worker
    assert completes(parent) == ["leaf", "full"]
    assert refreshed(child)[0].waiting_for == 0
    assert completes(other) == ["full"]
    alone = make_todo(state=State.CLAIMED, owner="w1")
    dependencies.clock = lambda: time.monotonic() + DEPENDENCIES_REMEMBERED
    try:
        assert completes(alone) == ["leaf"]
    finally:
        dependencies.clock = time.monotonic
    assert {todo.state for todo in refreshed(parent, other, alone)} == {State.DONE}


def test_a_todo_without_children_is_completed_by_the_lean_statement_under_its_guards(
    make_todo: MakeTodo,
) -> None:
    """One statement; a todo not held, or held by another, is refused and explained as the full
    complete explains it."""
    held = make_todo(state=State.CLAIMED, owner="w1")
    assert completes(held) == ["leaf"]
    assert refreshed(held)[0].state == State.DONE
    theirs = make_todo(state=State.CLAIMED, owner="w2")
    with pytest.raises(TodoConflict, match="w2"):
        Todo.objects.complete(theirs.id, "w1")
    assert refreshed(theirs)[0].state == State.CLAIMED
