"""The claim's low-water marks: where each queue's scans of ready todos may start.

Claimed and completed todos leave dead entries at the head of each priority's range of
`idx_todos_pending` (queue, priority, fair_at), in front of its first ready todo. Vacuum
removes them, unless another session holds an old snapshot (a report, `pg_dump`, a
transaction left open): then every claim steps over all of them, and visits each one's row in
the table, so its cost grows with the snapshot's age. A claim that starts a priority's scan at
its mark (the turn, `fair_at`, of the first ready todo this process last claimed at that queue
and priority, less MARK_SLACK) skips them: the B-tree seeks straight to (queue, priority,
mark). The priorities a process has no mark for are scanned from the queue's lowest mark,
those above its highest marked priority first and those below its lowest last, checking
`fair_at` inside the index (dead entries cost a comparison, not a row visit); the scans run
in priority order and stop once the claim has its limit. Measured in docs/operating.md,
section 9.

The claim's scan for expired leases (idx_todos_lease) meets the same dead entries, one per
claim and heartbeat, at the head of that index: it runs only in full scans, and the reaper
takes expired leases back meanwhile.

A mark trails this process's claims by MARK_TRAIL seconds of its clock: it is the lowest of
the marks its claims set within that time, and of the last one set before it. A fair key's
turns run ahead of the clock, and a fast drain moves through them quicker than the clock: four
processes claiming 20,000 todos a second of one key pass 20 s of its turns a second. A todo of
another key takes the head's turn as its create statement read it (fair_turn, shared.sql), and
by the time it commits, claims of that head may have moved a mark set from the turn just
claimed past it by more than MARK_SLACK. It was then behind the mark, and the todos of quiet
keys created next took its turn, the head, and joined it: a quiet tenant waited for the next
full scan or the backlog's end (the fair_queue scenario: seconds at p99). A create's read of
the head is at most its statement's time old, well within MARK_TRAIL.

A ready todo can sit behind the mark: one requeued or created with an old turn, one
whose concurrency key was held, a lower-priority one passed over while higher ones were
claimed, or one at a priority between two marked ones that this process has not claimed at
yet (a released todo is not: release makes it due now, found by the scan of due todos).
So every FULL_SCAN_EVERY seconds, a claim of this process scans every queue from the head of
its index, and expired leases too: a todo behind the mark waits at most that long (less with
several worker processes), never starves. The interval keeps full scans to about one claim
in a hundred for a busy worker, so they do not make the claim's p99. The marks live in this
process's memory, per database, queue and priority, shared by its threads: a restarted
process starts with a full scan, which is correct, only slower.

A claim that is not a full scan runs lean (claim_ready in sql/claiming.sql) unless the last
claim of this process from the same queues found one of them paused or limited. Each claim
statement says whether it did, so this memory follows the operators' changes at the next
claim; and the lean statement reads the queues' settings itself and claims nothing when one
limits them, so the memory only spares a limited queue the lean statement's round trip: it
can never make a claim wrong.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from switchboard_todos.cursors import array_literal

#: How far below the first turn it claimed a queue's mark is set: todos committed a little out
#: of turn order (concurrent producers; a fair key's first todo, which takes the head's turn
#: while claims move on: 1,000 turns of 1 ms) stay in front of it.
MARK_SLACK = timedelta(seconds=1)
#: At most this many seconds between claims of this process that scan from the heads.
FULL_SCAN_EVERY = 10.0
#: How long (this process's clock, seconds) a mark trails the claims that move it: longer than
#: a create statement takes to read the head and commit.
MARK_TRAIL = 0.5
#: Below every priority (-100 is the lowest): a queue's scan of the priorities above it is
#: the whole queue.
BELOW_ALL = -101
#: The queue of the first entry of the group arrays, which matches no queue: the arrays are
#: never empty, so each parameter of the claim always has one type and its prepared statement
#: stays one (cursors.py).
NO_QUEUE = ""
#: The mark of a scan from the head. A datetime, never None, so that the claim's parameter
#: always has one type and its prepared statement stays one (cursors.py).
FROM_HEAD = datetime.min.replace(tzinfo=UTC)


class ClaimMarks(NamedTuple):
    """Where the next claim's scans of ready todos start, in the claim's parameters.

    Per queue: `marks` (where the scans of priorities it has no mark for start), `tops` and
    `bottoms` (those priorities: above the one and below the other). Per (queue, priority) the
    process has claimed from, highest priority first: `group_queues`, `group_priorities`,
    `group_marks`. `full_scan`: every queue from the head, and expired leases.
    """

    marks: list[datetime]
    tops: list[int]
    bottoms: list[int]
    group_queues: list[str]
    group_priorities: list[int]
    group_marks: list[datetime]
    full_scan: bool

    def params(self) -> dict[str, Any]:
        """The claim's parameters: each array in its text form (cursors.array_literal), each
        built for its one type, the scan from the head's text made once: a claim's marks
        cost a third as much again by array_literal's test of each element."""
        return {
            "marks": _instants(self.marks),
            "tops": _numbers(self.tops),
            "bottoms": _numbers(self.bottoms),
            "group_queues": array_literal(self.group_queues),
            "group_priorities": _numbers(self.group_priorities),
            "group_marks": _instants(self.group_marks),
            "full_scan": self.full_scan,
        }


