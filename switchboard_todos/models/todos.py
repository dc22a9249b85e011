"""The `todos` table, column for column as in the switchboard seed schema, and `todo_edges`,
its dependencies."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from switchboard_todos.managers import TodoManager
from switchboard_todos.managers.rows import HISTORY
from switchboard_todos.models.defaults import db_now, db_prefixed_uuid, new_todo_id
from switchboard_todos.models.events import Event
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS, PERMISSIONS, State

#: The `next_retry_at` of a todo waiting for others (the "blocked" fragment of sql/shared.sql):
#: past every due time, at the end of idx_todos_scheduled, yet a date Python can read.
BLOCKED_UNTIL = datetime(9999, 1, 1, tzinfo=UTC)


class ParentFailure(models.TextChoices):
    """What a todo that waits for others becomes when one of them ends as a dead letter."""

    CANCEL = "cancel", _("cancel it")
    """It ends as a dead letter too, saying which parent failed; so do the todos waiting for it
    that would be cancelled too. Requeueing the parent brings them back."""

    RUN_ANYWAY = "run_anyway", _("run it anyway")
    """The failed parent counts as finished: it runs once its other parents are done."""


class Todo(models.Model):
    """A unit of work: created pending, claimed under a lease, then done or dead-lettered."""

    id = models.TextField(
        primary_key=True, default=new_todo_id, db_default=db_prefixed_uuid("td"), editable=False
    )
    queue = models.TextField(db_default="default")
    source = models.TextField(db_default="")
    kind = models.TextField(db_default="")
    title = models.TextField(db_default="")
    payload = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()))
    # The constraint is ON DELETE SET NULL in the database (migration 0001), not only in Python,
    # so deleting an event from another service cannot fail or leave a dangling id.
    event = models.ForeignKey(
        Event,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        db_index=False,
        related_name="todos",
    )
    idempotency_key = models.TextField(null=True, blank=True)
    assignee = models.TextField(null=True, blank=True)
    state = models.TextField(choices=State.choices, db_default=State.PENDING)
    owner = models.TextField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempt = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(db_default=DEFAULT_MAX_ATTEMPTS)
    # Higher is claimed first, -100 to 100 as Django's task priority; equal ones in the order
    # they became claimable.
    priority = models.SmallIntegerField(db_default=0)
    # While a todo with a key is claimed, no other todo with that key (in any queue) is.
    concurrency_key = models.TextField(null=True, blank=True)
    # The tenant whose share it is (docs/queues.md, fairness): within a priority, the keys of a
    # queue take turns. None: the one lane of the todos without a key.
    fair_key = models.TextField(null=True, blank=True)
    # Its turn, the order of claims within a priority: its creation time without a fair key;
    # with one, the queue's head or one step (FAIR_STEP) after its key's last pending todo,
    # whichever is later (start-time fair queuing, sql/shared.sql fair_turn).
    fair_at = models.DateTimeField(db_default=db_now(), editable=False)
    # The slot (1 to the limit) a claimed todo of a queue with a concurrency limit holds: one
    # claimed todo per slot (idx_todos_slot) keeps the queue to its limit.
    slot = models.SmallIntegerField(null=True, blank=True, editable=False)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    # How many entries of the failure history (`errors`, the ErrorEntry rows) were dropped to
    # keep it within SWITCHBOARD_TODOS_MAX_ERRORS_KEPT entries and MAX_ERROR_HISTORY_BYTES, and
    # the bytes of those kept (their sizes' sum): 0, the history is empty, read without a query.
    errors_dropped = models.IntegerField(db_default=0)
    errors_bytes = models.BigIntegerField(db_default=0, editable=False)
    # The holder's latest progress note (heartbeat(progress=...)), any JSON value.
    progress = models.JSONField(null=True, blank=True)
    # Someone waits for this todo to finish (wait_for): its end sends a notification.
    awaited = models.BooleanField(db_default=False)
    # Dependencies (docs/dependencies.md): the todos this one waits for, how many of them are not
    # done yet (while any is not, it is pending and not claimable: next_retry_at is BLOCKED_UNTIL)
    # and what becomes of it when one ends as a dead letter. The todos that wait for it are
    # found through TodoEdge, not in its row: naming a parent never writes the parent.
    parents = ArrayField(models.TextField(), null=True, blank=True, editable=False)
    waiting_for = models.IntegerField(db_default=0, editable=False)
    on_parent_failure = models.TextField(
        choices=ParentFailure.choices, null=True, blank=True, editable=False
    )
    created_at = models.DateTimeField(db_default=db_now())
    updated_at = models.DateTimeField(db_default=db_now())
    claimed_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # The creating code's trace context (tracing.py): the W3C headers its propagators wrote
    # (traceparent, tracestate, baggage) as a JSON object, stored only when one was active, so
    # that the spans of its claims, handler runs and settlements join the creator's trace.
    trace_context = models.TextField(null=True, blank=True, editable=False)

    objects = TodoManager()

    class Meta:
        db_table = "todos"
        ordering = ["-created_at"]
        permissions = [(codename, name) for codename, name in PERMISSIONS]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=State.values), name="todos_state_check"),
            models.CheckConstraint(
                condition=Q(max_attempts__gt=0), name="todos_max_attempts_check"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100), name="todos_priority_check"
            ),
            models.CheckConstraint(
                condition=Q(on_parent_failure__in=ParentFailure.values)
                | Q(on_parent_failure__isnull=True),
                name="todos_on_parent_failure_check",
            ),
            # One claimed todo per concurrency key: what settles two claims that both saw the
            # key free (the claim passes over held keys itself, sql/claiming.sql key_free).
            models.UniqueConstraint(
                fields=["concurrency_key"],
                condition=Q(concurrency_key__isnull=False, state=State.CLAIMED),
                name="idx_todos_key_claimed",
            ),
            # One claimed todo per slot of a queue's concurrency limit: what settles two claims
            # that both saw a slot free (sql/claiming.sql, the "slot" CTE).
            models.UniqueConstraint(
                fields=["queue", "slot"],
                condition=Q(slot__isnull=False, state=State.CLAIMED),
                name="idx_todos_slot",
            ),
            models.UniqueConstraint(
                fields=["queue", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False)
                & ~Q(state=State.DONE)
                & ~Q(state=State.FAILED),
                name="idx_todos_dedupe",
            ),
        ]
        indexes = [
            # The claim scan: one index scan per queue, stopping at the first unlocked row, in
            # priority order, then turn (fair_at: creation time without a fair key). The seed's
            # index, narrowed to todos not waiting for a retry, so that a backlog of retries is
            # never walked past to find ready work. Its creation times ride along, so that the
            # health page's ready counts and oldest age read the index alone (stats.py).
            models.Index(
                fields=["queue", "-priority", "fair_at"],
                include=["created_at"],
                condition=Q(state=State.PENDING, next_retry_at__isnull=True),
                name="idx_todos_pending",
            ),
            # A fair key's last pending todo at a queue and priority, read by each create with a
            # key (its turn comes after it); and the keys waiting, for the operators' pages.
            # Todos without a key are not in it, and cost it nothing.
            models.Index(
                fields=["queue", "priority", "fair_key", "fair_at"],
                condition=Q(state=State.PENDING, fair_key__isnull=False),
                name="idx_todos_lane",
            ),
            # The claim scan's other branch: retries and scheduled todos, in the order they are due.
            # A concurrency key's ready todos in claim order: the claim takes only the first.
            models.Index(
                F("concurrency_key"),
                F("priority").desc(),
                F("created_at"),
                F("id"),
                condition=Q(
                    concurrency_key__isnull=False, state=State.PENDING, next_retry_at__isnull=True
                ),
                name="idx_todos_key_order",
            ),
            models.Index(
                fields=["queue", "next_retry_at"],
                condition=Q(state=State.PENDING, next_retry_at__isnull=False),
                name="idx_todos_scheduled",
            ),
            # The reaper and the claim scan's lapsed-lease branch; only in-flight rows.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(state=State.CLAIMED),
                name="idx_todos_lease",
            ),
            # Retention (purge_todos): finished todos in completion order, so each batch reads
            # only the rows it deletes. Pending and claimed todos stay out of it.
            models.Index(
                fields=["completed_at"],
                condition=Q(state__in=[State.DONE, State.FAILED]),
                name="idx_todos_finished",
            ),
            # The event's todos (admin inline, ON DELETE SET NULL); most todos have no event.
            models.Index(
                fields=["event"],
                condition=Q(event__isnull=False),
                name="idx_todos_event",
            ),
            # The admin (see admin.py). Its newest-first pages sort created_at DESC NULLS LAST, an
            # order the claim scan (priority, then turn) cannot read from these indexes: so the
            # claim keeps to idx_todos_pending however the table looks.
            # The list's default order and its date hierarchy: a page is the first 100 entries.
            models.Index(F("created_at").desc(nulls_last=True), name="idx_todos_created"),
            # The queue filter's page (an index range, not a filtered walk of every todo) and its
            # list of queues, read by skipping from one queue to the next (stats.distinct_values).
            models.Index(F("queue"), F("created_at").desc(nulls_last=True), name="idx_todos_queue"),
            # Dead letters: the admin's dead-letter list, newest first, and the batches that
            # requeue them all; with the queue included, the health page counts them per queue
            # from the index alone. Small: only failed todos are in it.
            models.Index(
                F("created_at").desc(nulls_last=True),
                include=["queue"],
                condition=Q(state=State.FAILED),
                name="idx_todos_dead",
            ),
            # The admin's search by idempotency key, in every state (idx_todos_dedupe covers only
            # live todos, and needs the queue).
            models.Index(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="idx_todos_key",
            ),
            # The todos an agent holds, counted against its quota at each of its claims; only
            # in-flight rows.
            models.Index(
                fields=["owner"],
                condition=Q(state=State.CLAIMED),
                name="idx_todos_held",
            ),
            # The assignee filter and its list of assignees; few todos are assigned.
            models.Index(
                fields=["assignee"],
                condition=Q(assignee__isnull=False),
                name="idx_todos_assignee",
            ),
        ]

    def __str__(self) -> str:
        return self.title or self.kind or self.id

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The failure history, oldest first: the attempts that failed or expired, each an entry
        of `attempt`, `owner`, `claimed_at`, `at` and `error`. Its rows are ErrorEntry's, so
        that a fail writes its own entry and not the whole history again; read in one query,
        none when known_history knows it."""
        known = known_history(self)
        return known if known is not None else [row.entry for row in self.error_entries.all()]

    def refresh_from_db(self, *args: Any, **kwargs: Any) -> None:
        """Reload; the failure history too, which may have grown (it is read again)."""
        self.__dict__.pop(HISTORY, None)
        super().refresh_from_db(*args, **kwargs)

    @property
    def blocked(self) -> bool:
        """Whether it waits for todos that are not done yet (not claimable until they are)."""
        return self.state == State.PENDING and self.waiting_for > 0

    def parent_results(self) -> dict[str, Any]:
        """The results of the todos it waited for, by id in `after` order: what a todo that
        merges the work of others reads. One query; None for a parent not done (or purged)."""
        return parent_results_of([self]).get(self.id, {})


