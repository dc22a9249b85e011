"""`manage.py todo_queue`: pause, resume, show and set a queue's settings (queue_settings.py)."""

from __future__ import annotations

import argparse
import json
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.core.management.base import CommandError
from django.utils import timezone

from switchboard_todos import placement, queue_settings, validation
from switchboard_todos.durations import parse_duration
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.management.base import (
    OperatorCommand,
    add_database_argument,
    chosen_databases,
)
from switchboard_todos.management.cli import at_most, duration, queue_name
from switchboard_todos.queue_settings import QueueView, Rate

T = TypeVar("T")

#: What clears a setting back to its default.
NONE = "none"


def clearable(parse: Callable[[str], T]) -> Callable[[str], T | None]:
    """`parse`, or None (clear the setting) for the word `none`."""

    def read(text: str) -> T | None:
        return None if text.strip().lower() == NONE else parse(text)

    read.__name__ = parse.__name__
    return read


def rate(text: str) -> Rate:
    """`N/PERIOD`: at most N claims per PERIOD, in seconds or with a unit (50/10, 100/1m, 5/h)."""
    limit, slash, period = text.partition("/")
    if not slash:
        raise ArgumentTypeError(f"invalid rate {text!r}: write N/PERIOD, as 50/10s or 100/1m")
    try:
        count = int(limit)
    except ValueError:
        raise ArgumentTypeError(f"invalid rate {text!r}: {limit!r} is not a whole number") from None
    period = period.strip()
    if period.lower() in {"s", "m", "h", "d"}:
        period = f"1{period}"
    try:
        return queue_settings.checked_rate(Rate(count, parse_duration(period)))
    except (InvalidTodo, ValueError) as error:
        raise ArgumentTypeError(f"invalid rate {text!r}: {error}") from None


def retention(text: str) -> timedelta:
    """A retention: a plain number of days (30), or with a unit (12h, 90m)."""
    try:
        return parse_duration(text, plain="d")
    except ValueError as error:
        raise ArgumentTypeError(str(error)) from None


