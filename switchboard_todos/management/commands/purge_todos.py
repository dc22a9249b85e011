"""`manage.py purge_todos`: retention for finished todos, in batches that hold no long locks."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from switchboard_todos.durations import format_duration
from switchboard_todos.management.base import add_database_argument, chosen_databases
from switchboard_todos.management.cli import duration, plural, positive_int, queue_name
from switchboard_todos.upkeep.retention import MAX_BATCH_SIZE, Purged, count_purgeable, purge


class Command(BaseCommand):
    help = (
        "Delete done todos whose completed_at is older than --older-than (and dead-lettered "
        "ones too with --include-failed), in batches of --batch-size, each its own short "
        "transaction that skips rows other sessions hold. Pending and claimed todos are never "
        "deleted. --dry-run prints what would be deleted, per queue and state."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration,
            required=True,
            metavar="DURATION",
            help=("Delete todos completed longer ago than this: 30d, 12h, 90m, 45s, or seconds."),
        )
        parser.add_argument(
            "--include-failed",
            action="store_true",
            help="Also delete dead-lettered (failed) todos; by default they are kept.",
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=queue_name,
            metavar="QUEUE",
            help="Only purge this queue; repeat for several. Default: every queue.",
        )
        add_database_argument(
            parser,
            "Only purge this database; repeat for several. Default: every database that holds "
            "the todos table.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            metavar="N",
            help=f"Todos deleted per transaction (1 to {MAX_BATCH_SIZE}); default 1000.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Print what would be deleted, per queue and state, and delete nothing.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity: int = options["verbosity"]
        batch_size: int = options["batch_size"]
        if batch_size > MAX_BATCH_SIZE:
            raise CommandError(
                f"--batch-size {batch_size} is too large: at most {MAX_BATCH_SIZE}, so that "
                "no batch holds its locks for long."
            )
        selection: dict[str, Any] = {
            "older_than": options["older_than"],
            "include_failed": options["include_failed"],
            "queues": options["queues"],
        }
        kind = "done or failed todo" if options["include_failed"] else "done todo"
        age = format_duration(options["older_than"])
        databases = chosen_databases(options)
        if options["dry_run"]:
            would = Purged()
            for alias in databases:
                would.add(count_purgeable(**selection, using=alias))
            self._report(
                would, f"Would delete {plural(would.total, kind)} completed over {age} ago"
            )
            return
        purged = Purged()
        for alias in databases:
            purged.add(purge(**selection, batch_size=batch_size, using=alias))
        batches = plural(purged.batches, "batch", "batches")
        self._report(
            purged, f"Deleted {plural(purged.total, kind)} completed over {age} ago in {batches}"
        )

    def _report(self, purged: Purged, headline: str) -> None:
        if self.verbosity < 1:
            return
        self.stdout.write(f"{headline}{':' if purged.counts else '.'}")
        for (queue, state), count in sorted(purged.counts.items()):
            self.stdout.write(f"  {queue:<30} {state:<8} {count:>10}")
