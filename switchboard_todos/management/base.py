"""What the operator commands share: help with examples, --queue, --database."""

from __future__ import annotations

import textwrap
from argparse import ArgumentParser, RawDescriptionHelpFormatter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from switchboard_todos import placement
from switchboard_todos.management.cli import queue_name


class OperatorCommand(BaseCommand):
    """A command whose --help wraps its description and ends with `examples`."""

    examples: list[str] = []

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = RawDescriptionHelpFormatter
        parser.description = textwrap.fill(self.help, 78)
        parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in self.examples)
        return parser


def add_queue_argument(parser: ArgumentParser, help: str) -> None:
    """`--queue QUEUE`, repeatable, validated, into options["queues"] (None when absent)."""
    parser.add_argument(
        "--queue", action="append", type=queue_name, dest="queues", metavar="QUEUE", help=help
    )


def add_database_argument(parser: ArgumentParser, help: str) -> None:
    """`--database ALIAS`, repeatable, into options["databases"] (None when absent)."""
    parser.add_argument("--database", action="append", dest="databases", metavar="ALIAS", help=help)


def chosen_databases(options: dict[str, Any]) -> list[str]:
    """The databases of `--database`, each checked to hold the todos table; all by default."""
    held = placement.todo_databases()
    chosen: list[str] = list(dict.fromkeys(options["databases"] or held))
    for alias in chosen:
        if alias not in held:
            raise CommandError(
                f"--database {alias!r}: not a database that holds the todos table "
                f"(those are: {', '.join(held)})."
            )
    return chosen
