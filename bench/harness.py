"""What every scenario shares: worker processes, the database reset, rounds, the result table.

A scenario times OUR path and a RAW psycopg reference doing the same work, in the same run:
the same pool of processes, the same database, rounds interleaved (ours first in one round,
the reference first in the next), and the table emptied, refilled, `VACUUM ANALYZE`d and
checkpointed before every timed run, so that neither side inherits the other's dead rows or
pays the other's checkpoint. Each figure is the median over the rounds; the ratio is the
median of the per-round ratios, with their spread.

Workers are processes, not threads: the GIL would make threads measure Python's scheduling
rather than the database, and unfairly so for the side that does more in Python.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any, TypeVar

T = TypeVar("T")

#: The queue every scenario fills and drains.
QUEUE = "bench"
#: The lease every claim takes, in seconds: longer than any run, so none expires.
TTL = 300
#: How often the parent looks at the children's counters while a run goes on.
_TICK = 0.002
#: How often a Worker's watcher publishes its count: a thread that woke every _TICK in each of
#: 8 processes took CPU from the workers it measures; the run's end is seen up to this late.
_REPORT_EVERY = 0.01


class BenchError(RuntimeError):
    """A run went wrong: a child failed, hung, or the work was not all done."""


@dataclass
class Target:
    """What a figure should reach: `ours / raw >= ratio`, `ours / raw <= at_most` (a latency
    against a reference one), or `ours < below` (latencies)."""

    ratio: float | None = None
    below: float | None = None
    at_most: float | None = None

    def describe(self, unit: str) -> str:
        if self.ratio is not None:
            return f">= {self.ratio:.2f}x"
        if self.at_most is not None:
            return f"<= {self.at_most:.2f}x"
        return f"< {self.below:g} {unit}"

    def met(self, row: Row) -> bool:
        if self.ratio is not None:
            return row.ratio >= self.ratio
        if self.at_most is not None:
            return row.ratio <= self.at_most
        assert self.below is not None
        return statistics.median(row.ours) < self.below


@dataclass
class Row:
    """One line of the result table: per-round figures of our path and of the reference."""

    scenario: str
    ours: list[float]
    raw: list[float]
    reference: str
    unit: str = "todos/s"
    target: Target | None = None
    note: str = ""

    @property
    def ratios(self) -> list[float]:
        return [mine / theirs for mine, theirs in zip(self.ours, self.raw, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def cells(self) -> list[str]:
        ratios = self.ratios
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        target = self.target.describe(self.unit) if self.target else "-"
        mark = ("PASS" if self.target.met(self) else "MISS") if self.target else ""
        return [
            self.scenario,
            _figure(statistics.median(self.ours), self.unit),
            f"{_figure(statistics.median(self.raw), self.unit)} {self.reference}",
            f"{self.ratio:.2f}{spread}",
            target,
            mark,
            self.note,
        ]


HEADER = ["scenario", "ours", "raw reference", "ours/raw (spread)", "target", "", "note"]


def _figure(value: float, unit: str) -> str:
    if unit == "todos/s":
        return f"{value:,.0f}/s"
    return f"{value:.2f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def table(rows: Iterable[Row]) -> str:
    """The rows as a Markdown table, padded to line up in a terminal too."""
    lines = [HEADER, ["---"] * len(HEADER), *(row.cells() for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(HEADER))]
    return "\n".join(
        "| "
        + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        + " |"
        for line in lines
    )


# CPU


@dataclass(frozen=True)
class Cost:
    """CPU seconds per todo of a run: PostgreSQL's processes, and the benchmark's children."""

    server: float
    client: float


def process_cpu(pid: int | str, *, children: bool = False) -> float:
    """User + system CPU seconds of process `pid` (with `children`, of its reaped children too)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:  # gone, or no /proc: counts nothing
        return 0.0
    # utime, stime, cutime, cstime are fields 14-17 of proc(5); [0] here is field 3.
    ticks = sum(int(value) for value in fields[11 : 15 if children else 13])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu() -> float:
    """CPU seconds of the local PostgreSQL so far: its live processes, and through the
    postmaster's reaped children, the backends that have exited (0 for a remote server)."""
    total = 0.0
    with contextlib.suppress(OSError):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/comm") as comm:
                    if comm.read().strip() != "postgres":
                        continue
                with open(f"/proc/{pid}/stat") as stat:
                    parent = stat.read().rpartition(")")[2].split()[1]
            except OSError:
                continue
            total += process_cpu(pid, children=not _is_postgres(parent))
    return total


