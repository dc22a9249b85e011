"""Sustained load while another session holds back vacuum: `python -m bench.held_snapshot`.

The scenario of docs/operating.md, section 9: a producer enqueues at a steady rate into two
queues, worker processes (the real `Worker`, LISTEN on) drain them, and one `REPEATABLE READ`
transaction elsewhere holds its snapshot for minutes, so that vacuum can remove no dead row
version. It runs twice, without and with the snapshot, and prints side by side the workers'
claim latency (each `claim_batch` call, timed in the worker), the end-to-end lag from enqueue
to claim (both the database's clock), the dead rows and the sizes of the table and of its
claim index, then the sizes over time, to show how they come back once the snapshot ends.

Run by hand; it takes two runs of `--minutes` (default 5). `--smoke` runs a 20-second version.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from typing import Any

import psycopg

from bench.setup import configure, database_url

QUEUES = ["bench-a", "bench-b"]
KIND = "bench.noop"
#: The producer cycles through these priorities (--priorities), so claims rank across them.
PRIORITIES = (-10, 0, 10)
#: The producer enqueues one batch per tick.
TICK = 0.05
#: With autovacuum off on the server (test servers often have it so), the benchmark vacuums
#: the table this often itself, as autovacuum would under this load.
VACUUM_EVERY = 10.0


@dataclass
class Phase:
    """What one run measured; `window` is when the snapshot was held (or would have been)."""

    name: str
    window: tuple[float, float] = (0.0, 0.0)
    claims: list[tuple[float, float]] = field(default_factory=list)  # (wall time, seconds)
    lag: tuple[float, float] = (0.0, 0.0)  # p50, p99 in seconds, enqueued within the window
    samples: list[tuple[float, int, int, int]] = field(
        default_factory=list
    )  # t, table, index, dead

    def claim_times(self) -> list[float]:
        start, end = self.window
        return [seconds for at, seconds in self.claims if start <= at <= end]


def noop(todo: object) -> None:
    """The handler of the scenario's todos."""


def work(stop: Event, results: Any, index: int) -> None:
    """A worker process: the real Worker, its claims timed; sends (index, timings) at the end."""
    configure(migrate=False)
    from switchboard_todos import handlers
    from switchboard_todos.models import Todo
    from switchboard_todos.worker import Worker

    handlers.handler(KIND)(noop)
    timings: list[tuple[float, float]] = []
    claim_batch = Todo.objects.claim_batch

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return claim_batch(*args, **kwargs)
        finally:
            timings.append((time.time(), time.perf_counter() - started))

    Todo.objects.claim_batch = timed  # type: ignore[method-assign]
    worker = Worker(QUEUES, ttl=60, owner=f"bench-{index}")

    def stop_when_told() -> None:
        stop.wait()
        worker.stop()

    threading.Thread(target=stop_when_told, daemon=True).start()
    worker.run()
    results.put((index, timings))


