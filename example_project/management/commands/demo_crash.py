"""`manage.py demo_crash`: SIGKILL a worker mid-todo and watch nothing get lost (docs/demo.md)."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.processes import Console
from example_project.crash import CrashDemo
from switchboard_todos.management.cli import duration, positive_int


class Command(BaseCommand):
    help = (
        "Start several workers and a reaper with a short lease, enqueue a few slow todos, "
        "kill one worker with SIGKILL while it runs one, and print the timeline as its lease "
        "expires and another worker completes the todo; end with a summary. Leaves nothing "
        "running. Exits with status 1 unless every todo was done."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers", type=positive_int, default=3, metavar="N", help="Workers (3)."
        )
        parser.add_argument(
            "--todos", type=positive_int, default=6, metavar="N", help="Slow todos (6)."
        )
        parser.add_argument(
            "--seconds",
            type=duration,
            default=None,
            help="How long each todo takes (2 s).",
        )
        parser.add_argument("--ttl", type=duration, default=None, help="The workers' lease (3 s).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["workers"] < 2:
            raise CommandError("--workers must be 2 or more: one is killed, another finishes.")
        seconds = options["seconds"]
        ttl = options["ttl"]
        demo = CrashDemo(
            Console(sys.stdout),
            workers=options["workers"],
            todos=options["todos"],
            seconds=2.0 if seconds is None else seconds.total_seconds(),
            ttl=3.0 if ttl is None else ttl.total_seconds(),
        )
        if not demo.run():
            raise CommandError("Not every todo was done, or a process did not stop; see above.")