def _is_postgres(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip() == "postgres"
    except OSError:
        return False


# Worker processes


class Child:
    """A worker process's side of a run: say ready, wait for the start, count commits."""

    def __init__(self, index: int, pipe: Connection, go: Event, stop: Event, counts: Any) -> None:
        self.index = index
        self._pipe = pipe
        self._go = go
        self.stop = stop
        self._counts = counts

    def start(self) -> None:
        """Report ready, then block until every child is: the clock starts when they go."""
        self._pipe.send(("ready", None))
        self._go.wait()

    def count(self, todos: int = 1) -> None:
        """Record todos whose work is committed; the run ends when the total is reached."""
        self._counts[self.index] += todos

    def set_count(self, todos: int) -> None:
        self._counts[self.index] = todos


def run_worker(
    child: Child,
    kind: str,
    handler: Callable[[Any], Any],
    *,
    queues: str | list[str] = QUEUE,
    **options: Any,
) -> int:
    """Run a real `Worker` on `queues`, `handler` registered for `kind`, until told to stop.

    A watcher thread publishes the todos it has stored as done, which is what the parent
    counts, and stops the worker when the parent has seen them all.
    """
    from switchboard_todos import handlers
    from switchboard_todos.worker import Worker

    if handlers.get_handler(kind) is None:
        handlers.handler(kind)(handler)
    worker = Worker(queues, ttl=TTL, **options)

    def report() -> None:
        while not child.stop.wait(_REPORT_EVERY):
            child.set_count(worker.stats.done)
        worker.stop()

    watcher = threading.Thread(target=report, daemon=True)
    child.start()
    watcher.start()
    stats = worker.run()
    watcher.join()
    return stats.done


def _child_main(index: int, pipe: Connection, go: Event, stop: Event, counts: Any) -> None:
    from bench.setup import configure

    configure(migrate=False)
    child = Child(index, pipe, go, stop, counts)
    while True:
        message = pipe.recv()
        if message is None:
            return
        module, name, kwargs = message
        try:
            task = getattr(importlib.import_module(module), name)
            pipe.send(("result", task(child, **kwargs)))
        except BaseException:
            pipe.send(("error", traceback.format_exc()))
        finally:
            from django.db import connections

            connections.close_all()


class Pool:
    """Worker processes, started once and reused by every run (spawned: no inherited state)."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._go = context.Event()
        self._stop = context.Event()
        self._counts = context.Array("q", size, lock=False)
        self._pipes: list[Connection] = []
        self._processes = []
        for index in range(size):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=_child_main,
                args=(index, theirs, self._go, self._stop, self._counts),
                name=f"bench-{index}",
                daemon=True,
            )
            process.start()
            self._pipes.append(mine)
            self._processes.append(process)

    @property
    def size(self) -> int:
        return len(self._processes)

    def cpu(self) -> float:
        """CPU seconds the worker processes have used so far."""
        return sum(process_cpu(process.pid) for process in self._processes if process.pid)

    def run(
        self,
        task: Callable[..., Any],
        kwargs: Sequence[dict[str, Any]],
        total: int,
        *,
        timeout: float = 600,
        during: Callable[[], None] | None = None,
        duration: float | None = None,
    ) -> tuple[float, list[Any]]:
        """Run `task(child, **kwargs[i])` on len(kwargs) processes at once.

        Returns the seconds from the start signal until the children counted `total`
        committed todos (or, with `duration`, until that many seconds passed if sooner), and
        each task's return value. `during`, if given, runs in this process once the children
        have started (the pickup scenario enqueues there).
        """
        count = len(kwargs)
        if count > self.size:
            raise BenchError(f"{count} processes wanted, the pool has {self.size}")
        self._go.clear()
        self._stop.clear()
        for index in range(self.size):
            self._counts[index] = 0
        for pipe, arguments in zip(self._pipes, kwargs, strict=False):
            pipe.send((task.__module__, task.__name__, arguments))
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        for index in range(count):
            kind, value = self._receive(index, deadline)
            if kind == "result":  # finished without starting: it had nothing to do
                results[index] = value
        started = time.monotonic()
        self._go.set()
        try:
            if during is not None:
                during()
            while sum(self._counts[:count]) < total and (
                duration is None or time.monotonic() - started < duration
            ):
                for index in range(count):
                    if index not in results and self._pipes[index].poll():
                        results[index] = self._receive(index, deadline)[1]
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{task.__name__}: {sum(self._counts[:count])} of {total} todos "
                        f"after {timeout:g}s"
                    )
                time.sleep(_TICK)
            elapsed = time.monotonic() - started
        finally:
            self._stop.set()
        for index in range(count):
            if index not in results:
                results[index] = self._receive(index, deadline)[1]
        return elapsed, [results[index] for index in range(count)]

    def _receive(self, index: int, deadline: float) -> tuple[str, Any]:
        pipe = self._pipes[index]
        while not pipe.poll(0.1):
            if not self._processes[index].is_alive():
                raise BenchError(f"worker process {index} died")
            if time.monotonic() > deadline:
                raise BenchError(f"worker process {index} did not answer")
        kind, value = pipe.recv()
        if kind == "error":
            raise BenchError(f"worker process {index} failed:\n{value}")
        return kind, value

    def close(self) -> None:
        for pipe, process in zip(self._pipes, self._processes, strict=True):
            if process.is_alive():
                with contextlib.suppress(OSError):
                    pipe.send(None)
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()


# The database


def reset(backlog: int = 0, *, queue: str = QUEUE, using: str = "default") -> None:
    """Empty `todos` of database `using` and add `backlog` pending todos, then `settle()`."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute("TRUNCATE todos")
        if backlog:
            cursor.execute(
                """
                INSERT INTO todos (queue, kind, payload, created_at, fair_at)
                SELECT %s, 'bench.noop', jsonb_build_object('n', g), at, at
                  FROM generate_series(1, %s) AS g
                 CROSS JOIN LATERAL (
                        SELECT now() - (%s - g) * interval '1 microsecond' AS at) AS created
                """,
                [queue, backlog, backlog],
            )
    settle(using)


_checkpoints = True


def settle(using: str = "default") -> None:
    """VACUUM ANALYZE `todos`, then CHECKPOINT, so that every run starts from the same state.

    Vacuuming clears the dead rows of the run before, which each claim would step over. The
    checkpoint puts every run at the same place of the checkpoint cycle: the first write to a
    page after one logs the whole page, which would otherwise fall on some runs only. It takes
    a superuser (or pg_checkpoint); without one the runs go without.
    """
    global _checkpoints
    from django.db import DatabaseError, connections

    with connections[using].cursor() as cursor:
        cursor.execute("VACUUM ANALYZE todos")
        if _checkpoints:
            try:
                cursor.execute("CHECKPOINT")
            except DatabaseError as error:
                _checkpoints = False
                print(f"(no CHECKPOINT between runs: {error})".strip(), flush=True)


def count_states(using: str = "default") -> dict[str, int]:
    """How many todos are in each state, in database `using`."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute("SELECT state, count(*) FROM todos GROUP BY state")
        return dict(cursor.fetchall())


def expect_states(expected: dict[str, int], what: str, using: str = "default") -> None:
    """Raise BenchError unless the table holds exactly `expected` (a run did all its work)."""
    found = count_states(using)
    if found != expected:
        raise BenchError(f"{what}: expected {expected}, found {found}")


# Rounds


@dataclass
class Bench:
    """What a scenario is given: the size to run at, the process pool, and the rows so far."""

    smoke: bool
    rounds: int
    pool: Pool
    workers: tuple[int, ...]
    rows: list[Row] = field(default_factory=list)
    #: Each side's CPU per todo in the rounds of the last `interleave`, for the next row.
    costs: dict[str, list[Cost]] = field(default_factory=dict)
    _cost: Cost | None = None

    def size(self, full: T, smoke: T) -> T:
        return smoke if self.smoke else full

    def interleave(self, sides: dict[str, Callable[[], T]]) -> dict[str, list[T]]:
        """Run each side once per round, the order rotating each round; per-side figures."""
        names = list(sides)
        figures: dict[str, list[T]] = {name: [] for name in names}
        self.costs = {}
        for number in range(self.rounds):
            shift = number % len(names)
            for name in names[shift:] + names[:shift]:
                self._cost = None
                figures[name].append(sides[name]())
                if self._cost is not None:
                    self.costs.setdefault(name, []).append(self._cost)
        return figures

    def drain(
        self,
        task: Callable[..., Any],
        workers: int,
        backlog: int,
        *,
        fill: Callable[[int], None] = reset,
        **kwargs: Any,
    ) -> float:
        """Fill a backlog with `fill` (`reset`, or another that settles the table too) and drain
        it with `task` in `workers` processes; todos per second."""
        fill(backlog)
        server, client = server_cpu(), self.pool.cpu()
        seconds, _ = self.pool.run(
            task, [{"owner": f"bench-{index}", **kwargs} for index in range(workers)], backlog
        )
        self._cost = Cost((server_cpu() - server) / backlog, (self.pool.cpu() - client) / backlog)
        expect_states({"done": backlog}, f"{task.__module__}.{task.__name__}")
        return backlog / seconds

    def add(self, row: Row) -> None:
        """Add a row; one of `ours` against `raw` drains says what each cost per todo."""
        ours, raw = self.costs.get("ours"), self.costs.get("raw")
        if ours and raw and not row.note and ours[0].server:
            row.note = (
                f"CPU per todo: server {_micro(ours, 'server')} vs {_micro(raw, 'server')} µs, "
                f"client {_micro(ours, 'client')} vs {_micro(raw, 'client')} µs"
            )
        self.costs = {}
        self.rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)


def _micro(costs: list[Cost], side: str) -> str:
    return f"{statistics.median(getattr(cost, side) for cost in costs) * 1e6:.0f}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 'es' if noun.endswith('s') else 's'}"
