"""Retention: delete finished todos in small batches, behind `manage.py purge_todos` and, for
the queues with a retention of their own (Queue.retention), the reaper's sweeps.

Only `done` todos, and `failed` ones (dead letters) when asked, are ever deleted; the SQL says
so in its WHERE as well as here. A todo an MCP task keeps (agents/service/tasks.py) is not,
until the task's ttl has passed: a purge walks past it, and a reaper's mark stops at it. Each
batch is one statement, so outside a caller's transaction it commits on its own and holds its
row locks for one batch only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router

from switchboard_todos.conf import conf
from switchboard_todos.models import State, Todo
from switchboard_todos.sql import queries

#: The largest batch: bigger ones hold their row locks and WAL for longer than they save.
MAX_BATCH_SIZE = 100_000
#: The state of a purge's answer rows that count the todos an MCP task keeps, walked past and
#: not deleted (sql/retention.sql, kept_and_deleted).
KEPT = "kept"
#: Seconds one reaper sweep spends on the queues' retention in a database: past that it starts
#: no new batch, and the next sweep goes on (a retention set on a large backlog).
RETENTION_TIME_LIMIT = 5.0


@dataclass
class Purged:
    """What a purge deleted (or, for a dry run, would delete), per (queue, state)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    batches: int = 0
    unfinished: bool = False
    """A retention purge stopped at its time limit with todos left to delete."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, other: Purged) -> None:
        """Count `other` (another database's purge) in with these."""
        self.counts.update(other.counts)
        self.batches += other.batches


def purge(
    older_than: timedelta,
    *,
    include_failed: bool = False,
    queues: Iterable[str] | None = None,
    batch_size: int = 1000,
    using: str | None = None,
) -> Purged:
    """Delete done (and dead-lettered) todos completed more than `older_than` ago, in batches,
    from database `using` (the router's by default)."""
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, not {batch_size}.")
    params = _params(older_than, include_failed, queues)
    purged = Purged()
    after: datetime | None = None
    while True:
        rows = _fetch("purge_batch", {**params, "limit": batch_size, "after": after}, using)
        purged.batches += 1
        walked = 0
        for queue, state, count, newest in rows:
            walked += count
            if state != KEPT:  # a purge walks past what a task keeps: the next one sees it
                purged.counts[queue, state] += count
                after = newest if after is None else max(after, newest)
        # Skipped (locked) rows do not count against the limit, so a short batch is the last;
        # one that deleted nothing (all kept by tasks) too.
        if walked < batch_size or not any(state != KEPT for _, state, _, _ in rows):
            return purged


def purge_retained(
    *,
    using: str | None = None,
    batch_size: int | None = None,
    time_limit: float = RETENTION_TIME_LIMIT,
    marks: dict[str, datetime] | None = None,
) -> Purged:
    """Delete each queue's done and failed todos completed longer ago than its retention
    (Queue.retention) from database `using` (the router's by default), in batches of
    `batch_size` (SWITCHBOARD_TODOS_REAP_BATCH). A queue without a retention is not touched.

    The queues take a batch each in turn, so a large backlog in one does not hold the others
    back; after `time_limit` seconds no new round starts and the result says `unfinished`.
    `marks` (queue -> the newest completed_at deleted), kept by the caller from one purge to
    the next, lets each start where the last stopped (sql/retention.sql, purge_retained).
    """
    size = conf.REAP_BATCH if batch_size is None else batch_size
    marks = {} if marks is None else marks
    kept: dict[str, timedelta] = dict(_fetch("retained_queues", {}, using))
    left = list(kept)
    purged = Purged()
    deadline = time.monotonic() + time_limit
    while left:
        for queue in list(left):
            params = {
                "queue": queue,
                "retention": kept[queue],
                "limit": size,
                "after": marks.get(queue),
            }
            rows = _fetch("purge_retained", params, using)
            purged.batches += 1
            walked, deleted, oldest_kept = 0, 0, None
            for _queue, state, count, newest in rows:
                walked += count
                if state == KEPT:  # the oldest todo a task keeps: the mark stops there
                    oldest_kept = newest
                    continue
                purged.counts[queue, state] += count
                deleted += count
                marks[queue] = max(marks.get(queue, newest), newest)
            if oldest_kept is not None:
                marks[queue] = min(marks.get(queue, oldest_kept), oldest_kept)
            # Skipped (locked) rows do not count against the limit: a short batch is the last;
            # one that deleted nothing (all kept by tasks) too.
            if walked < size or not deleted:
                left.remove(queue)
        if left and time.monotonic() >= deadline:
            purged.unfinished = True
            break
    return purged


def count_purgeable(
    older_than: timedelta,
    *,
    include_failed: bool = False,
    queues: Iterable[str] | None = None,
    using: str | None = None,
) -> Purged:
    """Count what `purge` would delete now, per queue and state, deleting nothing."""
    rows = _fetch("count_purgeable", _params(older_than, include_failed, queues), using)
    return Purged(counts=Counter({(queue, state): count for queue, state, count in rows}))


def _params(
    older_than: timedelta, include_failed: bool, queues: Iterable[str] | None
) -> dict[str, Any]:
    if older_than <= timedelta(0):
        raise ValueError(f"older_than must be positive, not {older_than}.")
    states = [State.DONE.value, State.FAILED.value] if include_failed else [State.DONE.value]
    return {
        "older_than": older_than,
        "states": states,
        "queues": None if queues is None else sorted(set(queues)),
    }


def _fetch(name: str, params: dict[str, Any], using: str | None) -> list[tuple[Any, ...]]:
    with connections[using or router.db_for_write(Todo)].cursor() as cursor:
        cursor.execute(queries[name], params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows
