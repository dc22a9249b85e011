"""The claim's low-water marks: where each queue's scan of ready todos may start.

Claimed and completed todos leave dead entries at the head of `idx_todos_pending`, in front
of the oldest ready todo. Vacuum removes them, unless another session holds an old snapshot
(a report, `pg_dump`, a transaction left open): then every claim steps over all of them, and
visits each one's row in the table, so its cost grows with the snapshot's age. A claim that
starts its scan at a mark (the `created_at` of the oldest ready todo this process last
claimed from the queue, less MARK_SLACK) skips them inside the index, without visiting the
table: measured in docs/operating.md, section 9.

A ready todo can sit behind the mark: one released or created with an old `created_at`, or a
lower-priority one passed over while higher ones were claimed. So every FULL_SCAN_EVERY
seconds, a queue's claim scans from the head of the index again: a todo behind the mark waits
at most that long, never starves. The marks live in this process's memory, per database and
queue, shared by its threads: a restarted process starts with full scans, which is correct,
only slower until its first claim.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta

#: How far below the oldest todo it claimed a queue's mark is set: todos committed a little
#: out of created_at order (concurrent producers) stay in front of it.
MARK_SLACK = timedelta(seconds=1)
#: At most this many seconds between claims of a queue that scan from the head of the index.
FULL_SCAN_EVERY = 1.0
#: The mark of a scan from the head. A datetime, never None, so that the claim's parameter
#: always has one type and its prepared statement stays one (cursors.py).
FROM_HEAD = datetime.min.replace(tzinfo=UTC)


class Marks:
    """The marks of one process, by (database alias, queue)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._marks: dict[tuple[str, str], datetime] = {}
        self._full_scans: dict[tuple[str, str], float] = {}

    def for_claim(self, alias: str, queues: Sequence[str]) -> list[datetime]:
        """Each queue's mark for the next claim; FROM_HEAD where it is time for a full scan."""
        now = self.clock()
        marks: list[datetime] = []
        with self._lock:
            for queue in queues:
                key = (alias, queue)
                mark = self._marks.get(key)
                last_full_scan = self._full_scans.get(key, now - FULL_SCAN_EVERY)
                if mark is None or now - last_full_scan >= FULL_SCAN_EVERY:
                    self._full_scans[key] = now
                    mark = FROM_HEAD
                marks.append(mark)
        return marks

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
