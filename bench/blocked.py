"""Scenario: the claim scenarios with 100,000 blocked todos in the queue (docs/dependencies.md).

A todo blocked by others is pending but not claimable: it sits at the far end of
idx_todos_scheduled, where no claim's scan of due todos reaches, so it should cost a claim
nothing. Each drain of scenarios 3 and 4 runs again here with 100,000 such todos (children of
one parent that is never completed) in the drained queue; the raw reference runs beside it as
always (its claim reads only ready todos, so the blocked ones cost it nothing either). Compare
each row's ratio with its scenario's own row of the same run: the target is within 0.05.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from bench import drain_single, drain_worker, raw
from bench.harness import QUEUE, Bench, Row, Target, expect_states, plural, reset, settle

#: The scenarios' own targets: blocked todos should change nothing.
TARGETS = {"single": drain_single.TARGET, "worker": drain_worker.TARGET}


def add_blocked(count: int) -> None:
    """`count` todos of the drained queue blocked by a parent that never completes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH parent AS (
                INSERT INTO todos (queue, kind, state, owner, lease_expires_at, attempt)
                VALUES ('bench-parents', 'bench.parent', 'claimed', 'nobody',
                        now() + interval '1 day', 1)
                RETURNING id
            )
            INSERT INTO todos (queue, kind, parents, waiting_for, next_retry_at)
            SELECT %s, 'bench.child', ARRAY[parent.id], 1, '9999-01-01 00:00:00+00'
              FROM parent, generate_series(1, %s)
            """,
            [QUEUE, count],
        )
    settle()


def drain_with_blocked(
    bench: Bench, task: Any, workers: int, backlog: int, blocked: int, **kwargs: Any
) -> float:
    """`Bench.drain`, with `blocked` todos in the queue all along."""
    reset(backlog)
    add_blocked(blocked)
    seconds, _ = bench.pool.run(
        task, [{"owner": f"bench-{index}", **kwargs} for index in range(workers)], backlog
    )
    expect_states(
        {"done": backlog, "pending": blocked, "claimed": 1}, f"{task.__module__}.{task.__name__}"
    )
    return backlog / seconds


def run(bench: Bench) -> None:
    blocked = bench.size(full=100_000, smoke=1_000)
    sides = {
        "single": (drain_single.ours, 1, bench.size(full=4000, smoke=60), "claim + complete"),
        "worker": (
            drain_worker.ours,
            drain_worker.RAW_BATCH,
            bench.size(full=30_000, smoke=300),
            f"{drain_worker.RAW_BATCH}-per-batch loop",
        ),
    }
    for name, (ours, batch, backlog, reference) in sides.items():
        for workers in bench.workers:
            figures = bench.interleave(
                {
                    "ours": partial(drain_with_blocked, bench, ours, workers, backlog, blocked),
                    "raw": partial(
                        drain_with_blocked,
                        bench,
                        raw.drain,
                        workers,
                        backlog,
                        blocked,
                        batch=batch,
                    ),
                }
            )
            target: Target = TARGETS[name]
            bench.add(
                Row(
                    f"drain ({name}) with {blocked:,} blocked todos, {plural(workers, 'process')}",
                    figures["ours"],
                    figures["raw"],
                    reference,
                    target=target,
                )
            )
