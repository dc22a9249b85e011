"""`manage.py todo_reindex`: rebuild the claim indexes a held snapshot left bloated."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections, router

from switchboard_todos.models import Todo
from switchboard_todos.upkeep.reindex import index_bloat, reindex


class Command(BaseCommand):
    help = (
        "Print the claim indexes' size against what their live entries need, and rebuild "
        "with REINDEX CONCURRENTLY (no lock that stops enqueues or claims) each one larger "
        "than --min-ratio times that. Run it after a long transaction held back vacuum, or "
        "from a timer."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--min-ratio",
            type=float,
            default=4.0,
            help="Rebuild an index at least this many times larger than it needs (default 4).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print the sizes and rebuild nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["min_ratio"] <= 1:
            raise CommandError("--min-ratio must be more than 1.")
        if connections[router.db_for_write(Todo)].in_atomic_block:
            raise CommandError("REINDEX CONCURRENTLY cannot run inside a transaction.")
        for bloat in index_bloat():
            line = (
                f"{bloat.name}: {bloat.size / 2**20:.2f} MiB for {bloat.entries:,} live "
                f"entries, {bloat.ratio:.1f}x what they need"
            )
            if bloat.ratio < options["min_ratio"] or options["dry_run"]:
                self.stdout.write(f"{line}; left alone")
                continue
            reindex(bloat.name)
            after = next(found for found in index_bloat() if found.name == bloat.name)
            self.stdout.write(f"{line}; rebuilt: {after.size / 2**20:.2f} MiB")
