"""Periodic todos: declarations, exactly one todo per tick, missed ticks, pausing, the commands.

Every pass is given its `now`, a controlled clock: nothing here waits for a tick to come.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import LogEntry
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from switchboard_todos import handlers, schedules, signals
from switchboard_todos.models import Schedule, State, Todo
from switchboard_todos.schedules import periodic, run_due
from tests.conftest import run_in_threads

T0 = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
committed = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hourly() -> Iterator[schedules.Schedule]:
    """An hourly schedule, declared from one minute before T0: its first tick is T0."""
    schedule = schedules.declare(
        "hourly-report",
        "0 * * * *",
        kind="reports.hourly",
        queue="reports",
        payload={"scope": "all"},
        priority=5,
        timezone="UTC",
    )
    yield schedule
    schedules.forget(schedule.name)


def enqueued(name: str = "hourly-report") -> list[Todo]:
    return list(Todo.objects.filter(source="schedule", title=name).order_by("created_at"))


def row(name: str = "hourly-report") -> Schedule:
    return Schedule.objects.get(name=name)


# Ticks


def test_ticks_follow_the_schedule_time_zone_across_daylight_saving() -> None:
    """03:00 in Paris is 02:00 UTC in winter and 01:00 UTC once summer time begins."""
    schedule = schedules.declare("paris", "0 3 * * *", kind="k", timezone="Europe/Paris")
    try:
        winter = schedule.next_tick(datetime(2026, 3, 27, 12, 0, tzinfo=UTC))
        summer = schedule.next_tick(winter)
        assert winter.astimezone(UTC) == datetime(2026, 3, 28, 2, 0, tzinfo=UTC)
        assert summer.astimezone(UTC) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
        assert summer.tzinfo == ZoneInfo("Europe/Paris")
        assert schedule.latest_tick(summer) == summer
        assert schedule.latest_tick(summer - timedelta(seconds=1)) == winter
    finally:
        schedules.forget("paris")


@pytest.mark.django_db
def test_a_tick_enqueues_one_todo_and_never_again_even_once_done(
    hourly: schedules.Schedule,
) -> None:
    assert run_due(now=T0 - timedelta(minutes=1)) == schedules.Pass(0, 0)
    assert row().next_run_at == T0
    assert run_due(now=T0 + timedelta(seconds=5)) == schedules.Pass(1, 0)
    [todo] = enqueued()
    assert (todo.queue, todo.kind, todo.payload, todo.priority, todo.state) == (
        "reports",
        "reports.hourly",
        {"scope": "all"},
        5,
        State.PENDING,
    )
    assert todo.idempotency_key == f"schedule:hourly-report@{T0.isoformat()}"
    assert (row().next_run_at, row().last_tick_at, row().last_todo_id) == (T0 + HOUR, T0, todo.id)
    assert run_due(now=T0 + timedelta(seconds=6)) == schedules.Pass(0, 0)
    # Done, its idempotency key is free again: the durable record still holds the tick.
    Todo.objects.claim(todo.id, "w", 30)
    Todo.objects.complete(todo.id, "w")
    assert run_due(now=T0 + timedelta(seconds=7)) == schedules.Pass(0, 0)
    assert len(enqueued()) == 1
    assert run_due(now=T0 + HOUR) == schedules.Pass(1, 0)
    assert len(enqueued()) == 2


@pytest.mark.django_db
def test_the_todo_of_a_tick_is_announced_as_created(hourly: schedules.Schedule) -> None:
    created: list[Todo] = []

    def receiver(sender: type[Todo], todos: list[Todo], **kwargs: object) -> None:
        created.extend(todos)

    signals.todo_created.connect(receiver)
    try:
        run_due(now=T0 - timedelta(minutes=1))
        run_due(now=T0)
    finally:
        signals.todo_created.disconnect(receiver)
    assert [todo.id for todo in created] == [todo.id for todo in enqueued()]


@pytest.mark.django_db
def test_a_scheduler_that_read_a_tick_late_cannot_take_it_again(
    hourly: schedules.Schedule,
) -> None:
    """One scheduler read the tick as due, another took it and its todo is already done: the
    compare-and-set refuses the first, though the tick's idempotency key is free again."""
    run_due(now=T0 - timedelta(minutes=1))
    tick = partial(
        Todo.objects.tick_schedule, "hourly-report", awaited=T0, tick=T0, next_run_at=T0 + HOUR
    )
    todo = tick()
    assert todo is not None
    Todo.objects.claim(todo.id, "w", 30)
    Todo.objects.complete(todo.id, "w")
    assert tick() is None
    assert len(enqueued()) == 1


