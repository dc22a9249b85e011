"""Periodic todos: schedules declared in code, each tick enqueued exactly once.

Declare a schedule next to its handler, in a `todo_handlers.py` module:

    @periodic("0 3 * * *", timezone="Europe/Paris", queue="reports")
    @handler("reports.nightly")
    def nightly(todo): ...

or, for todos that agents rather than a Python handler work, in the settings:

    SWITCHBOARD_TODOS_SCHEDULES = {
        "triage": {"cron": "*/15 * * * *", "queue": "agents", "kind": "triage"},
    }

The scheduler (`reap_todos --loop`, or `todo_scheduler`) writes the declarations to the
`todo_schedules` table and, at each pass, enqueues the todos of the ticks that fell due. Each
schedule's row holds the tick it awaits, `next_run_at`; the statement that enqueues a tick's
todo advances it with a compare-and-set in the same statement (`tick_schedule` in
sql/creating.sql), so however many schedulers run, each tick yields exactly one todo, and a done
todo (whose idempotency key is free again) cannot make its tick run twice.

After downtime, or a pause, only the latest missed tick is enqueued; a schedule declared with
`missed="skip"` enqueues none of them, only ticks reached within MISSED_AFTER of their time.
Cron expressions are read by cronsim (five fields, or six with seconds first), in the
schedule's time zone (default: TIME_ZONE), with Debian cron's handling of daylight saving time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router, transaction

from switchboard_todos import handlers, placement, validation
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS

logger = logging.getLogger("switchboard_todos.schedules")

F = TypeVar("F", bound=Callable[..., Any])
Missed = Literal["latest", "skip"]

#: A tick reached later than this after its time is missed: `missed="skip"` drops it.
MISSED_AFTER = timedelta(seconds=60)
#: What a declaration in SWITCHBOARD_TODOS_SCHEDULES may hold besides "cron".
_SETTING_KEYS = frozenset(
    {
        "kind",
        "queue",
        "title",
        "payload",
        "timezone",
        "priority",
        "max_attempts",
        "concurrency_key",
        "missed",
    }
)


@dataclass(frozen=True)
class Schedule:
    """One declared schedule, validated: what its ticks enqueue, and when."""

    name: str
    cron: str
    timezone: str
    queue: str
    kind: str
    title: str
    payload: str  # JSON text, as validation.payload gives it
    priority: int
    max_attempts: int | None
    """None: its queue's default (Queue), else DEFAULT_MAX_ATTEMPTS, read at each pass."""
    concurrency_key: str | None
    missed: Missed

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after `after`."""
        return next(CronSim(self.cron, after.astimezone(ZoneInfo(self.timezone))))

    def latest_tick(self, at: datetime) -> datetime:
        """The last tick at or before `at` (to the second)."""
        local = at.astimezone(ZoneInfo(self.timezone)).replace(microsecond=0)
        return next(CronSim(self.cron, local + timedelta(seconds=1), reverse=True))


_declared: dict[str, Schedule] = {}


def declare(
    name: str,
    cron: str,
    *,
    kind: str,
    queue: str = "default",
    title: str = "",
    payload: Mapping[str, Any] | None = None,
    timezone: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    concurrency_key: str | None = None,
    missed: Missed = "latest",
) -> Schedule:
    """Validate and register a schedule; ImproperlyConfigured names what is wrong."""
    where = f"Schedule {name!r}"
    try:
        checked_name = validation.identifier(name, "schedule name", 200)
        spec = validation.creation(
            {
                "queue": queue,
                "kind": kind,
                "title": title or name,
                "payload": dict(payload or {}),
                "priority": priority,
                "max_attempts": max_attempts,
                "concurrency_key": concurrency_key,
            }
        )
    except InvalidTodo as error:
        raise ImproperlyConfigured(f"{where}: {error}") from None
    zone = timezone or settings.TIME_ZONE or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(f"{where}: unknown time zone {zone!r}.") from None
    if missed not in ("latest", "skip"):
        raise ImproperlyConfigured(f"{where}: missed must be 'latest' or 'skip', not {missed!r}.")
    if not isinstance(cron, str):
        raise ImproperlyConfigured(f"{where}: cron must be a str, not {type(cron).__name__}.")
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=ZoneInfo(zone)))
    except CronSimError as error:
        raise ImproperlyConfigured(f"{where}: bad cron expression {cron!r}: {error}") from None
    schedule = Schedule(
        name=checked_name,
        cron=" ".join(cron.split()),
        timezone=zone,
        queue=spec["queue"],
        kind=spec["kind"],
        title=spec["title"],
        payload=spec["payload"],
        priority=spec["priority"],
        max_attempts=spec["max_attempts"],
        concurrency_key=spec["concurrency_key"],
        missed=missed,
    )
    known = _declared.get(checked_name)
    if known is not None and known != schedule:
        raise ImproperlyConfigured(f"{where} is declared twice, differently.")
    _declared[checked_name] = schedule
    return schedule


def periodic(
    cron: str,
    *,
    name: str | None = None,
    queue: str = "default",
    title: str = "",
    payload: Mapping[str, Any] | None = None,
    timezone: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    concurrency_key: str | None = None,
    missed: Missed = "latest",
) -> Callable[[F], F]:
    """Enqueue a todo for the decorated handler at each tick of `cron`.

    Put it above `@handler(kind)`: the schedule takes the handler's kind, and its name
    (default: the kind) is how the admin and the database know it.
    """

    def register(function: F) -> F:
        kind = handlers.kind_of(function)
        if kind is None:
            raise ImproperlyConfigured(
                f"@periodic on {function.__module__}.{function.__qualname__}: put it above "
                "@handler(kind), which gives the kind of the todos it enqueues."
            )
        declare(
            name or kind,
            cron,
            kind=kind,
            queue=queue,
            title=title,
            payload=payload,
            timezone=timezone,
            priority=priority,
            max_attempts=max_attempts,
            concurrency_key=concurrency_key,
            missed=missed,
        )
        return function

    return register


def declared() -> dict[str, Schedule]:
    """Every schedule: those of @periodic, and those of SWITCHBOARD_TODOS_SCHEDULES."""
    configured = getattr(settings, "SWITCHBOARD_TODOS_SCHEDULES", {})
    if not isinstance(configured, Mapping):
        raise ImproperlyConfigured("SWITCHBOARD_TODOS_SCHEDULES must be a dict of name: schedule.")
    for name, spec in configured.items():
        if not isinstance(spec, Mapping) or "cron" not in spec or "kind" not in spec:
            raise ImproperlyConfigured(
                f"SWITCHBOARD_TODOS_SCHEDULES[{name!r}] must be a dict with 'cron' and 'kind'."
            )
        unknown = set(spec) - _SETTING_KEYS - {"cron"}
        if unknown:
            raise ImproperlyConfigured(
                f"SWITCHBOARD_TODOS_SCHEDULES[{name!r}] has unknown keys: "
                f"{', '.join(sorted(unknown))}."
            )
        options = {key: value for key, value in spec.items() if key != "cron"}
        declare(name, spec["cron"], **options)
    return dict(_declared)


def forget(name: str) -> None:
    """Drop a declaration (tests; a schedule removed from code stays in the table, inert)."""
    _declared.pop(name, None)


@dataclass(frozen=True)
class Pass:
    """What one scheduler pass did."""

    enqueued: int
    skipped: int


def run_due(*, using: str | None = None, now: datetime | None = None) -> Pass:
    """Write the declarations of the queues that live in database `using` (the router's by
    default) to its table, then enqueue every tick due by `now`.

    A schedule lives beside its queue's todos, so that a tick's compare-and-set and its todo
    are one statement. `now` defaults to the database's clock; tests give their own. Safe to
    run anywhere at any time: a tick another scheduler took is left to it.
    """
    from switchboard_todos.models import Todo

    alias = using or router.db_for_write(Todo)
    schedules = {
        name: schedule
        for name, schedule in declared().items()
        if placement.database_for(schedule.queue) == alias
    }
    if not schedules:
        return Pass(0, 0)
    with connections[alias].cursor() as cursor:
        if now is None:
            cursor.execute("SELECT now()")
            (now,) = cursor.fetchone()
        _write_declarations(cursor, schedules.values(), now)
        cursor.execute(DUE, {"names": list(schedules), "now": now})
        due = cursor.fetchall()
    enqueued = skipped = 0
    for name, awaited in due:
        schedule = schedules[name]
        tick = max(schedule.latest_tick(now), awaited)
        late = now - tick > MISSED_AFTER
        enqueue = schedule.missed == "latest" or not late
        with transaction.atomic(using=alias):
            todo = Todo.objects.db_manager(alias).tick_schedule(
                name,
                awaited=awaited,
                tick=tick,
                next_run_at=schedule.next_tick(now),
                enqueue=enqueue,
            )
        if todo is not None:
            enqueued += 1
            logger.info("Schedule %s: enqueued %s for the tick of %s.", name, todo.id, tick)
        elif not enqueue:
            skipped += 1
            logger.info("Schedule %s: skipped the missed tick of %s.", name, tick)
    return Pass(enqueued, skipped)


#: The schedules among `names` whose awaited tick has come: (name, next_run_at).
DUE = """
SELECT name, next_run_at
  FROM todo_schedules
 WHERE name = ANY (%(names)s::text[]) AND NOT paused AND next_run_at <= %(now)s
 ORDER BY next_run_at
