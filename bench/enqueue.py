"""Scenario 1: enqueue one todo at a time, each in its own transaction.

Ours is `create_todo` (validation, the idempotency-key guard, NOTIFY, the new Todo back); the
reference a raw single-row INSERT returning the new id. One process each: the commit's WAL
flush sets much of the pace, and more processes would measure group commit instead.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from psycopg.types.json import Jsonb

from bench import raw
from bench.harness import QUEUE, Bench, Child, Row, Target, expect_states, reset

#: `create_todo` against a raw single-row INSERT (issue 28).
TARGET = Target(ratio=0.85)

#: The queue of the todos already in the table when `enqueue(ballast=)` begins.
BALLAST = "ballast"

INSERT = "INSERT INTO todos (queue, kind, payload) VALUES (%s, %s, %s) RETURNING id"


def ours(child: Child, *, count: int, keys: int = 0) -> None:
    """Enqueue `count` todos through the manager; with `keys`, over that many fair keys."""
    from django.db import connection

    from switchboard_todos.models import Todo

    connection.ensure_connection()
    child.start()
    for number in range(count):
        Todo.objects.create_todo(
            queue=QUEUE, kind="bench.noop", payload={"n": number}, fair_key=fair_key(number, keys)
        )
        child.count()


def reference(child: Child, *, count: int) -> None:
    """Enqueue `count` todos with a raw INSERT each."""
    with raw.connect() as connection, connection.cursor() as cursor:
        child.start()
        for number in range(count):
            cursor.execute(INSERT, (QUEUE, "bench.noop", Jsonb({"n": number}))).fetchone()
            child.count()


def fair_key(number: int, keys: int) -> str | None:
    """The fair key of the `number`th todo spread over `keys` keys (none without keys)."""
    return f"key-{number % keys}" if keys else None


def enqueue(bench: Bench, task: Any, count: int, *, ballast: int = 0, **kwargs: Any) -> float:
    """Todos per second of `task` enqueuing `count`, into a table that holds `ballast` pending
    todos of another queue (the planner then knows it has rows)."""
    reset(ballast, queue=BALLAST)
    seconds, _ = bench.pool.run(task, [{"count": count, **kwargs}], count)
    expect_states({"pending": count + ballast}, f"enqueue by {task.__name__}")
    return count / seconds


def run(bench: Bench) -> None:
    count = bench.size(full=3000, smoke=50)
    figures = bench.interleave(
        {
            "ours": partial(enqueue, bench, ours, count),
            "raw": partial(enqueue, bench, reference, count),
        }
    )
    bench.add(
        Row(
            "enqueue one at a time, create_todo",
            figures["ours"],
            figures["raw"],
            "INSERT",
            target=TARGET,
        )
    )
