"""Scenario 4: drain a backlog through the real `Worker`, with a handler that does nothing.

The reference is the raw 50-per-batch claim loop: claim 50 todos with SKIP LOCKED, call the
no-op handler on each, complete them in one statement. Both run in 1, 4 and 8 processes;
each of ours is a `Worker` with one runner thread and its default batching.
"""

from __future__ import annotations

from functools import partial

from bench import raw
from bench.harness import Bench, Child, Row, Target, plural, run_worker

#: The worker should reach this share of the raw 50-per-batch loop's rate, with priorities,
#: concurrency keys, low-water marks, limits and dependencies all in the claim (issue 28).
TARGET = Target(ratio=0.85)
RAW_BATCH = 50


def noop(todo: object) -> None:
    """The handler of `bench.noop` todos."""


def ours(child: Child, *, owner: str) -> int:
    """Run a Worker on the queue until the parent has seen every todo done."""
    return run_worker(child, "bench.noop", noop, owner=owner)


def run(bench: Bench) -> None:
    backlog = bench.size(full=30_000, smoke=300)
    for workers in bench.workers:
        figures = bench.interleave(
            {
                "ours": partial(bench.drain, ours, workers, backlog),
                "raw": partial(bench.drain, raw.drain, workers, backlog, batch=RAW_BATCH),
            }
        )
        bench.add(
            Row(
                f"drain, Worker with a no-op handler, {plural(workers, 'process')}",
                figures["ours"],
                figures["raw"],
                f"{RAW_BATCH}-per-batch loop",
                target=TARGET,
            )
        )
