"""The `todos` and `events` tables, column for column as in the switchboard seed schema."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Cast
from django.utils.translation import gettext_lazy as _

from switchboard_todos import validation
from switchboard_todos.events import EventManager
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.managers import TodoManager
from switchboard_todos.managers.rows import HISTORY
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS, PERMISSIONS, State

__all__ = [
    "Agent",
    "Event",
    "ParentFailure",
    "Queue",
    "Schedule",
    "State",
    "Todo",
    "ErrorEntry",
    "new_event_id",
    "new_todo_id",
    "new_todo_ids",
]


def new_event_id() -> str:
    """Return a fresh `ev_<uuid4>` event id."""
    return _prefixed_ids("ev", 1)[0]


def new_todo_id() -> str:
    """Return a fresh `td_<uuid4>` todo id."""
    return _prefixed_ids("td", 1)[0]


def new_todo_ids(count: int) -> list[str]:
    """Return `count` fresh `td_<uuid4>` todo ids (create_many's)."""
    return _prefixed_ids("td", count)


def _prefixed_ids(prefix: str, count: int) -> list[str]:
    """`count` ids `<prefix>_<uuid4>`: random UUIDs of version 4, as uuid.uuid4() makes them,
    from one read of os.urandom (a batch's ids cost 0.6 us each, not 2.6)."""
    digits = os.urandom(16 * count).hex()
    return [
        # Version 4, and the RFC 4122 variant: the top bits of the 17th digit are 10.
        f"{prefix}_{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"
        for h in (digits[start : start + 32] for start in range(0, 32 * count, 32))
    ]


def _random_uuid() -> models.Func:
    return models.Func(function="gen_random_uuid", output_field=models.UUIDField())


def _prefixed_uuid(prefix: str) -> models.Func:
    """Database default `'<prefix>_' || gen_random_uuid()`, so raw SQL inserts get an id too."""
    return models.Func(
        models.Value(f"{prefix}_"),
        Cast(_random_uuid(), models.TextField()),
        template="(%(expressions)s)",
        arg_joiner=" || ",
        output_field=models.TextField(),
    )


def _now() -> models.Func:
    """Database default `now()`: the one clock every transition reads."""
    return models.Func(function="now", output_field=models.DateTimeField())


class Event(models.Model):
    """An inbound delivery (a webhook, say) that todos can point back to."""

    id = models.TextField(
        primary_key=True, default=new_event_id, db_default=_prefixed_uuid("ev"), editable=False
    )
    source = models.TextField(db_default="")
    kind = models.TextField(db_default="")
    payload = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()))
    delivery_id = models.TextField(null=True, blank=True)
    received_at = models.DateTimeField(db_default=_now())

    objects = EventManager()

    class Meta:
        db_table = "events"
        ordering = ["-received_at"]
        indexes = [
            # The admin's event list, newest first, without sorting the table.
            models.Index(fields=["received_at"], name="idx_events_received"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "delivery_id"],
                condition=Q(delivery_id__isnull=False),
                name="idx_events_delivery",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.kind} {self.id}"


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
        primary_key=True, default=new_todo_id, db_default=_prefixed_uuid("td"), editable=False
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
    fair_at = models.DateTimeField(db_default=_now(), editable=False)
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
    created_at = models.DateTimeField(db_default=_now())
    updated_at = models.DateTimeField(db_default=_now())
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


class TodoTask(models.Model):
    """An MCP task (docs/agents.md, tasks): a todo an agent created as a task-augmented tool
    call, which it follows by the task's id.

    The id is random (`tk_` and 256 bits) and bound to the agent: another agent's id for the
    same todo, or any id of another agent, is not found. A row lives in its todo's database.
    While `keep_until` has not passed, retention leaves its todo alone; a purge of the todo
    deletes its tasks with it (sql/retention.sql). No foreign key, as for TodoEdge.
    """

    id = models.TextField(primary_key=True, editable=False)
    agent = models.TextField()
    todo_id = models.TextField()
    # The tool that made it (create_for, create_many), whose output shape its result takes, and
    # whether that call created the todo (false: its idempotency key found it live).
    tool = models.TextField()
    created = models.BooleanField()
    created_at = models.DateTimeField(db_default=_now())
    keep_until = models.DateTimeField()

    class Meta:
        db_table = "todo_tasks"
        indexes = [
            # An agent's tasks, newest first, for tasks/list's pages.
            models.Index(
                F("agent"),
                F("created_at").desc(),
                F("id").desc(),
                name="idx_todo_tasks_agent",
            ),
            # A todo's tasks: the purge that deletes them, and the retention that keeps it.
            models.Index(fields=["todo_id"], name="idx_todo_tasks_todo"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.todo_id})"


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


