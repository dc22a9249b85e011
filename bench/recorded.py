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

#: Row name -> ours/raw, as docs/benchmarks.md records it.
RECORDED: dict[str, float] = {}


def drops(rows: Iterable[Row]) -> list[str]:
    """A line for each row of a throughput whose ratio fell more than DROP below its record."""
    return [
        f"  {row.scenario}: {row.ratio:.2f}, recorded {RECORDED[row.scenario]:.2f}"
        for row in rows
        if row.unit == "todos/s"
        and row.scenario in RECORDED
        and row.ratio < RECORDED[row.scenario] - DROP
    ]
