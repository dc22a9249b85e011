"""The reaper loop behind `manage.py reap_todos` and `todo_scheduler`: sweep, sleep, repeat.

A sweep of each database that holds todos (placement.py) takes back expired leases with
`reap_expired()`, one statement that skips rows another session holds, so any number of reapers
can run at once; recounts the blocked todos whose creation raced the end of a parent
(`repair_blocked()`, docs/dependencies.md: such a child is unblocked by the next sweep); deletes
the old done and failed todos of each queue with a retention (`retention.purge_retained`, in
bounded batches that likewise skip held rows); analyzes the todos table once it has outgrown the
size the planner last measured eightfold (`vacuum.analyze_if_outgrown`: the prepared statements'
plans are made from that size); and, when schedules are declared, enqueues the periodic todos
that fell due (`schedules.run_due`, whose ticks are likewise taken once however many schedulers
run). `todo_scheduler` does only the last. A database that fails does not keep the others from
their sweep.

Once the first sweep has worked, a database that goes away or turns read-only (`faults`) is
logged and retried with a capped backoff instead of ending the process: a long-running service
should outlive a database restart or a failover. Its connections get the timeouts of
`faults.timeouts`. A database that cannot be reached at the first sweep ends the run
(`ReaperError`), since that is more often a wrong DATABASE_URL than an outage, and systemd's
Restart= retries it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import datetime
from typing import NamedTuple

from django.db import DatabaseError, close_old_connections

from switchboard_todos import faults, placement, schedules
from switchboard_todos.backoff import retry_delay
from switchboard_todos.models import Todo
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.upkeep import retention, vacuum

logger = logging.getLogger("switchboard_todos.reaper")

#: Longest wait between retries while the database is unavailable (or the interval, if longer).
MAX_RETRY_DELAY = 60.0


class ReaperError(Exception):
    """The first sweep failed; the message is one line, fit for an operator."""


class Sweep(NamedTuple):
    """What one sweep did."""

    requeued: int = 0
    dead_lettered: int = 0
    enqueued: int = 0  # periodic todos
    purged: int = 0  # old todos deleted by their queue's retention
    repaired: int = 0  # blocked todos whose stale count was recomputed (repair_blocked)


class ReapTotals(NamedTuple):
    """What a run of the reaper did."""

    sweeps: int
    failed_sweeps: int
    requeued: int
    dead_lettered: int
    enqueued: int = 0
    purged: int = 0
    repaired: int = 0


def describe(result: Sweep | ReapTotals, *, reaping: bool = True, scheduling: bool = False) -> str:
    """Say what was done, as "2 requeued, 1 dead-lettered; 1 scheduled todo enqueued"."""
    parts = []
    if reaping:
        parts.append(f"{result.requeued} requeued, {result.dead_lettered} dead-lettered")
        if result.purged:
            parts.append(f"{result.purged} deleted by retention")
        if result.repaired:
            parts.append(f"{result.repaired} blocked todos recounted")
    if scheduling:
        noun = "scheduled todo" if result.enqueued == 1 else "scheduled todos"
        parts.append(f"{result.enqueued} {noun} enqueued")
    return "; ".join(parts)


class Reaper:
    """Sweep every `interval` seconds until `shutdown` is requested or `max_sweeps` are done.

    `report` receives a line for every sweep that reaped something (every sweep when
    `report_idle`); failures go to the `switchboard_todos.reaper` logger only.
    """

    def __init__(
        self,
        *,
        interval: float,
        shutdown: Shutdown,
        max_sweeps: int | None = None,
        report: Callable[[str], None] = lambda line: None,
        report_idle: bool = False,
        reaping: bool = True,
        scheduling: bool | None = None,
        databases: Sequence[str] | None = None,
        retention_time_limit: float = retention.RETENTION_TIME_LIMIT,
    ) -> None:
        self.databases = list(databases) if databases else placement.todo_databases()
        self.interval = interval
        self.shutdown = shutdown
        self.max_sweeps = max_sweeps
        self.report = report
        self.report_idle = report_idle
        self.reaping = reaping
        self.retention_time_limit = retention_time_limit
        # Per database, where each queue's retention purge stopped (retention.purge_retained).
        self.retention_marks: dict[str, dict[str, datetime]] = {}
        # Read (and check: ImproperlyConfigured) the declarations before the first sweep; by
        # default, schedule when any is declared.
        declared = schedules.declared()
        self.scheduling = bool(declared) if scheduling is None else scheduling
        self.label = "Reaped lapsed leases" if reaping else "Scheduled"
        self.failure = "Reaping failed" if reaping else "Scheduling failed"

    def describe(self, result: Sweep | ReapTotals) -> str:
        """What `result` says, for the jobs this reaper does."""
        return describe(result, reaping=self.reaping, scheduling=self.scheduling)

    def sweep(self) -> Sweep:
        """Run one sweep of each database, on fresh or still-healthy connections.

        A database that fails does not keep the others from their sweep; the first failure is
        raised after them, and the next sweep tries it again.
        """
        close_old_connections()
        results: list[Sweep] = []
        failure: DatabaseError | None = None
        try:
            for alias in self.databases:
                try:
                    results.append(self._sweep(alias))
                except DatabaseError as error:
                    if len(self.databases) == 1 or not faults.is_outage(error):
                        raise
                    logger.warning("Database %r: %s", alias, faults.one_line(error))
                    failure = failure or error
        finally:
            close_old_connections()
        if failure is not None:
            raise failure
        result = Sweep(*(sum(column) for column in zip(Sweep(), *results, strict=True)))
        if any(result):
            logger.info("%s: %s.", self.label, self.describe(result))
        else:
            logger.debug("%s: nothing.", self.label)
        return result

    def _sweep(self, alias: str) -> Sweep:
        """Reap, repair stale children, apply the queues' retention and schedule in database
        `alias`."""
        swept = Sweep()
        if self.reaping:
            reaped = Todo.objects.db_manager(alias).reap_expired()
            repaired = Todo.objects.db_manager(alias).repair_blocked()
            purged = retention.purge_retained(
                using=alias,
                time_limit=self.retention_time_limit,
                marks=self.retention_marks.setdefault(alias, {}),
            )
            swept = Sweep(
                reaped.requeued, reaped.dead_lettered, purged=purged.total, repaired=sum(repaired)
            )
            if purged.total:
                logger.info(
                    "Retention in database %r: deleted %s%s.",
                    alias,
                    ", ".join(
                        f"{count} {state} of {queue}"
                        for (queue, state), count in sorted(purged.counts.items())
                    ),
                    "; more at the next sweep" if purged.unfinished else "",
                )
            outgrown = vacuum.analyze_if_outgrown(alias)
            if outgrown is not None:
                logger.info(
                    "Database %r: analyzed todos, %s pages where the planner last measured %s; "
                    "the prepared statements are planned again.",
                    alias,
                    outgrown.now,
                    outgrown.measured,
                )
        if self.scheduling:
            swept = swept._replace(enqueued=schedules.run_due(using=alias).enqueued)
        return swept

    def run(self) -> ReapTotals:
        """Sweep until stopped; raise ReaperError if the very first sweep fails."""
        with ExitStack() as stack:
            for alias in self.databases:
                stack.enter_context(faults.timeouts(alias))
            return self._run()

    def _run(self) -> ReapTotals:
        sweeps = failed = failures_in_a_row = requeued = dead_lettered = enqueued = purged = 0
        repaired = 0
        while not self.shutdown.requested:
            sweeps += 1
            try:
                result = self.sweep()
            except DatabaseError as error:
                unavailable = faults.is_outage(error)
                if sweeps == 1:
                    what = "Cannot reach the database" if unavailable else self.failure
                    raise ReaperError(f"{what}: {faults.one_line(error)}") from error
                if not unavailable:
                    raise
                failed += 1
                failures_in_a_row += 1
                delay = retry_delay(
                    failures_in_a_row,
                    base=self.interval,
                    cap=max(self.interval, MAX_RETRY_DELAY),
                    jitter=0.25,
                )
                logger.warning(
                    "Database unavailable (%s); sweep %d failed, %d in a row; retrying in %.1f s.",
                    faults.one_line(error),
                    sweeps,
                    failures_in_a_row,
                    delay,
                )
                pause = delay
            else:
                if failures_in_a_row:
                    logger.info(
                        "Database available again after %d failed sweeps.", failures_in_a_row
                    )
                failures_in_a_row = 0
                requeued += result.requeued
                dead_lettered += result.dead_lettered
                enqueued += result.enqueued
                purged += result.purged
                repaired += result.repaired
                if self.report_idle or any(result):
                    self.report(f"{self.label}: {self.describe(result)}.")
                pause = self.interval
            if self.max_sweeps is not None and sweeps >= self.max_sweeps:
                break
            self.shutdown.wait(pause)
        return ReapTotals(sweeps, failed, requeued, dead_lettered, enqueued, purged, repaired)
