"""Concurrency keys: while a todo with a key is claimed, no other todo with that key is."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from switchboard_todos.claims.marks import marks
from switchboard_todos.exceptions import InvalidTodo, TodoConflict
from switchboard_todos.models import State, Todo
from tests.conftest import run_in_threads
from tests.helpers import MakeTodo

LAPSED = timedelta(seconds=-5)


@pytest.mark.django_db
def test_a_held_key_is_passed_over_in_every_queue(make_todo: MakeTodo) -> None:
    first = make_todo(queue="a", concurrency_key="repo:api", created_ago=timedelta(seconds=30))
    second = make_todo(queue="b", concurrency_key="repo:api", created_ago=timedelta(seconds=20))
    other = make_todo(queue="a", concurrency_key="repo:web", created_ago=timedelta(seconds=10))
    plain = make_todo(queue="b")
    claimed = Todo.objects.claim_batch(["a", "b"], "w1", 30, limit=10)
    assert [todo.id for todo in claimed] == [first.id, other.id, plain.id]
    assert Todo.objects.claim_next(["a", "b"], "w2", 30) is None
    Todo.objects.complete(first.id, "w1")
    marks.forget()  # `second` is older than what was claimed: behind the mark (test_marks.py)
    after = Todo.objects.claim_next(["a", "b"], "w2", 30)
    assert after is not None and after.id == second.id


@pytest.mark.django_db
def test_claim_by_id_says_who_holds_the_key(make_todo: MakeTodo) -> None:
    holder = make_todo(state=State.CLAIMED, concurrency_key="customer:7")
    waiting = make_todo(concurrency_key="customer:7")
    with pytest.raises(TodoConflict, match=f"held by claimed todo {holder.id}"):
        Todo.objects.claim(waiting.id, "w2", 30)


@pytest.mark.django_db
def test_a_lapsed_holder_is_claimed_again_first(make_todo: MakeTodo) -> None:
    """The key stays with its todo until that todo is done: a lapsed lease gives it to the
    next claim, which takes the lapsed todo itself, then the others in order."""
    lapsed = make_todo(state=State.CLAIMED, concurrency_key="k", lease_expires_in=LAPSED)
    waiting = make_todo(concurrency_key="k", created_ago=timedelta(minutes=5))
    again = Todo.objects.claim_next("default", "w2", 30)
    assert again is not None and again.id == lapsed.id
    Todo.objects.complete(lapsed.id, "w2")
    marks.forget()  # `waiting` is older than what was claimed: behind the mark
    claimed = Todo.objects.claim_next("default", "w2", 30)
    assert claimed is not None and claimed.id == waiting.id


@pytest.mark.django_db
def test_a_bad_key_is_refused() -> None:
    with pytest.raises(InvalidTodo, match="concurrency_key must not be empty"):
        Todo.objects.create_todo(kind="k", concurrency_key=" ")
    with pytest.raises(InvalidTodo, match="concurrency_key must be a str"):
        Todo.objects.create_many([{"kind": "k", "concurrency_key": 7}])
    assert Todo.objects.enqueue_many([{"kind": "k", "concurrency_key": "x"}]) == 1
    assert Todo.objects.get().concurrency_key == "x"


@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_workers_never_hold_one_key_twice() -> None:
    """Workers race for 300 todos over 6 keys and unkeyed ones: whenever a worker holds a
    keyed todo, it is the only claimed todo with that key, and every todo is done."""
    keys = [f"repo:{n}" for n in range(6)]
    with connection.cursor() as cursor:  # each todo a millisecond younger than the one before
        cursor.execute(
            "INSERT INTO todos (kind, concurrency_key, created_at) "
            "SELECT 'k', CASE WHEN n % 7 < 6 THEN 'repo:' || n % 7 END, "
            "now() - (300 - n) * interval '1 millisecond' FROM generate_series(0, 299) AS n"
        )
    violations: list[str] = []

    def work(index: int) -> int:
        done = 0
        while True:
            claimed = Todo.objects.claim_batch("default", f"w{index}", 60, limit=3)
            if not claimed:
                if not Todo.objects.exclude(state=State.DONE).exists():
                    return done
                time.sleep(0.005)
                continue
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT concurrency_key, count(*) FROM todos WHERE state = 'claimed' "
                    "AND concurrency_key IS NOT NULL GROUP BY concurrency_key HAVING count(*) > 1"
                )
                violations.extend(f"{key} x{count}" for key, count in cursor.fetchall())
            time.sleep(0.001)
            done += len(Todo.objects.complete_many(f"w{index}", {t.id: None for t in claimed}))

    assert sum(run_in_threads(8, work)) == 300
    assert violations == []
    claimed_keys = set(
        Todo.objects.filter(concurrency_key__isnull=False).values_list("concurrency_key", flat=True)
    )
    assert claimed_keys == set(keys)
