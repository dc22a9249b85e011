"""The operator's transitions (requeue, expire_lease, cancel), one todo or a batch."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos import validation
from switchboard_todos.exceptions import InvalidTodo, TodoConflict, TodoNotFound
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo, db_now

LAPSED = timedelta(seconds=-5)

#: Every starting state an operator can meet, by name.
STARTING: dict[str, dict[str, Any]] = {
    "ready": {},
    "waiting": {"next_retry_in": timedelta(minutes=5), "attempt": 1},
    "claimed": {"state": State.CLAIMED},
    "lapsed": {"state": State.CLAIMED, "lease_expires_in": LAPSED},
    "done": {"state": State.DONE},
    "failed": {"state": State.FAILED},
}


def statements(queries: CaptureQueriesContext) -> list[str]:
    """The statements run, without the savepoints `atomic` wraps them in inside a test."""
    return [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]


# expire_lease


def test_expire_lease_makes_a_valid_lease_lapse_now(make_todo: MakeTodo) -> None:
    """The lease ends at the database's now; the todo stays claimed by its owner until taken."""
    todo = make_todo(**STARTING["claimed"])
    expired = Todo.objects.expire_lease(todo.id)
    assert (expired.state, expired.owner) == (State.CLAIMED, "w1")
    assert expired.lease_expires_at == db_now()
    assert expired.updated_at == expired.lease_expires_at


def test_an_expired_lease_is_taken_by_the_next_claim(make_todo: MakeTodo) -> None:
    """Once expired, another worker's claim takes the todo and the lapse is in the history."""
    todo = make_todo(**STARTING["claimed"])
    Todo.objects.expire_lease(todo.id)
    taken = Todo.objects.claim_next("default", "w2", 30)
    assert taken is not None and (taken.id, taken.owner, taken.attempt) == (todo.id, "w2", 2)
    assert taken.errors[-1]["error"]["type"] == "LeaseExpired"


def test_an_expired_lease_is_reaped(make_todo: MakeTodo) -> None:
    """The reaper's next sweep sends an expired todo back to pending."""
    todo = make_todo(**STARTING["claimed"])
    Todo.objects.expire_lease(todo.id)
    assert Todo.objects.reap_expired().requeued == 1
    assert Todo.objects.get(pk=todo.pk).state == State.PENDING


def test_expire_lease_keeps_a_lease_that_already_lapsed(make_todo: MakeTodo) -> None:
    """A lapsed lease is not moved later: the todo stays as claimable as it was."""
    todo = make_todo(**STARTING["lapsed"])
    assert Todo.objects.expire_lease(todo.id).lease_expires_at == todo.lease_expires_at


@pytest.mark.parametrize("starting", ["ready", "waiting", "done", "failed"])
def test_expire_lease_needs_a_claimed_todo(make_todo: MakeTodo, starting: str) -> None:
    """Only claimed todos have a lease: the others are refused, naming their state."""
    todo = make_todo(**STARTING[starting])
    with pytest.raises(TodoConflict, match="only claimed todos have a lease to expire") as caught:
        Todo.objects.expire_lease(todo.id)
    assert caught.value.state == todo.state
    assert Todo.objects.get(pk=todo.pk).updated_at == todo.updated_at


# cancel


@pytest.mark.parametrize("starting", ["ready", "waiting"])
def test_cancel_makes_a_pending_todo_a_dead_letter(make_todo: MakeTodo, starting: str) -> None:
    """Pending, due or waiting for a retry, becomes failed; the reason is result and history."""
    todo = make_todo(**STARTING[starting])
    dead = Todo.objects.cancel(todo.id, "  duplicate order  ")
    assert (dead.state, dead.next_retry_at, dead.owner) == (State.FAILED, None, None)
    assert dead.result == {"type": "Cancelled", "message": "duplicate order"}
    assert dead.errors[-1]["error"] == dead.result
    assert (dead.errors[-1]["attempt"], dead.errors[-1]["owner"]) == (todo.attempt, None)
    assert dead.completed_at == db_now()
    assert Todo.objects.get(pk=todo.pk).result == dead.result


