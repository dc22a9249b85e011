"""A queue's settings (queue_settings.py) and `manage.py todo_queue`: set, pause, resume, show."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import F
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from switchboard_todos import queue_settings
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import Queue, State
from switchboard_todos.queue_settings import Rate
from tests.helpers import MakeTodo, db_now

pytestmark = pytest.mark.django_db


def todo_queue(*args: str) -> str:
    out = StringIO()
    call_command("todo_queue", *args, stdout=out)
    return out.getvalue()


def row(name: str) -> dict[str, Any]:
    return dict(Queue.objects.filter(pk=name).values().get())


# Setting


def test_configure_makes_the_row_with_what_it_sets_and_the_defaults_for_the_rest() -> None:
    queue = queue_settings.configure("mail", max_attempts=3, retention=timedelta(days=30))
    assert (queue.name, queue.max_attempts, queue.retention) == ("mail", 3, timedelta(days=30))
    assert queue == Queue.objects.get(pk="mail")
    stored = row("mail")
    assert (stored["description"], stored["paused"], stored["visibility_timeout"]) == (
        "",
        False,
        None,
    )
    assert (stored["rate_limit"], stored["concurrency_limit"], stored["rate_count"]) == (
        None,
        None,
        0,
    )


def test_configure_sets_only_what_it_names_and_none_clears() -> None:
    """Each call leaves the other settings as they were; None is the default again."""
    queue_settings.configure("mail", visibility_timeout=300, rate=Rate(50, timedelta(seconds=10)))
    queue_settings.configure("mail", concurrency_limit=4, description="Outgoing mail")
    stored = row("mail")
    assert stored["visibility_timeout"] == timedelta(minutes=5)
    assert (stored["rate_limit"], stored["rate_period"]) == (50, timedelta(seconds=10))
    assert (stored["concurrency_limit"], stored["description"]) == (4, "Outgoing mail")
    queue_settings.configure("mail", rate=None, description=None, visibility_timeout=None)
    stored = row("mail")
    assert (stored["rate_limit"], stored["rate_period"], stored["visibility_timeout"]) == (
        None,
        None,
        None,
    )
    assert (stored["concurrency_limit"], stored["description"]) == (4, "")


def test_configure_never_writes_the_claims_rate_counters() -> None:
    """The claim counts its window in the row: an operator's change must not reset it."""
    queue_settings.configure("mail", rate=Rate(50, timedelta(seconds=10)))
    Queue.objects.filter(pk="mail").update(rate_window=Now(), rate_count=17)
    window = row("mail")["rate_window"]
    queue_settings.configure("mail", rate=Rate(20, timedelta(seconds=10)), max_attempts=2)
    queue_settings.pause("mail")
    queue_settings.resume("mail")
    assert (row("mail")["rate_window"], row("mail")["rate_count"]) == (window, 17)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "nothing to set on queue 'mail'"),
        ({"colour": "red"}, "unknown queue settings: 'colour'"),
        ({"max_attempts": 0}, "max_attempts must be between 1 and 1000"),
        ({"max_attempts": 1001}, "max_attempts must be between 1 and 1000"),
        ({"visibility_timeout": 0}, "visibility_timeout must be more than zero"),
        ({"visibility_timeout": timedelta(hours=13)}, "visibility_timeout must be at most"),
        ({"concurrency_limit": 0}, "concurrency_limit must be between 1"),
        ({"retention": -1}, "retention must be more than zero"),
        ({"rate": 50}, "rate must be a Rate"),
        ({"rate": Rate(0, timedelta(seconds=1))}, "rate limit must be between 1"),
        ({"rate": Rate(5, timedelta(0))}, "rate period must be more than zero"),
        ({"rate": Rate(5, timedelta(days=40))}, "rate period must be at most"),
        ({"description": "a\x00b"}, "description must not contain NUL"),
        ({"description": 5}, "description must be a str"),
    ],
)
def test_configure_refuses_bad_settings_before_writing(
    changes: dict[str, Any], message: str
) -> None:
    with CaptureQueriesContext(connection) as captured, pytest.raises(InvalidTodo, match=message):
        queue_settings.configure("mail", **changes)
    assert len(captured) == 0


def test_configure_refuses_a_bad_queue_name() -> None:
    with pytest.raises(InvalidTodo, match="is not a valid queue name"):
        queue_settings.configure("no spaces", max_attempts=2)


# Pausing


