"""Scenario 14: a noisy tenant's backlog and ten quiet tenants, drained by the Worker (issue 35).

One fair key has a backlog of 50,000 todos; meanwhile this process enqueues for ten quiet keys,
one todo every 50 ms each with `create_todo`, and Workers in 4 processes (drain_worker's,
no-op handler) drain the queue. The figures come from the database: a quiet todo's dwell is its
`claimed_at - created_at`, over the quiet todos created while the backlog lasted (before its
last claim); the noisy key's throughput is its todos claimed per second while the quiet keys
enqueue (the first quiet create to the last, cut at the noisy key's last claim).

Five runs a round, their order rotating: `fair` (the keyed backlog and the quiet keys),
`quiet` (the quiet keys alone: their dwell's reference), `alone` (the keyed backlog alone, the
same wait in place of the creates: the noisy key's reference), `aside` (the keyed backlog, the
quiet todos created in a queue no Worker serves: what the creates cost the noisy key by
sharing the machine, not the queue), and `fifo` (the same backlog and creates without any fair
key: the contrast, the quiet todos queue behind the backlog).

Beside the dwell, each run notes how long each quiet create took as this process saw it (its
round trip, `time.perf_counter`): the dwell begins when the create's statement begins, and on
a machine the drain keeps busy the create itself is slower, before any claim can see it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench import drain_worker
from bench.enqueue import fair_key
from bench.harness import QUEUE, Bench, BenchError, Row, Target, expect_states, plural, settle

#: A quiet key's dwell beside the backlog, against its dwell with the quiet keys alone.
DWELL = Target(at_most=2.0)
#: The noisy key's throughput beside the quiet keys, against its throughput alone.
NOISY = Target(ratio=0.9)
WORKERS = 4
#: The queue no Worker serves: `aside` sends the quiet todos there.
ASIDE = "bench-aside"
QUIET_KEYS = 10

DWELLS = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY claimed_at - created_at),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY claimed_at - created_at)
  FROM todos
 WHERE payload ? 'quiet'
   AND created_at <= (SELECT coalesce(max(claimed_at), 'infinity') FROM todos
                       WHERE NOT payload ? 'quiet')
"""
#: The noisy todos claimed in the window, and the window cut at the last of them.
NOISY_CLAIMS = """
SELECT count(*) FILTER (WHERE claimed_at BETWEEN %(start)s AND %(end)s),
       extract(epoch FROM least(%(end)s, max(claimed_at)) - %(start)s)
  FROM todos
 WHERE NOT payload ? 'quiet'
"""


@dataclass
class Outcome:
    """One run's figures: the quiet todos' dwell (ms) and the noisy key's claims per second."""

    p50: float = 0.0
    p99: float = 0.0
    noisy: float = 0.0
    #: The median of the quiet creates' round trips, in ms.
    create: float = 0.0


def fill(backlog: int, keys: int) -> None:
    """Empty `todos`, then enqueue `backlog` todos round `keys` fair keys (none for 0) with
    `enqueue_many`, as an import would (so that their turns are the ones the code gives), and
    settle."""
    from django.db import connection

    from switchboard_todos.models import Todo

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos")
    for first in range(0, backlog, 5000):
        Todo.objects.enqueue_many(
            {
                "queue": QUEUE,
                "kind": "bench.noop",
                "payload": {"n": n},
                "fair_key": fair_key(n, keys),
            }
            for n in range(first, min(first + 5000, backlog))
        )
    settle()


def now() -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def produce(
    warm_up: float, schedule: list[float], keyed: bool, into: str | None, window: dict[str, Any]
) -> None:
    """After `warm_up` seconds (the Workers are up and claiming by then), create a quiet todo in
    queue `into` at each of `schedule`'s offsets (seconds), round the quiet keys; without a
    queue, only wait as long. `window` gets the database's time at both ends, and under
    "creates" each create's round trip in ms."""
    from switchboard_todos.models import Todo

    time.sleep(warm_up)
    window["start"] = now()
    window["creates"] = creates = []
    began = time.monotonic()
    for number, offset in enumerate(schedule):
        time.sleep(max(0.0, began + offset - time.monotonic()))
        if into is not None:
            key = number % QUIET_KEYS
            sent = time.perf_counter()
            Todo.objects.create_todo(
                queue=into,
                kind="bench.noop",
                payload={"quiet": key},
                fair_key=f"quiet-{key}" if keyed else None,
            )
            creates.append((time.perf_counter() - sent) * 1000)
    window["end"] = now()