@pytest.mark.parametrize("starting", ["claimed", "lapsed"])
def test_cancel_ends_a_claimed_todo_and_keeps_its_holder(
    make_todo: MakeTodo, starting: str
) -> None:
    """A claimed todo becomes failed, its lease ended; its owner stays, so that the holder is
    told "cancelled", and the attempt it ended is in the history."""
    todo = make_todo(**STARTING[starting], attempt=2)
    dead = Todo.objects.cancel(todo.id, "runaway agent")
    assert (dead.state, dead.owner, dead.lease_expires_at) == (State.FAILED, "w1", None)
    assert dead.result == {"type": "Cancelled", "message": "runaway agent"}
    assert dead.errors[-1]["error"] == dead.result
    assert (dead.errors[-1]["attempt"], dead.errors[-1]["owner"]) == (2, "w1")


def test_a_cancelled_todo_can_be_requeued(make_todo: MakeTodo) -> None:
    """A cancelled todo is an ordinary dead letter: requeue brings it back, without its holder."""
    todo = make_todo(state=State.CLAIMED)
    Todo.objects.cancel(todo.id, "wrong payload")
    requeued = Todo.objects.requeue(todo.id)
    assert (requeued.state, requeued.owner) == (State.PENDING, None)


@pytest.mark.parametrize("starting", ["done", "failed"])
def test_cancel_needs_a_pending_or_claimed_todo(make_todo: MakeTodo, starting: str) -> None:
    """Done and failed todos are refused, naming their state."""
    todo = make_todo(**STARTING[starting])
    with pytest.raises(TodoConflict, match=f"is {todo.state}; only pending and claimed todos"):
        Todo.objects.cancel(todo.id, "no")
    assert Todo.objects.get(pk=todo.pk).updated_at == todo.updated_at


@pytest.mark.parametrize("reason", ["", "   ", "x" * (validation.REASON_MAX_LENGTH + 1), None])
def test_cancel_needs_a_reason(make_todo: MakeTodo, reason: Any) -> None:
    """Without a usable reason nothing is written."""
    todo = make_todo()
    with pytest.raises(InvalidTodo, match="reason"):
        Todo.objects.cancel(todo.id, reason)
    assert Todo.objects.get(pk=todo.pk).state == State.PENDING


# requeue, in batches


def test_requeue_many_requeues_the_newest_of_dead_letters_sharing_a_key(
    make_todo: MakeTodo,
) -> None:
    """Two dead letters with one key: the newer goes back, the older is refused with the reason."""
    older = make_todo(state=State.FAILED, idempotency_key="k", created_ago=timedelta(hours=2))
    newer = make_todo(state=State.FAILED, idempotency_key="k", created_ago=timedelta(hours=1))
    plain = make_todo(state=State.FAILED)
    result = Todo.objects.requeue_many([older.id, newer.id, plain.id])
    assert sorted(todo.id for todo in result.changed) == sorted([newer.id, plain.id])
    assert result.refused == {older.id: "a live todo holds the same idempotency key"}
    assert Todo.objects.get(pk=older.pk).state == State.FAILED


def test_requeue_many_says_why_it_left_each_todo(make_todo: MakeTodo) -> None:
    """Every refusal names its cause: the state, or that the todo does not exist."""
    pending = make_todo()
    done = make_todo(state=State.DONE)
    result = Todo.objects.requeue_many([pending.id, done.id, "td_missing"])
    assert result.changed == []
    assert result.refused == {
        pending.id: "it is pending, not dead-lettered",
        done.id: "it is done, not dead-lettered",
        "td_missing": "it does not exist",
    }


def test_a_batch_is_one_statement(make_todo: MakeTodo) -> None:
    """Each batch operation changes all its todos in one statement when none is refused."""
    failed = [make_todo(state=State.FAILED).id for _ in range(3)]
    claimed = [make_todo(state=State.CLAIMED).id for _ in range(3)]
    pending = [make_todo().id for _ in range(3)]
    calls: list[Callable[[], object]] = [
        lambda: Todo.objects.requeue_many(failed),
        lambda: Todo.objects.expire_lease_many(claimed),
        lambda: Todo.objects.cancel_many(pending + claimed, "cancelled"),
    ]
    for call in calls:
        with CaptureQueriesContext(connection) as queries:
            call()
        assert len(statements(queries)) == 1, queries.captured_queries


