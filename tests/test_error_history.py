"""The failure history is a table, todo_errors: bounded in entries and in bytes, the oldest
dropped and counted; a fail writes its own entry's WAL, not the whole history's; and every
reader of `Todo.errors` sees the history as before, without a query per todo."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.db import connection
from django.db.models import F, Sum
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext

from switchboard_todos.agents.serialize import todos_json
from switchboard_todos.models import ErrorEntry, State, Todo
from switchboard_todos.upkeep import retention
from tests.conftest import run_in_threads
from tests.helpers import MakeTodo, entry_size, own_wal

#: Bytes of each error of the WAL measurement: the hostile agent's 60 KB errors.
BIG = 60 * 1024


def noise(size: int) -> str:
    """Text that pglz cannot shrink much, so that an entry's WAL is about its size."""
    return "".join(random.choices(string.ascii_letters + string.digits, k=size))


def entry(attempt: int, size: int) -> dict[str, Any]:
    return {"attempt": attempt, "owner": "w1", "error": {"type": "E", "message": "m" * size}}


def stored(todo: Todo) -> Todo:
    return Todo.objects.get(pk=todo.pk)


def history_bytes(todo: Todo) -> int:
    return ErrorEntry.objects.filter(todo=todo).aggregate(total=Sum("size"))["total"] or 0


def failed(todo: Todo, error: Any) -> None:
    Todo.objects.fail(todo.id, "w1", error, retry_in=0)


def reaped(todo: Todo, error: Any) -> None:
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=F("lease_expires_at") - timedelta(1))
    assert Todo.objects.reap_expired().requeued == 1


def taken_over(todo: Todo, error: Any) -> None:
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=F("lease_expires_at") - timedelta(1))
    assert Todo.objects.claim(todo.id, "w2", 60).owner == "w2"


def cancelled(todo: Todo, error: Any) -> None:
    Todo.objects.cancel(todo.id, "not needed")


@pytest.mark.parametrize(
    "ends_attempt",
    [failed, reaped, taken_over, cancelled],
    ids=["fail", "reap_expired", "claim over an expired lease", "cancel"],
)
def test_each_writer_keeps_the_history_within_its_bytes(
    settings: Any, make_todo: MakeTodo, ends_attempt: Callable[[Todo, Any], None]
) -> None:
    """Four entries of ~1 KB each, a limit of 2.5 KB and a small new entry: the two oldest go,
    and are counted, whatever statement appends it."""
    settings.SWITCHBOARD_TODOS_MAX_ERROR_HISTORY_BYTES = 2500
    history = [entry(number, 1000) for number in range(1, 5)]
    todo = make_todo(state=State.CLAIMED, owner="w1", attempt=5, max_attempts=10, errors=history)
    ends_attempt(todo, "the fifth")
    after = stored(todo)
    assert [item["attempt"] for item in after.errors] == [3, 4, 5]
    assert after.errors_dropped == 2
    assert after.errors_bytes == history_bytes(todo) <= 2500
    assert history_bytes(todo) == sum(entry_size(item) for item in after.errors)


def test_the_newest_entry_stays_whatever_its_size(settings: Any, make_todo: MakeTodo) -> None:
    settings.SWITCHBOARD_TODOS_MAX_ERROR_HISTORY_BYTES = 100
    todo = make_todo(state=State.CLAIMED, owner="w1", errors=[entry(0, 10)], max_attempts=5)
    Todo.objects.fail(todo.id, "w1", "x" * 500, retry_in=0)
    after = stored(todo)
    assert [item["error"]["message"] for item in after.errors] == ["x" * 500]
    assert after.errors_dropped == 1


def test_entries_and_bytes_bound_the_history_together(settings: Any, make_todo: MakeTodo) -> None:
    """Small entries are cut by MAX_ERRORS_KEPT, large ones by MAX_ERROR_HISTORY_BYTES."""
    settings.SWITCHBOARD_TODOS_MAX_ERRORS_KEPT = 3
    settings.SWITCHBOARD_TODOS_MAX_ERROR_HISTORY_BYTES = 3000
    todo = make_todo(max_attempts=100)
    for size in (10, 10, 10, 10, 1200, 1200, 1200):
        Todo.objects.claim(todo.id, "w1", 60)
        failed(todo, "y" * size)
    after = stored(todo)
    assert [len(item["error"]["message"]) for item in after.errors] == [1200, 1200]
    assert after.errors_dropped == 5
    assert after.attempt == 7