def one_run(
    bench: Bench, backlog: int, schedule: list[float], *, keyed: bool, into: str | None
) -> Outcome:
    from django.db import connection

    fill(backlog, 1 if keyed else 0)
    quiet = len(schedule) if into == QUEUE else 0
    aside = len(schedule) if into == ASIDE else 0
    window: dict[str, Any] = {}
    workers = min(WORKERS, bench.pool.size)
    bench.pool.run(
        drain_worker.ours,
        [{"owner": f"bench-{index}"} for index in range(workers)],
        backlog + quiet,
        during=partial(produce, bench.size(0.3, 0.0), schedule, keyed, into, window),
    )
    expect_states({"done": backlog + quiet, **({"pending": aside} if aside else {})}, "fair_queue")
    outcome = Outcome()
    with connection.cursor() as cursor:
        if quiet:
            cursor.execute(DWELLS)
            p50, p99_ = cursor.fetchone()
            if p50 is None:
                raise BenchError("fair_queue: the backlog was gone before the first quiet todo")
            outcome.p50, outcome.p99 = p50.total_seconds() * 1000, p99_.total_seconds() * 1000
            outcome.create = statistics.median(window["creates"])
        if backlog:
            cursor.execute(NOISY_CLAIMS, window)
            claims, seconds = cursor.fetchone()
            outcome.noisy = claims / float(seconds)
    return outcome


def run(bench: Bench) -> None:
    backlog = bench.size(full=50_000, smoke=5000)
    # One todo every 50 ms per quiet key for 2.5 s (smoke: every 30 ms for 0.3 s), within the
    # few seconds the backlog lasts.
    count, gap = bench.size(full=(500, 0.005), smoke=(100, 0.003))
    schedule = [number * gap for number in range(count)]
    runs = {
        "fair": partial(one_run, bench, backlog, schedule, keyed=True, into=QUEUE),
        "quiet": partial(one_run, bench, 0, schedule, keyed=True, into=QUEUE),
        "alone": partial(one_run, bench, backlog, schedule, keyed=True, into=None),
        "aside": partial(one_run, bench, backlog, schedule, keyed=True, into=ASIDE),
        "fifo": partial(one_run, bench, backlog, schedule, keyed=False, into=QUEUE),
    }
    outcomes: dict[str, list[Outcome]] = {name: [] for name in runs}

    def side(name: str) -> float:
        outcomes[name].append(runs[name]())
        return 0.0

    bench.interleave({name: partial(side, name) for name in runs})
    workers = min(WORKERS, bench.pool.size)
    note = (
        f"{QUIET_KEYS} quiet keys, {count // QUIET_KEYS} todos each, "
        f"{gap * QUIET_KEYS * 1000:.0f} ms apart; {plural(workers, 'process')}"
    )
    for name, what, target in (
        ("fair", f"fair queue, quiet keys' dwell beside {backlog:,} todos of one key", DWELL),
        ("fifo", f"FIFO (no keys), quiet todos' dwell beside {backlog:,} todos", None),
    ):
        for statistic in ("p50", "p99"):
            bench.add(
                Row(
                    f"{what}, {statistic}",
                    [getattr(outcome, statistic) for outcome in outcomes[name]],
                    [getattr(outcome, statistic) for outcome in outcomes["quiet"]],
                    "quiet keys alone",
                    unit="ms",
                    target=target,
                    note=note,
                )
            )
    bench.add(
        Row(
            f"fair queue, a quiet create's round trip beside {backlog:,} todos of one key, p50",
            [outcome.create for outcome in outcomes["fair"]],
            [outcome.create for outcome in outcomes["quiet"]],
            "quiet keys alone",
            unit="ms",
            note=f"the part of the dwell before any claim can see the todo; {note}",
        )
    )
    bench.add(
        Row(
            f"fair queue, the noisy key's {backlog:,} todos beside the quiet keys",
            [outcome.noisy for outcome in outcomes["fair"]],
            [outcome.noisy for outcome in outcomes["alone"]],
            "the noisy key alone",
            target=NOISY,
            note=f"claims per second while the quiet keys enqueue; {note}",
        )
    )
    bench.add(
        Row(
            f"the noisy key's {backlog:,} todos, the quiet keys enqueuing to another queue",
            [outcome.noisy for outcome in outcomes["aside"]],
            [outcome.noisy for outcome in outcomes["alone"]],
            "the noisy key alone",
            note="the creating process's share of the machine, without the fair queue; " + note,
        )
    )
