"""claim_next / claim_batch: which todos a claim takes, in what order, and reap_expired."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models.signals import post_init

from switchboard_todos.claims.marks import marks
from switchboard_todos.models import Queue, State, Todo
from tests.helpers import MakeTodo

LAPSED = timedelta(seconds=-5)


def test_nothing_claimable_returns_none(make_todo: MakeTodo) -> None:
    """Empty queues, other queues, future retries and valid leases are not claimable."""
    make_todo(queue="other")
    make_todo(next_retry_in=timedelta(minutes=1))
    make_todo(state=State.CLAIMED)
    make_todo(state=State.DONE)
    make_todo(state=State.FAILED)
    assert Todo.objects.claim_next("default", "w1", 30) is None
    assert Todo.objects.claim_batch("default", "w1", 30, limit=10) == []


def test_oldest_first_across_queues(make_todo: MakeTodo) -> None:
    """Several queues are served in the order their todos became claimable."""
    newest = make_todo(queue="a", created_ago=timedelta(seconds=1))
    oldest = make_todo(queue="b", created_ago=timedelta(seconds=30))
    middle = make_todo(queue="a", created_ago=timedelta(seconds=10))
    claimed = Todo.objects.claim_batch(["a", "b"], "w1", 30, limit=10)
    assert [todo.id for todo in claimed] == [oldest.id, middle.id, newest.id]


def test_a_due_retry_queues_behind_work_that_was_waiting(make_todo: MakeTodo) -> None:
    """A retry counts from when it became due, not from when it was created."""
    retried = make_todo(created_ago=timedelta(hours=1), next_retry_in=timedelta(seconds=-1))
    waiting = make_todo(created_ago=timedelta(seconds=30))
    lapsed = make_todo(
        state=State.CLAIMED, created_ago=timedelta(hours=2), lease_expires_in=timedelta(seconds=-2)
    )
    claimed = Todo.objects.claim_batch("default", "w2", 30, limit=10)
    assert [todo.id for todo in claimed] == [waiting.id, lapsed.id, retried.id]


def test_limit_holds_across_queues_and_branches(make_todo: MakeTodo) -> None:
    """However many queues and kinds of claimable todo there are, at most `limit` come back."""
    for queue in ("a", "b", "c"):
        make_todo(queue=queue)
        make_todo(queue=queue, next_retry_in=timedelta(seconds=-1))
        make_todo(queue=queue, state=State.CLAIMED, lease_expires_in=LAPSED)
    assert len(Todo.objects.claim_batch(["a", "b", "c"], "w1", 30, limit=2)) == 2
    marks.forget()  # a full scan again, which looks for lapsed leases too (marks.py)
    assert len(Todo.objects.claim_batch(["a", "b", "c"], "w1", 30, limit=100)) == 7


def test_assigned_todos_go_to_their_assignee_only(make_todo: MakeTodo) -> None:
    """An assigned todo is invisible to other owners."""
    assigned = make_todo(assignee="bob")
    assert Todo.objects.claim_next("default", "alice", 30) is None
    claimed = Todo.objects.claim_next("default", "bob", 30)
    assert claimed is not None and claimed.id == assigned.id


def test_a_lapsed_lease_with_no_attempts_left_is_left_for_the_reaper(make_todo: MakeTodo) -> None:
    """The claim scan never hands out an attempt past max_attempts."""
    make_todo(state=State.CLAIMED, attempt=5, max_attempts=5, lease_expires_in=LAPSED)
    assert Todo.objects.claim_next("default", "w2", 30) is None


def test_claiming_clears_the_retry_time(make_todo: MakeTodo) -> None:
    """A claimed todo has no next_retry_at; its lease is what counts now."""
    make_todo(next_retry_in=timedelta(seconds=-1))
    claimed = Todo.objects.claim_next("default", "w1", timedelta(seconds=45))
    assert claimed is not None
    assert claimed.next_retry_at is None
    assert claimed.lease_expires_at is not None and claimed.claimed_at is not None
    assert claimed.lease_expires_at - claimed.claimed_at == timedelta(seconds=45)


def test_reap_requeues_lapsed_and_dead_letters_exhausted(make_todo: MakeTodo) -> None:
    """Each lapsed lease goes back to pending, or to failed on its last attempt."""
    lapsed = make_todo(state=State.CLAIMED, attempt=1, lease_expires_in=LAPSED)
    exhausted = make_todo(
        state=State.CLAIMED, attempt=3, max_attempts=3, lease_expires_in=LAPSED, owner="w9"
    )
    valid = make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=30))
    others = [make_todo(), make_todo(state=State.DONE), make_todo(state=State.FAILED)]

    assert tuple(Todo.objects.reap_expired()) == (1, 1)

    requeued = Todo.objects.get(pk=lapsed.pk)
    assert (requeued.state, requeued.owner, requeued.lease_expires_at) == (
        State.PENDING,
        None,
        None,
    )
    assert (requeued.attempt, requeued.next_retry_at) == (1, None)
    assert requeued.errors[-1]["error"]["type"] == "LeaseExpired"
    dead = Todo.objects.get(pk=exhausted.pk)
    assert (dead.state, dead.owner) == (State.FAILED, None)
    assert dead.completed_at is not None
    assert dead.result == {
        "type": "LeaseExpired",
        "message": "The lease lapsed on the last attempt.",
    }
    assert dead.errors[-1]["owner"] == "w9"
    assert Todo.objects.get(pk=valid.pk).updated_at == valid.updated_at
    for todo in others:
        assert Todo.objects.get(pk=todo.pk).updated_at == todo.updated_at
    assert tuple(Todo.objects.reap_expired()) == (0, 0)


def test_max_held_claims_only_up_to_what_the_owner_may_hold(make_todo: MakeTodo) -> None:
    """With max_held, a claim tops the owner's held todos up to it, and then claims nothing."""
    make_todo(state=State.CLAIMED, owner="w1")
    make_todo(state=State.CLAIMED, owner="w2")
    for _ in range(5):
        make_todo()
    assert len(Todo.objects.claim_batch("default", "w1", 30, limit=10, max_held=3)) == 2
    assert Todo.objects.claim_next("default", "w1", 30, max_held=3) is None
    assert len(Todo.objects.claim_batch("default", "w2", 30, limit=10, max_held=2)) == 1
    assert len(Todo.objects.claim_batch("default", "w3", 30, limit=10)) == 2


