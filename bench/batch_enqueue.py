"""Scenario 2: enqueue in batches, one statement per batch.

Ours is `create_many` (validation, ids, the idempotency-key guard, NOTIFY, the Todos back),
measured against the raw statement of its kind, an INSERT from `unnest` of column arrays (the
bar issue 28 sets); and `enqueue_many` (validation, COPY, NOTIFY; no keys, nothing back),
measured against a raw COPY. Both raw forms write the three columns that differ from the
defaults. Multi-row VALUES is slower than either, so it is not the bar.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from bench import raw
from bench.enqueue import BALLAST, fair_key
from bench.harness import QUEUE, Bench, Child, Row, Target, expect_states, reset

#: Batch enqueue should reach this share of its raw form (issue 28: create_many of unnest).
TARGET = Target(ratio=0.8)

UNNEST = """
INSERT INTO todos (queue, kind, payload)
SELECT * FROM unnest(%s::text[], %s::text[], %s::jsonb[])
"""
COPY = "COPY todos (queue, kind, payload) FROM STDIN"


def ours(child: Child, *, count: int, batch: int, keys: int = 0) -> None:
    """Enqueue `count` todos through `create_many`, `batch` at a time (over `keys` fair keys)."""
    through(child, "create_many", count, batch, keys)


def ours_copy(child: Child, *, count: int, batch: int, keys: int = 0) -> None:
    """Enqueue `count` todos through `enqueue_many` (COPY), `batch` at a time (over `keys`)."""
    through(child, "enqueue_many", count, batch, keys)


def through(child: Child, method: str, count: int, batch: int, keys: int) -> None:
    from django.db import connection

    from switchboard_todos.models import Todo

    enqueue = getattr(Todo.objects, method)
    connection.ensure_connection()
    child.start()
    for first in range(0, count, batch):
        numbers = range(first, min(first + batch, count))
        enqueue(
            {
                "queue": QUEUE,
                "kind": "bench.noop",
                "payload": {"n": n},
                "fair_key": fair_key(n, keys),
            }
            for n in numbers
        )
        child.count(len(numbers))


def unnest(child: Child, *, count: int, batch: int) -> None:
    """Enqueue `count` todos with an INSERT from unnest(arrays), `batch` at a time."""
    with raw.connect() as connection, connection.cursor() as cursor:
        child.start()
        for first in range(0, count, batch):
            numbers = range(first, min(first + batch, count))
            size = len(numbers)
            payloads = [json.dumps({"n": number}) for number in numbers]
            cursor.execute(UNNEST, ([QUEUE] * size, ["bench.noop"] * size, payloads))
            child.count(size)


def copy(child: Child, *, count: int, batch: int) -> None:
    """Enqueue `count` todos with COPY, `batch` rows per COPY."""
    with raw.connect() as connection, connection.cursor() as cursor:
        child.start()
        for first in range(0, count, batch):
            numbers = range(first, min(first + batch, count))
            with cursor.copy(COPY) as rows:
                for number in numbers:
                    rows.write_row((QUEUE, "bench.noop", json.dumps({"n": number})))
            child.count(len(numbers))


def enqueue(
    bench: Bench, task: Any, count: int, batch: int, *, ballast: int = 0, **kwargs: Any
) -> float:
    """As `enqueue.enqueue`, `batch` at a time."""
    reset(ballast, queue=BALLAST)
    seconds, _ = bench.pool.run(task, [{"count": count, "batch": batch, **kwargs}], count)
    expect_states({"pending": count + ballast}, f"batch enqueue by {task.__name__}")
    return count / seconds


def run(bench: Bench) -> None:
    count = bench.size(full=40_000, smoke=1000)
    for batch in (500, 1000):
        figures = bench.interleave(
            {
                name: partial(enqueue, bench, task, count, batch)
                for name, task in (
                    ("ours", ours),
                    ("ours_copy", ours_copy),
                    ("unnest", unnest),
                    ("copy", copy),
                )
            }
        )
        for name, method, reference, form in (
            ("ours", "create_many", "unnest", "unnest INSERT"),
            ("ours_copy", "enqueue_many", "copy", "COPY"),
        ):
            bench.add(
                Row(
                    f"enqueue in batches of {batch}, {method}",
                    figures[name],
                    figures[reference],
                    form,
                    target=TARGET,
                )
            )
