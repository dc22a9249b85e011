"""Which queues a worker serves: the ones it names, or every queue (`*`) but those excluded,
and in which databases (placement.py): a named queue in the one it lives in, `*` in each.

The claim scans one index range per queue, so "every queue" is a list of names too: the queues
that hold pending todos, read with a loose index scan (one descent per queue, however large the
backlog) at start and every REFRESH_EVERY seconds, and a queue named by a notification joins it
at once. A queue whose only todos are claimed ones with expired leases joins once the reaper has
made them pending again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from django.db import connections

from switchboard_todos import placement, validation
from switchboard_todos.exceptions import InvalidTodo

#: The token for every queue, as `todo_worker --queue '*'`.
EVERY = "*"
#: Seconds between reads of the queues that hold pending todos, for `*`.
REFRESH_EVERY = 10.0

#: The queues that hold pending todos, ready or scheduled (in backoff, before their run_after,
#: or blocked): one descent of idx_todos_pending and of idx_todos_scheduled per queue (a loose
#: index scan).
PENDING_QUEUES = """
WITH RECURSIVE ready (queue) AS (
    (SELECT queue FROM todos
      WHERE state = 'pending' AND next_retry_at IS NULL
      ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM todos
             WHERE state = 'pending' AND next_retry_at IS NULL AND queue > ready.queue
             ORDER BY queue LIMIT 1)
      FROM ready WHERE ready.queue IS NOT NULL
),
scheduled (queue) AS (
    (SELECT queue FROM todos
      WHERE state = 'pending' AND next_retry_at IS NOT NULL
      ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM todos
             WHERE state = 'pending' AND next_retry_at IS NOT NULL AND queue > scheduled.queue
             ORDER BY queue LIMIT 1)
      FROM scheduled WHERE scheduled.queue IS NOT NULL
)
SELECT queue FROM ready WHERE queue IS NOT NULL
UNION
SELECT queue FROM scheduled WHERE queue IS NOT NULL
ORDER BY queue
"""


class QueueSelection:
    """The queues named, or with `*`, every queue but `exclude`; `current(alias)` lists those
    of one database. `databases` narrows the databases served (default: every one that holds
    a named queue, or with `*` every one that holds todos)."""

    def __init__(
        self,
        queues: str | Iterable[str],
        *,
        exclude: Iterable[str] = (),
        databases: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = [queues] if isinstance(queues, str) else list(queues)
        self.every = EVERY in names
        if self.every and len(names) > 1:
            raise InvalidTodo("'*' already means every queue; give it alone, or name the queues.")
        self.excluded = frozenset(validation.queue(name) for name in exclude)
        if self.excluded and not self.every:
            raise InvalidTodo("excluded queues apply to '*' (every queue) only.")
        self.named = [EVERY] if self.every else validation.queues(names)
        chosen = None if databases is None else list(dict.fromkeys(databases))
        if self.every:
            self._known: dict[str, list[str]] = {
                alias: [] for alias in chosen or placement.todo_databases()
            }
        else:
            self._known = placement.by_database(self.named)
            for alias, placed in self._known.items():
                if chosen is not None and alias not in chosen:
                    raise InvalidTodo(
                        f"queue {placed[0]!r} lives in database {alias!r}, which is not among "
                        f"the databases to serve ({', '.join(chosen)})."
                    )
        #: The databases served, in order.
        self.databases = list(self._known)
        self.clock = clock
        self._lock = threading.Lock()
        self._read_at: dict[str, float] = {}

    def __str__(self) -> str:
        if not self.every:
            return ",".join(self.named)
        return EVERY + "".join(f" but {name}" for name in sorted(self.excluded))

    def wants(self, queue: str) -> bool:
        """Whether work in `queue` is for us; with `*`, a new queue joins at once."""
        if not self.every:
            return queue in self.named
        if queue in self.excluded:
            return False
        alias = placement.database_for(queue)
        with self._lock:
            known = self._known.get(alias)
            if known is not None and queue not in known:
                self._known[alias] = [*known, queue]
        return True

    def current(self, alias: str) -> list[str]:
        """The queues to claim from in database `alias` now (read with `*` when due)."""
        if self.every:
            now = self.clock()
            read_at = self._read_at.get(alias)
            if read_at is None or now - read_at >= REFRESH_EVERY:
                with connections[alias].cursor() as cursor:
                    cursor.execute(PENDING_QUEUES)
                    found = [queue for (queue,) in cursor.fetchall()]
                with self._lock:
                    self._known[alias] = [queue for queue in found if queue not in self.excluded]
                    self._read_at[alias] = now
        return self._known.get(alias, [])
