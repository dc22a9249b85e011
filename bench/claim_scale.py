"""Scenario 6: claim cost against backlog size, ours vs the naive ANY() form.

For each backlog size, fills `todos` with that many pending todos spread over three queues,
then times single claims for one queue and for three: ours (one index scan per queue, which
stops at the first unlocked row) and the same claim written as `queue = ANY(...) ORDER BY
created_at LIMIT 1 FOR UPDATE SKIP LOCKED`, which sorts the whole backlog of those queues.
The point is that ours stays flat as the backlog grows. The 1M backlog runs in full mode only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from bench.harness import Bench, Row, plural, settle

NAIVE_CLAIM = """
UPDATE todos
   SET state = 'claimed', owner = %(owner)s, lease_expires_at = now() + interval '60 seconds',
       attempt = attempt + 1, claimed_at = now(), updated_at = now()
 WHERE id = (SELECT id FROM todos
              WHERE state = 'pending' AND queue = ANY(%(queues)s::text[])
                AND (next_retry_at IS NULL OR next_retry_at <= now())
              ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""


def fill(size: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos")
        cursor.execute(
            """
            INSERT INTO todos (queue, kind, created_at)
            SELECT (ARRAY['a', 'b', 'c'])[1 + g %% 3], 'bench', now() - g * interval '1 ms'
              FROM generate_series(1, %s) AS g
            """,
            [size],
        )
    settle()


def claims_per_second(claim: Callable[[], object], claims: int) -> float:
    started = time.perf_counter()
    for _ in range(claims):
        claim()
    return claims / (time.perf_counter() - started)


def ours(queues: list[str]) -> object:
    from switchboard_todos.models import Todo

    return Todo.objects.claim_next(queues, "ours", 60)


def naive(queues: list[str]) -> object:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(NAIVE_CLAIM, {"owner": "naive", "queues": queues})
        return cursor.fetchone()


def run(bench: Bench) -> None:
    sizes = [1000] if bench.smoke else [10_000, 1_000_000]
    claims = bench.size(full=500, smoke=20)
    for size in sizes:
        fill(size)
        # The naive claim sorts the backlog each time: fewer of them at the same precision.
        slow_claims = max(3, claims // (10 if size < 100_000 else 50))
        for queues in (["a"], ["a", "b", "c"]):
            figures = bench.interleave(
                {
                    "ours": partial(claims_per_second, partial(ours, queues), claims),
                    "naive": partial(claims_per_second, partial(naive, queues), slow_claims),
                }
            )
            bench.add(
                Row(
                    f"claim one todo, {size:,} pending, {plural(len(queues), 'queue')}",
                    figures["ours"],
                    figures["naive"],
                    "ANY() + ORDER BY",
                    unit="claims/s",
                    note="ours is one index scan per queue; ANY() sorts the backlog",
                )
            )
