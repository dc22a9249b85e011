"""A queue's settings (the Queue model, table `todo_queues`): what operators set and read.

No row means the defaults; the admin's Queues page and `manage.py todo_queue` make a queue's
row the first time they set something on it. A row lives in the database its queue's todos
live in (placement.py), where the claims, creations and the reaper read it. Every write here is
one statement that sets the columns it names and no others: what the claims keep there (the
rate counters `rate_window` and `rate_count`, the `slot_cursor`) is never written, and two
operators setting different things at once both keep theirs. Each change is logged to
`switchboard_todos.queues`; the admin also records it in the queue's History.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connections, router
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from switchboard_todos import placement, stats, validation
from switchboard_todos.conf import conf
from switchboard_todos.durations import format_duration
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS

if TYPE_CHECKING:
    from switchboard_todos.models import Queue

logger = logging.getLogger("switchboard_todos.queues")

DESCRIPTION_MAX_LENGTH = 1000
#: The longest rate period: a quota per month is the longest an upstream API gives.
MAX_RATE_PERIOD = timedelta(days=31)
#: The longest retention or timed pause: a century, far inside what PostgreSQL's timestamps
#: can add or take away.
MAX_SPAN = timedelta(days=36500)
#: The largest rate or concurrency limit: what the integer columns hold.
MAX_LIMIT = 2**31 - 1


class Rate(NamedTuple):
    """A rate limit: at most `limit` claims per `period`, counted over every claimer."""

    limit: int
    period: timedelta


def checked_rate(value: object) -> Rate:
    """A Rate whose limit and period are in range (InvalidTodo otherwise)."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidTodo(f"rate must be a Rate(limit, period), not {type(value).__name__}.")
    limit, period = value
    return Rate(
        validation.whole_number(limit, "rate limit", 1, MAX_LIMIT),
        validation.duration(period, "rate period", maximum=MAX_RATE_PERIOD, allow_zero=False),
    )


#: The check of each setting `configure` takes; None (clear the setting) is not checked.
SETTINGS: dict[str, Any] = {
    "description": lambda value: validation.text(value, "description", DESCRIPTION_MAX_LENGTH),
    "visibility_timeout": lambda value: validation.duration(
        value, "visibility_timeout", maximum=validation.MAX_LEASE, allow_zero=False
    ),
    "max_attempts": lambda value: validation.whole_number(
        value, "max_attempts", 1, validation.MAX_ATTEMPTS_LIMIT
    ),
    "rate": checked_rate,
    "concurrency_limit": lambda value: validation.whole_number(
        value, "concurrency_limit", 1, MAX_LIMIT
    ),
    "retention": lambda value: validation.duration(
        value, "retention", maximum=MAX_SPAN, allow_zero=False
    ),
}


