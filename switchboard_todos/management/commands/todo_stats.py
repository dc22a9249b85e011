"""`manage.py todo_stats`: the queue health page's numbers, as a table or as JSON."""

from __future__ import annotations

import json
import textwrap
from argparse import ArgumentParser, ArgumentTypeError, RawDescriptionHelpFormatter
from typing import Any

from django.core.management.base import BaseCommand

from switchboard_todos import stats, validation
from switchboard_todos.exceptions import InvalidTodo

COLUMNS = [
    ("queue", "queue"),
    ("ready", "ready"),
    ("scheduled", "waiting"),
    ("claimed", "claimed"),
    ("lease_expired", "expired"),
    ("done_24h", "done 24h"),
    ("dead", "dead"),
    ("oldest_ready", "oldest ready"),
]


def queue_name(value: str) -> str:
    """argparse type: a valid queue name."""
    try:
        return validation.queue(value)
    except InvalidTodo as error:
        raise ArgumentTypeError(str(error)) from error


class Command(BaseCommand):
    help = textwrap.fill(
        "Print each queue's health: todos ready to claim, waiting for a retry, claimed (lease "
        "valid), claimed with an expired lease, done in the last 24 hours, dead letters, and the "
        "age of the oldest ready todo. Cheap enough to run every minute from monitoring."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = RawDescriptionHelpFormatter
        parser.epilog = (
            "examples:\n"
            "  manage.py todo_stats\n"
            "  manage.py todo_stats --queue mail --queue billing\n"
            '  manage.py todo_stats --json   # {"at": ..., "queues": [{"queue": ..., ...}]}'
        )
        return parser

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            type=queue_name,
            dest="queues",
            metavar="QUEUE",
            help="Only this queue; repeat for several. Default: every queue.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print JSON for monitoring; oldest_ready_age is in seconds (null if none ready).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        rows = stats.queue_health(options["queues"])
        if options["json"]:
            report = {
                "at": stats.database_now().isoformat(),
                "queues": [row.as_json() for row in rows],
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        if not rows:
            self.stdout.write("No todos.")
            return
        self.stdout.write(render_table(rows))


def render_table(rows: list[stats.QueueHealth]) -> str:
    """Align the rows under COLUMNS' headings; numbers right-aligned."""
    cells = [[str(getattr(row, name)) or "-" for name, _heading in COLUMNS] for row in rows]
    headings = [heading for _name, heading in COLUMNS]
    widths = [max(len(line[i]) for line in [headings, *cells]) for i in range(len(COLUMNS))]
    lines = []
    for line in [headings, *cells]:
        first, *numbers = line
        lines.append(
            "  ".join(
                [first.ljust(widths[0])]
                + [cell.rjust(width) for cell, width in zip(numbers, widths[1:], strict=True)]
            )
        )
    return "\n".join(lines)
