"""Scenario: what a queue's settings cost a claim, and a rate limit's achieved rate.

1. The worker drain of scenario 4 with the drained queue's `todo_queues` row present, once with
   a row that limits nothing (a description and a visibility timeout: a primary-key probe per
   claim) and once with a concurrency limit far above the workers (every claim locks nothing
   but takes a slot). Compare each ratio with scenario 4's row of the same run: the budget is
   within 0.05 (docs/benchmarks.md).
2. A queue limited to `RATE` claims per `PERIOD` seconds, drained by the same workers with
   `claim_next` + `complete` for a few windows: the claims per second achieved against the
   limit, by the database's clock (the claims' `claimed_at`).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from bench import drain_worker, raw
from bench.harness import QUEUE, TTL, Bench, Child, Row, Target, plural

#: The rate limit of part 2: claims per period (seconds).
RATE = 100
PERIOD = 1.0


def configure(**settings: Any) -> None:
    """Give the drained queue a settings row (or none)."""
    from switchboard_todos.models import Queue

    Queue.objects.filter(name=QUEUE).delete()
    if settings:
        Queue.objects.create(name=QUEUE, **settings)


def drain_with(
    bench: Bench, settings: dict[str, Any], task: Any, workers: int, backlog: int, **kwargs: Any
) -> float:
    """`Bench.drain` with the queue's row as `settings` says, removed after."""
    configure(**settings)
    try:
        return bench.drain(task, workers, backlog, **kwargs)
    finally:
        configure()


def claim_and_complete(child: Child, *, owner: str) -> int:
    """Claim and complete one todo at a time until the queue is empty (the rate-limited run)."""
    from django.db import connection

    from switchboard_todos.models import Todo

    connection.ensure_connection()
    child.start()
    done = 0
    while not child.stop.is_set():
        todo = Todo.objects.claim_next(QUEUE, owner, TTL, wait=PERIOD)
        if todo is None:
            continue
        Todo.objects.complete(todo.id, owner)
        done += 1
        child.count()
    return done


def achieved_rate(bench: Bench, workers: int, windows: int) -> float:
    """Claims per second of a rate-limited queue over `windows` full windows, by the
    database's clock."""
    from django.db import connection

    backlog = RATE * (windows + 2)
    configure(rate_limit=RATE, rate_period=timedelta(seconds=PERIOD))
    try:
        bench.pool.run(
            claim_and_complete,
            [{"owner": f"bench-{index}"} for index in range(workers)],
            backlog,
            duration=PERIOD * (windows + 1),
        )
        with connection.cursor() as cursor:
            # The windows as the claim counts them (from the Unix epoch), but the first and
            # the last, which the run began and ended inside.
            cursor.execute(
                """
                WITH per_window AS (
                    SELECT floor(extract(epoch FROM claimed_at) / %(period)s) AS slice,
                           count(*) AS claims
                      FROM todos
                     WHERE claimed_at IS NOT NULL
                     GROUP BY 1
                )
                SELECT coalesce(avg(claims), 0) / %(period)s
                  FROM per_window
                 WHERE slice > (SELECT min(slice) FROM per_window)
                   AND slice < (SELECT max(slice) FROM per_window)
                """,
                {"period": PERIOD},
            )
            (rate,) = cursor.fetchone()
    finally:
        configure()
    return float(rate)


def run(bench: Bench) -> None:
    backlog = bench.size(full=30_000, smoke=300)
    rows: dict[str, dict[str, Any]] = {
        "a queue row that limits nothing": {
            "description": "steered",
            "visibility_timeout": timedelta(minutes=5),
        },
        "a concurrency limit not reached": {"concurrency_limit": 10_000},
    }
    for label, settings in rows.items():
        for workers in bench.workers:
            figures = bench.interleave(
                {
                    "ours": partial(
                        drain_with, bench, settings, drain_worker.ours, workers, backlog
                    ),
                    "raw": partial(
                        drain_with,
                        bench,
                        settings,
                        raw.drain,
                        workers,
                        backlog,
                        batch=drain_worker.RAW_BATCH,
                    ),
                }
            )
            bench.add(
                Row(
                    f"drain with {label}, {plural(workers, 'process')}",
                    figures["ours"],
                    figures["raw"],
                    f"{drain_worker.RAW_BATCH}-per-batch loop",
                    target=drain_worker.TARGET,
                )
            )
    from bench.harness import reset

    windows = bench.size(full=5, smoke=2)
    workers = max(bench.workers)
    rates = []
    for _ in range(bench.rounds):
        reset(RATE * (windows + 2))
        rates.append(achieved_rate(bench, workers, windows))
    bench.add(
        Row(
            f"rate limit {RATE} per {PERIOD:g} s, {plural(workers, 'process')}: achieved",
            rates,
            [RATE / PERIOD] * len(rates),
            "the limit",
            unit="claims/s",
            target=Target(at_most=1.0),
        )
    )