def parent_results_of(todos: Iterable[Todo]) -> dict[str, dict[str, Any]]:
    """`parent_results()` of each of `todos` that has parents, by its id: one query per
    database they were read from, none when no todo has parents."""
    waiting = [todo for todo in todos if todo.parents]
    wanted: dict[str | None, set[str]] = {}
    for todo in waiting:
        wanted.setdefault(todo._state.db, set()).update(todo.parents or ())
    found = {
        alias: dict(
            Todo.objects.using(alias)
            .filter(pk__in=ids, state=State.DONE)
            .values_list("pk", "result")
        )
        for alias, ids in wanted.items()
    }
    return {
        todo.id: {parent: found[todo._state.db].get(parent) for parent in todo.parents or ()}
        for todo in waiting
    }


def known_history(todo: Todo) -> list[dict[str, Any]] | None:
    """`todo`'s failure history when it is known without a query: empty (no bytes of it,
    errors_bytes), read with it (`Todo.objects.with_errors()`) or prefetched
    (`prefetch_related("error_entries")`); else None."""
    if todo.__dict__.get("errors_bytes") == 0:
        return []
    if HISTORY in todo.__dict__:
        return list(todo.__dict__[HISTORY] or [])
    prefetched = getattr(todo, "_prefetched_objects_cache", {}).get("error_entries")
    return None if prefetched is None else [row.entry for row in prefetched]


class TodoEdge(models.Model):
    """One dependency: todo `child_id` waits for todo `parent_id` (docs/dependencies.md).

    A row of its own, inserted with the child: naming a parent neither rewrites nor locks the
    parent's row, however many children it has. The statements that end a parent find its
    children here (the primary key, parent first); the child's `parents` column keeps its own
    list in `after` order. No foreign keys: todos are purged by retention, which deletes their
    edges with them (sql/retention.sql).
    """

    pk = models.CompositePrimaryKey("parent_id", "child_id")
    parent_id = models.TextField()
    child_id = models.TextField()

    class Meta:
        db_table = "todo_edges"
        indexes = [
            # The parents of a child, for the purge that deletes the child's edges.
            models.Index(fields=["child_id"], name="idx_todo_edges_child"),
        ]

    def __str__(self) -> str:
        return f"{self.child_id} after {self.parent_id}"
