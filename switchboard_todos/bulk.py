"""Apply an operator batch transition to every todo of a queryset, however many there are.

The admin's actions and `manage.py requeue_todos` share this loop. It walks the queryset in
(created_at, id) order, `batch_size` ids at a time, so each batch is one index range read and one
guarded statement that commits on its own: locks are held for one batch, never for the whole run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db.models import F, Q, QuerySet

from switchboard_todos.managers import BatchResult
from switchboard_todos.models import Todo

BATCH_SIZE = 500


@dataclass
class BulkOutcome:
    """What a run changed and refused, and whether it stopped early with todos left."""

    changed: int = 0
    refused: dict[str, list[str]] = field(default_factory=dict)
    """Why -> the ids refused for that reason."""
    unfinished: bool = False
    """True when the time limit stopped the run before the end of the queryset."""

    @property
    def refused_count(self) -> int:
        return sum(len(ids) for ids in self.refused.values())

    def add(self, result: BatchResult) -> None:
        """Count in one batch's result."""
        self.changed += len(result.changed)
        for todo_id, reason in result.refused.items():
            self.refused.setdefault(reason, []).append(todo_id)


def apply_in_batches(
    queryset: QuerySet[Todo],
    operation: Callable[[list[str]], BatchResult],
    *,
    batch_size: int = BATCH_SIZE,
    time_limit: float | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
) -> BulkOutcome:
    """Run `operation` (e.g. `Todo.objects.requeue_many`) over `queryset`, batch by batch.

    `on_batch` sees each batch's result (the admin writes its log entries there). With
    `time_limit` seconds, no new batch starts after that time; at least one always runs.
    """
    outcome = BulkOutcome()
    # Oldest first, NULLS FIRST: idx_todos_created and idx_todos_dead read backwards.
    keys = queryset.order_by(F("created_at").asc(nulls_first=True), "pk").values_list(
        "created_at", "pk"
    )
    deadline = None if time_limit is None else time.monotonic() + time_limit
    page = keys
    while True:
        rows = list(page[:batch_size])
        if not rows:
            return outcome
        result = operation([todo_id for _, todo_id in rows])
        outcome.add(result)
        if on_batch is not None:
            on_batch(result)
        last_created, last_id = rows[-1]
        # The keyset: past the last row seen. The redundant >= keeps it an index range.
        page = keys.filter(created_at__gte=last_created).filter(
            Q(created_at__gt=last_created) | Q(pk__gt=last_id)
        )
        if len(rows) < batch_size:
            return outcome
        if deadline is not None and time.monotonic() >= deadline:
            outcome.unfinished = page.exists()
            return outcome
