"""Lifecycle signals: which transition sends which, with what, and nothing without receivers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.dispatch import Signal
from django.test.utils import CaptureQueriesContext

from switchboard_todos import signals
from switchboard_todos.models import State, Todo

MakeTodo = Callable[..., Todo]
Heard = list[tuple[str, str, list[str]]]

NAMES = {
    signals.todo_created: "created",
    signals.todo_claimed: "claimed",
    signals.todo_completed: "completed",
    signals.todo_failed: "failed",
    signals.todo_dead_lettered: "dead_lettered",
    signals.todo_requeued: "requeued",
    signals.todo_lease_lapsed: "lease_lapsed",
}


@pytest.fixture
def heard() -> Iterator[Heard]:
    """(signal, operation, sorted todo ids) for each signal sent while the test runs."""
    sent: Heard = []
    receivers = []
    for signal, name in NAMES.items():

        def receive(sender: type[Todo], todos: list[Todo], operation: str, name: str = name,
                    **kwargs: Any) -> None:  # fmt: skip
            assert sender is Todo
            sent.append((name, operation, sorted(todo.id for todo in todos)))

        signal.connect(receive, sender=Todo, weak=False)
        receivers.append((signal, receive))
    yield sent
    for signal, receive in receivers:
        signal.disconnect(receive, sender=Todo)


def test_every_lifecycle_signal_is_in_the_table() -> None:
    assert set(NAMES) == set(signals.LIFECYCLE)
    sent = {signal for sends in signals.SENT_BY.values() for signal, _ in sends}
    assert sent == set(signals.LIFECYCLE)


def test_a_todos_life_sends_each_signal_once(db: None, heard: Heard) -> None:
    """Created, claimed, failed, claimed, dead-lettered, requeued, claimed, completed."""
    todo, _ = Todo.objects.create_todo(kind="k", max_attempts=2)
    Todo.objects.create_todo(kind="k", idempotency_key="x")
    Todo.objects.create_todo(kind="k", idempotency_key="x")  # the live one: nothing new
    assert heard == [
        ("created", "create_todo", [todo.id]),
        ("created", "create_todo", [heard[1][2][0]]),
    ]
    heard.clear()
    Todo.objects.claim(todo.id, "w1", 30)
    Todo.objects.fail(todo.id, "w1", "boom", retry_in=0)
    Todo.objects.claim(todo.id, "w1", 30)
    Todo.objects.fail(todo.id, "w1", "boom again")
    Todo.objects.requeue(todo.id)
    Todo.objects.claim(todo.id, "w1", 30)
    Todo.objects.complete(todo.id, "w1", {"ok": True})
    assert heard == [
        ("claimed", "claim", [todo.id]),
        ("failed", "fail", [todo.id]),
        ("claimed", "claim", [todo.id]),
        ("failed", "fail", [todo.id]),
        ("dead_lettered", "fail", [todo.id]),
        ("requeued", "requeue", [todo.id]),
        ("claimed", "claim", [todo.id]),
        ("completed", "complete", [todo.id]),
    ]


def test_batches_send_once_per_statement(make_todo: MakeTodo, heard: Heard) -> None:
    created = Todo.objects.create_many([{"kind": "k"}, {"kind": "k"}])
    ids = [todo.id for todo, _ in created]
    claimed = Todo.objects.claim_batch("default", "w1", 30, limit=5)
    done = Todo.objects.complete_many("w1", {todo.id: None for todo in claimed})
    pending = make_todo()
    Todo.objects.cancel_many([pending.id], "no longer needed")
    assert heard == [
        ("created", "create_many", sorted(ids)),
        ("claimed", "claim_next", sorted(ids)),
        ("completed", "complete_many", sorted(done)),
        ("dead_lettered", "cancel", [pending.id]),
    ]


def test_lapsed_leases_are_told_by_the_reaper_and_by_claims(
    make_todo: MakeTodo, heard: Heard
) -> None:
    """The reaper's sweep and a claim that takes a lapsed lease over both send lease_lapsed."""
    lapsed = timedelta(seconds=-1)
    retried = make_todo(state=State.CLAIMED, lease_expires_in=lapsed)
    last = make_todo(state=State.CLAIMED, lease_expires_in=lapsed, attempt=5, max_attempts=5)
    Todo.objects.reap_expired()
    assert sorted(heard) == sorted([
        ("lease_lapsed", "reap_expired", sorted([retried.id, last.id])),
        ("dead_lettered", "reap_expired", [last.id]),
    ])  # fmt: skip
    heard.clear()
    taken_over = make_todo(state=State.CLAIMED, lease_expires_in=lapsed, queue="q")
    Todo.objects.claim_next("q", "w2", 30)
    assert heard == [
        ("claimed", "claim_next", [taken_over.id]),
        ("lease_lapsed", "claim_next", [taken_over.id]),
    ]
    heard.clear()
    reaped_before = make_todo(
        errors=[
            {"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": {"type": "LeaseExpired"}}
        ]
    )
    Todo.objects.claim(reaped_before.id, "w2", 30)  # its lapse was told by that reaper
    assert heard == [("claimed", "claim", [reaped_before.id])]


def test_a_receiver_that_raises_does_not_undo_the_transition(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    signals.todo_created.connect(broken, sender=Todo, weak=False)
    try:
        todo, created = Todo.objects.create_todo(kind="k")
    finally:
        signals.todo_created.disconnect(broken, sender=Todo)
    assert created and Todo.objects.filter(pk=todo.pk).exists()
    assert "the transition stands" in caplog.text


@pytest.mark.parametrize("signal", [signals.todo_completed, signals.todo_lease_lapsed])
def test_without_receivers_nothing_more_is_read(make_todo: MakeTodo, signal: Signal) -> None:
    """complete_many and the reaper return ids only; their todos are read only for a receiver."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-1))
    with CaptureQueriesContext(connection) as quiet:
        Todo.objects.complete_many("w1", {todo.id: 1})
        Todo.objects.reap_expired()
    assert len(quiet) == 2

    def receive(**kwargs: Any) -> None:
        pass

    signal.connect(receive, sender=Todo, weak=False)
    try:
        other = make_todo(state=State.CLAIMED, owner="w1")
        make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-1))
        with CaptureQueriesContext(connection) as listened:
            Todo.objects.complete_many("w1", {other.id: 1})
            Todo.objects.reap_expired()
    finally:
        signal.disconnect(receive, sender=Todo)
    assert len(listened) == 3