def last_errors_of(todos: Iterable[Todo]) -> dict[str, Any]:
    """The error of the last entry of each of `todos`' failure histories, by id, for those that
    have one: one query per database they were read from, none for those whose history is
    known (known_history)."""
    found: dict[str, Any] = {}
    wanted: dict[str | None, set[str]] = {}
    for todo in todos:
        known = known_history(todo)
        if known is None:
            wanted.setdefault(todo._state.db, set()).add(todo.id)
        elif known:
            found[todo.id] = known[-1].get("error")
    for alias, ids in wanted.items():
        last = (
            ErrorEntry.objects.using(alias)
            .filter(todo_id__in=ids)
            .order_by("todo_id", "-id")
            .distinct("todo_id")
            .values_list("todo_id", "entry")
        )
        found.update((todo_id, entry.get("error")) for todo_id, entry in last)
    return found


#: An agent's name is the `owner` of every todo it claims: a one-word name, as a queue's.
AGENT_NAME_MAX_LENGTH = 100
agent_name_validator = RegexValidator(
    rf"\A[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{AGENT_NAME_MAX_LENGTH - 1}}}\Z",
    "Use up to 100 letters, digits and _ . : -, starting with a letter or digit.",
)


def validate_queue_name(name: str) -> None:
    """A valid queue name (for the admin's forms)."""
    try:
        validation.queue(name)
    except InvalidTodo as error:
        raise ValidationError(str(error)) from None


def validate_queue_names(names: list[str]) -> None:
    """Each of an agent's granted queues is a valid queue name (for the admin's form)."""
    for name in names:
        validate_queue_name(name)


class ErrorEntry(models.Model):
    """One entry of a todo's failure history (Todo.errors), a row each: a fail inserts its
    entry and deletes the oldest beyond the limits, deciding on `size` alone
    (sql/shared.sql, trimmed), instead of writing the whole history again."""

    # The order of the entries: the entries of one todo are written one at a time, under its
    # row's lock.
    id = models.BigAutoField(primary_key=True)
    # No foreign key constraint: a purge deletes a todo's entries in its own statement, and
    # TRUNCATE todos needs no CASCADE.
    todo = models.ForeignKey(
        Todo,
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,
        related_name="error_entries",
    )
    attempt = models.IntegerField()
    entry = models.JSONField()
    # Bytes of the entry's JSON text, what MAX_ERROR_HISTORY_BYTES counts.
    size = models.IntegerField()

    class Meta:
        db_table = "todo_errors"
        ordering = ["id"]
        indexes = [models.Index(fields=["todo", "id"], name="idx_todo_errors_todo")]

    def __str__(self) -> str:
        return f"{self.todo_id} #{self.attempt}"


class Agent(models.Model):
    """A remote agent (HTTP, MCP): its name is the owner of what it claims, its token its key.

    Only a hash of the token is stored (see agents/tokens.py); `token_prefix` is its first
    characters, enough for a person to tell which token a log line or a leak is about.
    """

    name = models.TextField(validators=[agent_name_validator])
    claim_queues = ArrayField(
        models.TextField(),
        default=list,
        blank=True,
        validators=[validate_queue_names],
        help_text=_("Queues it may claim from, separated by commas."),
    )
    create_queues = ArrayField(
        models.TextField(),
        default=list,
        blank=True,
        validators=[validate_queue_names],
        help_text=_("Queues it may create todos in, separated by commas."),
    )
    is_active = models.BooleanField(default=True, help_text=_("Unset to revoke its token."))
    token_prefix = models.TextField(editable=False)
    token_hash = models.TextField(editable=False)
    #: Bumped at every rotation: credentials derived from the token can tell old from new.
    token_generation = models.IntegerField(default=1, editable=False)
    created_at = models.DateTimeField(db_default=_now(), editable=False)
    #: Updated at most once a minute by the requests the agent makes.
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: Random, new with every token: what credentials derived from the token (SQS secrets) mix
    #: in, so that a deleted or revoked agent's stay dead.
    credential_salt = models.TextField(
        default=secrets.token_hex,
        db_default=Cast(_random_uuid(), models.TextField()),
        editable=False,
    )
    # Quotas; empty takes the project's default (SWITCHBOARD_TODOS_AGENT_*).
    max_held = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_("Most todos it may hold at once; empty: SWITCHBOARD_TODOS_AGENT_MAX_HELD."),
    )
    max_creates_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "Most todos it may create per minute; empty: "
            "SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE."
        ),
    )
    max_attempts_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "The highest max_attempts it may give a todo; empty: "
            "SWITCHBOARD_TODOS_AGENT_MAX_ATTEMPTS."
        ),
    )
    max_bytes_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "Most bytes of JSON (payloads, results, errors, progress notes) it may write per "
            "minute; empty: SWITCHBOARD_TODOS_AGENT_MAX_BYTES_PER_MINUTE."
        ),
    )
    burst_seconds = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(60)],
        help_text=_(
            "Most seconds' worth of its quotas a minute it may spend at once (1 to 60); empty: "
            "SWITCHBOARD_TODOS_AGENT_BURST_SECONDS."
        ),
    )
    #: The paced quotas (count_writes, sql/agents.sql): the time until which its creations, and
    #: its bytes of JSON, are paid for at the quota's rate; empty or past: nothing owed.
    creates_paid_until = models.DateTimeField(null=True, blank=True, editable=False)
    bytes_paid_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "todo_agents"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["name"], name="todo_agents_name_key"),
            # Every request looks its agent up by this hash.
            models.UniqueConstraint(fields=["token_hash"], name="todo_agents_token_key"),
        ]

    def __str__(self) -> str:
        return self.name