def pass_at(tick: datetime, index: int) -> schedules.Pass:
    return run_due(now=tick + timedelta(seconds=index))


@committed
def test_schedulers_racing_take_each_tick_exactly_once(hourly: schedules.Schedule) -> None:
    """Four schedulers on their own connections, at each of 25 ticks: one todo per tick."""
    run_due(now=T0 - timedelta(minutes=1))
    ticks = [T0 + n * HOUR for n in range(25)]
    for tick in ticks:
        passes = run_in_threads(4, partial(pass_at, tick))
        assert sum(result.enqueued for result in passes) == 1
    keys = [todo.idempotency_key for todo in enqueued()]
    assert keys == [f"schedule:hourly-report@{tick.isoformat()}" for tick in ticks]


# Missed ticks, pausing


@pytest.mark.django_db
def test_after_downtime_only_the_latest_missed_tick_is_enqueued(
    hourly: schedules.Schedule,
) -> None:
    run_due(now=T0 - timedelta(minutes=1))
    assert run_due(now=T0 + 5 * HOUR + timedelta(minutes=20)) == schedules.Pass(1, 0)
    [todo] = enqueued()
    assert todo.idempotency_key == f"schedule:hourly-report@{(T0 + 5 * HOUR).isoformat()}"
    assert row().next_run_at == T0 + 6 * HOUR


@pytest.mark.django_db
def test_skip_enqueues_no_missed_tick_but_an_on_time_one() -> None:
    schedules.declare("skipper", "0 * * * *", kind="k", timezone="UTC", missed="skip")
    try:
        run_due(now=T0 - timedelta(minutes=1))
        assert run_due(now=T0 + 5 * HOUR + timedelta(minutes=20)) == schedules.Pass(0, 1)
        assert enqueued("skipper") == []
        assert row("skipper").next_run_at == T0 + 6 * HOUR
        # Within MISSED_AFTER of its time, a tick is on time, not missed.
        assert run_due(now=T0 + 6 * HOUR + schedules.MISSED_AFTER) == schedules.Pass(1, 0)
    finally:
        schedules.forget("skipper")


@pytest.mark.django_db
def test_a_paused_schedule_enqueues_nothing_and_resumes_at_the_latest_tick(
    hourly: schedules.Schedule,
) -> None:
    run_due(now=T0 - timedelta(minutes=1))
    Schedule.objects.filter(name="hourly-report").update(paused=True)
    assert run_due(now=T0 + 3 * HOUR) == schedules.Pass(0, 0)
    assert enqueued() == []
    Schedule.objects.filter(name="hourly-report").update(paused=False)
    assert run_due(now=T0 + 3 * HOUR + timedelta(seconds=30)) == schedules.Pass(1, 0)
    assert row().next_run_at == T0 + 4 * HOUR


# Declarations


@pytest.mark.django_db
def test_a_changed_cron_starts_again_from_now_and_other_changes_keep_the_tick() -> None:
    schedules.declare("changing", "0 * * * *", kind="k", timezone="UTC")
    try:
        run_due(now=T0 - timedelta(minutes=1))
        schedules.forget("changing")
        schedules.declare("changing", "0 * * * *", kind="k", timezone="UTC", payload={"v": 2})
        run_due(now=T0 - timedelta(seconds=30))
        assert (row("changing").next_run_at, row("changing").payload) == (T0, {"v": 2})
        schedules.forget("changing")
        schedules.declare("changing", "30 * * * *", kind="k", timezone="UTC")
        run_due(now=T0 - timedelta(seconds=20))
        assert row("changing").next_run_at == T0 - timedelta(minutes=30) + HOUR
    finally:
        schedules.forget("changing")


def test_periodic_goes_above_handler_and_takes_its_kind() -> None:
    @periodic("*/5 * * * *", queue="digests", payload={"n": 1}, timezone="UTC")
    @handlers.handler("test.periodic-digest")
    def digest(todo: Todo) -> None:
        """A handler with a schedule."""

    try:
        schedule = schedules.declared()["test.periodic-digest"]
        assert (schedule.cron, schedule.queue, schedule.kind) == (
            "*/5 * * * *",
            "digests",
            "test.periodic-digest",
        )
    finally:
        schedules.forget("test.periodic-digest")

    def unregistered(todo: Todo) -> None:
        """No @handler below."""

    with pytest.raises(ImproperlyConfigured, match=r"put it above @handler\(kind\)"):
        periodic("* * * * *")(unregistered)


