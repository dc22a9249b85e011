"""One word per idea: a lease *expires*; the names it replaced keep working as aliases."""

from __future__ import annotations

from typing import Any

from switchboard_todos import signals
from switchboard_todos.models import Todo


def test_todo_lease_lapsed_is_the_same_signal_as_todo_lease_expired() -> None:
    assert signals.todo_lease_lapsed is signals.todo_lease_expired


def test_a_receiver_of_the_old_name_hears_a_lease_expire_and_be_reaped(db: None) -> None:
    """Claimed for real, its lease expired by the operator, taken back by the reaper."""
    heard: list[tuple[str, list[str]]] = []

    def receive(sender: type[Todo], todos: list[Todo], operation: str, **kwargs: Any) -> None:
        heard.append((operation, [todo.id for todo in todos]))

    todo, _ = Todo.objects.create_todo(kind="k", queue="words")
    signals.todo_lease_lapsed.connect(receive, sender=Todo, weak=False)
    try:
        (claimed,) = Todo.objects.claim_batch("words", "w1", 30, limit=1)
        Todo.objects.expire_lease(claimed.id)
        assert heard == []
        assert Todo.objects.reap_expired() == (1, 0)
    finally:
        signals.todo_lease_lapsed.disconnect(receive, sender=Todo)
    assert heard == [("reap_expired", [todo.id])]