#: FROM_HEAD as an element of an array's text form (cursors.array_literal).
_FROM_HEAD_TEXT = f'"{FROM_HEAD.isoformat()}"'


def _instants(values: list[datetime]) -> str:
    """array_literal of aware datetimes."""
    texts = [
        _FROM_HEAD_TEXT if value is FROM_HEAD else f'"{value.isoformat()}"' for value in values
    ]
    return "{" + ",".join(texts) + "}"


def _numbers(values: list[int]) -> str:
    """array_literal of priorities (integers, never bools)."""
    return "{" + ",".join(map(str, values)) + "}"


class Marks:
    """The marks of one process, by (database alias, queue), then priority."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._marks: dict[tuple[str, str], dict[int, datetime]] = {}
        #: Per (database alias, queue, priority): (clock, mark) of the claims within MARK_TRAIL
        #: and of the last one before it, each one lower than all set after it, so that the
        #: first is the mark.
        self._trails: dict[tuple[str, str, int], deque[tuple[float, datetime]]] = {}
        self._full_scans: dict[str, float] = {}
        self._limited: set[tuple[str, tuple[str, ...]]] = set()
        #: The database's time at the last claim of each database that took something.
        self._claimed_at: dict[str, datetime] = {}

    def for_claim(self, alias: str, queues: Sequence[str]) -> ClaimMarks:
        """The marks of the next claim from `queues` (see ClaimMarks)."""
        now = self.clock()
        found = ClaimMarks([], [], [], [NO_QUEUE], [BELOW_ALL], [FROM_HEAD], False)
        with self._lock:
            full = now - self._full_scans.get(alias, now - FULL_SCAN_EVERY) >= FULL_SCAN_EVERY
            if full:
                self._full_scans[alias] = now
            for queue in queues:
                groups = {} if full else self._marks.get((alias, queue), {})
                if not groups:
                    found.marks.append(FROM_HEAD)
                    found.tops.append(BELOW_ALL)
                    found.bottoms.append(BELOW_ALL)
                    continue
                found.marks.append(min(groups.values()))
                found.tops.append(max(groups))
                found.bottoms.append(min(groups))
                for priority in sorted(groups, reverse=True):
                    found.group_queues.append(queue)
                    found.group_priorities.append(priority)
                    found.group_marks.append(groups[priority])
        return found._replace(full_scan=full)

    def claimed(
        self,
        alias: str,
        todos: Iterable[tuple[str, int, datetime | None]],
        *,
        at: datetime | None = None,
        short_of: Sequence[str] = (),
    ) -> None:
        """Move the mark of each (queue, priority) claimed from to the first turn claimed there
        within MARK_TRAIL, less MARK_SLACK (the module says why). A claim made `at` (the
        database's time) that came back short of its limit has taken what its scans found: the
        marks of its queues, `short_of`, come down to the last claim's time, less MARK_SLACK,
        wherever they are above it.

        A fair key's turns run ahead of the clock (1 ms a todo: a backlog of 50,000 of one key
        reaches 50 s ahead), and so do the marks of a process that claims them. A todo created
        once that backlog is gone takes its creation time as its turn (fair_turn, shared.sql),
        behind those marks: without this, it waited for the next full scan, up to
        FULL_SCAN_EVERY. Every todo created after a claim comes back short has a turn from
        that claim's time on.
        """
        oldest: dict[tuple[str, int], datetime] = {}
        for queue, priority, turn in todos:
            key = (queue, priority)
            if turn is not None and (key not in oldest or turn < oldest[key]):
                oldest[key] = turn
        now = self.clock()
        with self._lock:
            for (queue, priority), turn in oldest.items():
                mark = turn - MARK_SLACK
                trail = self._trails.setdefault((alias, queue, priority), deque())
                while trail and trail[-1][1] >= mark:
                    trail.pop()  # never the lowest again while this one is in the trail
                trail.append((now, mark))
                while len(trail) > 1 and trail[1][0] <= now - MARK_TRAIL:
                    trail.popleft()
                self._marks.setdefault((alias, queue), {})[priority] = trail[0][1]
            if at is not None:
                self._claimed_at[alias] = max(at, self._claimed_at.get(alias, at))
            latest = self._claimed_at.get(alias)
            if latest is None:
                return  # no claim has taken anything: no mark is set
            ceiling = latest - MARK_SLACK
            for queue in short_of:
                groups = self._marks.get((alias, queue), {})
                for priority, mark in groups.items():
                    if mark > ceiling:
                        groups[priority] = ceiling
                        self._trails[(alias, queue, priority)] = deque([(now, ceiling)])

    def lean(self, alias: str, queues: Sequence[str]) -> bool:
        """Whether a claim from `queues` may try the lean statement: the last claim from them
        did not find one paused or limited."""
        return (alias, tuple(queues)) not in self._limited

    def found(self, alias: str, queues: Sequence[str], *, limited: bool) -> None:
        """A claim from `queues` found one of them paused or limited, or none."""
        with self._lock:
            if limited:
                self._limited.add((alias, tuple(queues)))
            else:
                self._limited.discard((alias, tuple(queues)))

    def forget(self) -> None:
        """Drop every mark: the next claims scan from the head (tests, a truncated table)."""
        with self._lock:
            self._marks.clear()
            self._trails.clear()
            self._full_scans.clear()
            self._limited.clear()
            self._claimed_at.clear()


#: This process's marks.
marks = Marks()
