"""Heartbeats never wait on a row lock: one locked todo costs no other todo its lease."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import State, Todo
from switchboard_todos.worker import Worker, WorkerStats
from tests import worker_handlers  # noqa: F401 (registers the handlers)
from tests.conftest import database_url
from tests.helpers import MakeTodo, db_now, open_gate, started_lines, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def row_locked(todo_id: str) -> Iterator[None]:
    """Another session holds `SELECT ... FOR UPDATE` on the todo until the block ends."""
    with psycopg.connect(database_url()) as other:
        other.execute("SELECT id FROM todos WHERE id = %s FOR UPDATE", [todo_id])
        yield
        other.rollback()


def test_heartbeat_many_extends_every_held_lease_in_one_statement(make_todo: MakeTodo) -> None:
    held = [make_todo(state=State.CLAIMED, owner="w1") for _ in range(3)]
    taken = make_todo(state=State.CLAIMED, owner="w2")
    done = make_todo(state=State.DONE)
    ids = [todo.id for todo in [*held, taken, done]] + ["td_missing"]
    with CaptureQueriesContext(connection) as queries:
        beats = Todo.objects.heartbeat_many("w1", timedelta(minutes=10), ids)
    assert len(queries) == 1
    assert sorted(beats.extended) == sorted(todo.id for todo in held)
    assert beats.lost == [taken.id, done.id, "td_missing"]
    for todo in Todo.objects.filter(pk__in=beats.extended):
        assert todo.lease_expires_at is not None
        assert todo.lease_expires_at - db_now() > timedelta(minutes=9)
    assert Todo.objects.get(pk=taken.pk).lease_expires_at == taken.lease_expires_at


def test_heartbeat_many_skips_a_locked_row_without_waiting(make_todo: MakeTodo) -> None:
    """The locked todo is neither extended nor lost: the next beat tries it again."""
    free, locked = (make_todo(state=State.CLAIMED, owner="w1") for _ in range(2))
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '5s'")  # waiting would fail the test, not hang it
    try:
        with row_locked(locked.id):
            beats = Todo.objects.heartbeat_many("w1", 600, [free.id, locked.id])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert (beats.extended, beats.lost) == ([free.id], [])
    assert Todo.objects.get(pk=locked.pk).lease_expires_at == locked.lease_expires_at
    assert Todo.objects.heartbeat_many("w1", 600, [locked.id]).extended == [locked.id]


@pytest.mark.parametrize(
    ("ids", "message"),
    [("td_1", "not a single str"), ([], "at least one"), ([1], "must be a str")],
)
def test_heartbeat_many_refuses_bad_ids(ids: object, message: str) -> None:
    with pytest.raises(InvalidTodo, match=message):
        Todo.objects.heartbeat_many("w1", 30, ids)  # type: ignore[arg-type]


def test_a_locked_row_costs_no_other_todo_its_lease(gate: dict[str, str]) -> None:
    """Reproduction: a row lock held longer than the TTL used to block the heartbeat thread,
    so the leases of the worker's other running todos lapsed and they ran twice."""
    created = Todo.objects.create_many([{"kind": "test.gate", "payload": gate} for _ in range(3)])
    todos = [todo for todo, _ in created]
    worker = Worker(concurrency=3, ttl=2, max_todos=3, listen=False, poll_interval=0.05)
    stats: list[WorkerStats] = []

    def run() -> None:
        stats.append(worker.run())
        connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: len(started_lines(gate)) == 3, "three handlers to start")
        with row_locked(todos[0].id):
            # Hold the lock past two TTLs by the database clock, then look at the others.
            until = db_now() + timedelta(seconds=5)
            wait_until(lambda: db_now() > until, "the lock to be held past two TTLs")
            others = Todo.objects.filter(pk__in=[todo.id for todo in todos[1:]])
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM todos WHERE id = ANY(%s) AND lease_expires_at > now()",
                    [[todo.id for todo in others]],
                )
                assert cursor.fetchone() == (2,), "a lease lapsed while one row was locked"
        # Released: the locked todo's lease is extended again at the next beat.
        wait_until(
            lambda: Todo.objects.filter(pk=todos[0].pk, lease_expires_at__gt=db_now()).exists(),
            "the locked todo's next heartbeat",
        )
        open_gate(gate)
    finally:
        open_gate(gate)
        thread.join(60)
    assert stats and (stats[0].done, stats[0].lost) == (3, 0)
    assert sorted(started_lines(gate)) == sorted(f"{todo.id} 1" for todo in todos)
    assert Todo.objects.filter(state=State.DONE, attempt=1).count() == 3
