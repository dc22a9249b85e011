"""Scenario: queues split over two databases on one server, drained by one fleet of Workers.

First every todo lives in one database (queues `bench` and `bench-2` in `default`); then the
same backlog is split, `eu-bench` placed in the second database `eu` by QueueRouter (the
database is `<bench database>_eu`, created and migrated here). In both runs each process is a
`Worker` serving both queues. The reference is the raw 50-per-batch loop, claiming from each
queue in turn on one connection per database. The note gives each database's own rate (its
todos over the span of its claims and completions, by its clock) and the split run's total
over the one-database run's: on one server the databases share its cores, so the sum is
bounded by them; on two servers each would have its own.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from bench import raw
from bench.harness import Bench, Child, Row, Target, expect_states, plural, run_worker, settle

#: Where the second queue lives: "eu-*" in the second database.
PLACED = {"eu-*": "eu"}
ONE = {"default": ["bench", "bench-2"]}
SPLIT = {"default": ["bench"], "eu": ["eu-bench"]}
TARGET = Target(ratio=0.7)
RAW_BATCH = 50


def noop(todo: object) -> None:
    """The handler of `bench.noop` todos."""


def place() -> None:
    """Place `eu-*` in `eu` in this process (the parent and each child)."""
    from django.conf import settings

    settings.SWITCHBOARD_TODOS_QUEUE_DATABASES = PLACED


def ours(child: Child, *, owner: str, queues: list[str]) -> int:
    place()
    return run_worker(child, "bench.noop", noop, owner=owner, queues=queues)


def reference(child: Child, *, owner: str, layout: dict[str, list[str]]) -> int:
    """The raw loop: claim a batch from each queue in turn (one connection per database)."""
    from django.db import connections

    urls = {alias: _url(connections[alias].settings_dict) for alias in layout}
    done = 0
    with _connections(urls) as cursors:
        child.start()
        while True:
            found = 0
            for alias, queues in layout.items():
                for queue in queues:
                    found += _claim_and_complete(cursors[alias], queue, owner)
            if not found:
                return done
            done += found
            child.count(found)


def _claim_and_complete(cursor: psycopg.Cursor[Any], queue: str, owner: str) -> int:
    params = {"queue": queue, "limit": RAW_BATCH, "owner": owner, "ttl": timedelta(seconds=300)}
    rows = cursor.execute(raw.CLAIM, params).fetchall()
    if rows:
        at = raw.column(cursor, "id")
        for row in rows:
            raw.handle(row)
        cursor.execute(raw.COMPLETE_MANY, {"ids": [row[at] for row in rows], "owner": owner})
    return len(rows)


class _connections:
    """One autocommit psycopg connection per database, as the raw reference connects."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.opened: list[psycopg.Connection[Any]] = []

    def __enter__(self) -> dict[str, psycopg.Cursor[Any]]:
        cursors = {}
        for alias, url in self.urls.items():
            connection = psycopg.connect(url, autocommit=True)
            self.opened.append(connection)
            cursors[alias] = connection.cursor()
        return cursors

    def __exit__(self, *exc: object) -> None:
        for connection in self.opened:
            connection.close()


def _url(settings: dict[str, Any]) -> str:
    """A database's URL from its Django settings (same server as DATABASE_URL)."""
    base = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(base._replace(path=f"/{settings['NAME']}"))


def prepare_second_database() -> None:
    """Create `eu` if missing and migrate it with `eu-*` placed there."""
    from django.core.management import call_command
    from django.db import connections

    name = connections["eu"].settings_dict["NAME"]
    server = urlsplit(os.environ["DATABASE_URL"])
    with psycopg.connect(urlunsplit(server._replace(path="/postgres")), autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    place()
    call_command("migrate", database="eu", verbosity=0)


def fill(layout: dict[str, list[str]], per_queue: int) -> None:
    """Empty both databases; give each queue of `layout` `per_queue` todos."""
    from django.db import connections

    for alias in ("default", "eu"):
        with connections[alias].cursor() as cursor:
            cursor.execute("TRUNCATE todos")
            for queue in layout.get(alias, []):
                cursor.execute(
                    "INSERT INTO todos (queue, kind, payload) SELECT %s, 'bench.noop', "
                    "jsonb_build_object('n', g) FROM generate_series(1, %s) AS g",
                    [queue, per_queue],
                )
        settle(alias)


def rates(layout: dict[str, list[str]]) -> dict[str, float]:
    """Each database's todos over the span from its first claim to its last completion."""
    from django.db import connections

    found = {}
    for alias in layout:
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "SELECT count(*), extract(epoch FROM max(completed_at) - min(claimed_at)) "
                "FROM todos WHERE state = 'done'"
            )
            count, seconds = cursor.fetchone()
        found[alias] = count / float(seconds) if seconds else 0.0
    return found


def drain(
    bench: Bench,
    layout: dict[str, list[str]],
    workers: int,
    per_queue: int,
    *,
    side: str,
    per_database: dict[str, list[float]],
) -> float:
    """Fill, drain with `side` in `workers` processes; the total rate. Ours also adds each
    database's rate to `per_database`."""
    fill(layout, per_queue)
    total = per_queue * sum(len(queues) for queues in layout.values())
    queues = [queue for names in layout.values() for queue in names]
    task: Callable[..., int] = ours if side == "ours" else reference
    given: dict[str, Any] = {"queues": queues} if side == "ours" else {"layout": layout}
    seconds, _ = bench.pool.run(
        task, [{"owner": f"bench-{index}", **given} for index in range(workers)], total
    )
    for alias, names in layout.items():
        expect_states({"done": per_queue * len(names)}, f"two_databases {side}", alias)
    if side == "ours":
        for alias, rate in rates(layout).items():
            per_database[alias].append(rate)
    return total / seconds


def run(bench: Bench) -> None:
    prepare_second_database()
    per_queue = bench.size(full=15_000, smoke=150)
    workers = max(bench.workers)
    totals: dict[str, float] = {}
    for name, layout in (("one database", ONE), ("two databases", SPLIT)):
        per_database: dict[str, list[float]] = {alias: [] for alias in layout}
        sides: dict[str, Callable[[], float]] = {
            side: partial(
                drain, bench, layout, workers, per_queue, side=side, per_database=per_database
            )
            for side in ("ours", "raw")
        }
        figures = bench.interleave(sides)
        totals[name] = statistics.median(figures["ours"])
        note = ", ".join(
            f"{alias} {statistics.median(values):,.0f}/s" for alias, values in per_database.items()
        )
        if name == "two databases":
            note += f"; total {totals[name] / totals['one database']:.2f}x the one-database run"
        bench.add(
            Row(
                f"drain, {name}, Workers on both queues, {plural(workers, 'process')}",
                figures["ours"],
                figures["raw"],
                f"{RAW_BATCH}-per-batch loop",
                target=TARGET,
                note=f"per database: {note}",
            )
        )
