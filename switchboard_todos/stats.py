"""Queue health and cheap lookups of what exists, for the admin and `manage.py todo_stats`.

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
        row = asdict(self)
        age = self.oldest_ready_age
        row["oldest_ready_age"] = None if age is None else round(age.total_seconds(), 3)
        return row


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


def _cursor(using: str | None) -> Any:
    return connections[using or router.db_for_read(Todo)].cursor()