def test_pause_and_resume() -> None:
    """Pause makes the row; a second pause or a resume of a running queue changes nothing."""
    paused = queue_settings.pause("mail")
    assert paused is not None and (paused.paused, paused.resume_at) == (True, None)
    assert queue_settings.pause("mail") is None
    resumed = queue_settings.resume("mail")
    assert resumed is not None and (resumed.paused, resumed.resume_at) == (False, None)
    assert queue_settings.resume("mail") is None


def test_resuming_a_queue_without_settings_makes_no_row() -> None:
    assert queue_settings.resume("mail") is None
    assert not Queue.objects.exists()


def test_pause_until_a_time_or_for_a_while_by_the_database_clock() -> None:
    now = db_now()
    paused = queue_settings.pause("mail", until=timedelta(hours=2))
    assert paused is not None and paused.resume_at == now + timedelta(hours=2)
    later = now + timedelta(days=1)
    paused = queue_settings.pause("mail", until=later)
    assert paused is not None and paused.resume_at == later
    assert queue_settings.pause("mail", until=later) is None
    paused = queue_settings.pause("mail")  # until resumed: no resume time
    assert paused is not None and paused.resume_at is None


def test_pause_until_a_time_that_has_passed_is_refused() -> None:
    with pytest.raises(InvalidTodo, match="has passed"):
        queue_settings.pause("mail", until=db_now() - timedelta(seconds=1))
    assert not Queue.objects.exists()


# What the operator sees


def test_overview_lists_queues_with_settings_or_todos(make_todo: MakeTodo) -> None:
    """A queue with todos but no row shows the defaults; one with a row and no todos, its own."""
    make_todo(queue="mail")
    make_todo(queue="mail", state=State.FAILED)
    make_todo(queue="mail", next_retry_in=timedelta(minutes=5))
    queue_settings.configure("billing", concurrency_limit=2)
    queue_settings.pause("billing")
    mail, billing = sorted(queue_settings.overview(), key=lambda view: view.name, reverse=True)
    assert (mail.name, mail.configured, mail.paused_now, mail.depth) == ("mail", False, False, 2)
    assert mail.health is not None and mail.health.dead == 1
    assert (mail.lease_text, mail.max_attempts_text, mail.rate_text) == (
        "30s (default)",
        "5 (default)",
        "none",
    )
    assert (billing.configured, billing.paused_now, billing.health, billing.depth) == (
        True,
        True,
        None,
        0,
    )
    assert (billing.pause_text, billing.concurrency_text) == ("paused", "2")


def test_a_pause_whose_time_has_come_shows_as_running() -> None:
    queue_settings.pause("mail", until=timedelta(minutes=1))
    Queue.objects.filter(pk="mail").update(resume_at=F("resume_at") - timedelta(minutes=2))
    (view,) = queue_settings.overview()
    assert not view.paused_now
    assert view.pause_text.startswith("running (resumed by itself at ")


# manage.py todo_queue


def test_todo_queue_set_each_option_alone_then_none_clears_it() -> None:
    for args, column, value in [
        (["--visibility-timeout", "5m"], "visibility_timeout", timedelta(minutes=5)),
        (["--visibility-timeout", "90"], "visibility_timeout", timedelta(seconds=90)),
        (["--max-attempts", "3"], "max_attempts", 3),
        (["--rate", "50/10s"], "rate_limit", 50),
        (["--concurrency", "4"], "concurrency_limit", 4),
        (["--retention", "30"], "retention", timedelta(days=30)),
        (["--retention", "12h"], "retention", timedelta(hours=12)),
        (["--description", "Outgoing mail"], "description", "Outgoing mail"),
    ]:
        out = todo_queue("set", "mail", *args)
        assert out.startswith("Updated queue 'mail'.\n"), out
        assert row("mail")[column] == value
    stored = row("mail")
    assert stored["rate_period"] == timedelta(seconds=10)
    for flag in (
        "--visibility-timeout",
        "--max-attempts",
        "--rate",
        "--concurrency",
        "--retention",
    ):
        todo_queue("set", "mail", flag, "none")
    todo_queue("set", "mail", "--description", "")
    stored = row("mail")
    cleared = ["visibility_timeout", "max_attempts", "rate_limit", "rate_period"]
    cleared += ["concurrency_limit", "retention"]
    assert [stored[name] for name in cleared] == [None] * len(cleared)
    assert stored["description"] == ""