def test_a_cancelled_child_records_its_parent_failed(settings: Any, make_todo: MakeTodo) -> None:
    """The todos cancelled below a dead letter get their entry, and theirs are bounded too."""
    settings.SWITCHBOARD_TODOS_MAX_ERRORS_KEPT = 2
    parent, _ = Todo.objects.create_todo(kind="k", max_attempts=1)
    child, _ = Todo.objects.create_todo(kind="k", after=[parent.id], on_parent_failure="cancel")
    made = ErrorEntry.objects.bulk_create(
        ErrorEntry(todo=child, attempt=n, entry=entry(n, 5), size=entry_size(entry(n, 5)))
        for n in (1, 2)
    )
    Todo.objects.filter(pk=child.pk).update(errors_bytes=sum(row.size for row in made))
    Todo.objects.claim(parent.id, "w1", 60)
    Todo.objects.fail(parent.id, "w1", "boom")
    after = stored(child)
    assert after.state == State.FAILED and after.errors_dropped == 1
    assert after.errors_bytes == history_bytes(child)
    assert [item["error"]["type"] for item in after.errors] == ["E", "ParentFailed"]
    assert after.errors[-1]["error"]["parent"] == parent.id and after.errors[-1]["owner"] is None


def test_a_fail_returns_its_entry_in_one_query_when_read(make_todo: MakeTodo) -> None:
    """The fail is one statement; reading the returned history is one query more, only when
    read."""
    todo = make_todo(state=State.CLAIMED, owner="w1", errors=[entry(0, 5)], max_attempts=5)
    with CaptureQueriesContext(connection) as fail:
        done = Todo.objects.fail(todo.id, "w1", "bad")
    assert len(fail.captured_queries) == 1
    with CaptureQueriesContext(connection) as read:
        history = done.errors
    assert len(read.captured_queries) == 1
    assert [item["error"] for item in history] == [
        {"type": "E", "message": "mmmmm"},
        {"type": "", "message": "bad"},
    ]


def test_lists_read_every_history_in_one_query(make_todo: MakeTodo) -> None:
    for number in range(5):
        make_todo(state=State.FAILED, title=f"t{number}", errors=[entry(1, 5), entry(2, number)])
    with CaptureQueriesContext(connection) as listed:
        todos = list(Todo.objects.prefetch_related("error_entries"))
        histories = [todo.errors for todo in todos]
    assert len(listed.captured_queries) == 2
    assert all([item["attempt"] for item in history] == [1, 2] for history in histories)
    with CaptureQueriesContext(connection) as shaped:
        answers = todos_json(list(Todo.objects.all()))
    assert len(shaped.captured_queries) == 2  # the todos, then their last errors
    assert {answer["title"]: answer["last_error"]["message"] for answer in answers} == {
        f"t{number}": "m" * number for number in range(5)
    }


def test_a_fresh_todo_costs_no_history_query(db: None) -> None:
    todo, _ = Todo.objects.create_todo(kind="k")
    with CaptureQueriesContext(connection) as shaped:
        [answer] = todos_json([todo])
    assert answer["last_error"] is None and not shaped.captured_queries


def test_the_admin_and_the_task_result_show_the_history(
    make_todo: MakeTodo, admin_client: Client
) -> None:
    todo = make_todo(max_attempts=5)
    Todo.objects.claim(todo.id, "w1", 60)
    failed(todo, {"type": "ValueError", "message": "first try"})
    page = admin_client.get(f"/admin/switchboard_todos/todo/{quote(todo.pk)}/change/")
    assert "first try" in page.content.decode()
    assert stored(todo).errors[0]["owner"] == "w1"


