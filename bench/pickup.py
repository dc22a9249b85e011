"""Scenario 5: pickup latency, from the enqueueing commit to the handler starting.

One idle consumer process; this process enqueues one todo at a time, at random intervals,
and notes when each enqueue returned (its transaction had committed). Ours is a `Worker`
whose handler returns the time it started, enqueued with `create_todo`; the reference a raw
psycopg loop that notes when its claim returned, fed by a raw INSERT that notifies in the
same statement. Both wake on NOTIFY, or, polling, look again 50 ms after they last found
work, then twice as long each time up to 1 s (`--no-listen`). The clock is CLOCK_MONOTONIC,
which every process on the machine shares.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial

from bench import raw
from bench.harness import QUEUE, TTL, Bench, Child, Row, Target, reset, run_worker

#: A todo enqueued while the worker waits should start within this, in milliseconds.
TARGET = Target(below=10.0)
#: The reference's channel (ours notifies on `switchboard_todos`).
CHANNEL = "bench_pickup"
RAW_ENQUEUE = """
WITH inserted AS (
    INSERT INTO todos (queue, kind) VALUES (%s, 'bench.pickup') RETURNING id
)
SELECT id, pg_notify(%s, %s) FROM inserted
"""
POLL_MIN, POLL_MAX = 0.05, 1.0
#: How often the reference's LISTEN loop looks up to see whether to stop.
TICK = 0.25


def started(todo: object) -> float:
    """The handler of `bench.pickup` todos: when it started."""
    return time.monotonic()


def ours(child: Child, *, listen: bool) -> int:
    """Run a Worker until the parent has seen every todo done."""
    return run_worker(child, "bench.pickup", started, owner="bench-pickup", listen=listen)


def reference(child: Child, *, listen: bool) -> dict[str, float]:
    """Claim each todo as soon as a notification (or a poll) finds it; when each claim returned."""
    params = {"queue": QUEUE, "limit": 1, "owner": "raw-pickup", "ttl": timedelta(seconds=TTL)}
    claimed: dict[str, float] = {}
    pause = POLL_MIN
    with raw.connect() as connection, connection.cursor() as cursor:
        if listen:
            cursor.execute(f"LISTEN {CHANNEL}")
        child.start()
        while not child.stop.is_set():
            row = cursor.execute(raw.CLAIM, params).fetchone()
            if row is not None:
                todo_id = row[raw.column(cursor, "id")]
                claimed[todo_id] = time.monotonic()
                cursor.execute(raw.COMPLETE, {"id": todo_id, "owner": "raw-pickup"})
                child.count()
                pause = POLL_MIN
            elif listen:
                for _ in connection.notifies(timeout=TICK, stop_after=1):
                    pass
            else:
                child.stop.wait(pause)
                pause = min(pause * 2, POLL_MAX)
    return claimed


def enqueue_ours(settle: float, gaps: list[float], enqueued: dict[str, float]) -> None:
    from switchboard_todos.models import Todo

    time.sleep(settle)
    for gap in gaps:
        todo, _ = Todo.objects.create_todo(queue=QUEUE, kind="bench.pickup")
        enqueued[todo.id] = time.monotonic()
        time.sleep(gap)


def enqueue_raw(settle: float, gaps: list[float], enqueued: dict[str, float]) -> None:
    with raw.connect() as connection, connection.cursor() as cursor:
        time.sleep(settle)
        for gap in gaps:
            row = cursor.execute(RAW_ENQUEUE, (QUEUE, CHANNEL, QUEUE)).fetchone()
            assert row is not None
            enqueued[row[0]] = time.monotonic()
            time.sleep(gap)


def latencies(bench: Bench, side: str, listen: bool, gaps: list[float]) -> list[float]:
    """Enqueue one todo per gap; the pickup latency of each, in milliseconds."""
    from switchboard_todos.models import Todo

    reset()
    enqueued: dict[str, float] = {}
    picked: dict[str, float]
    settle = bench.size(full=0.5, smoke=0.2)  # the consumer is up and idle by then
    if side == "ours":
        during = partial(enqueue_ours, settle, gaps, enqueued)
        bench.pool.run(ours, [{"listen": listen}], len(gaps), during=during)
        results = Todo.objects.filter(id__in=enqueued).values_list("id", "result")
        picked = {todo_id: result for todo_id, result in results if result is not None}
    else:
        during = partial(enqueue_raw, settle, gaps, enqueued)
        _, (picked,) = bench.pool.run(reference, [{"listen": listen}], len(gaps), during=during)
    return [(picked[todo_id] - at) * 1000 for todo_id, at in enqueued.items()]


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def measure(bench: Bench, listen: bool, count: int, low: float, high: float) -> None:
    rng = random.Random(4)
    gaps = [rng.uniform(low, high) for _ in range(count)]
    rounds: dict[str, list[list[float]]] = {"ours": [], "raw": []}

    def side(name: str) -> float:
        rounds[name].append(latencies(bench, name, listen, gaps))
        return 0.0

    bench.interleave({name: partial(side, name) for name in rounds})
    how = "LISTEN/NOTIFY" if listen else "polling"
    statistic: Callable[[list[float]], float]
    for statistic, name in ((statistics.median, "median"), (p99, "p99")):
        bench.add(
            Row(
                f"pickup latency {name}, {how}",
                [statistic(samples) for samples in rounds["ours"]],
                [statistic(samples) for samples in rounds["raw"]],
                "LISTEN loop" if listen else "polling loop",
                unit="ms",
                target=TARGET if listen and name == "median" else None,
                note=f"{count} todos a round, {low * 1000:.0f}-{high * 1000:.0f} ms apart",
            )
        )


def run(bench: Bench) -> None:
    measure(bench, True, bench.size(full=100, smoke=10), 0.02, 0.06)
    measure(bench, False, bench.size(full=40, smoke=5), 0.1, 0.3)