"""

#: Write the declarations: a new schedule awaits its first tick after now; a changed cron or
#: time zone starts again from now; `paused` belongs to the operators and is never written. A
#: schedule declared without max_attempts gets its queue's default, as create_todo's todos do
#: (creating.sql, max_attempts_of), read at each pass, so a changed default reaches its next tick.
DECLARE = """
INSERT INTO todo_schedules AS schedule
       (name, cron, timezone, queue, kind, title, payload, priority, max_attempts,
        concurrency_key, missed, next_run_at)
SELECT name, cron, timezone, queue, kind, title, payload, priority,
       coalesce(declared.max_attempts,
                (SELECT settings.max_attempts FROM todo_queues AS settings
                  WHERE settings.name = declared.queue),
                %(default_max_attempts)s::int),
       concurrency_key, missed, next_run_at
  FROM unnest(%(names)s::text[], %(crons)s::text[], %(timezones)s::text[],
              %(queues)s::text[], %(kinds)s::text[], %(titles)s::text[],
              %(payloads)s::jsonb[], %(priorities)s::smallint[], %(max_attempts)s::int[],
              %(concurrency_keys)s::text[], %(missed)s::text[],
              %(next_run_ats)s::timestamptz[])
       AS declared (name, cron, timezone, queue, kind, title, payload, priority, max_attempts,
                    concurrency_key, missed, next_run_at)
