"""The claim's low-water marks: where each queue's scan of ready todos may start.

Claimed and completed todos leave dead entries at the head of `idx_todos_pending`, in front
of the oldest ready todo. Vacuum removes them, unless another session holds an old snapshot
(a report, `pg_dump`, a transaction left open): then every claim steps over all of them, and
visits each one's row in the table, so its cost grows with the snapshot's age. A claim that
starts its scan at a mark (the `created_at` of the oldest ready todo this process last
claimed from the queue, less MARK_SLACK) skips them inside the index, without visiting the
table: measured in docs/operating.md, section 9.

The claim's scan for lapsed leases (idx_todos_lease) meets the same dead entries, one per
claim and heartbeat, at the head of that index: it runs only in full scans, and the reaper
takes lapsed leases back meanwhile.

A ready todo can sit behind the mark: one requeued or created with an old `created_at`, one
whose concurrency key was held, or a lower-priority one passed over while higher ones were
claimed (a released todo is not: release makes it due now, found by the scan of due todos).
So every FULL_SCAN_EVERY seconds, a claim of this process scans every queue from the head of
its index, and lapsed leases too: a todo behind the mark waits at most that long (less with
several worker processes), never starves. The interval keeps full scans to about one claim
in a hundred for a busy worker, so they do not make the claim's p99. The marks live in this
process's memory, per database and queue, shared by its threads: a restarted process starts
with a full scan, which is correct, only slower.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta

#: How far below the oldest todo it claimed a queue's mark is set: todos committed a little
#: out of created_at order (concurrent producers) stay in front of it.
MARK_SLACK = timedelta(seconds=1)
#: At most this many seconds between claims of this process that scan from the heads.
FULL_SCAN_EVERY = 10.0
#: The mark of a scan from the head. A datetime, never None, so that the claim's parameter
#: always has one type and its prepared statement stays one (cursors.py).
FROM_HEAD = datetime.min.replace(tzinfo=UTC)


class Marks:
    """The marks of one process, by (database alias, queue)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._marks: dict[tuple[str, str], datetime] = {}
        self._full_scans: dict[str, float] = {}

    def for_claim(self, alias: str, queues: Sequence[str]) -> tuple[list[datetime], bool]:
        """Each queue's mark for the next claim (FROM_HEAD if it has none), and whether the
        claim is a full scan: every queue from the head, and lapsed leases."""
        now = self.clock()
        with self._lock:
            full = now - self._full_scans.get(alias, now - FULL_SCAN_EVERY) >= FULL_SCAN_EVERY
            if full:
                self._full_scans[alias] = now
                return [FROM_HEAD] * len(queues), True
            return [self._marks.get((alias, queue), FROM_HEAD) for queue in queues], False

    def claimed(self, alias: str, todos: Iterable[tuple[str, datetime | None]]) -> None:
        """Move each queue's mark to the oldest todo just claimed from it, less MARK_SLACK."""
        oldest: dict[str, datetime] = {}
        for queue, created_at in todos:
            if created_at is not None and (queue not in oldest or created_at < oldest[queue]):
                oldest[queue] = created_at
        with self._lock:
            for queue, created_at in oldest.items():
                self._marks[alias, queue] = created_at - MARK_SLACK

    def forget(self) -> None:
        """Drop every mark: the next claims scan from the head (tests, a truncated table)."""
        with self._lock:
            self._marks.clear()
            self._full_scans.clear()


#: This process's marks.
marks = Marks()
