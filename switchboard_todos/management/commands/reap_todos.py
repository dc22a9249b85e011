"""`manage.py reap_todos`: requeue expired leases, once (a timer) or in a loop (a service)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from switchboard_todos import handlers
from switchboard_todos.management.base import add_database_argument, chosen_databases
from switchboard_todos.management.cli import duration, plural, positive_int
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.upkeep.reaper import Reaper, ReaperError

DEFAULT_INTERVAL = 10.0


class Command(BaseCommand):
    #: What the sweeps do: todo_scheduler subclasses this command with reaping off.
    reaping = True
    default_interval = DEFAULT_INTERVAL
    doing = "Reaping lapsed leases"
    help = (
        "Requeue every claimed todo whose lease has expired, or dead-letter it when it has no "
        "attempt left. Runs one sweep and exits (for a systemd timer or cron); with --loop it "
        "sweeps every --interval until SIGTERM or SIGINT, which stop it between sweeps with "
        "exit status 0. Any number of reapers may run at once: each skips the rows another "
        "is reaping. Exits with status 1 and a one-line message when the first sweep cannot "
        "reach the database; in --loop mode a database lost later is retried with backoff. "
        "Each sweep also enqueues the periodic todos that fell due, when schedules are "
        "declared (@periodic, SWITCHBOARD_TODOS_SCHEDULES), unless --no-schedules."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Keep sweeping every --interval until SIGTERM or SIGINT (a long-running service).",
        )
        parser.add_argument(
            "--interval",
            type=duration,
            default=None,
            metavar="SECONDS",
            help=(
                f"With --loop: time between sweeps, in seconds or with a unit (30s, 5m); "
                f"default {self.default_interval:g}. An expired lease or a tick waits at most "
                "this long."
            ),
        )
        parser.add_argument(
            "--max-sweeps",
            type=positive_int,
            default=None,
            metavar="N",
            help="With --loop: stop after N sweeps (for tests, or to recycle the process).",
        )
        add_database_argument(
            parser,
            "Sweep this database; repeat for several. Default: every database that holds the "
            "todos table (one reaper serves them all).",
        )
        if not self.reaping:
            return
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="Do not enqueue periodic todos (when todo_scheduler runs them instead).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        loop: bool = options["loop"]
        if not loop:
            for option in ("interval", "max_sweeps"):
                if options[option] is not None:
                    flag = "--" + option.replace("_", "-")
                    raise CommandError(f"{flag} only applies with --loop.")
        interval = options["interval"]
        seconds = self.default_interval if interval is None else interval.total_seconds()
        verbosity: int = options["verbosity"]
        handlers.autodiscover()
        databases = chosen_databases(options)
        with Shutdown() as shutdown:
            try:
                reaper = Reaper(
                    databases=databases,
                    reaping=self.reaping,
                    scheduling=self._scheduling(options),
                    interval=seconds,
                    shutdown=shutdown,
                    max_sweeps=options["max_sweeps"] if loop else 1,
                    report=self.stdout.write if verbosity >= 1 else lambda line: None,
                    report_idle=not loop or verbosity >= 2,
                )
            except ImproperlyConfigured as error:
                raise CommandError(str(error)) from error
            if loop and verbosity >= 1:
                self.stdout.write(f"{self.doing} every {seconds:g} s until SIGTERM or SIGINT.")
            try:
                totals = reaper.run()
            except ReaperError as error:
                raise CommandError(str(error)) from error
            if loop and verbosity >= 1:
                why = f"on {shutdown.signal.name}" if shutdown.signal else "at --max-sweeps"
                self.stdout.write(
                    f"Stopped {why} after {plural(totals.sweeps, 'sweep')} "
                    f"({totals.failed_sweeps} failed): "
                    f"{reaper.describe(totals)} in total."
                )

    def _scheduling(self, options: dict[str, Any]) -> bool | None:
        """Whether sweeps run the schedules; None: when any is declared."""
        if not self.reaping:
            return True
        return False if options["no_schedules"] else None