def test_purges_delete_the_histories_with_their_todos(make_todo: MakeTodo) -> None:
    old = make_todo(
        state=State.FAILED, completed_at=Now() - timedelta(days=40), errors=[entry(1, 5)]
    )
    kept = make_todo(state=State.FAILED, errors=[entry(1, 5)])
    retention.purge(timedelta(days=30), include_failed=True)
    assert not Todo.objects.filter(pk=old.pk).exists()
    assert set(ErrorEntry.objects.values_list("todo_id", flat=True)) == {kept.pk}


@pytest.mark.django_db(transaction=True)
def test_reapers_and_claims_racing_record_each_expiry_once(
    settings: Any, make_todo: MakeTodo
) -> None:
    """Two reapers and two claimers race over 60 expired leases with full histories: each
    expiry is one entry, one entry is dropped for it, and the byte counts stay the sums."""
    settings.SWITCHBOARD_TODOS_MAX_ERRORS_KEPT = 3
    todos = [
        make_todo(
            state=State.CLAIMED,
            owner="gone",
            attempt=3,
            max_attempts=10,
            lease_expires_in=timedelta(seconds=-5),
            errors=[entry(number, 20) for number in range(3)],
        )
        for _ in range(60)
    ]

    def race(index: int) -> None:
        for _ in range(10):
            if index < 2:
                Todo.objects.reap_expired()
            else:
                Todo.objects.claim_batch("default", f"w{index}", 60, limit=5)

    run_in_threads(4, race)
    for todo in todos:
        after = stored(todo)
        history = after.errors
        assert [item["error"]["type"] for item in history] == ["E", "E", "LeaseExpired"]
        assert history[-1]["owner"] == "gone" and history[-1]["attempt"] == 3
        assert after.errors_dropped == 1
        assert after.errors_bytes == history_bytes(todo)


@pytest.mark.django_db(transaction=True)
def test_the_wal_of_a_fail_is_its_own_entry_not_the_history() -> None:
    """The 20th fail of 60 KiB errors writes less than twice the WAL of the first (before the
    table, the whole history again: 20 times as much).

    Each figure is the WAL of the fail's own transaction (helpers.own_wal), the least of three
    todos'.
    """
    todos = [Todo.objects.create_todo(kind="k", max_attempts=100)[0] for _ in range(3)]
    wal: dict[int, list[int]] = {1: [], 20: []}
    for number in range(1, 21):
        for todo in todos:
            Todo.objects.claim(todo.id, "w1", 60)
            error = {"type": "Flood", "message": noise(BIG)}
            written = own_wal(lambda: failed(todo, error))  # noqa: B023 (called at once)
            if number in wal:
                wal[number].append(int(written))
    first, twentieth = min(wal[1]), min(wal[20])
    assert first >= BIG * 0.5, wal  # the measurement sees the entry itself
    assert twentieth < 2 * first, wal
    assert all(stored(todo).errors_dropped > 0 for todo in todos)


@pytest.mark.django_db(transaction=True)
def test_migration_0018_moves_the_histories_and_back() -> None:
    """Histories in the `errors` column become rows, in order; unapplied, a column again."""
    history = [entry(1, 3), entry(2, 4)]
    call_command("migrate", "switchboard_todos", "0015", verbosity=0, stdout=StringIO())
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO todos (id, queue, kind, errors, errors_dropped)"
                " VALUES ('td_a', 'default', 'k', %s::jsonb, 3), ('td_b', 'default', 'k', '[]', 0)",
                [json.dumps(history)],
            )
    finally:
        call_command("migrate", "switchboard_todos", verbosity=0, stdout=StringIO())
    assert Todo.objects.get(pk="td_a").errors == history
    assert Todo.objects.get(pk="td_a").errors_dropped == 3
    assert Todo.objects.get(pk="td_a").errors_bytes == sum(entry_size(item) for item in history)
    assert not Todo.objects.get(pk="td_b").errors
    assert [row.size for row in ErrorEntry.objects.order_by("id")] == [
        entry_size(item) for item in history
    ]
    call_command("migrate", "switchboard_todos", "0015", verbosity=0, stdout=StringIO())
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT errors FROM todos WHERE id = 'td_a'")
            (restored,) = cursor.fetchone()
        assert (json.loads(restored) if isinstance(restored, str) else restored) == history
    finally:
        call_command("migrate", "switchboard_todos", verbosity=0, stdout=StringIO())
