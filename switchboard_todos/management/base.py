"""What the operator commands (todo_stats, requeue_todos) share: help with examples, --queue."""

from __future__ import annotations

import textwrap
from argparse import ArgumentParser, RawDescriptionHelpFormatter
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

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
