"""Each operation from each starting state: what it does, and how a miss is classified."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from switchboard_todos.exceptions import TodoConflict, TodoNotFound
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo, db_now

LAPSED = timedelta(seconds=-5)


def assert_matches_database(todo: Todo) -> None:
    """The instance a transition returns equals a fresh read, field by field."""
    fresh = Todo.objects.get(pk=todo.pk)
    for field in Todo._meta.concrete_fields:
        assert getattr(todo, field.attname) == getattr(fresh, field.attname), field.name


# claim


def test_claim_takes_a_pending_todo(make_todo: MakeTodo) -> None:
    """Claiming sets owner, lease from the database clock, attempt and claimed_at."""
    todo = make_todo()
    claimed = Todo.objects.claim(todo.id, "w1", timedelta(seconds=30))
    assert claimed.state == State.CLAIMED
    assert claimed.owner == "w1"
    assert claimed.attempt == 1
    assert claimed.claimed_at is not None and claimed.lease_expires_at is not None
    assert claimed.lease_expires_at - claimed.claimed_at == timedelta(seconds=30)
    assert_matches_database(claimed)


def test_claim_takes_a_lapsed_lease_and_records_the_lapse(make_todo: MakeTodo) -> None:
    """A lapsed lease is claimable again; the lapsed attempt counts and is in the history."""
    todo = make_todo(state=State.CLAIMED, owner="w1", lease_expires_in=LAPSED)
    claimed = Todo.objects.claim(todo.id, "w2", 30)
    assert (claimed.owner, claimed.attempt) == ("w2", 2)
    assert [entry["error"]["type"] for entry in claimed.errors] == ["LeaseExpired"]
    assert claimed.errors[0]["owner"] == "w1"
    assert_matches_database(claimed)


@pytest.mark.parametrize(
    ("starting", "message"),
    [
        ({"state": State.CLAIMED, "owner": "w2"}, "is claimed by 'w2' until"),
        ({"state": State.DONE}, "is done; only pending todos can be claimed"),
        ({"state": State.FAILED}, "is failed; only pending todos can be claimed"),
        ({"next_retry_in": timedelta(minutes=5)}, "is waiting to be retried until"),
        ({"assignee": "bob"}, "is assigned to 'bob'; 'w1' may not claim it"),
        (
            {"state": State.CLAIMED, "attempt": 5, "lease_expires_in": LAPSED},
            "lease lapsed on its last attempt (5 of 5)",
        ),
    ],
)
def test_claim_refuses_with_the_reason(
    make_todo: MakeTodo, starting: dict[str, Any], message: str
) -> None:
    """A claim that cannot happen raises TodoConflict naming the actual state."""
    todo = make_todo(**starting)
    with pytest.raises(TodoConflict, match=message.replace("(", r"\(").replace(")", r"\)")):
        Todo.objects.claim(todo.id, "w1", 30)
    assert Todo.objects.get(pk=todo.pk).updated_at == todo.updated_at


def test_claim_by_the_assignee(make_todo: MakeTodo) -> None:
    """Only the assignee may claim an assigned todo."""
    todo = make_todo(assignee="bob")
    assert Todo.objects.claim(todo.id, "bob", 30).owner == "bob"


def test_claim_after_the_retry_wait(make_todo: MakeTodo) -> None:
    """A todo whose retry time has come is claimable by id."""
    todo = make_todo(next_retry_in=timedelta(seconds=-1))
    claimed = Todo.objects.claim(todo.id, "w1", 30)
    assert claimed.next_retry_at is None


# heartbeat, complete, fail, release: the owner's verbs share one guard


OWNER_VERBS: dict[str, Callable[[str, str], Todo]] = {
    "heartbeat": lambda todo_id, owner: Todo.objects.heartbeat(todo_id, owner, 60),
    "complete": lambda todo_id, owner: Todo.objects.complete(todo_id, owner, {"n": 1}),
    "fail": lambda todo_id, owner: Todo.objects.fail(todo_id, owner, "boom"),
    "release": lambda todo_id, owner: Todo.objects.release(todo_id, owner),
}


@pytest.mark.parametrize("verb", OWNER_VERBS)
@pytest.mark.parametrize("state", [State.PENDING, State.DONE, State.FAILED])
def test_owner_verbs_need_a_claimed_todo(make_todo: MakeTodo, verb: str, state: str) -> None:
    """heartbeat/complete/fail/release on an unclaimed todo name its state."""
    todo = make_todo(state=state)
    with pytest.raises(TodoConflict, match=f"is {state}, not claimed; {verb} needs it") as caught:
        OWNER_VERBS[verb](todo.id, "w1")
    assert caught.value.state == state
    assert Todo.objects.get(pk=todo.pk).updated_at == todo.updated_at


@pytest.mark.parametrize("verb", OWNER_VERBS)
def test_owner_verbs_need_the_owner(make_todo: MakeTodo, verb: str) -> None:
    """Another worker's todo is refused with the holder's name."""
    todo = make_todo(state=State.CLAIMED, owner="w2")
    with pytest.raises(TodoConflict, match="is claimed by 'w2', not by 'w1'") as caught:
        OWNER_VERBS[verb](todo.id, "w1")
    assert (caught.value.state, caught.value.owner) == (State.CLAIMED, "w2")


@pytest.mark.parametrize("verb", OWNER_VERBS)
def test_owner_verbs_on_a_missing_todo(db: None, verb: str) -> None:
    """An unknown id raises TodoNotFound."""
    with pytest.raises(TodoNotFound, match="td_missing"):
        OWNER_VERBS[verb]("td_missing", "w1")


def test_heartbeat_extends_the_lease(make_todo: MakeTodo) -> None:
    """The new lease runs ttl from the database's now."""
    todo = make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=5))
    beaten = Todo.objects.heartbeat(todo.id, "w1", timedelta(minutes=10))
    assert beaten.lease_expires_at is not None
    assert beaten.lease_expires_at - db_now() > timedelta(minutes=9)
    assert_matches_database(beaten)