class Schedule(models.Model):
    """A periodic todo's durable record (schedules.py): declared in code, ticked by the scheduler.

    Every column but `paused` is written from the declaration; `next_run_at` is the tick the
    schedule awaits, advanced by a compare-and-set in the statement that enqueues its todo.
    """

    name = models.TextField(primary_key=True)
    cron = models.TextField()
    timezone = models.TextField()
    queue = models.TextField()
    kind = models.TextField()
    title = models.TextField()
    payload = models.JSONField(default=dict)
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.IntegerField(default=DEFAULT_MAX_ATTEMPTS)
    concurrency_key = models.TextField(null=True, blank=True)
    missed = models.TextField(
        choices=[("latest", _("enqueue the latest")), ("skip", _("skip"))],
        default="latest",
        help_text=_("What a tick missed during downtime or a pause gets."),
    )
    paused = models.BooleanField(
        db_default=False,
        help_text=_("A paused schedule enqueues nothing; resuming it skips ahead."),
    )
    next_run_at = models.DateTimeField(help_text=_("The tick it awaits."))
    last_tick_at = models.DateTimeField(null=True, blank=True)
    # No constraint: purging the todo must not fail, nor have to touch this table.
    last_todo = models.ForeignKey(
        Todo,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    created_at = models.DateTimeField(db_default=_now(), editable=False)
    updated_at = models.DateTimeField(db_default=_now(), editable=False)

    class Meta:
        db_table = "todo_schedules"
        ordering = ["name"]
        permissions = [("pause_schedule", "Can pause and resume schedules")]

    def __str__(self) -> str:
        return self.name


class Queue(models.Model):
    """A queue's settings, for an operator to steer it: no row means the defaults.

    Claims read the row of each queue they scan in their one statement: a paused queue is
    passed over, and a queue with a rate or concurrency limit is claimed from one claim at a
    time (its row locked) within what the limits leave (docs/queues.md). Rows are made by the
    operator (admin, `manage.py todo_queue`), and live in the database the queue's todos do.
    """

    name = models.TextField(primary_key=True, validators=[validate_queue_name])
    description = models.TextField(blank=True, default="")
    paused = models.BooleanField(
        default=False, help_text=_("A paused queue's todos are not claimed; held ones finish.")
    )
    resume_at = models.DateTimeField(
        null=True, blank=True, help_text=_("A paused queue resumes by itself at this time.")
    )
    visibility_timeout = models.DurationField(
        null=True,
        blank=True,
        help_text=_(
            "The lease of a claim that gives none (SQS's visibility timeout); empty: "
            "SWITCHBOARD_TODOS_DEFAULT_TTL."
        ),
    )
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Attempts a new todo gets unless it says otherwise.")
    )
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("At most this many claims per rate period.")
    )
    rate_period = models.DurationField(null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("At most this many of its todos claimed at once.")
    )
    retention = models.DurationField(
        null=True,
        blank=True,
        help_text=_("The reaper deletes its done and failed todos older than this."),
    )
    #: The rate limit's current window (its start) and the claims made in it.
    rate_window = models.DateTimeField(null=True, blank=True, editable=False)
    rate_count = models.IntegerField(default=0, editable=False)
    #: Where the next claim starts looking for free slots of the concurrency limit (counted
    #: from 0): past the slots the claim before it took, which its snapshot may not show.
    slot_cursor = models.IntegerField(default=0, db_default=0, editable=False)
    created_at = models.DateTimeField(db_default=_now(), editable=False)
    updated_at = models.DateTimeField(db_default=_now(), editable=False)

    class Meta:
        db_table = "todo_queues"
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True, rate_period__isnull=True)
                | Q(rate_limit__gt=0, rate_period__gt=timedelta(0)),
                name="todo_queues_rate_valid",
            ),
            models.CheckConstraint(
                condition=Q(concurrency_limit__isnull=True) | Q(concurrency_limit__gt=0),
                name="todo_queues_concurrency_valid",
            ),
            models.CheckConstraint(
                condition=Q(visibility_timeout__isnull=True)
                | Q(visibility_timeout__gt=timedelta(0)),
                name="todo_queues_visibility_valid",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gt=0),
                name="todo_queues_max_attempts_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name
