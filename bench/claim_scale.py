"""Claim cost against backlog size: ours (one index scan per queue) vs the naive ANY() form.

    python -m bench.claim_scale [--sizes 10000 1000000] [--claims 500]

For each backlog size, fills `todos` with that many pending todos spread over three queues,
then times single claims for one queue and for three, and the same claim written as
`queue = ANY(...) ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED`. Prints ms per claim;
the point is that ours stays flat as the backlog grows.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.setup import configure

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
        cursor.execute("TRUNCATE todos CASCADE")
        cursor.execute(
            """
            INSERT INTO todos (queue, kind, created_at)
            SELECT (ARRAY['a', 'b', 'c'])[1 + g %% 3], 'bench', now() - g * interval '1 ms'
              FROM generate_series(1, %s) AS g
            """,
            [size],
        )
        cursor.execute("VACUUM ANALYZE todos")


def per_claim_ms(claim: Callable[[], object], claims: int) -> float:
    started = time.perf_counter()
    for _ in range(claims):
        claim()
    return (time.perf_counter() - started) / claims * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--claims", type=int, default=500)
    options = parser.parse_args()
    configure()
    from django.db import connection

    from switchboard_todos.models import Todo

    def ours(queues: list[str]) -> Callable[[], object]:
        return lambda: Todo.objects.claim_next(queues, "ours", 60)

    def naive(queues: list[str]) -> Callable[[], object]:
        def claim() -> object:
            with connection.cursor() as cursor:
                cursor.execute(NAIVE_CLAIM, {"owner": "naive", "queues": queues})
                return cursor.fetchone()

        return claim

    print(f"{'pending':>10} {'queues':>6} {'ours ms':>8} {'ANY() ms':>9}")
    for size in options.sizes:
        fill(size)
        for queues in (["a"], ["a", "b", "c"]):
            fast = per_claim_ms(ours(queues), options.claims)
            slow = per_claim_ms(naive(queues), max(1, options.claims // 10))
            print(f"{size:>10,} {len(queues):>6} {fast:>8.3f} {slow:>9.3f}")


if __name__ == "__main__":
    main()
