"""`manage.py todo_stats`: the queue health page's numbers, as a table or as JSON."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from switchboard_todos import stats
from switchboard_todos.management.base import OperatorCommand, add_queue_argument

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


class Command(OperatorCommand):
    help = (
        "Print each queue's health: todos ready to claim, waiting for a retry, claimed (lease "
        "valid), claimed with an expired lease, done in the last 24 hours, dead letters, and the "
        "age of the oldest ready todo. Cheap enough to run every minute from monitoring."
    )

    examples = [
        "manage.py todo_stats",
        "manage.py todo_stats --queue mail --queue billing",
        'manage.py todo_stats --json   # {"at": ..., "queues": [{"queue": ..., ...}]}',
    ]

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_queue_argument(parser, "Only this queue; repeat for several. Default: every queue.")
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