def test_a_claim_without_ttl_takes_its_queues_visibility_timeout(
    make_todo: MakeTodo, settings: Any
) -> None:
    """No ttl: the lease is the queue's visibility timeout (Queue), else DEFAULT_TTL; a
    heartbeat without ttl extends it as much."""
    settings.SWITCHBOARD_TODOS_DEFAULT_TTL = 45
    Queue.objects.create(name="slow", visibility_timeout=timedelta(minutes=10))
    slow, default = make_todo(queue="slow"), make_todo()
    claimed = Todo.objects.claim_batch(["slow", "default"], "w1", None, limit=2)
    leases = {todo.id: lease_of(todo, todo.claimed_at) for todo in claimed}
    assert leases == {slow.id: timedelta(minutes=10), default.id: timedelta(seconds=45)}
    beaten = Todo.objects.heartbeat(slow.id, "w1")
    assert lease_of(beaten, beaten.updated_at) == timedelta(minutes=10)
    assert Todo.objects.claim_next("default", "w2", 5) is None


def lease_of(todo: Todo, since: datetime | None) -> timedelta:
    """How long a todo's lease runs from `since` (the claim's or the heartbeat's now())."""
    assert todo.lease_expires_at is not None and since is not None
    return todo.lease_expires_at - since


def test_a_claimed_todo_is_the_todo_the_orm_reads(make_todo: MakeTodo) -> None:
    """The instances a statement returns are built without Model.__init__ (managers.py,
    `_instances`): every field as the ORM reads it, saved as an existing row."""
    make_todo(payload={"n": [1, "two"]}, priority=3, concurrency_key="k")
    [claimed] = Todo.objects.claim_batch("default", "w1", 30, limit=1)
    read = Todo.objects.get(pk=claimed.pk)
    for field in Todo._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(read, field.attname), field.name
    assert (claimed._state.adding, claimed._state.db) == (False, "default")
    assert claimed == read
    claimed.title = "renamed"
    claimed.save(update_fields=["title"])
    assert Todo.objects.get(pk=claimed.pk).title == "renamed"
    assert Todo.objects.count() == 1


def test_a_post_init_receiver_sees_every_claimed_todo(make_todo: MakeTodo) -> None:
    """With a pre_init or post_init receiver the statements build todos through Model.from_db,
    so the receiver runs for each."""
    made = {make_todo().id, make_todo().id}
    seen: list[str] = []

    def receiver(sender: type[Todo], instance: Todo, **kwargs: Any) -> None:
        seen.append(instance.id)

    post_init.connect(receiver, sender=Todo)
    try:
        claimed = Todo.objects.claim_batch("default", "w1", 30, limit=10)
    finally:
        post_init.disconnect(receiver, sender=Todo)
    assert {todo.id for todo in claimed} == made
    assert sorted(seen) == sorted(made)


def test_empty_json_values_are_separate_objects(make_todo: MakeTodo) -> None:
    """An empty payload ({}) and an empty list ([]) are made, not parsed (EMPTY_JSON in
    managers/rows.py): each claimed Todo gets its own dict and list, as json.loads would give."""
    make_todo(payload={}, result=[])
    make_todo(payload={}, result=[])
    first, second = Todo.objects.claim_batch("default", "w1", 30, limit=2)
    assert first.result == second.result == [] and first.payload == second.payload == {}
    assert isinstance(first.result, list)
    first.result.append("changed")
    first.payload["changed"] = True
    assert second.result == [] and second.payload == {}
    assert first.result is not second.result and first.payload is not second.payload
