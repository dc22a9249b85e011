"""The argparse `type=` validators of the management commands; no database."""

from __future__ import annotations

from argparse import ArgumentTypeError
from datetime import timedelta

import pytest
from django.core.management import load_command_class

from switchboard_todos.durations import format_duration
from switchboard_todos.management.cli import duration, plural, positive_int, queue_name


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("3600", timedelta(hours=1)),
        ("0.5", timedelta(milliseconds=500)),
        (" 2D ", timedelta(days=2)),
    ],
)
def test_duration_reads_units_and_plain_seconds(text: str, value: timedelta) -> None:
    """Days, hours, minutes, seconds, or a plain number of seconds."""
    assert duration(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "invalid duration ''"),
        ("3x", "invalid duration '3x'"),
        ("-5m", "invalid duration '-5m'"),
        ("1h30m", "invalid duration '1h30m'"),
        ("0", "must be more than zero"),
        ("0.0d", "must be more than zero"),
        ("9" * 20 + "d", "is too long"),
    ],
)
def test_duration_rejects_anything_else(text: str, message: str) -> None:
    with pytest.raises(ArgumentTypeError, match=message):
        duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(days=30), "30d"),
        (timedelta(hours=36), "36h"),
        (timedelta(minutes=90), "90m"),
        (timedelta(seconds=45), "45s"),
        (timedelta(milliseconds=1500), "1.5s"),
    ],
)
def test_format_duration_writes_what_duration_reads(value: timedelta, text: str) -> None:
    """The largest unit that fits exactly, so the output can be pasted back as an argument."""
    assert format_duration(value) == text
    assert duration(text) == value


def test_positive_int() -> None:
    assert positive_int("7") == 7
    for text, message in [("0", "must be 1 or more"), ("2.5", "is not a whole number")]:
        with pytest.raises(ArgumentTypeError, match=message):
            positive_int(text)


def test_queue_name_is_checked_as_create_todo_checks_it() -> None:
    assert queue_name("mail.high:v2") == "mail.high:v2"
    with pytest.raises(ArgumentTypeError, match="is not a valid queue name"):
        queue_name("-mail")


def test_plural() -> None:
    assert [plural(1, "sweep"), plural(2, "sweep"), plural(0, "batch", "batches")] == [
        "1 sweep",
        "2 sweeps",
        "0 batches",
    ]


@pytest.mark.parametrize(
    ("app", "command", "mentions"),
    [
        (
            "switchboard_todos",
            "reap_todos",
            ["--loop", "--interval SECONDS", "--max-sweeps N", "SIGTERM", "status 1"],
        ),
        (
            "switchboard_todos",
            "purge_todos",
            ["--older-than DURATION", "--include-failed", "--queue QUEUE", "30d"],
        ),
        (
            "switchboard_todos",
            "todo_systemd_units",
            ["--output DIR", "--user USER", "--python PATH", "root"],
        ),
        ("example_project", "demo", ["--port PORT", "--workers N", "--no-seed", "DEBUG off"]),
        (
            "example_project",
            "demo_crash",
            ["--workers N", "--todos N", "--seconds", "--ttl", "SIGKILL", "status 1"],
        ),
    ],
)
def test_help_explains_each_command(app: str, command: str, mentions: list[str]) -> None:
    """`--help` says what the command does and documents every option."""
    text = " ".join(
        load_command_class(app, command).create_parser("manage.py", command).format_help().split()
    )
    for mention in mentions:
        assert mention in text, mention
