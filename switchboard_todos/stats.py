"""Queue health, the tenants (fair keys) waiting in each queue, and cheap lookups of what exists,
for the admin, `manage.py todo_stats` and the metrics.

Every query here reads a partial index (see `Todo.Meta.indexes`) or skips through an index, so its
cost follows the work in flight and the number of queues, not the millions of done todos.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Literal

from django.db import connections, router

from switchboard_todos.models import BLOCKED_UNTIL, Todo

#: Most values a list of queues or assignees shows; past that, filter by typing (search).
VALUES_LIMIT = 500
#: What "recently" finished means on the health page and in todo_stats.
RECENT = timedelta(hours=24)
#: How many of the newest todos the list of kinds is read from.
RECENT_TODOS = 10_000
#: How many fair keys a queue's tenants show, the deepest and the longest waiting.
TOP_KEYS = 5

# An index skip scan: each step asks the index for the first value after the previous one, so
# finding the distinct values costs one probe per value instead of a read of every row.
_DISTINCT = """
WITH RECURSIVE found (value) AS (
    (SELECT {column} FROM todos WHERE {column} IS NOT NULL ORDER BY {column} LIMIT 1)
    UNION ALL
    SELECT (SELECT {column} FROM todos WHERE {column} > found.value ORDER BY {column} LIMIT 1)
      FROM found
     WHERE found.value IS NOT NULL
)
"""

_RECENT_KINDS = """
SELECT DISTINCT kind
  FROM (SELECT kind FROM todos ORDER BY created_at DESC NULLS LAST LIMIT %(recent)s) AS recent
 WHERE kind <> ''
 ORDER BY kind
 LIMIT %(limit)s
"""

# One row per queue. Each CTE reads one partial index: idx_todos_pending (ready),
# idx_todos_scheduled (retries in backoff, and blocked todos at its end, at
# %(blocked)s), idx_todos_lease (claimed), idx_todos_dead (dead letters, the
# queue included): their cost follows the work in flight, not the done todos. "finished" reads a
# range of idx_todos_finished, so its cost follows the todos finished within `recent`. The
# queue names come from a skip scan of idx_todos_queue.
_QUEUES = (
    _DISTINCT.format(column="queue").rstrip()
    + """,
fresh AS (
    SELECT queue, count(*) AS ready, min(created_at) AS oldest
      FROM todos
     WHERE state = 'pending' AND next_retry_at IS NULL
     GROUP BY queue
),
retries AS (
    SELECT queue,
           count(*) FILTER (WHERE next_retry_at <= now()) AS due,
           count(*) FILTER (WHERE next_retry_at > now() AND next_retry_at < %(blocked)s)
               AS scheduled,
           count(*) FILTER (WHERE next_retry_at = %(blocked)s) AS blocked,
           min(next_retry_at) FILTER (WHERE next_retry_at <= now()) AS oldest
      FROM todos
     WHERE state = 'pending' AND next_retry_at IS NOT NULL
     GROUP BY queue
),
claimed AS (
    SELECT queue,
           count(*) FILTER (WHERE lease_expires_at > now()) AS claimed,
           count(*) FILTER (WHERE lease_expires_at <= now()) AS lease_expired
      FROM todos
     WHERE state = 'claimed'
     GROUP BY queue
),
dead AS (
    SELECT queue, count(*) AS dead
      FROM todos
     WHERE state = 'failed'
     GROUP BY queue
),
finished AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'done') AS done,
           count(*) FILTER (WHERE state = 'failed') AS dead_lettered
      FROM todos
     WHERE state IN ('done', 'failed') AND completed_at > now() - %(recent)s::interval
     GROUP BY queue
)
SELECT found.value AS queue,
       coalesce(fresh.ready, 0) + coalesce(retries.due, 0) AS ready,
       coalesce(retries.scheduled, 0) AS scheduled,
       coalesce(claimed.claimed, 0) AS claimed,
       coalesce(claimed.lease_expired, 0) AS lease_expired,
       coalesce(finished.done, 0) AS done_recently,
       coalesce(dead.dead, 0) AS dead,
       now() - least(fresh.oldest, retries.oldest) AS oldest_ready_age,
       coalesce(finished.dead_lettered, 0) AS dead_lettered_recently,
       coalesce(retries.blocked, 0) AS blocked
  FROM found
  LEFT JOIN fresh ON fresh.queue = found.value
  LEFT JOIN retries ON retries.queue = found.value
  LEFT JOIN claimed ON claimed.queue = found.value
  LEFT JOIN finished ON finished.queue = found.value
  LEFT JOIN dead ON dead.queue = found.value
 WHERE found.value IS NOT NULL
   AND (%(queues)s::text[] IS NULL OR found.value = ANY (%(queues)s::text[]))
 ORDER BY found.value
 LIMIT %(limit)s