def checked(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The columns `changes` set, each value checked (InvalidTodo names what is wrong)."""
    unknown = set(changes) - set(SETTINGS)
    if unknown:
        raise InvalidTodo(
            f"unknown queue settings: {', '.join(sorted(map(repr, unknown)))}; "
            f"the settings are {', '.join(SETTINGS)}."
        )
    columns: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "description":
            columns[name] = "" if value is None else SETTINGS[name](value)
        elif name == "rate":
            rate = None if value is None else checked_rate(value)
            columns["rate_limit"] = None if rate is None else rate.limit
            columns["rate_period"] = None if rate is None else rate.period
        else:
            columns[name] = None if value is None else SETTINGS[name](value)
    return columns


# Each statement returns the row it wrote, or nothing when it changed nothing.

#: Make queue %(name)s's row with the columns given (`{inserted}`, the others at their
#: defaults), or set those columns (`{columns}`) of its row. The column lists are filled in by
#: `configure` from the names of SETTINGS alone, never from input.
CONFIGURE = """
INSERT INTO todo_queues AS queue (name, {inserted})
VALUES (%(name)s, {values})
ON CONFLICT (name) DO UPDATE SET ({columns}) = ROW({excluded}), updated_at = now()
RETURNING *
"""
#: The columns without a database default (the model's defaults are Python's), as a new row
#: without settings has them.
NEW_ROW = {"description": "", "paused": False, "rate_count": 0}

#: Pause queue %(name)s, until %(resume_at)s or for %(resume_in)s if either is given; nothing
#: when that time has passed (by the database's clock) or the queue is already paused so.
PAUSE = """
INSERT INTO todo_queues AS queue (name, description, paused, resume_at, rate_count)
SELECT %(name)s, '', true, until.at, 0
  FROM (SELECT coalesce(%(resume_at)s::timestamptz, now() + %(resume_in)s::interval) AS at)
       AS until
 WHERE until.at IS NULL OR until.at > now()
ON CONFLICT (name) DO UPDATE SET paused = true, resume_at = excluded.resume_at, updated_at = now()
 WHERE NOT queue.paused OR queue.resume_at IS DISTINCT FROM excluded.resume_at
RETURNING *
"""

#: Resume queue %(name)s if it is paused (a queue without a row never is).
RESUME = """
UPDATE todo_queues SET paused = false, resume_at = NULL, updated_at = now()
 WHERE name = %(name)s AND paused
RETURNING *
"""


def configure(queue: str, *, using: str | None = None, **changes: Any) -> Queue:
    """Set the settings named in `changes` of `queue` (None clears one back to its default),
    making its row if it has none; return the row.

    `description`; `visibility_timeout` (a timedelta or seconds, at most 12 hours: the lease a
    claim without ttl gets); `max_attempts` (1-1000: what a todo created without one gets);
    `rate` (a Rate: at most `limit` claims per `period`); `concurrency_limit` (todos claimed at
    once); `retention` (a timedelta or seconds: the reaper deletes the queue's done and failed
    todos completed longer ago). InvalidTodo before anything is written.
    """
    name = validation.queue(queue)
    columns = checked(changes)
    if not columns:
        raise InvalidTodo(f"nothing to set on queue {name!r}: name at least one setting.")
    inserted = {**NEW_ROW, **columns}
    # The column names come from SETTINGS, never from the caller: safe to write into the SQL.
    statement = CONFIGURE.format(
        inserted=", ".join(inserted),
        values=", ".join(f"%({column})s" for column in inserted),
        columns=", ".join(columns),
        excluded=", ".join(f"excluded.{column}" for column in columns),
    )
    saved = _write(statement, {**inserted, "name": name}, using, name)
    assert saved is not None  # an upsert always returns its row
    logger.info("Queue %s set: %s.", name, ", ".join(_described(saved, columns)))
    return saved


def pause(
    queue: str, *, until: datetime | timedelta | None = None, using: str | None = None
) -> Queue | None:
    """Pause `queue`: claims pass its todos over (the ones held finish) until it is resumed, or
    until `until` (an aware datetime, or a timedelta from now) when given.

    Returns its row, or None when it was already paused so. InvalidTodo when `until` has
    passed, by the database's clock.
    """
    name = validation.queue(queue)
    params: dict[str, Any] = {"name": name, "resume_at": None, "resume_in": None}
    if isinstance(until, timedelta):
        params["resume_in"] = validation.duration(
            until, "until", maximum=MAX_SPAN, allow_zero=False
        )
    elif until is not None:
        params["resume_at"] = validation.instant(until, "until")
    paused = _write(PAUSE, params, using, name)
    if paused is None:
        given = params["resume_at"]
        if given is not None and settings_of(name, using=using).resume_at != given:
            raise InvalidTodo(f"until: {until} has passed; a queue pauses until a later time.")
        return None
    logger.info("Queue %s paused%s.", name, _until(paused))
    return paused


def resume(queue: str, *, using: str | None = None) -> Queue | None:
    """Resume `queue`: claims take its todos again. Returns its row, or None when it was not
    paused."""
    name = validation.queue(queue)
    resumed = _write(RESUME, {"name": name}, using, name)
    if resumed is not None:
        logger.info("Queue %s resumed.", name)
    return resumed


def settings_of(queue: str, *, using: str | None = None) -> Queue:
    """`queue`'s row, or an unsaved Queue holding the defaults when it has none."""
    from switchboard_todos.models import Queue

    name = validation.queue(queue)
    alias = using or placement.database_for(name)
    found = Queue.objects.using(alias).filter(pk=name).first()
    return found if found is not None else Queue(name=name)


@dataclass(frozen=True)
class QueueView:
    """A queue as an operator sees it: its settings (or the defaults) and its todos now."""

    settings: Queue
    """Its row, or an unsaved Queue with the defaults (`configured` is False)."""
    database: str
    paused_now: bool
    """Paused, and its resume time (if any) not yet come, by the database's clock."""
    health: stats.QueueHealth | None
    """Its todos' numbers (stats.queue_health); None when it has no todos."""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def configured(self) -> bool:
        return not self.settings._state.adding

    @property
    def depth(self) -> int:
        """Pending todos: claimable now, in backoff or before their run_after, and blocked by other
        todos."""
        health = self.health
        return 0 if health is None else health.ready + health.scheduled + health.blocked

    @property
    def todos_text(self) -> str:
        """Its todos in a line: "12 pending (10 ready, 2 waiting), 2 claimed, …" (and "N
        blocked" among the pending when some are blocked by other todos; "waiting" counts those
        in backoff or before their run_after)."""
        health = self.health
        if health is None:
            return "none"
        blocked = f", {health.blocked} blocked" if health.blocked else ""
        return (
            f"{self.depth} pending ({health.ready} ready, {health.scheduled} waiting{blocked}), "
            f"{health.claimed} claimed, {health.lease_expired} lease expired, "
            f"{health.dead} dead letters; oldest ready {health.oldest_ready or '-'}"
        )

    @property
    def pause_text(self) -> str:
        queue = self.settings
        if self.paused_now:
            return f"paused{_until(queue)}"
        if queue.paused and queue.resume_at is not None:
            return f"running (resumed by itself at {_when(queue.resume_at)})"
        return "running"

    @property
    def lease_text(self) -> str:
        given = self.settings.visibility_timeout
        if given is None:
            return f"{format_duration(timedelta(seconds=conf.DEFAULT_TTL))} (default)"
        return format_duration(given)

    @property
    def max_attempts_text(self) -> str:
        given = self.settings.max_attempts
        return f"{DEFAULT_MAX_ATTEMPTS} (default)" if given is None else str(given)

    @property
    def rate_text(self) -> str:
        queue = self.settings
        if queue.rate_limit is None or queue.rate_period is None:
            return "none"
        return f"{queue.rate_limit} per {format_duration(queue.rate_period)}"

    @property
    def concurrency_text(self) -> str:
        limit = self.settings.concurrency_limit
        return "none" if limit is None else str(limit)

    @property
    def retention_text(self) -> str:
        retention = self.settings.retention
        return "kept (none)" if retention is None else format_duration(retention)

    def as_json(self) -> dict[str, Any]:
        """For scripts: durations in seconds, times in ISO 8601, null for a default."""
        queue = self.settings
        return {
            "queue": self.name,
            "database": self.database,
            "configured": self.configured,
            "description": queue.description,
            "paused": self.paused_now,
            "paused_flag": queue.paused,
            "resume_at": None if queue.resume_at is None else queue.resume_at.isoformat(),
            "visibility_timeout": _seconds(queue.visibility_timeout),
            "max_attempts": queue.max_attempts,
            "rate_limit": queue.rate_limit,
            "rate_period": _seconds(queue.rate_period),
            "concurrency_limit": queue.concurrency_limit,
            "retention": _seconds(queue.retention),
            "defaults": {
                "visibility_timeout": conf.DEFAULT_TTL,
                "max_attempts": DEFAULT_MAX_ATTEMPTS,
            },
            "todos": None if self.health is None else self.health.as_json(),
        }


def overview(queues: Iterable[str] | None = None, *, using: str | None = None) -> list[QueueView]:
    """Every queue of database `using` (the router's by default) that has a row or todos, or
    those of `queues`, by name: two queries."""
    from switchboard_todos.models import Queue, Todo

    alias = using or router.db_for_read(Todo)
    wanted = None if queues is None else [validation.queue(name) for name in queues]
    rows = Queue.objects.using(alias).annotate(
        paused_now=ExpressionWrapper(
            Q(paused=True) & (Q(resume_at__isnull=True) | Q(resume_at__gt=Now())),
            output_field=BooleanField(),
        )
    )
    if wanted is not None:
        rows = rows.filter(name__in=wanted)
    settings = {row.name: row for row in rows}
    health = {row.queue: row for row in stats.queue_health(wanted, using=alias)}
    names = sorted(set(settings) | set(health) | set(wanted or ()))
    return [
        QueueView(
            settings.get(name) or Queue(name=name),
            alias,
            getattr(settings.get(name), "paused_now", False),
            health.get(name),
        )
        for name in names
    ]


def _write(statement: str, params: dict[str, Any], using: str | None, name: str) -> Queue | None:
    """Run a statement that returns a row of todo_queues (or none) in `name`'s database."""
    from switchboard_todos.models import Queue

    alias = using or placement.database_for(name)
    with connections[alias].cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
        if row is None:
            return None
        values = dict(zip((column.name for column in cursor.description), row, strict=True))
    # Placed by name: from_db reads a full row in the model's field order, not the table's.
    fields = Queue._meta.concrete_fields
    return Queue.from_db(alias, [f.attname for f in fields], [values[f.column] for f in fields])


def _described(queue: Queue, columns: Iterable[str]) -> list[str]:
    """Each column and its value as the command reads it: "retention 30d", "max_attempts None"."""
    said = []
    for column in columns:
        value = getattr(queue, column)
        said.append(f"{column} {format_duration(value) if isinstance(value, timedelta) else value}")
    return said


def _until(queue: Queue) -> str:
    return "" if queue.resume_at is None else f" until {_when(queue.resume_at)}"


def _when(at: datetime) -> str:
    return at.isoformat(sep=" ", timespec="seconds")


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()
