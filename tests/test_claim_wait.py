"""Blocking claims for pull consumers: `claim_next(..., wait=)` returns when work arrives."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import DatabaseError, connection, connections
from django.test.utils import CaptureQueriesContext, override_settings

from switchboard_todos.claims import listen, long_polls
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.managers import run_now
from switchboard_todos.models import Todo
from tests.helpers import wait_until


@pytest.fixture(autouse=True)
def _stop_listeners() -> Iterator[None]:
    yield
    long_polls.stop()


def enqueue_later(seconds: float, **fields: object) -> threading.Thread:
    """Create a todo from another connection after `seconds`, as a producer elsewhere would."""

    def produce() -> None:
        try:
            time.sleep(seconds)
            Todo.objects.create_todo(kind="k", **fields)  # type: ignore[arg-type]
        finally:
            connections.close_all()

    thread = threading.Thread(target=produce)
    thread.start()
    return thread


@pytest.mark.django_db
@pytest.mark.parametrize("wait", [None, 0, timedelta(0)])
def test_no_wait_is_one_statement(wait: object) -> None:
    """Without a wait, a claim is exactly the one statement it always was."""
    with CaptureQueriesContext(connection) as queries:
        assert Todo.objects.claim_next("default", "w1", 30, wait=wait) is None  # type: ignore[arg-type]
    assert len(queries) == 1


@pytest.mark.django_db
def test_available_work_returns_at_once(make_todo: Callable[..., Todo]) -> None:
    """With work waiting, a blocking claim is the same single statement."""
    todo = make_todo()
    with CaptureQueriesContext(connection) as queries:
        claimed = Todo.objects.claim_next("default", "w1", 30, wait=30)
    assert claimed is not None and claimed.id == todo.id
    assert len(queries) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("wait", [-1, timedelta(hours=1), "5", float("inf")])
def test_a_bad_wait_is_refused_before_claiming(
    make_todo: Callable[..., Todo], wait: object
) -> None:
    """A negative, oversized or non-numeric wait raises InvalidTodo and claims nothing."""
    make_todo()
    with pytest.raises(InvalidTodo, match="wait"):
        Todo.objects.claim_next("default", "w1", 30, wait=wait)  # type: ignore[arg-type]
    assert Todo.objects.filter(state="pending").count() == 1


@pytest.mark.django_db(transaction=True)
def test_returns_none_when_the_wait_ends() -> None:
    """Nothing arrives: None after the wait, not before."""
    started = time.monotonic()
    assert Todo.objects.claim_next("default", "w1", 30, wait=0.3) is None
    assert time.monotonic() - started >= 0.3


@pytest.mark.django_db(transaction=True)
def test_a_notification_wakes_the_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """A todo committed during the wait is claimed at once: polling alone would take a minute."""
    monkeypatch.setattr(listen, "POLL_MAX", 60.0)
    producer = enqueue_later(0.3)
    started = time.monotonic()
    claimed = Todo.objects.claim_next("default", "w1", 30, wait=30)
    elapsed = time.monotonic() - started
    producer.join()
    assert claimed is not None and claimed.owner == "w1"
    assert elapsed < 10


@pytest.mark.django_db(transaction=True)
def test_other_queues_do_not_end_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work in a queue the claim is not asking for neither wakes nor satisfies it."""
    monkeypatch.setattr(listen, "POLL_MAX", 60.0)
    producer = enqueue_later(0.1, queue="elsewhere")
    assert Todo.objects.claim_batch(["default"], "w1", 30, limit=5, wait=0.6) == []
    producer.join()


@pytest.mark.django_db(transaction=True)
@override_settings(SWITCHBOARD_TODOS_LISTEN=False)
def test_without_listen_polling_finds_the_work() -> None:
    """With LISTEN off (PgBouncer in transaction mode), the claim polls and still gets it."""
    producer = enqueue_later(0.2)
    claimed = Todo.objects.claim_next("default", "w1", 30, wait=30)
    producer.join()
    assert claimed is not None
    assert not listen.shared_listener().listening


@pytest.mark.django_db(transaction=True)
def test_async_twin_waits_without_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """`aclaim_next(wait=)` suspends on the doorbell and is woken by the notification."""
    monkeypatch.setattr(listen, "POLL_MAX", 60.0)
    producer = enqueue_later(0.3)
    claimed = async_to_sync(Todo.objects.aclaim_next)("default", "w1", 30, wait=30)
    producer.join()
    assert claimed is not None and claimed.owner == "w1"


@pytest.mark.django_db(transaction=True)
def test_async_twin_returns_none_when_the_wait_ends() -> None:
    """Nothing arrives: the async claim returns an empty batch after the wait."""
    assert async_to_sync(Todo.objects.aclaim_batch)("default", "w1", 30, 3, wait=0.2) == []


def test_the_blocking_claim_refuses_code_that_would_suspend() -> None:
    """claim_batch runs aclaim_batch's code on its own thread: an await that suspends is a bug."""

    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended"):
        run_now(suspends())


@pytest.mark.django_db(transaction=True)
def test_a_read_only_database_is_waited_out(
    read_only_database: Callable[[bool], None], caplog: pytest.LogCaptureFixture
) -> None:
    """A failover to a standby during a long poll: the claim backs off and logs once, and
    claims the work once the database is writable again."""
    Todo.objects.count()  # this thread's connection opens writable, before the failover
    read_only_database(True)
    claimed: list[Todo | None] = []

    def poll() -> None:
        try:
            claimed.append(Todo.objects.claim_next("default", "w1", 30, wait=60))
        finally:
            connections.close_all()

    with caplog.at_level(logging.WARNING, "switchboard_todos.faults"):
        thread = threading.Thread(target=poll)
        thread.start()
        wait_until(lambda: "blocking claims: the database is read-only" in caplog.text, "it")
        read_only_database(False)
        todo, _ = Todo.objects.create_todo(kind="k")
        thread.join(60)
    assert claimed and claimed[0] is not None and claimed[0].id == todo.id
    assert caplog.text.count("the database is read-only") == 1
    assert "blocking claims: the database is back after" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_database_still_read_only_at_the_end_of_the_wait_is_an_error(
    read_only_database: Callable[[bool], None],
) -> None:
    read_only_database(True)
    failures: list[BaseException] = []

    def poll() -> None:  # a new thread: a new connection, read-only
        try:
            Todo.objects.claim_next("default", "w1", 30, wait=1)
        except DatabaseError as error:
            failures.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=poll)
    thread.start()
    thread.join(60)
    assert len(failures) == 1 and "read-only transaction" in str(failures[0])
