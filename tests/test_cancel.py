"""An operator cancels a running todo: its holder is told so at its next heartbeat, and refused."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos.exceptions import TodoCancelled, TodoConflict
from switchboard_todos.models import State, Todo
from tests.conftest import run_in_threads
from tests.helpers import MakeTodo

#: The holder's verbs, each as the holder "w1" calls it.
VERBS: dict[str, Callable[[str], object]] = {
    "heartbeat": lambda todo_id: Todo.objects.heartbeat(todo_id, "w1", 30),
    "complete": lambda todo_id: Todo.objects.complete(todo_id, "w1", {"late": True}),
    "fail": lambda todo_id: Todo.objects.fail(todo_id, "w1", "gave up"),
    "release": lambda todo_id: Todo.objects.release(todo_id, "w1"),
}


@pytest.mark.parametrize("verb", VERBS)
def test_the_holder_of_a_cancelled_todo_is_told_and_refused(make_todo: MakeTodo, verb: str) -> None:
    """Heartbeat, complete, fail and release raise TodoCancelled with the reason; nothing moves."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    cancelled = Todo.objects.cancel(todo.id, "the customer withdrew")
    with pytest.raises(TodoCancelled) as caught:
        VERBS[verb](todo.id)
    assert str(caught.value) == (
        f"Todo {todo.id} was cancelled by an operator while 'w1' held it (the customer "
        f"withdrew): stop work on it; {verb} is refused."
    )
    assert (caught.value.todo_id, caught.value.state, caught.value.owner) == (
        todo.id,
        State.FAILED,
        "w1",
    )
    after = Todo.objects.get(pk=todo.pk)
    assert (after.state, after.result, after.updated_at) == (
        State.FAILED,
        {"type": "Cancelled", "message": "the customer withdrew"},
        cancelled.updated_at,
    )


def test_only_the_holder_hears_of_the_cancel(make_todo: MakeTodo) -> None:
    """Another owner is refused as for any dead letter: the cancel is not its business."""
    todo = make_todo(state=State.CLAIMED, owner="w1")
    Todo.objects.cancel(todo.id, "stop")
    with pytest.raises(TodoConflict) as caught:
        Todo.objects.heartbeat(todo.id, "w2", 30)
    assert type(caught.value) is TodoConflict
    assert "is failed, not claimed" in str(caught.value)


LAST_ATTEMPT = {"state": State.CLAIMED, "owner": "w1", "attempt": 5, "max_attempts": 5}


@pytest.mark.parametrize(
    ("starting", "end"),
    [
        pytest.param({}, lambda todo_id: Todo.objects.cancel(todo_id, "stop"), id="pending"),
        pytest.param(
            LAST_ATTEMPT,
            lambda todo_id: Todo.objects.fail(todo_id, "w1", {"type": "Cancelled", "message": ""}),
            id="its holder's own last failure",
        ),
        pytest.param(
            {"state": State.CLAIMED, "owner": "w1"},
            lambda todo_id: Todo.objects.requeue(Todo.objects.cancel(todo_id, "stop").id),
            id="requeued",
        ),
    ],
)
def test_other_ends_are_no_cancel_to_tell(
    make_todo: MakeTodo, starting: dict[str, object], end: Callable[[str], object]
) -> None:
    """A todo cancelled while pending, a holder's own last failure (whatever its error says)
    and a requeued cancel are plain conflicts: no hold of the caller's was cancelled."""
    todo = make_todo(**starting)
    end(todo.id)
    with pytest.raises(TodoConflict) as caught:
        Todo.objects.heartbeat(todo.id, "w1", 30)
    assert type(caught.value) is TodoConflict


def test_heartbeat_many_reports_the_cancelled_todos(make_todo: MakeTodo) -> None:
    """One statement: the held ones extended, the cancelled ones listed apart (not lost), the
    others lost; a cancelled todo's lease is not given back."""
    held = make_todo(state=State.CLAIMED, owner="w1")
    cancelled = make_todo(state=State.CLAIMED, owner="w1")
    taken = make_todo(state=State.CLAIMED, owner="w2")
    Todo.objects.cancel(cancelled.id, "stop")
    with CaptureQueriesContext(connection) as queries:
        beats = Todo.objects.heartbeat_many("w1", 60, [held.id, cancelled.id, taken.id])
    assert len(queries) == 1
    assert beats == ([held.id], [taken.id], [cancelled.id])
    after = Todo.objects.get(pk=cancelled.pk)
    assert (after.state, after.lease_expires_at) == (State.FAILED, None)


def test_complete_many_leaves_a_cancelled_todo_alone(make_todo: MakeTodo) -> None:
    """The batch completes what the owner still holds; a cancelled todo stays a dead letter."""
    held, cancelled = (make_todo(state=State.CLAIMED, owner="w1") for _ in range(2))
    Todo.objects.cancel(cancelled.id, "stop")
    assert Todo.objects.complete_many("w1", {held.id: 1, cancelled.id: 2}) == [held.id]
    assert Todo.objects.get(pk=cancelled.pk).result == {"type": "Cancelled", "message": "stop"}


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_the_holders_complete_ends_one_way(make_todo: MakeTodo) -> None:
    """On two connections at once: done with the holder's result and the cancel refused, or a
    dead letter and the completion refused as cancelled; never both, never neither."""
    for todo in [make_todo(state=State.CLAIMED, owner="w1") for _ in range(20)]:

        def race(side: int, todo_id: str = todo.id) -> str:
            try:
                if side:
                    Todo.objects.cancel(todo_id, "stop")
                else:
                    Todo.objects.complete(todo_id, "w1", "finished")
            except TodoConflict as refused:
                return type(refused).__name__
            return "ok"

        answers = tuple(run_in_threads(2, race))
        state = Todo.objects.get(pk=todo.id).state
        assert (state, answers) in {
            (State.DONE, ("ok", "TodoConflict")),
            (State.FAILED, ("TodoCancelled", "ok")),
        }


def test_a_lapsed_lease_cancelled_before_the_reaper_stays_cancelled(make_todo: MakeTodo) -> None:
    """The reaper takes back only claimed todos: a cancelled one is not requeued."""
    todo = make_todo(state=State.CLAIMED, owner="w1", lease_expires_in=timedelta(seconds=-5))
    Todo.objects.cancel(todo.id, "stop")
    assert Todo.objects.reap_expired() == (0, 0)
    assert Todo.objects.get(pk=todo.pk).state == State.FAILED