def produce(stop: Event, rate: float, priorities: tuple[int, ...]) -> None:
    """Enqueue `rate` todos a second, alternating queues and priorities, until `stop`."""
    configure(migrate=False)
    from switchboard_todos.models import Todo

    per_tick = max(1, round(rate * TICK))
    due = time.monotonic()
    count = 0
    while not stop.is_set():
        Todo.objects.create_many(
            [
                {
                    "queue": QUEUES[(count + n) % len(QUEUES)],
                    "kind": KIND,
                    "priority": priorities[(count + n) // len(QUEUES) % len(priorities)],
                }
                for n in range(per_tick)
            ]
        )
        count += per_tick
        due += TICK
        stop.wait(max(0.0, due - time.monotonic()))


def vacuum_while(url: str, finished: threading.Event) -> None:
    """Stand in for autovacuum when the server has it off: VACUUM every VACUUM_EVERY seconds."""
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute("SELECT current_setting('autovacuum')").fetchone()
        if row is not None and row[0] == "on":
            return
        while not finished.wait(VACUUM_EVERY):
            connection.execute("VACUUM todos")


def sizes(connection: psycopg.Connection[Any]) -> tuple[int, int, int]:
    row = connection.execute(
        "SELECT pg_relation_size('todos'), pg_relation_size('idx_todos_pending'), n_dead_tup "
        "FROM pg_stat_user_tables WHERE relname = 'todos'"
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def run_phase(
    name: str,
    *,
    seconds: float,
    rate: float,
    priorities: tuple[int, ...],
    workers: int,
    window: tuple[float, float],
    hold: bool,
) -> Phase:
    """One run; `window` is (start, length) in seconds of the snapshot, held if `hold`."""
    url = database_url()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("TRUNCATE todos CASCADE")
        admin.execute("VACUUM ANALYZE todos")
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    children = [context.Process(target=work, args=(stop, results, n)) for n in range(workers)]
    children.append(context.Process(target=produce, args=(stop, rate, priorities)))
    for child in children:
        child.start()
    begin = time.time()
    start, length = window
    phase = Phase(name, window=(begin + start, begin + start + length))
    holder = psycopg.connect(url)
    finished = threading.Event()
    vacuum = threading.Thread(target=vacuum_while, args=(url, finished), daemon=True)
    vacuum.start()
    with psycopg.connect(url, autocommit=True) as sampler:
        held = False
        while (now := time.time()) < begin + seconds:
            if hold and not held and phase.window[0] <= now < phase.window[1]:
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM todos")  # the snapshot is taken here
                held = True
            if held and now >= phase.window[1]:
                holder.commit()
                held = False
            phase.samples.append((now - begin, *sizes(sampler)))
            time.sleep(min(5.0, seconds / 20))
        if held:
            holder.commit()
    holder.close()
    finished.set()
    vacuum.join()
    stop.set()
    for _ in range(workers):
        _, timings = results.get(timeout=120)
        phase.claims.extend(timings)
    for child in children:
        child.join(60)
    with psycopg.connect(url) as reader:
        row = reader.execute(
            "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP ("
            "ORDER BY extract(epoch FROM claimed_at - created_at)) FROM todos "
            "WHERE claimed_at IS NOT NULL AND created_at BETWEEN to_timestamp(%s) "
            "AND to_timestamp(%s)",
            list(phase.window),
        ).fetchone()
    assert row is not None and row[0] is not None, "nothing was claimed"
    phase.lag = (row[0][0], row[0][1])
    return phase


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def report(free: Phase, held: Phase, hold: tuple[float, float]) -> str:
    def row(figure: str, a: float, b: float, unit: str) -> str:
        ratio = b / a if a else float("nan")
        digits = 2 if unit else 0
        return f"| {figure} | {a:,.{digits}f} {unit} | {b:,.{digits}f} {unit} | {ratio:.2f}x |"

    free_claims, held_claims = free.claim_times(), held.claim_times()
    lines = [
        f"| figure | no snapshot | snapshot held {hold[1]:.0f} s | held / free |",
        "| --- | --- | --- | --- |",
        row("claim median", statistics.median(free_claims) * 1e3,
            statistics.median(held_claims) * 1e3, "ms"),
        row("claim p99", percentile(free_claims, 0.99) * 1e3,
            percentile(held_claims, 0.99) * 1e3, "ms"),
        row("lag p50 (enqueue to claim)", free.lag[0] * 1e3, held.lag[0] * 1e3, "ms"),
        row("lag p99", free.lag[1] * 1e3, held.lag[1] * 1e3, "ms"),
        row("dead rows, most", max(s[3] for s in free.samples),
            max(s[3] for s in held.samples), ""),
        row("table size, most", max(s[1] for s in free.samples) / 2**20,
            max(s[1] for s in held.samples) / 2**20, "MiB"),
        row("idx_todos_pending size, most", max(s[2] for s in free.samples) / 2**20,
            max(s[2] for s in held.samples) / 2**20, "MiB"),
        "",
        f"claims timed: {len(free_claims):,} without the snapshot, {len(held_claims):,} with it",
        "",
        f"sizes over the run with the snapshot (held from {hold[0]:.0f} s "
        f"to {hold[0] + hold[1]:.0f} s):",
        "| t (s) | table (MiB) | idx_todos_pending (MiB) | dead rows |",
        "| --- | --- | --- | --- |",
    ]  # fmt: skip
    lines += [
        f"| {t:.0f} | {table / 2**20:.1f} | {index / 2**20:.2f} | {dead:,} |"
        for t, table, index, dead in held.samples
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.held_snapshot", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="length of each run")
    parser.add_argument("--rate", type=float, default=200.0, help="todos enqueued a second")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument("--hold-from", type=float, default=1.0, help="minute the snapshot begins")
    parser.add_argument("--hold-for", type=float, default=3.0, help="minutes it is held")
    parser.add_argument(
        "--priorities",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=PRIORITIES,
        help="comma-separated priorities the producer cycles through (default -10,0,10)",
    )
    parser.add_argument("--smoke", action="store_true", help="a 20-second run of each")
    options = parser.parse_args(argv)
    configure()
    seconds = 20.0 if options.smoke else options.minutes * 60
    scale = seconds / (options.minutes * 60)
    hold = (options.hold_from * 60 * scale, options.hold_for * 60 * scale)
    common = {
        "seconds": seconds,
        "rate": options.rate,
        "priorities": options.priorities,
        "workers": options.workers,
    }
    free = run_phase("no snapshot", window=hold, hold=False, **common)
    held = run_phase("snapshot held", window=hold, hold=True, **common)
    with psycopg.connect(database_url()) as connection:
        row = connection.execute("SELECT current_setting('autovacuum')").fetchone()
    vacuum = "autovacuum" if row and row[0] == "on" else f"VACUUM every {VACUUM_EVERY:g} s"
    print(
        f"{options.rate:g} todos/s into {len(QUEUES)} queues at priorities "
        f"{', '.join(map(str, options.priorities))}, {options.workers} worker "
        f"processes, {seconds:.0f} s per run; snapshot from {hold[0]:.0f} s for {hold[1]:.0f} s; "
        f"{vacuum}"
    )
    print(report(free, held, hold))


if __name__ == "__main__":
    main()