"""
)


@dataclass(frozen=True)
class QueueHealth:
    """The state of one queue right now, by the database's clock."""

    queue: str
    ready: int
    """Pending and claimable now: new, or due for a retry."""
    scheduled: int
    """Pending, not claimable before `next_retry_at`: in backoff, a delayed release, run_after."""
    claimed: int
    """Claimed, lease still valid: being worked on."""
    lease_expired: int
    """Claimed, lease expired: not yet taken back by the reaper or another claim."""
    done_recently: int
    """Completed within `recent` (the last 24 hours unless asked otherwise)."""
    dead: int
    """Failed: dead letters waiting for an operator."""
    oldest_ready_age: timedelta | None
    """How long the longest-waiting ready todo has been claimable; None when none is ready."""
    dead_lettered_recently: int
    """Failed for good (last attempt, or cancelled) within `recent`."""
    blocked: int
    """Pending, blocked by other todos until they are done (docs/dependencies.md)."""

    @property
    def oldest_ready(self) -> str:
        """The oldest ready todo's age for people: "3 d 4 h", "12 min 5 s"; "" if none."""
        return "" if self.oldest_ready_age is None else format_age(self.oldest_ready_age)

    def as_json(self) -> dict[str, Any]:
        """The row for monitoring: the age in seconds, None when nothing is ready."""
        return {**asdict(self), "oldest_ready_age": _seconds(self.oldest_ready_age)}


# The tenants of each queue: its fair keys with pending todos (ready, in backoff or blocked).
# "lanes" is an index-only scan of idx_todos_lane, grouped: its cost follows the keyed pending
# todos (docs/operating.md, measured). "keyed" reads each lane's head (its first todo in turn
# order), one probe of idx_todos_lane per (queue, priority, key): the age of a key is that of the
# todo it has waited longest to have claimed. A retry takes a new turn behind its key's todos, so
# its older creation time is not the head's: reading every keyed todo's created_at would cost a
# heap read each, three to five times the statement. With %(top)s 0 (the metrics) no head is
# read, and each queue keeps one row for its counts.
_FAIR_SHARES = """
WITH lanes AS (
    SELECT queue, priority, fair_key, count(*) AS depth
      FROM todos
     WHERE state = 'pending' AND fair_key IS NOT NULL
       AND (%(queues)s::text[] IS NULL OR queue = ANY (%(queues)s::text[]))
     GROUP BY queue, priority, fair_key
),
keyed AS (
    SELECT lanes.queue, lanes.fair_key,
           sum(lanes.depth)::bigint AS depth, min(head.created_at) AS oldest
      FROM lanes
      LEFT JOIN LATERAL (
        SELECT lane.created_at
          FROM todos AS lane
         WHERE lane.state = 'pending' AND lane.fair_key = lanes.fair_key
           AND lane.queue = lanes.queue AND lane.priority = lanes.priority
           AND %(top)s > 0
         ORDER BY lane.fair_at
         LIMIT 1) AS head ON true
     GROUP BY lanes.queue, lanes.fair_key
),
ranked AS (
    SELECT queue, fair_key, depth, oldest,
           count(*) OVER per_queue AS keys,
           (sum(depth) OVER per_queue)::bigint AS keyed,
           row_number() OVER (PARTITION BY queue ORDER BY depth DESC, fair_key) AS by_depth,
           row_number() OVER (PARTITION BY queue ORDER BY oldest, fair_key) AS by_age
      FROM keyed
    WINDOW per_queue AS (PARTITION BY queue)
)
SELECT queue, keys, keyed, fair_key, depth, now() - oldest AS oldest_age, by_depth, by_age
  FROM ranked
 WHERE by_depth <= greatest(%(top)s, 1) OR by_age <= %(top)s
 ORDER BY queue, fair_key
"""


def queue_health(
    queues: Iterable[str] | None = None,
    *,
    recent: timedelta = RECENT,
    using: str | None = None,
) -> list[QueueHealth]:
    """Return the health of every queue (or of `queues`) of database `using` (the router's
    by default), one row per queue, by name.

    The counts of todos finished within `recent` read every such todo: a day's worth on the
    health page, a few minutes' for the metrics, which are scraped every few seconds.
    """
    wanted = None if queues is None else list(queues)
    with _cursor(using) as cursor:
        cursor.execute(
            _QUEUES,
            {"queues": wanted, "limit": VALUES_LIMIT, "recent": recent, "blocked": BLOCKED_UNTIL},
        )
        return [QueueHealth(*row) for row in cursor.fetchall()]


