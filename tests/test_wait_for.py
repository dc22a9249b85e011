"""wait_for: a producer blocks until a todo is done or failed, woken by the NOTIFY of the
statement that ended it (endings.py); the async twin holds no thread while it waits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from switchboard_todos.claims import listen, long_polls
from switchboard_todos.exceptions import InvalidTodo, TodoNotFound
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo


@pytest.fixture(autouse=True)
def no_connections_left() -> Iterator[None]:
    """The listener and the claim threads close their connections after each test, before the
    test database is dropped."""
    yield
    long_polls.stop()


#: How soon a woken wait must return: far below the 20 s it would otherwise wait, and the
#: second a poll would take. The benchmark reports the real figure (docs/benchmarks.md).
WOKEN_WITHIN = 1.0


def test_an_ended_todo_comes_back_at_once(make_todo: MakeTodo) -> None:
    done = make_todo(state=State.DONE, result={"n": 1})
    assert Todo.objects.wait_for(done.id, 20).result == {"n": 1}
    with pytest.raises(TodoNotFound):
        Todo.objects.wait_for("td_nope", 1)
    with pytest.raises(InvalidTodo, match="timeout"):
        Todo.objects.wait_for(done.id, -1)


def test_a_todo_that_does_not_end_in_time_comes_back_as_it_is(make_todo: MakeTodo) -> None:
    todo = make_todo(state=State.CLAIMED, owner="w1")
    found = Todo.objects.wait_for(todo.id, 0)
    assert (found.state, found.awaited) == (State.CLAIMED, True)


def ended_in_thread(todo_id: str, end: Callable[[], Any]) -> tuple[Todo, float]:
    """Wait for `todo_id` on this thread while another thread ends it; the todo and how long
    after the end's commit the wait returned."""
    ended_at: list[float] = []

    def end_it() -> None:
        try:
            time.sleep(0.3)  # the wait has marked the todo and sleeps
            end()
            ended_at.append(time.monotonic())
        finally:
            connections.close_all()

    ender = threading.Thread(target=end_it)
    ender.start()
    todo = Todo.objects.wait_for(todo_id, 20)
    woken_at = time.monotonic()
    ender.join(30)
    return todo, woken_at - ended_at[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("end", "state"),
    [
        (lambda todo: Todo.objects.complete(todo.id, "w1", {"ok": True}), State.DONE),
        (lambda todo: Todo.objects.complete_many("w1", {todo.id: {"ok": True}}), State.DONE),
        (lambda todo: Todo.objects.fail(todo.id, "w1", "boom"), State.FAILED),
        (lambda todo: Todo.objects.cancel(todo.id, "not needed"), State.FAILED),
    ],
    ids=["complete", "complete_many", "fail", "cancel"],
)
def test_a_wait_is_woken_when_the_todo_ends(end: Callable[[Todo], Any], state: str) -> None:
    todo, _ = Todo.objects.create_todo(kind="k", max_attempts=1)
    Todo.objects.claim(todo.id, "w1", 60)
    ended, after = ended_in_thread(todo.id, lambda: end(todo))
    assert ended.state == state
    assert after < WOKEN_WITHIN, after
    assert listen.shared_listener().listening


@pytest.mark.django_db(transaction=True)
def test_the_reaper_and_a_dead_parent_wake_their_waits() -> None:
    lapsing, _ = Todo.objects.create_todo(kind="k", max_attempts=1)
    Todo.objects.claim(lapsing.id, "w1", 60)
    Todo.objects.filter(pk=lapsing.pk).update(lease_expires_at=lapsing.created_at)
    ended, after = ended_in_thread(lapsing.id, Todo.objects.reap_expired)
    assert ended.state == State.FAILED and after < WOKEN_WITHIN
    parent, _ = Todo.objects.create_todo(kind="parent", max_attempts=1)
    child, _ = Todo.objects.create_todo(kind="child", after=[parent.id])
    Todo.objects.claim(parent.id, "w1", 60)
    ended, after = ended_in_thread(child.id, lambda: Todo.objects.fail(parent.id, "w1", "x"))
    assert ended.state == State.FAILED and after < WOKEN_WITHIN


@pytest.mark.django_db(transaction=True)
def test_a_todo_ending_while_it_is_marked_is_seen_ended() -> None:
    """The completion holds the row; the mark waits for it, then finds it ended: no wait."""
    todo, _ = Todo.objects.create_todo(kind="k")
    Todo.objects.claim(todo.id, "w1", 60)
    found: list[Todo] = []

    def wait() -> None:
        try:
            found.append(Todo.objects.wait_for(todo.id, 20))
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait)
    with transaction.atomic():
        Todo.objects.complete(todo.id, "w1", "done")
        waiter.start()
        time.sleep(0.3)  # the mark waits for this transaction's row lock
    started = time.monotonic()
    waiter.join(30)
    assert found[0].state == State.DONE
    assert time.monotonic() - started < WOKEN_WITHIN


def complete_on_own_connection(todo_id: str) -> None:
    try:
        Todo.objects.complete(todo_id, "w1", "x")
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_the_async_twin_waits_without_a_thread() -> None:
    todo, _ = Todo.objects.create_todo(kind="k")
    Todo.objects.claim(todo.id, "w1", 60)

    async def scenario() -> tuple[Todo, int]:
        before = threading.active_count()  # earlier tests may have left threads of their own
        waits = [asyncio.ensure_future(Todo.objects.await_for(todo.id, 20)) for _ in range(20)]
        await asyncio.sleep(0.5)
        added = threading.active_count() - before
        await asyncio.to_thread(complete_on_own_connection, todo.id)
        done = await asyncio.gather(*waits)
        return done[0], added

    ended, added = asyncio.run(scenario())
    assert ended.state == State.DONE
    assert added < 15  # twenty waits, not twenty threads


def test_a_wait_for_names_its_timeout(make_todo: MakeTodo) -> None:
    todo = make_todo(state=State.DONE)
    assert Todo.objects.wait_for(todo.id, timedelta(seconds=5)).state == State.DONE
    with pytest.raises(InvalidTodo, match="timeout"):
        Todo.objects.wait_for(todo.id, timedelta(days=2))