@pytest.mark.parametrize(
    ("text", "limit", "period"),
    [
        ("50/10", 50, timedelta(seconds=10)),
        ("100/1m", 100, timedelta(minutes=1)),
        ("5/h", 5, timedelta(hours=1)),
        (" 7/2d", 7, timedelta(days=2)),
    ],
)
def test_todo_queue_set_rate_forms(text: str, limit: int, period: timedelta) -> None:
    todo_queue("set", "mail", "--rate", text)
    assert (row("mail")["rate_limit"], row("mail")["rate_period"]) == (limit, period)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set", "mail"], "Nothing to set: give --visibility-timeout"),
        (["set", "mail", "--rate", "50"], "argument --rate: invalid rate '50': write N/PERIOD"),
        (["set", "mail", "--rate", "x/10"], "'x' is not a whole number"),
        (["set", "mail", "--rate", "0/10"], "rate limit must be between 1"),
        (["set", "mail", "--rate", "5/40d"], "rate period must be at most"),
        (["set", "mail", "--max-attempts", "0"], "argument --max-attempts: '0' must be 1 or more"),
        (["set", "mail", "--max-attempts", "1001"], "must be 1000 or less"),
        (["set", "mail", "--visibility-timeout", "13h"], "visibility_timeout must be at most"),
        (["set", "mail", "--visibility-timeout", "soon"], "invalid duration 'soon'"),
        (["set", "mail", "--retention", "0"], "must be more than zero"),
        (["set", "mail", "--concurrency", "-1"], "argument --concurrency"),
        (["set", "mail box", "--concurrency", "1"], "is not a valid queue name"),
        (["pause", "mail", "--resume-at", "tomorrow"], "invalid time 'tomorrow'"),
        (["pause", "mail", "--resume-at", "2000-01-01T00:00"], "has passed"),
        (["show", "mail", "--database", "nowhere"], "only applies without QUEUE"),
    ],
)
def test_todo_queue_refuses_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        todo_queue(*args)
    assert not Queue.objects.exists()


def test_todo_queue_pause_resume_and_show(make_todo: MakeTodo) -> None:
    make_todo(queue="mail")
    out = todo_queue("pause", "mail")
    assert out == ("Paused queue 'mail': claims take none of its todos; the ones held finish.\n")
    assert todo_queue("pause", "mail") == "Queue 'mail' was paused so already.\n"
    shown = todo_queue("show", "mail").splitlines()
    assert shown[0] == "queue               mail (database default)"
    assert shown[2] == "state               paused"
    assert shown[3].startswith(
        "todos               1 pending (1 ready, 0 waiting), 0 claimed, 0 lease expired, "
        "0 dead letters; oldest ready "
    )
    assert todo_queue("resume", "mail") == ("Resumed queue 'mail': claims take its todos again.\n")
    assert todo_queue("resume", "mail") == "Queue 'mail' was not paused.\n"
    out = todo_queue("pause", "mail", "--resume-at", "2h")
    assert out.startswith("Paused queue 'mail' until ")
    assert row("mail")["resume_at"] == db_now() + timedelta(hours=2)
    todo_queue("pause", "mail", "--resume-at", "2999-01-01T08:00")
    assert row("mail")["resume_at"].isoformat() == "2999-01-01T08:00:00+00:00"  # TIME_ZONE UTC


def test_todo_queue_show_a_queue_without_settings(db: None) -> None:
    shown = todo_queue("show", "mail")
    assert shown.splitlines() == [
        "queue               mail (database default) (no settings: the defaults)",
        "description         -",
        "state               running",
        "todos               none",
        "lease without ttl   30s (default)",
        "max attempts        5 (default)",
        "rate limit          none",
        "concurrency limit   none",
        "retention           kept (none)",
    ]
    assert not Queue.objects.exists()


def test_todo_queue_show_json(make_todo: MakeTodo) -> None:
    make_todo(queue="mail")
    queue_settings.configure(
        "billing", rate=Rate(50, timedelta(seconds=10)), retention=timedelta(days=7)
    )
    one = json.loads(todo_queue("show", "billing", "--json"))
    assert one["queue"] == "billing" and one["configured"] is True
    assert (one["rate_limit"], one["rate_period"], one["retention"]) == (50, 10.0, 604800.0)
    assert one["defaults"] == {"visibility_timeout": 30.0, "max_attempts": 5}
    assert one["todos"] is None and one["paused"] is False
    every = json.loads(todo_queue("show", "--json"))
    assert [(q["queue"], q["configured"]) for q in every["queues"]] == [
        ("billing", True),
        ("mail", False),
    ]
    assert every["queues"][1]["todos"]["ready"] == 1
    text = todo_queue("show")
    assert "queue               billing (database default)" in text
    assert "queue               mail (database default) (no settings: the defaults)" in text