def test_heartbeat_and_complete_work_on_a_lapsed_lease_nobody_took(make_todo: MakeTodo) -> None:
    """As in SQS, a lapsed lease is still the owner's until someone else receives the todo."""
    todo = make_todo(state=State.CLAIMED, lease_expires_in=LAPSED)
    assert Todo.objects.heartbeat(todo.id, "w1", 30).state == State.CLAIMED
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=Now() + LAPSED)
    assert Todo.objects.complete(todo.id, "w1").state == State.DONE


def test_complete_stores_the_result(make_todo: MakeTodo) -> None:
    """Complete marks done with the result and the completion time."""
    todo = make_todo(state=State.CLAIMED)
    done = Todo.objects.complete(todo.id, "w1", {"answer": 42})
    assert (done.state, done.result) == (State.DONE, {"answer": 42})
    assert done.completed_at is not None and done.lease_expires_at is None
    assert_matches_database(done)


def test_complete_many(make_todo: MakeTodo) -> None:
    """Completes what the owner holds in one statement and names what it completed."""
    mine = [make_todo(state=State.CLAIMED) for _ in range(3)]
    theirs = make_todo(state=State.CLAIMED, owner="w2")
    results = {todo.id: {"n": index} for index, todo in enumerate([*mine, theirs])}
    with CaptureQueriesContext(connection) as queries:
        completed = Todo.objects.complete_many("w1", results)
    assert len(queries) == 1
    assert sorted(completed) == sorted(todo.id for todo in mine)
    assert Todo.objects.get(pk=mine[2].pk).result == {"n": 2}
    assert Todo.objects.get(pk=theirs.pk).state == State.CLAIMED
    assert Todo.objects.complete_many("w1", {}) == []


def test_complete_many_sends_ids_and_results_as_they_are(make_todo: MakeTodo) -> None:
    """The ids and results travel as one JSON object: quotes, backslashes and non-ASCII text
    arrive unchanged, None stores no result and a JSON string "null" stays a string."""
    results: dict[str, Any] = {
        'quote " and \\ back': None,
        "é ✓ 😀": {"text": 'a "quoted" \\ line\n', "list": [1, None, 2.5]},
        "plain": "null",
    }
    for todo_id in results:
        make_todo(id=todo_id, state=State.CLAIMED)
    assert sorted(Todo.objects.complete_many("w1", results)) == sorted(results)
    stored = dict(Todo.objects.values_list("id", "result"))
    assert stored == results
    assert Todo.objects.filter(result__isnull=True).count() == 1


def test_fail_below_the_cap_waits_for_a_retry(make_todo: MakeTodo, settings: Any) -> None:
    """A failure with attempts left is pending again after the backoff, error recorded."""
    settings.SWITCHBOARD_TODOS_BACKOFF_BASE = 60
    settings.SWITCHBOARD_TODOS_BACKOFF_JITTER = 0
    todo = make_todo(state=State.CLAIMED, attempt=2)
    failed = Todo.objects.fail(todo.id, "w1", ValueError("boom"))
    assert (failed.state, failed.owner, failed.lease_expires_at) == (State.PENDING, None, None)
    assert failed.next_retry_at is not None
    assert failed.next_retry_at - failed.updated_at == timedelta(seconds=120)
    assert failed.result == {"type": "builtins.ValueError", "message": "boom"}
    assert failed.errors[-1]["attempt"] == 2 and failed.errors[-1]["owner"] == "w1"
    assert failed.completed_at is None
    assert_matches_database(failed)


