"""Give the claim's indexes back the space a held snapshot made them swell into.

While vacuum is held back, every claim and completion leaves entries in the claim's partial
indexes that vacuum may not remove. Afterwards vacuum removes them, but the index keeps its
pages: the table reuses its free space, a B-tree mostly does not shrink. An index many times
larger than its live entries need costs every claim a few more pages to read. `REINDEX
CONCURRENTLY` builds a compact copy beside it without blocking enqueues or claims, then swaps
it in; `manage.py todo_reindex` does that for each claim index whose bloat passes a ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections, router
from psycopg import sql

from switchboard_todos.models import Todo

#: The indexes every claim reads, whose bloat slows the claim.
CLAIM_INDEXES = ("idx_todos_pending", "idx_todos_scheduled", "idx_todos_lease")
#: Below this size an index is left alone, however bloated: a few pages cost nothing.
MIN_BYTES = 1024 * 1024
#: Bytes a live entry of these indexes takes, with the B-tree's fill factor and page overhead.
BYTES_PER_ENTRY = 64

# The live entries of each claim index: the rows its predicate covers.
_ENTRIES = {
    "idx_todos_pending": (
        "SELECT count(*) FROM todos WHERE state = 'pending' AND next_retry_at IS NULL"
    ),
    "idx_todos_scheduled": (
        "SELECT count(*) FROM todos WHERE state = 'pending' AND next_retry_at IS NOT NULL"
    ),
    "idx_todos_lease": "SELECT count(*) FROM todos WHERE state = 'claimed'",
}


@dataclass(frozen=True)
class IndexBloat:
    """One claim index: its size, what its live entries need, and their ratio."""

    name: str
    size: int
    entries: int

    @property
    def needed(self) -> int:
        return max(MIN_BYTES, self.entries * BYTES_PER_ENTRY)

    @property
    def ratio(self) -> float:
        return self.size / self.needed


def index_bloat() -> list[IndexBloat]:
    """Each claim index's size and live entries."""
    connection = connections[router.db_for_write(Todo)]
    found = []
    with connection.cursor() as cursor:
        for name in CLAIM_INDEXES:
            cursor.execute("SELECT pg_relation_size(%s::regclass)", [name])
            (size,) = cursor.fetchone()
            cursor.execute(_ENTRIES[name])
            (entries,) = cursor.fetchone()
            found.append(IndexBloat(name, size, entries))
    return found


def reindex(name: str) -> None:
    """REINDEX CONCURRENTLY one claim index; it must run outside a transaction."""
    if name not in CLAIM_INDEXES:
        raise ValueError(f"{name!r} is not a claim index; choose from {', '.join(CLAIM_INDEXES)}.")
    connection = connections[router.db_for_write(Todo)]
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(name)))