def test_expire_lease_many_and_cancel_many_refuse_by_state(make_todo: MakeTodo) -> None:
    """The batch twins change what they may and explain the rest."""
    todos = {name: make_todo(**starting) for name, starting in STARTING.items()}
    ids = [todo.id for todo in todos.values()]
    expired = Todo.objects.expire_lease_many(ids)
    assert {todo.id for todo in expired.changed} == {todos["claimed"].id, todos["lapsed"].id}
    assert expired.refused[todos["ready"].id] == "it is pending, not claimed"
    dead = Todo.objects.cancel_many(ids, "cleanup")
    assert {todo.id for todo in dead.changed} == {
        todos[name].id for name in ("ready", "waiting", "claimed", "lapsed")
    }
    assert dead.refused == {
        todos["done"].id: "it is done, neither pending nor claimed",
        todos["failed"].id: "it is failed, neither pending nor claimed",
    }


def test_requeue_falls_back_to_one_by_one_when_a_key_is_taken_mid_statement(
    make_todo: MakeTodo,
) -> None:
    """A live twin created between the guard and the write fails the whole batch statement;
    each todo is then requeued alone, so the others are not held back."""
    contested = make_todo(state=State.FAILED, idempotency_key="contested")
    other = make_todo(state=State.FAILED)
    with connection.cursor() as cursor:
        # Simulates the race once: the first time the contested todo is requeued, a producer
        # inserts a live todo with its key just before the row is written. (A sequence, unlike
        # a table, keeps counting through the rollback that follows.)
        cursor.execute(
            """
            CREATE TEMP SEQUENCE race_fires;
            CREATE FUNCTION pg_temp.race() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('race_fires') = 1 THEN
                    INSERT INTO todos (queue, kind, idempotency_key)
                    VALUES (NEW.queue, 'twin', NEW.idempotency_key);
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER race BEFORE UPDATE ON todos FOR EACH ROW
                WHEN (OLD.state = 'failed' AND NEW.state = 'pending'
                      AND OLD.idempotency_key = 'contested')
                EXECUTE FUNCTION pg_temp.race();
            """
        )
    try:
        result = Todo.objects.requeue_many([contested.id, other.id])
        with connection.cursor() as cursor:
            cursor.execute("SELECT last_value FROM race_fires")
            assert cursor.fetchone()[0] == 2
        assert sorted(todo.id for todo in result.changed) == sorted([contested.id, other.id])
        assert result.refused == {}
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER race ON todos")


# shared


@pytest.mark.parametrize(
    "call",
    [
        lambda: Todo.objects.expire_lease("td_missing"),
        lambda: Todo.objects.cancel("td_missing", "gone"),
        lambda: Todo.objects.requeue("td_missing"),
    ],
)
def test_a_missing_todo_is_not_found(db: None, call: Callable[[], object]) -> None:
    """An unknown id raises TodoNotFound."""
    with pytest.raises(TodoNotFound, match="td_missing"):
        call()


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ("td_1", "not a single str"),
        ([], "at least one todo"),
        ([""], "todo id must not be empty"),
        ([7], "todo id must be a str"),
        (["td_x"] * 2 + [f"td_{n}" for n in range(validation.OPERATOR_BATCH_LIMIT)], "at most"),
    ],
)
def test_batch_ids_are_validated(db: None, ids: Any, message: str) -> None:
    """Malformed id lists are refused before anything runs."""
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTodo, match=message):
        Todo.objects.expire_lease_many(ids)
    assert queries.captured_queries == []


def test_batch_ids_repeated_count_once(make_todo: MakeTodo) -> None:
    """An id listed twice is changed once and not reported as refused."""
    todo = make_todo(state=State.CLAIMED)
    result = Todo.objects.expire_lease_many([todo.id, todo.id])
    assert ([t.id for t in result.changed], result.refused) == ([todo.id], {})


def test_async_twins(make_todo: MakeTodo) -> None:
    """Each operator transition has an `a`-prefixed twin doing the same."""
    claimed, pending, failed = (
        make_todo(state=State.CLAIMED),
        make_todo(),
        make_todo(state=State.FAILED),
    )
    manager = Todo.objects
    assert async_to_sync(manager.aexpire_lease)(claimed.id).state == State.CLAIMED
    assert async_to_sync(manager.acancel)(pending.id, "x").state == State.FAILED
    assert async_to_sync(manager.arequeue_many)([failed.id, pending.id]).refused == {}
    assert async_to_sync(manager.aexpire_lease_many)([claimed.id]).changed[0].id == claimed.id
    assert async_to_sync(manager.acancel_many)([claimed.id], "y").changed[0].id == claimed.id
