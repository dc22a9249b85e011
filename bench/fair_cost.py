"""Scenario 15: the cost of fairness (issue 35), each path with fair keys against itself without.

* The Worker in 4 processes (drain_worker's, no-op handler) draining 40,000 todos spread over
  1,000 fair keys, against the same backlog without keys; both enqueued with `enqueue_many`, so
  that the turns are the ones the code gives.
* `create_todo`, `create_many` and `enqueue_many` (batches of 500) with a fair key on every todo,
  ten keys in turn, against the same without keys (enqueue's and batch_enqueue's tasks): into
  an empty table as the enqueue scenarios, then into one that holds 100,000 todos of another
  queue (1,000 in smoke mode).
* A single `claim_next` on a backlog of 1,000,000 todos of ten keys against one of 1,000,000 of
  one key (claim_scale's approach): both in the same table, as two queues, so that the rounds
  interleave on one fill. The claim reads the head of the queue's index either way: the same
  cost. 1,000 of each in smoke mode.
"""

from __future__ import annotations

from functools import partial

from bench import batch_enqueue, drain_worker, enqueue, fair_queue
from bench.claim_scale import claims_per_second
from bench.harness import Bench, Row, Target, plural, settle

#: A queue of 1,000 active keys drains at this share of the same queue without keys.
DRAIN = Target(ratio=0.8)
#: Ten keys' claim against one key's, on the same backlog: the same cost.
CLAIM = Target(ratio=0.9)
WORKERS = 4
DRAIN_KEYS = 1000
CREATE_KEYS = 10
BATCH = 500

#: `size` todos of queue `queue` over `keys` fair keys, with the turns `enqueue_many` gives a
#: backlog enqueued round the keys: each key's todos one millisecond apart.
FILL_KEYED = """
INSERT INTO todos (queue, kind, fair_key, fair_at)
SELECT %(queue)s, 'bench', 'key-' || g %% %(keys)s, now() + (g / %(keys)s) * interval '1 ms'
  FROM generate_series(0, %(size)s - 1) AS g
"""


def drains(bench: Bench) -> None:
    backlog = bench.size(full=40_000, smoke=1000)
    workers = min(WORKERS, bench.pool.size)
    figures = bench.interleave(
        {
            name: partial(
                bench.drain,
                drain_worker.ours,
                workers,
                backlog,
                fill=partial(fair_queue.fill, keys=keys),
            )
            for name, keys in (("ours", DRAIN_KEYS), ("raw", 0))
        }
    )
    bench.add(
        Row(
            f"drain, Worker, {backlog:,} todos of {DRAIN_KEYS:,} fair keys, "
            f"{plural(workers, 'process')}",
            figures["ours"],
            figures["raw"],
            "without keys",
            target=DRAIN,
        )
    )


def creates(bench: Bench, ballast: int) -> None:
    """Each create path with a fair key against without; with `ballast`, into a table that
    already holds that many todos of another queue, so that the generic plans prepared on the
    first create are those of a table with rows (on an empty one, the probes of a todo's turn
    are planned as scans of the table)."""
    beside = f" beside {ballast:,} todos of another queue" if ballast else ""
    count = bench.size(full=3000, smoke=50)
    figures = bench.interleave(
        {
            name: partial(enqueue.enqueue, bench, enqueue.ours, count, ballast=ballast, keys=keys)
            for name, keys in (("keyed", CREATE_KEYS), ("plain", 0))
        }
    )
    rows = [("create_todo, one at a time", figures)]
    count = bench.size(full=40_000, smoke=1000)
    for method, task in (
        ("create_many", batch_enqueue.ours),
        ("enqueue_many", batch_enqueue.ours_copy),
    ):
        figures = bench.interleave(
            {
                name: partial(
                    batch_enqueue.enqueue, bench, task, count, BATCH, ballast=ballast, keys=keys
                )
                for name, keys in (("keyed", CREATE_KEYS), ("plain", 0))
            }
        )
        rows.append((f"{method}, batches of {BATCH}", figures))
    for what, figures in rows:
        bench.add(
            Row(
                f"enqueue with a fair key ({CREATE_KEYS} keys){beside}, {what}",
                figures["keyed"],
                figures["plain"],
                "without keys",
                note="the cost of each todo's turn (fair_turn)",
            )
        )


def claim(queue: str) -> object:
    from switchboard_todos.models import Todo

    return Todo.objects.claim_next(queue, "ours", 60)


def claims(bench: Bench) -> None:
    from django.db import connection

    size = bench.size(full=1_000_000, smoke=1000)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos")
        for queue, keys in (("one-key", 1), ("ten-keys", 10)):
            cursor.execute(FILL_KEYED, {"queue": queue, "keys": keys, "size": size})
    settle()
    count = bench.size(full=500, smoke=20)
    figures = bench.interleave(
        {
            queue: partial(claims_per_second, partial(claim, queue), count)
            for queue in ("ten-keys", "one-key")
        }
    )
    bench.add(
        Row(
            f"claim one todo, {size:,} pending of 10 fair keys",
            figures["ten-keys"],
            figures["one-key"],
            "of 1 fair key",
            unit="claims/s",
            target=CLAIM,
            note="the claim reads the head of the queue's index either way",
        )
    )


def run(bench: Bench) -> None:
    drains(bench)
    creates(bench, 0)
    creates(bench, bench.size(full=100_000, smoke=1000))
    claims(bench)