def test_fail_with_an_explicit_retry_wait(make_todo: MakeTodo) -> None:
    """retry_in overrides the backoff schedule."""
    todo = make_todo(state=State.CLAIMED)
    failed = Todo.objects.fail(todo.id, "w1", "rate limited", retry_in=timedelta(minutes=7))
    assert failed.next_retry_at is not None
    assert failed.next_retry_at - failed.updated_at == timedelta(minutes=7)
    assert failed.result == {"type": "", "message": "rate limited"}


def test_fail_at_the_cap_dead_letters(make_todo: MakeTodo) -> None:
    """The last attempt's failure makes the todo failed: the dead letter."""
    todo = make_todo(state=State.CLAIMED, attempt=3, max_attempts=3)
    failed = Todo.objects.fail(todo.id, "w1", {"code": 500}, retry_in=10)
    assert (failed.state, failed.next_retry_at) == (State.FAILED, None)
    assert failed.completed_at is not None
    assert failed.result == {"code": 500}


def test_a_todo_fails_max_attempts_times_then_dead_letters(make_todo: MakeTodo) -> None:
    """Claim and fail in a loop: pending after each of the first attempts, failed after the last."""
    todo = make_todo(max_attempts=3)
    states = []
    for _ in range(3):
        Todo.objects.claim(todo.id, "w1", 30)
        states.append(Todo.objects.fail(todo.id, "w1", "boom", retry_in=0).state)
    assert states == [State.PENDING, State.PENDING, State.FAILED]
    assert [entry["attempt"] for entry in Todo.objects.get(pk=todo.pk).errors] == [1, 2, 3]


def test_release_refunds_the_attempt(make_todo: MakeTodo) -> None:
    """Release returns the todo to pending without spending an attempt."""
    todo = make_todo(state=State.CLAIMED, attempt=1)
    released = Todo.objects.release(todo.id, "w1")
    assert (released.state, released.attempt, released.owner) == (State.PENDING, 0, None)
    assert released.next_retry_at == released.updated_at  # due at once, whatever the marks
    assert_matches_database(released)


def test_release_with_a_delay(make_todo: MakeTodo) -> None:
    """A delayed release is claimable only after the delay."""
    todo = make_todo(state=State.CLAIMED)
    released = Todo.objects.release(todo.id, "w1", delay=timedelta(seconds=90))
    assert released.next_retry_at is not None
    assert released.next_retry_at - released.updated_at == timedelta(seconds=90)
    assert Todo.objects.claim_next("default", "w2", 30) is None


# requeue


def test_requeue_resets_a_dead_letter(make_todo: MakeTodo) -> None:
    """Requeue: failed to pending, attempt budget reset, retry wait cleared."""
    todo = make_todo(state=State.FAILED, attempt=5)
    requeued = Todo.objects.requeue(todo.id)
    assert (requeued.state, requeued.attempt, requeued.next_retry_at) == (State.PENDING, 0, None)
    assert requeued.completed_at is None
    assert_matches_database(requeued)


@pytest.mark.parametrize("state", [State.PENDING, State.CLAIMED, State.DONE])
def test_requeue_needs_a_dead_letter(make_todo: MakeTodo, state: str) -> None:
    """Only failed todos can be requeued."""
    todo = make_todo(state=state)
    with pytest.raises(TodoConflict, match=f"is {state}; only failed"):
        Todo.objects.requeue(todo.id)


def test_requeue_refuses_when_a_live_todo_holds_the_key(make_todo: MakeTodo) -> None:
    """A requeue would duplicate live work: refused, naming the live todo."""
    dead = make_todo(state=State.FAILED, idempotency_key="delivery-1")
    live = make_todo(idempotency_key="delivery-1")
    with pytest.raises(TodoConflict, match=f"live todo {live.id} holds idempotency key"):
        Todo.objects.requeue(dead.id)
    assert Todo.objects.get(pk=dead.pk).state == State.FAILED


def test_requeue_of_a_missing_todo(db: None) -> None:
    """An unknown id raises TodoNotFound."""
    with pytest.raises(TodoNotFound):
        Todo.objects.requeue("td_missing")


def test_each_transition_is_one_statement(make_todo: MakeTodo) -> None:
    """A successful transition costs exactly one query."""
    todo = make_todo()
    calls: list[Callable[[], object]] = [
        lambda: Todo.objects.claim(todo.id, "w1", 30),
        lambda: Todo.objects.heartbeat(todo.id, "w1", 30),
        lambda: Todo.objects.release(todo.id, "w1"),
        lambda: Todo.objects.claim_next("default", "w1", 30),
        lambda: Todo.objects.fail(todo.id, "w1", "x", retry_in=0),
        lambda: Todo.objects.claim_batch("default", "w1", 30, limit=10),
        lambda: Todo.objects.complete(todo.id, "w1"),
        lambda: Todo.objects.reap_expired(),
    ]
    for call in calls:
        with CaptureQueriesContext(connection) as queries:
            call()
        assert len(queries) == 1, queries.captured_queries
