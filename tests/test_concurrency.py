"""Real concurrent clients: duplicate deliveries collapse, no todo is ever held twice."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from switchboard_todos.claims.marks import marks
from switchboard_todos.exceptions import TodoConflict
from switchboard_todos.models import State, Todo
from tests.conftest import database_url, run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8


def test_concurrent_creates_with_one_key_make_one_row() -> None:
    """Eight clients racing to enqueue the same delivery: one row, exactly one created=True."""
    for round_number in range(10):
        key = f"delivery-{round_number}"

        def create(index: int, key: str = key) -> tuple[Todo, bool]:
            return Todo.objects.create_todo(kind="k", idempotency_key=key)

        results = run_in_threads(THREADS, create)
        assert sum(created for _, created in results) == 1
        assert len({todo.id for todo, _ in results}) == 1
        assert Todo.objects.filter(idempotency_key=key).count() == 1


def test_concurrent_create_many_with_overlapping_keys() -> None:
    """Batches racing over the same keys still make one row per key."""
    keys = [f"k{index}" for index in range(40)]
    results = run_in_threads(
        THREADS,
        lambda index: Todo.objects.create_many(
            [{"kind": "k", "idempotency_key": key} for key in keys[index % 2 :: 1]]
        ),
    )
    assert Todo.objects.count() == len(keys)
    created = Counter(todo.idempotency_key for batch in results for todo, made in batch if made)
    assert created == Counter(keys)


def test_concurrent_claims_never_share_a_todo() -> None:
    """Claimers racing over a small queue each get different todos, and all get claimed."""
    Todo.objects.create_many([{"kind": "k"} for _ in range(200)])

    def claim_all(index: int) -> list[str]:
        mine = []
        while todos := Todo.objects.claim_batch("default", f"w{index}", 60, limit=3):
            mine += [todo.id for todo in todos]
        return mine

    claimed = run_in_threads(THREADS, claim_all)
    every_claim = [todo_id for mine in claimed for todo_id in mine]
    assert len(every_claim) == len(set(every_claim)) == 200
    assert Todo.objects.filter(state=State.CLAIMED, attempt=1).count() == 200


@pytest.mark.parametrize("claimable", ["ready", "due", "lapsed"])
def test_a_claim_locks_only_the_todos_it_takes(claimable: str) -> None:
    """While a claim's transaction is open, the next claimer gets the next todos, not none.

    Each scan of the claim reads under a larger constant limit: it must lock no more than
    the claim's own limit.
    """
    past = Now() - timedelta(seconds=5)
    states: dict[str, dict[str, Any]] = {
        "ready": {},
        "due": {"next_retry_at": past},
        "lapsed": {"state": State.CLAIMED, "owner": "w0", "lease_expires_at": past},
    }
    for _ in range(5):
        Todo.objects.create(kind=claimable, **states[claimable])
    with transaction.atomic():
        first = Todo.objects.claim_batch("default", "w1", 60, limit=2)
        marks.forget()  # the second claim is a full scan too: it looks for lapsed leases
        [second] = run_in_threads(
            1, lambda index: Todo.objects.claim_batch("default", "w2", 60, limit=3)
        )
    assert (len(first), len(second)) == (2, 3)
    assert not {todo.id for todo in first} & {todo.id for todo in second}


def test_reaper_and_owner_racing_agree_on_one_outcome() -> None:
    """Completing a lapsed lease while reapers sweep: each todo is done xor requeued."""
    todos = Todo.objects.create_many([{"kind": "k"} for _ in range(300)])
    ids = [todo.id for todo, _ in todos]
    Todo.objects.claim_batch("default", "w1", 60, limit=300)
    Todo.objects.update(lease_expires_at=Now() - timedelta(seconds=1))

    def race(index: int) -> list[str]:
        if index:
            for _ in range(50):
                Todo.objects.reap_expired()
            return []
        completed = []
        for todo_id in ids:
            try:
                Todo.objects.complete(todo_id, "w1")
                completed.append(todo_id)
            except TodoConflict:
                pass
        return completed

    completed = set(run_in_threads(4, race)[0])
    states = dict(Todo.objects.values_list("id", "state"))
    assert {todo_id for todo_id, state in states.items() if state == State.DONE} == completed
    assert all(
        state == State.PENDING for todo_id, state in states.items() if todo_id not in completed
    )


DRAIN_TODOS = 4000
DRAIN_PROCESSES = 4


@pytest.mark.parametrize("batch", [1, 50])
def test_processes_drain_every_todo_exactly_once(
    spawn: Callable[..., subprocess.Popen[str]], batch: int
) -> None:
    """Four processes drain thousands of todos: each is completed once, by one owner."""
    Todo.objects.create_many([{"kind": "k", "queue": "drain"} for _ in range(DRAIN_TODOS)])
    processes = [
        spawn(
            "tests.client", "drain", "--queue", "drain", "--owner", f"p{n}", "--batch", str(batch)
        )
        for n in range(DRAIN_PROCESSES)
    ]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        reports.append(json.loads(out))
    completed = [todo_id for report in reports for todo_id in report["completed"]]
    assert len(completed) == len(set(completed)) == DRAIN_TODOS
    done = Todo.objects.filter(queue="drain", state=State.DONE, attempt=1)
    assert done.count() == DRAIN_TODOS
    for report in reports:
        owned = set(done.filter(owner=report["owner"]).values_list("id", flat=True))
        assert owned == set(report["completed"])
    slowest = max(report["seconds"] for report in reports)
    print(
        f"\ndrain batch={batch}: {DRAIN_TODOS / slowest:.0f} todos/s with {len(reports)} processes"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos WHERE state = 'claimed'")
        assert cursor.fetchone()[0] == 0


def commit_after_the_other_blocks(sql: str, params: list[object]) -> threading.Thread:
    """Run `sql` in an open transaction on a second connection; commit it only once another
    session is waiting on its row lock. Returns the started thread."""
    started = threading.Event()

    def run() -> None:
        with psycopg.connect(database_url()) as other:
            other.execute(sql, params)
            started.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                waiting = other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.01)
            other.commit()

    thread = threading.Thread(target=run)
    thread.start()
    started.wait(10)
    return thread


def test_create_todo_finds_a_twin_committed_after_its_snapshot() -> None:
    """A duplicate committed while our insert waits on it is returned, not lost or doubled."""
    thread = commit_after_the_other_blocks(
        "INSERT INTO todos (kind, idempotency_key) VALUES ('k', 'late') RETURNING id", []
    )
    todo, created = Todo.objects.create_todo(kind="k", idempotency_key="late")
    thread.join()
    assert not created
    assert Todo.objects.filter(idempotency_key="late").count() == 1
    assert Todo.objects.get(idempotency_key="late") == todo


def test_requeue_refuses_a_twin_created_while_it_runs() -> None:
    """A live twin committed during the requeue maps the unique violation to TodoConflict."""
    dead = Todo.objects.create_todo(kind="k", idempotency_key="twin")[0]
    Todo.objects.filter(pk=dead.pk).update(state=State.FAILED, attempt=5)
    thread = commit_after_the_other_blocks(
        "INSERT INTO todos (kind, idempotency_key) VALUES ('k', 'twin') RETURNING id", []
    )
    with pytest.raises(TodoConflict, match="holds idempotency key 'twin'"):
        Todo.objects.requeue(dead.id)
    thread.join()
    assert Todo.objects.get(pk=dead.pk).state == State.FAILED


def test_complete_many_never_waits_for_a_row_another_session_holds_locked() -> None:
    """A batch completion leaves a locked todo alone instead of waiting for it.

    A claim keeps the lock of a row that was pending when it began and was claimed since (its
    recheck failed), and a claim into a limited queue's slot waits for the statement finishing
    the todo that held the slot: a complete_many that waited for the first closed the circle.
    Four workers on a queue with a concurrency limit deadlocked many times a second, and each
    deadlock stood for deadlock_timeout. Here the claim's lock is held by hand, and the test
    connection gives up on any lock wait after 10 s (a failure, not a pause).
    """
    held, free = (Todo.objects.create_todo(kind="k")[0] for _ in range(2))
    claimed = Todo.objects.claim_batch("default", "w1", 300, limit=2)
    assert {todo.id for todo in claimed} == {held.id, free.id}
    with psycopg.connect(database_url(), autocommit=True) as claim:
        with claim.transaction():
            claim.execute("SELECT 1 FROM todos WHERE id = %s FOR NO KEY UPDATE", [held.id])
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '10s'")
            try:
                done = Todo.objects.complete_many("w1", {held.id: 1, free.id: 2})
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        assert done == [free.id]
        assert Todo.objects.get(pk=held.id).state == State.CLAIMED
    assert Todo.objects.complete_many("w1", {held.id: 1}) == [held.id]
    assert dict(Todo.objects.values_list("id", "result")) == {held.id: 1, free.id: 2}
