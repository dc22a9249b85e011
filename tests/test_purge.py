"""Retention: `purge_todos` deletes only old finished todos, in batches, and stays an index scan."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models.functions import Now

from switchboard_todos.models import State, Todo
from switchboard_todos.sql import queries
from switchboard_todos.upkeep import retention
from tests.helpers import MakeTodo

OLD = timedelta(days=31)


def finished(make_todo: MakeTodo, state: str, ago: timedelta, **fields: Any) -> Todo:
    return make_todo(state=state, completed_at=Now() - ago, **fields)


def purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_todos", *args, stdout=out)
    return out.getvalue()


def remaining() -> set[str]:
    return set(Todo.objects.values_list("title", flat=True))


def test_purge_deletes_only_done_todos_older_than_the_cutoff(make_todo: MakeTodo) -> None:
    """Old done todos go; recent ones, dead letters and live todos stay, whatever their dates."""
    finished(make_todo, State.DONE, OLD, title="old done")
    finished(make_todo, State.DONE, timedelta(days=29), title="recent done")
    finished(make_todo, State.FAILED, OLD, title="old dead letter")
    make_todo(title="pending", completed_at=Now() - OLD)
    make_todo(state=State.CLAIMED, title="claimed", completed_at=Now() - OLD)
    assert purge("--older-than", "30d") == (
        "Deleted 1 done todo completed over 30d ago in 1 batch:\n"
        "  default                        done              1\n"
    )
    assert remaining() == {"recent done", "old dead letter", "pending", "claimed"}


def test_purge_include_failed_deletes_old_dead_letters(make_todo: MakeTodo) -> None:
    """--include-failed adds dead letters to what is deleted; live todos still stay."""
    finished(make_todo, State.DONE, OLD, title="old done")
    finished(make_todo, State.FAILED, OLD, title="old dead letter")
    finished(make_todo, State.FAILED, timedelta(hours=1), title="recent dead letter")
    make_todo(state=State.CLAIMED, title="claimed", completed_at=Now() - OLD)
    out = purge("--older-than", "12h", "--include-failed")
    assert out.splitlines()[0] == (
        "Deleted 2 done or failed todos completed over 12h ago in 1 batch:"
    )
    assert remaining() == {"recent dead letter", "claimed"}


def test_purge_by_queue(make_todo: MakeTodo) -> None:
    """--queue, repeatable, limits the purge to those queues and reports per queue."""
    for queue in ("mail", "sms", "push"):
        finished(make_todo, State.DONE, OLD, queue=queue, title=queue)
    out = purge("--older-than", "90m", "--queue", "mail", "--queue", "sms")
    assert out.splitlines()[1:] == [
        "  mail                           done              1",
        "  sms                            done              1",
    ]
    assert remaining() == {"push"}


def test_purge_in_batches_deletes_everything_due(make_todo: MakeTodo) -> None:
    """Batches smaller than the backlog, with ties on completed_at, still delete every row once."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (kind, state, completed_at) "
            "SELECT 'test.kind', 'done', now() - interval '40 days' FROM generate_series(1, 25)"
        )
    finished(make_todo, State.DONE, timedelta(days=35))
    out = purge("--older-than", "30d", "--batch-size", "10")
    assert out.splitlines()[0] == "Deleted 26 done todos completed over 30d ago in 3 batches:"
    assert Todo.objects.count() == 0


def test_purge_dry_run_counts_and_deletes_nothing(make_todo: MakeTodo) -> None:
    """--dry-run prints per queue and state what would go, and leaves every row."""
    finished(make_todo, State.DONE, OLD, queue="mail")
    finished(make_todo, State.DONE, OLD, queue="mail")
    finished(make_todo, State.FAILED, OLD, queue="sms")
    finished(make_todo, State.DONE, timedelta(seconds=10), queue="sms")
    out = purge("--older-than", "45s", "--include-failed", "--dry-run")
    assert out == (
        "Would delete 3 done or failed todos completed over 45s ago:\n"
        "  mail                           done              2\n"
        "  sms                            failed            1\n"
    )
    assert Todo.objects.count() == 4


def test_purge_with_nothing_to_delete(db: None) -> None:
    """An empty purge says so in one line; -v 0 says nothing."""
    assert (
        purge("--older-than", "3600") == "Deleted 0 done todos completed over 1h ago in 1 batch.\n"
    )
    assert purge("--older-than", "1d", "--verbosity", "0") == ""


