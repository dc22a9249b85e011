"""Priority: higher first, then the longest-claimable; validated on every way in."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo

pytestmark = pytest.mark.django_db

LAPSED = timedelta(seconds=-5)


def test_higher_priority_first_then_oldest(make_todo: MakeTodo) -> None:
    low_old = make_todo(priority=-3, created_ago=timedelta(seconds=50))
    normal = make_todo(created_ago=timedelta(seconds=40))
    high_new = make_todo(priority=5, created_ago=timedelta(seconds=1))
    high_old = make_todo(priority=5, created_ago=timedelta(seconds=20))
    top = make_todo(priority=100, created_ago=timedelta(seconds=0))
    claimed = Todo.objects.claim_batch("default", "w1", 30, limit=10)
    assert [todo.id for todo in claimed] == [
        top.id,
        high_old.id,
        high_new.id,
        normal.id,
        low_old.id,
    ]


def test_priority_ranks_across_queues_and_branches(make_todo: MakeTodo) -> None:
    """A due retry or a lapsed lease of higher priority goes before older ready work."""
    ready = make_todo(queue="a", created_ago=timedelta(minutes=5))
    retry = make_todo(queue="b", priority=10, next_retry_in=timedelta(seconds=-1))
    lapsed = make_todo(queue="a", state=State.CLAIMED, priority=50, lease_expires_in=LAPSED)
    first = Todo.objects.claim_next(["a", "b"], "w1", 30)
    assert first is not None and first.id == lapsed.id
    rest = Todo.objects.claim_batch(["a", "b"], "w1", 30, limit=10)
    assert [todo.id for todo in rest] == [retry.id, ready.id]


def test_one_claim_takes_the_highest_priority_of_a_large_backlog() -> None:
    Todo.objects.enqueue_many([{"kind": "k", "priority": n % 7} for n in range(500)])
    Todo.objects.create_todo(kind="urgent", priority=99)
    claimed = Todo.objects.claim_next("default", "w1", 30)
    assert claimed is not None and claimed.kind == "urgent"


def test_every_way_in_stores_the_priority() -> None:
    one, _ = Todo.objects.create_todo(kind="k", priority=-100)
    [(many, _)] = Todo.objects.create_many([{"kind": "k", "priority": 100}])
    assert Todo.objects.enqueue_many([{"kind": "bulk", "priority": 7}]) == 1
    assert (one.priority, many.priority) == (-100, 100)
    assert Todo.objects.get(kind="bulk").priority == 7
    assert Todo.objects.create_todo(kind="k")[0].priority == 0


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        (101, "priority must be between -100 and 100, not 101"),
        (-101, "priority must be between -100 and 100, not -101"),
        (True, "priority must be an int, not bool"),
        ("1", "priority must be an int, not str"),
        (1.5, "priority must be an int, not float"),
    ],
)
def test_a_bad_priority_is_refused_before_any_write(priority: Any, message: str) -> None:
    with pytest.raises(InvalidTodo, match=message):
        Todo.objects.create_todo(kind="k", priority=priority)
    with pytest.raises(InvalidTodo, match=message):
        Todo.objects.create_many([{"kind": "k"}, {"kind": "k", "priority": priority}])
    with pytest.raises(InvalidTodo, match=message):
        Todo.objects.enqueue_many([{"kind": "k", "priority": priority}])
    assert not Todo.objects.exists()


def test_set_priority_changes_pending_todos_only(make_todo: MakeTodo) -> None:
    pending, claimed = make_todo(), make_todo(state=State.CLAIMED)
    assert Todo.objects.set_priority(pending.id, 30).priority == 30
    result = Todo.objects.set_priority_many([pending.id, claimed.id, "td_missing"], -7)
    assert [todo.id for todo in result.changed] == [pending.id]
    assert result.refused == {
        claimed.id: "it is claimed, not pending",
        "td_missing": "it does not exist",
    }
    assert Todo.objects.get(pk=claimed.pk).priority == 0
    with pytest.raises(InvalidTodo, match="priority must be between"):
        Todo.objects.set_priority_many([pending.id], 500)