@pytest.mark.parametrize(
    ("cron", "options", "message"),
    [
        ("61 * * * *", {}, "bad cron expression '61 \\* \\* \\* \\*'"),
        ("* * *", {}, "Wrong number of fields"),
        ("* * * * *", {"timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ("* * * * *", {"queue": ""}, "queue"),
        ("* * * * *", {"priority": 101}, "priority"),
        ("* * * * *", {"missed": "all"}, "missed must be 'latest' or 'skip'"),
    ],
)
def test_bad_declarations_say_what_is_wrong(
    cron: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        schedules.declare("bad", cron, kind="k", **options)  # type: ignore[arg-type]
    assert "bad" not in schedules.declared()


def test_schedules_come_from_the_setting_too(settings: object) -> None:
    settings.SWITCHBOARD_TODOS_SCHEDULES = {  # type: ignore[attr-defined]
        "triage": {"cron": "*/15 * * * *", "queue": "agents", "kind": "triage"}
    }
    try:
        assert schedules.declared()["triage"].queue == "agents"
    finally:
        schedules.forget("triage")
    settings.SWITCHBOARD_TODOS_SCHEDULES = {"x": {"cron": "* * * * *", "kind": "k", "q": 1}}  # type: ignore[attr-defined]
    with pytest.raises(ImproperlyConfigured, match="unknown keys: q"):
        schedules.declared()


# The commands


def _due_by_the_database_clock(name: str) -> None:
    """Make the schedule's awaited tick one an hour ago, by the database's clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE todo_schedules SET next_run_at = date_trunc('hour', now()) - interval '1 hour'"
            " WHERE name = %s",
            [name],
        )


@committed
def test_todo_scheduler_and_reap_todos_enqueue_what_fell_due(hourly: schedules.Schedule) -> None:
    run_due()
    _due_by_the_database_clock("hourly-report")
    out = StringIO()
    call_command("todo_scheduler", stdout=out)
    assert out.getvalue() == "Scheduled: 1 scheduled todo enqueued.\n"
    # Rewound by hand to the tick it took: a fresh todo only once the first is gone.
    Todo.objects.filter(source="schedule").delete()
    _due_by_the_database_clock("hourly-report")
    out = StringIO()
    call_command("reap_todos", stdout=out)
    assert out.getvalue() == (
        "Reaped lapsed leases: 0 requeued, 0 dead-lettered; 1 scheduled todo enqueued.\n"
    )
    _due_by_the_database_clock("hourly-report")
    Todo.objects.filter(source="schedule").delete()
    call_command("reap_todos", "--no-schedules", stdout=StringIO())
    assert enqueued() == []


def test_a_bad_setting_stops_the_scheduler_with_a_one_line_error(settings: object) -> None:
    settings.SWITCHBOARD_TODOS_SCHEDULES = {"x": {"cron": "nope", "kind": "k"}}  # type: ignore[attr-defined]
    with pytest.raises(CommandError, match="Schedule 'x': bad cron expression 'nope'"):
        call_command("todo_scheduler", stdout=StringIO())


# The admin


@pytest.mark.django_db
def test_the_admin_lists_schedules_and_pauses_them_on_the_record(
    admin_client: Client, hourly: schedules.Schedule
) -> None:
    run_due(now=T0 - timedelta(minutes=1))
    run_due(now=T0)
    todo = enqueued()[0]
    page = admin_client.get("/admin/switchboard_todos/schedule/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "0 * * * * (At the start of every hour)" in text
    assert todo.id in text
    response = admin_client.post(
        "/admin/switchboard_todos/schedule/",
        {"action": "pause_selected", "_selected_action": ["hourly-report"]},
        follow=True,
    )
    assert "Paused 1 schedule." in response.content.decode()
    assert row().paused
    assert [entry.get_change_message() for entry in LogEntry.objects.all()] == ["Paused."]


@pytest.mark.django_db
def test_saving_the_pause_switch_leaves_the_awaited_tick_alone(
    admin_client: Client, hourly: schedules.Schedule
) -> None:
    """The change form writes `paused` only: a scheduler may have advanced the tick meanwhile."""
    run_due(now=T0 - timedelta(minutes=1))
    page = admin_client.get("/admin/switchboard_todos/schedule/hourly-report/change/")
    assert page.status_code == 200
    run_due(now=T0)  # the tick advances while the operator looks at the form
    response = admin_client.post(
        "/admin/switchboard_todos/schedule/hourly-report/change/", {"paused": "on"}
    )
    assert response.status_code == 302
    assert (row().paused, row().next_run_at) == (True, T0 + HOUR)
