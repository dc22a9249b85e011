"""The ratios recorded in docs/benchmarks.md (full size, the benchmark machine), by row.

Each run prints, before its table, the rows whose ratio fell more than `DROP` below its figure
here: in CI's smoke run too, where it fails nothing (smoke sizes are small and the machine is
shared, so a line there is a prompt to measure, not a verdict). Update a figure when
docs/benchmarks.md is refreshed; a latency's ratio (ours over the reference) is better lower,
and is left out.
"""

from __future__ import annotations

from collections.abc import Iterable

from bench.harness import Row

#: How far below its recorded figure a ratio may fall before the run says so.
DROP = 0.1

#: Row name -> ours/raw, as docs/benchmarks.md records it (the run of 2026-12-05 12:33-12:51).
RECORDED: dict[str, float] = {
    "enqueue one at a time, create_todo": 0.70,
    "enqueue in batches of 500, create_many": 0.63,
    "enqueue in batches of 500, enqueue_many": 0.66,
    "enqueue in batches of 1000, create_many": 0.59,
    "enqueue in batches of 1000, enqueue_many": 0.70,
    "drain, claim_next + complete, 1 process": 0.66,
    "drain, claim_next + complete, 4 processes": 0.56,
    "drain, claim_next + complete, 8 processes": 0.45,
    "drain, Worker with a no-op handler, 1 process": 0.90,
    "drain, Worker with a no-op handler, 4 processes": 0.93,
    "drain, Worker with a no-op handler, 8 processes": 0.85,
    "HTTP agents, claim + complete, 4 agents": 0.45,
    # MCP over HTTP on one uvicorn process, the run of 2026-12-06 09:01 (issue 36).
    "MCP agents, claim + complete, 4 agents": 0.30,
    "drain, one database, Workers on both queues, 8 processes": 0.95,
    "drain, two databases, Workers on both queues, 8 processes": 0.88,
    "hostile agent (long polls): 4 agents claim + complete": 0.96,
    "drain with a queue row that limits nothing, 1 process": 0.87,
    "drain with a queue row that limits nothing, 4 processes": 1.06,
    "drain with a queue row that limits nothing, 8 processes": 0.91,
    # After the probe of free slots (21:20), the claim's turn and taken_over skipped (23:56).
    "drain with a concurrency limit not reached, 1 process": 0.88,
    "drain with a concurrency limit not reached, 4 processes": 0.86,
    "drain with a concurrency limit not reached, 8 processes": 0.58,
}


def drops(rows: Iterable[Row]) -> list[str]:
    """A line for each row of a throughput whose ratio fell more than DROP below its record."""
    return [
        f"  {row.scenario}: {row.ratio:.2f}, recorded {RECORDED[row.scenario]:.2f}"
        for row in rows
        if row.unit == "todos/s"
        and row.scenario in RECORDED
        and row.ratio < RECORDED[row.scenario] - DROP
    ]
