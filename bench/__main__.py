"""Run the benchmark scenarios: `python -m bench [--smoke] [--rounds N] [--only NAME ...]`.

Prints one table row per figure: our path, the raw psycopg reference, the ratio (median of
the rounds, with its spread) and the target with PASS or MISS. A miss never fails the run:
the exit status says only whether every scenario ran to completion.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
from collections.abc import Sequence

from bench import recorded
from bench.harness import Bench, Pool, table
from bench.setup import NO_PREPARE, configure

SCENARIOS = (
    "enqueue",
    "batch_enqueue",
    "drain_single",
    "drain_worker",
    "pickup",
    "claim_scale",
    "http_agents",
    "mcp_agents",
    "sqs_agents",
    "two_databases",
    "hostile_agent",
    "sqs_clients",
    "celery_brokers",
    "queue_limits",
    "blocked",
    "fair_queue",
    "fair_cost",
)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, one round: proves every scenario runs"
    )
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 5, smoke 1)")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        help="process counts of the drain scenarios (default 1 4 8, smoke 1 2)",
    )
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run these scenarios only")
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="our side with SWITCHBOARD_TODOS_PREPARE = False (as behind PgBouncer)",
    )
    return parser.parse_args(argv)


def describe_machine() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(version(), ' on ', 1), current_setting('synchronous_commit'), "
            "current_setting('shared_buffers')"
        )
        server, synchronous_commit, shared_buffers = cursor.fetchone()
    import psycopg

    return (
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {server} "
        f"(synchronous_commit={synchronous_commit}, shared_buffers={shared_buffers}), "
        f"Python {platform.python_version()}, psycopg {psycopg.__version__} "
        f"({psycopg.pq.__impl__}), load average {os.getloadavg()[0]:.2f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    rounds = options.rounds or (1 if options.smoke else 5)
    workers = tuple(options.workers or ((1, 2) if options.smoke else (1, 4, 8)))
    if options.no_prepare:
        os.environ[NO_PREPARE] = "1"
    configure()
    print(describe_machine())
    print(
        f"{'smoke' if options.smoke else 'full'} size, {rounds} round(s) per figure, "
        f"statements {'not ' if options.no_prepare else ''}prepared\n",
        flush=True,
    )
    pool = Pool(max(workers))
    bench = Bench(smoke=options.smoke, rounds=rounds, pool=pool, workers=workers)
    try:
        for name in options.only or SCENARIOS:
            started = time.monotonic()
            importlib.import_module(f"bench.{name}").run(bench)
            print(f"  ({name}: {time.monotonic() - started:.0f}s)", flush=True)
    finally:
        pool.close()
    dropped = recorded.drops(bench.rows)
    print()
    if dropped:
        print(
            f"Ratios more than {recorded.DROP:.2f} below their recorded figure "
            "(bench/recorded.py; this fails nothing):"
        )
        print("\n".join(dropped))
    else:
        print(f"No ratio is more than {recorded.DROP:.2f} below its recorded figure.")
    print()
    print(table(bench.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
