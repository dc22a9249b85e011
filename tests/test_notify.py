"""NOTIFY on enqueue: the statements that make todos claimable now notify their queues on commit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
from django.db import transaction
from django.db.models.functions import Now
from django.test.utils import override_settings
from django.utils import timezone

from switchboard_todos.claims.listen import CHANNEL
from switchboard_todos.models import State, Todo
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)

Heard = Callable[[], list[str]]


@pytest.fixture
def heard() -> Iterator[Heard]:
    """A second connection listening on the channel; call it for the payloads received so far."""
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")

        def received() -> list[str]:
            # A notification is on its way once the notifying statement has committed; this
            # round trip to the server makes sure it has been read.
            listener.execute("SELECT 1")
            return [notify.payload for notify in listener.notifies(timeout=0.05)]

        yield received


def test_create_todo_notifies_its_queue(heard: Heard) -> None:
    """One claimable todo: one notification whose payload is the queue name."""
    Todo.objects.create_todo(queue="mail", kind="k")
    assert heard() == ["mail"]


def test_a_deferred_todo_does_not_notify(heard: Heard) -> None:
    """A todo not claimable before run_after wakes nobody (the pollers find it when due)."""
    Todo.objects.create_todo(kind="k", run_after=timezone.now() + timedelta(hours=1))
    assert heard() == []


def test_a_duplicate_delivery_does_not_notify(heard: Heard) -> None:
    """Returning the live todo for an idempotency key inserts nothing and notifies nothing."""
    Todo.objects.create_todo(kind="k", idempotency_key="once")
    heard()
    Todo.objects.create_todo(kind="k", idempotency_key="once")
    assert heard() == []


def test_create_many_notifies_once_per_queue(heard: Heard) -> None:
    """A batch notifies each queue with claimable todos once, however many rows it inserts."""
    later = timezone.now() + timedelta(hours=1)
    Todo.objects.create_many(
        [{"queue": "a", "kind": "k"} for _ in range(500)]
        + [{"queue": "b", "kind": "k"}, {"queue": "c", "kind": "k", "run_after": later}]
    )
    assert sorted(heard()) == ["a", "b"]


def test_nothing_is_notified_before_commit_or_after_rollback(heard: Heard) -> None:
    """NOTIFY is transactional: delivered at commit, dropped by a rollback."""
    with transaction.atomic():
        Todo.objects.create_todo(queue="kept", kind="k")
        assert heard() == []
    assert heard() == ["kept"]
    with pytest.raises(RuntimeError), transaction.atomic():
        Todo.objects.create_todo(queue="dropped", kind="k")
        raise RuntimeError
    assert heard() == []


def test_release_notifies_only_without_delay(heard: Heard) -> None:
    """A released todo claimable at once notifies; one released with a delay does not."""
    now_ = Todo.objects.create(kind="k", state=State.CLAIMED, owner="w1", queue="now")
    later = Todo.objects.create(kind="k", state=State.CLAIMED, owner="w1", queue="later")
    Todo.objects.release(now_.id, "w1")
    Todo.objects.release(later.id, "w1", delay=60)
    assert heard() == ["now"]


def test_requeue_notifies(heard: Heard) -> None:
    """A dead letter requeued by an operator is claimable at once."""
    dead = Todo.objects.create(kind="k", state=State.FAILED, queue="dlq", attempt=5)
    Todo.objects.requeue(dead.id)
    assert heard() == ["dlq"]


def test_requeue_many_notifies_each_queue_once(heard: Heard) -> None:
    """A batch of dead letters over two queues wakes each queue once."""
    dead = {"kind": "k", "state": State.FAILED, "attempt": 5}
    ids = [Todo.objects.create(queue=queue, **dead).id for queue in ("a", "a", "b")]
    assert len(Todo.objects.requeue_many(ids).changed) == 3
    assert sorted(heard()) == ["a", "b"]


def test_expire_lease_notifies_and_cancel_does_not(heard: Heard) -> None:
    """An expired lease is claimable at once; a cancelled todo is not claimable at all."""
    held = Todo.objects.create(
        kind="k",
        state=State.CLAIMED,
        owner="w1",
        attempt=1,
        queue="held",
        lease_expires_at=Now() + timedelta(minutes=5),
    )
    pending = Todo.objects.create(kind="k", queue="cancelled")
    heard()
    Todo.objects.expire_lease(held.id)
    Todo.objects.cancel(pending.id, "not wanted")
    assert heard() == ["held"]


def test_reap_notifies_the_queues_it_requeued(heard: Heard) -> None:
    """The reaper notifies each queue it put todos back in, not those it only dead-lettered."""
    lapsed = {"state": State.CLAIMED, "owner": "w1", "lease_expires_at": Now() - timedelta(1)}
    Todo.objects.create(kind="k", queue="back", attempt=1, **lapsed)
    Todo.objects.create(kind="k", queue="back", attempt=1, **lapsed)
    Todo.objects.create(kind="k", queue="dead", attempt=5, **lapsed)
    assert Todo.objects.reap_expired() == (2, 1)
    assert heard() == ["back"]


def test_fail_notifies_only_an_immediate_retry(heard: Heard) -> None:
    """A failure retried at once notifies; one waiting for its backoff does not."""
    soon = Todo.objects.create(kind="k", state=State.CLAIMED, owner="w1", attempt=1, queue="soon")
    late = Todo.objects.create(kind="k", state=State.CLAIMED, owner="w1", attempt=1, queue="late")
    Todo.objects.fail(soon.id, "w1", "boom", retry_in=0)
    Todo.objects.fail(late.id, "w1", "boom")
    assert heard() == ["soon"]


def test_claim_and_complete_do_not_notify(heard: Heard) -> None:
    """Only statements that make work claimable notify."""
    Todo.objects.create_todo(kind="k")
    heard()
    todo = Todo.objects.claim_next("default", "w1", 30)
    assert todo is not None
    Todo.objects.complete(todo.id, "w1")
    assert heard() == []


@override_settings(SWITCHBOARD_TODOS_LISTEN=False)
def test_no_notifications_when_listen_is_off(heard: Heard) -> None:
    """With SWITCHBOARD_TODOS_LISTEN off nobody listens, so enqueueing pays for no NOTIFY."""
    Todo.objects.create_todo(kind="k")
    Todo.objects.create_many([{"kind": "k", "queue": "b"}])
    claimed = Todo.objects.create(kind="k", state=State.CLAIMED, owner="w1")
    Todo.objects.release(claimed.id, "w1")
    assert heard() == []


def test_enqueue_many_notifies_once_per_ready_queue(heard: Heard) -> None:
    """The COPY path notifies after its rows are in, once per queue with claimable todos."""
    later = timezone.now() + timedelta(hours=1)
    Todo.objects.enqueue_many(
        [
            {"queue": "a", "kind": "k"},
            {"queue": "a", "kind": "k"},
            {"queue": "b", "kind": "k"},
            {"queue": "later", "kind": "k", "run_after": later},
        ]
    )
    assert sorted(heard()) == ["a", "b"]


def test_enqueue_many_rolled_back_notifies_nothing(heard: Heard) -> None:
    """Inside a transaction that rolls back, neither the rows nor the notification survive."""
    with pytest.raises(RuntimeError), transaction.atomic():
        Todo.objects.enqueue_many([{"queue": "a", "kind": "k"}])
        raise RuntimeError
    assert heard() == []
    assert not Todo.objects.exists()