@dataclass(frozen=True)
class FairKey:
    """One tenant of a queue: a fair key with pending todos."""

    key: str
    depth: int
    """Its pending todos: ready, in backoff or before their run_after, blocked."""
    oldest_age: timedelta
    """How long its first todo in turn order (at any priority) has existed: what it has waited
    longest to have claimed."""

    @property
    def oldest(self) -> str:
        return format_age(self.oldest_age)

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "depth": self.depth, "oldest_age": _seconds(self.oldest_age)}


@dataclass(frozen=True)
class FairShares:
    """The tenants waiting in one queue: how many keys, and the top ones by depth and by age."""

    queue: str
    keys: int
    """Fair keys with pending todos."""
    keyed: int
    """The pending todos of those keys."""
    by_depth: tuple[FairKey, ...]
    """The keys with the most pending todos, deepest first (at most `top`)."""
    by_age: tuple[FairKey, ...]
    """The keys whose first todo in turn order is the oldest, oldest first (at most `top`)."""

    def unkeyed(self, health: QueueHealth | None) -> int:
        """The queue's pending todos without a key (one lane): all pending (`health`, read by
        another statement) less the keyed ones, so off by the todos written between the two."""
        pending = 0 if health is None else health.ready + health.scheduled + health.blocked
        return max(pending - self.keyed, 0)

    def as_json(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "keyed": self.keyed,
            "by_depth": [key.as_json() for key in self.by_depth],
            "by_age": [key.as_json() for key in self.by_age],
        }


def fair_shares(
    queues: Iterable[str] | None = None, *, top: int = TOP_KEYS, using: str | None = None
) -> list[FairShares]:
    """Return the tenants waiting in every queue (or in `queues`) of database `using` that has
    pending todos with a fair key, by name, with its `top` keys by depth and by age: one
    statement over idx_todos_lane alone. `top=0` counts the keys without ranking them, at the
    cost of the index-only scan alone."""
    wanted = None if queues is None else list(queues)
    with _cursor(using) as cursor:
        cursor.execute(_FAIR_SHARES, {"queues": wanted, "top": top})
        rows = cursor.fetchall()
    found: dict[str, list[Any]] = {}
    for queue, keys, keyed, key, depth, age, by_depth, by_age in rows:
        found.setdefault(queue, [keys, keyed, [], []])
        fair = FairKey(key, depth, age)
        if by_depth <= top:
            found[queue][2].append((by_depth, fair))
        if by_age <= top:
            found[queue][3].append((by_age, fair))
    return [
        FairShares(
            queue,
            keys,
            keyed,
            tuple(fair for _rank, fair in sorted(deepest)),
            tuple(fair for _rank, fair in sorted(oldest)),
        )
        for queue, (keys, keyed, deepest, oldest) in found.items()
    ]


def distinct_values(
    column: Literal["queue", "assignee"], limit: int = VALUES_LIMIT, *, using: str | None = None
) -> list[str]:
    """Return the distinct non-null values of an indexed column, in order, at most `limit`."""
    with _cursor(using) as cursor:
        cursor.execute(
            _DISTINCT.format(column=column)
            + "SELECT value FROM found WHERE value IS NOT NULL LIMIT %(limit)s",
            {"limit": limit},
        )
        return [value for (value,) in cursor.fetchall()]


def recent_kinds(
    recent: int = RECENT_TODOS, limit: int = VALUES_LIMIT, *, using: str | None = None
) -> list[str]:
    """Return the kinds among the newest `recent` todos: kind has no index to skip through."""
    with _cursor(using) as cursor:
        cursor.execute(_RECENT_KINDS, {"recent": recent, "limit": limit})
        return [kind for (kind,) in cursor.fetchall()]


def format_age(age: timedelta) -> str:
    """A duration in its two largest units: "3 d 4 h", "2 h 5 min", "12 min 5 s", "0 s"."""
    seconds = max(round(age.total_seconds()), 0)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count or (parts and len(parts) < 2):
            parts.append(f"{count} {unit}")
        if len(parts) == 2:
            break
    return " ".join(parts) or "0 s"


def _seconds(age: timedelta | None) -> float | None:
    return None if age is None else round(age.total_seconds(), 3)


def _cursor(using: str | None) -> Any:
    return connections[using or router.db_for_read(Todo)].cursor()