@pytest.mark.django_db(transaction=True)
def test_purge_skips_todos_another_session_holds(make_todo: MakeTodo) -> None:
    """A row locked elsewhere is skipped, not waited for; the next purge takes it."""
    held = finished(make_todo, State.DONE, OLD)
    finished(make_todo, State.DONE, OLD)
    other = connection.copy()
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM todos WHERE id = %s FOR UPDATE", [held.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a purge that waited would fail
        assert retention.purge(OLD - timedelta(days=1)).total == 1
        assert list(Todo.objects.values_list("pk", flat=True)) == [held.pk]
        other.rollback()
        assert retention.purge(OLD - timedelta(days=1)).total == 1
    finally:
        other.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --older-than"),
        (["--older-than", "3x"], "argument --older-than: invalid duration '3x'"),
        (["--older-than", "0d"], "argument --older-than: duration '0d' must be more than zero"),
        (["--older-than", "1d", "--queue", "no spaces"], "argument --queue: queue 'no spaces'"),
        (["--older-than", "1d", "--batch-size", "-5"], "argument --batch-size: '-5' must be 1"),
        (["--older-than", "1d", "--batch-size", "many"], "'many' is not a whole number"),
        (["--older-than", "1d", "--batch-size", "100001"], "--batch-size 100001 is too large"),
    ],
)
def test_purge_rejects_bad_arguments(args: list[str], message: str) -> None:
    """Every argument is validated with a message that names it."""
    with pytest.raises(CommandError, match=message):
        call_command("purge_todos", *args)


@pytest.mark.parametrize(
    "call",
    [
        lambda: retention.purge(timedelta(0)),
        lambda: retention.purge(timedelta(days=1), batch_size=0),
        lambda: retention.count_purgeable(timedelta(seconds=-1)),
    ],
)
def test_retention_api_rejects_bad_input(call: Callable[[], object]) -> None:
    """The Python API refuses a non-positive age or a batch size out of range."""
    with pytest.raises(ValueError):
        call()


# The plan at scale


def explain(name: str, params: dict[str, Any]) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + queries[name], params)
        return "\n".join(row[0] for row in cursor.fetchall())


def fill_for_plans() -> None:
    """40,000 todos over three queues, a quarter in each state, the finished a minute apart;
    each with two entries in its failure history, and each tenth the parent of the next. All
    analyzed: the plans must not hang on what earlier tests left in the tables (an emptied
    todo_edges, planned as ten pages, was read by a Seq Scan)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (queue, kind, state, completed_at) "
            "SELECT (ARRAY['mail', 'sms', 'push'])[1 + n % 3], 'test.kind', "
            "       (ARRAY['pending', 'claimed', 'done', 'failed'])[1 + n % 4], "
            "       CASE WHEN n % 4 >= 2 THEN now() - n * interval '1 minute' END "
            "FROM generate_series(1, 40000) AS n"
        )
        cursor.execute(
            "INSERT INTO todo_errors (todo_id, attempt, entry, size) "
            "SELECT id, n, '{}', 2 FROM todos CROSS JOIN generate_series(1, 2) AS n"
        )
        cursor.execute(
            "INSERT INTO todo_edges (parent_id, child_id) "
            "SELECT parent.id, child.id FROM "
            "  (SELECT id, row_number() OVER (ORDER BY id) AS n FROM todos) AS parent "
            "  JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM todos) AS child "
            "    ON child.n = parent.n + 1 "
            "WHERE parent.n % 10 = 0"
        )
        cursor.execute("ANALYZE todos")
        cursor.execute("ANALYZE todo_errors")
        cursor.execute("ANALYZE todo_edges")


@pytest.mark.parametrize("queues", [None, ["mail", "sms"]])
def test_purge_walks_the_finished_index(db: None, vacuumed: None, queues: list[str] | None) -> None:
    """With many live and finished todos, a batch and a dry run read idx_todos_finished only."""
    fill_for_plans()
    params: dict[str, Any] = {
        "older_than": timedelta(days=20),
        "states": ["done", "failed"],
        "queues": queues,
        "after": None,
        "limit": 1000,
    }
    batch = explain("purge_batch", params)
    # The index gives the order, so the LIMIT stops the scan after one batch of rows: no Sort.
    walk = r"Limit .*\n\s+->  LockRows .*\n\s+->  Index Scan using idx_todos_finished on todos "
    assert re.search(walk, batch), batch
    assert "Index Cond: (id = ANY" in batch, batch  # the DELETE probes the primary key
    assert "Index Cond: (todo_id = ANY" in batch, batch  # and the histories' index
    assert "Seq Scan" not in batch, batch
    count = explain("count_purgeable", params)
    assert "idx_todos_finished" in count, count
    assert "Seq Scan" not in count, count