ON CONFLICT (name) DO UPDATE
   SET cron = excluded.cron, timezone = excluded.timezone, queue = excluded.queue,
       kind = excluded.kind, title = excluded.title, payload = excluded.payload,
       priority = excluded.priority, max_attempts = excluded.max_attempts,
       concurrency_key = excluded.concurrency_key, missed = excluded.missed,
       next_run_at = CASE WHEN (schedule.cron, schedule.timezone)
                               = (excluded.cron, excluded.timezone)
                          THEN schedule.next_run_at ELSE excluded.next_run_at END,
       updated_at = now()
 WHERE (schedule.cron, schedule.timezone, schedule.queue, schedule.kind, schedule.title,
        schedule.payload, schedule.priority, schedule.max_attempts, schedule.concurrency_key,
        schedule.missed)
       IS DISTINCT FROM
       (excluded.cron, excluded.timezone, excluded.queue, excluded.kind, excluded.title,
        excluded.payload, excluded.priority, excluded.max_attempts, excluded.concurrency_key,
        excluded.missed)
"""


def _write_declarations(cursor: Any, schedules: Any, now: datetime) -> None:
    rows = sorted(schedules, key=lambda schedule: schedule.name)  # one lock order for all
    cursor.execute(
        DECLARE,
        {
            "names": [s.name for s in rows],
            "crons": [s.cron for s in rows],
            "timezones": [s.timezone for s in rows],
            "queues": [s.queue for s in rows],
            "kinds": [s.kind for s in rows],
            "titles": [s.title for s in rows],
            "payloads": [s.payload for s in rows],
            "priorities": [s.priority for s in rows],
            "max_attempts": [s.max_attempts for s in rows],
            "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
            "concurrency_keys": [s.concurrency_key for s in rows],
            "missed": [s.missed for s in rows],
            "next_run_ats": [s.next_tick(now) for s in rows],
        },
    )