def moment(text: str) -> datetime | timedelta:
    """When a pause ends: an ISO 8601 date and time (in TIME_ZONE unless it says its offset),
    or a duration from now (30m, 2h, 1d)."""
    try:
        return parse_duration(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ArgumentTypeError(
            f"invalid time {text!r}: give a date and time (2026-12-24T08:00, with an offset or "
            "in TIME_ZONE) or a duration from now (30m, 2h, 1d)"
        ) from None
    return timezone.make_aware(at) if timezone.is_naive(at) else at


class Command(OperatorCommand):
    help = (
        "Steer a queue. `pause` stops claims taking its todos (the ones held finish), until "
        "`resume` or the --resume-at time; `show` prints its settings and todos (every queue's "
        "without QUEUE); `set` changes its settings, each option alone or together, `none` "
        "clearing one back to its default. A queue without settings has the defaults; pause "
        "and set make its settings row. Changes are logged to switchboard_todos.queues."
    )

    examples = [
        "manage.py todo_queue pause mail",
        "manage.py todo_queue pause mail --resume-at 2h",
        "manage.py todo_queue pause mail --resume-at 2026-12-24T08:00",
        "manage.py todo_queue resume mail",
        "manage.py todo_queue show mail",
        "manage.py todo_queue show --json",
        "manage.py todo_queue set mail --visibility-timeout 5m --max-attempts 3",
        "manage.py todo_queue set mail --rate 50/10s --concurrency 4",
        "manage.py todo_queue set mail --retention 30 --description 'Outgoing mail'",
        "manage.py todo_queue set mail --rate none",
    ]

    def add_arguments(self, parser: ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        pause = actions.add_parser("pause", help="Pause a queue: its todos are not claimed.")
        pause.add_argument("queue", type=queue_name, metavar="QUEUE")
        pause.add_argument(
            "--resume-at",
            type=moment,
            metavar="WHEN",
            help="Resume by itself then: a date and time (2026-12-24T08:00, in TIME_ZONE "
            "unless it gives its offset) or a duration from now (30m, 2h, 1d).",
        )
        resume = actions.add_parser("resume", help="Resume a paused queue.")
        resume.add_argument("queue", type=queue_name, metavar="QUEUE")
        show = actions.add_parser(
            "show", help="Print a queue's settings and todos; every queue's without QUEUE."
        )
        show.add_argument("queue", type=queue_name, metavar="QUEUE", nargs="?")
        show.add_argument("--json", action="store_true", help="Print JSON; durations in seconds.")
        add_database_argument(
            show,
            "Without QUEUE: only this database; repeat for several. Default: every one with todos.",
        )
        configure = actions.add_parser(
            "set", help="Change a queue's settings; `none` clears one back to its default."
        )
        configure.add_argument("queue", type=queue_name, metavar="QUEUE")
        for flag, dest, parse, metavar, help in [
            (
                "--visibility-timeout",
                "visibility_timeout",
                duration,
                "SECONDS",
                "The lease of a claim that gives no ttl (SQS's visibility timeout): seconds "
                "or with a unit (300, 5m); at most 12h. Default: SWITCHBOARD_TODOS_DEFAULT_TTL.",
            ),
            (
                "--max-attempts",
                "max_attempts",
                at_most(validation.MAX_ATTEMPTS_LIMIT),
                "N",
                "Attempts a todo created without max_attempts gets (1 to 1000). Default: 5.",
            ),
            (
                "--rate",
                "rate",
                rate,
                "N/PERIOD",
                "At most N claims per PERIOD, over every worker and agent: 50/10s, 100/1m, 5/h.",
            ),
            (
                "--concurrency",
                "concurrency_limit",
                at_most(queue_settings.MAX_LIMIT),
                "N",
                "At most N of its todos claimed at once, over every worker and agent.",
            ),
            (
                "--retention",
                "retention",
                retention,
                "DAYS",
                "The reaper deletes its done and failed todos completed longer ago: days (30) "
                "or with a unit (12h). Default: kept (purge_todos deletes them).",
            ),
        ]:
            configure.add_argument(
                flag,
                dest=dest,
                type=clearable(parse),
                default=argparse.SUPPRESS,
                metavar=metavar,
                help=f"{help} `none` clears it.",
            )
        configure.add_argument(
            "--description",
            default=argparse.SUPPRESS,
            metavar="TEXT",
            help="What the queue is for; '' clears it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "show":
                self._show(options)
            elif action == "pause":
                self._pause(options["queue"], options["resume_at"])
            elif action == "resume":
                self._resume(options["queue"])
            else:
                self._set(options)
        except InvalidTodo as error:
            raise CommandError(str(error)) from None

    def _pause(self, queue: str, until: datetime | timedelta | None) -> None:
        paused = queue_settings.pause(queue, until=until)
        if paused is None:
            self.stdout.write(f"Queue {queue!r} was paused so already.")
            return
        until_text = "" if paused.resume_at is None else f" until {paused.resume_at.isoformat()}"
        self.stdout.write(
            f"Paused queue {queue!r}{until_text}: claims take none of its todos; the ones held "
            "finish."
        )

    def _resume(self, queue: str) -> None:
        if queue_settings.resume(queue) is None:
            self.stdout.write(f"Queue {queue!r} was not paused.")
        else:
            self.stdout.write(f"Resumed queue {queue!r}: claims take its todos again.")

    def _set(self, options: dict[str, Any]) -> None:
        changes = {name: options[name] for name in queue_settings.SETTINGS if name in options}
        if not changes:
            raise CommandError(
                "Nothing to set: give --visibility-timeout, --max-attempts, --rate, "
                "--concurrency, --retention or --description."
            )
        queue = options["queue"]
        queue_settings.configure(queue, **changes)
        self.stdout.write(f"Updated queue {queue!r}.")
        self._write_view(queue_settings.overview([queue], using=placement.database_for(queue))[0])

    def _show(self, options: dict[str, Any]) -> None:
        queue: str | None = options["queue"]
        if queue is not None and options["databases"]:
            raise CommandError("--database only applies without QUEUE: a queue has one database.")
        if queue is not None:
            view = queue_settings.overview([queue], using=placement.database_for(queue))[0]
            if options["json"]:
                self.stdout.write(json.dumps(view.as_json(), indent=2))
            else:
                self._write_view(view)
            return
        views = [
            view
            for alias in chosen_databases(options)
            for view in queue_settings.overview(using=alias)
        ]
        if options["json"]:
            self.stdout.write(json.dumps({"queues": [v.as_json() for v in views]}, indent=2))
            return
        if not views:
            self.stdout.write("No queues: none has settings or todos.")
        for number, view in enumerate(views):
            if number:
                self.stdout.write("")
            self._write_view(view)

    def _write_view(self, view: QueueView) -> None:
        for label, value in render(view):
            self.stdout.write(f"{label:<19} {value}")


def render(view: QueueView) -> list[tuple[str, str]]:
    """A queue's lines for people: label, value."""
    settings = "" if view.configured else " (no settings: the defaults)"
    return [
        ("queue", f"{view.name} (database {view.database}){settings}"),
        ("description", view.settings.description or "-"),
        ("state", view.pause_text),
        ("todos", view.todos_text),
        ("lease without ttl", view.lease_text),
        ("max attempts", view.max_attempts_text),
        ("rate limit", view.rate_text),
        ("concurrency limit", view.concurrency_text),
        ("retention", view.retention_text),
    ]
