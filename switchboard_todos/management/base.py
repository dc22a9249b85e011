"""What the operator commands share: help with examples, argument types that say what is wrong."""

from __future__ import annotations

import textwrap
from argparse import ArgumentParser, ArgumentTypeError, RawDescriptionHelpFormatter
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from switchboard_todos import validation
from switchboard_todos.exceptions import InvalidTodo


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


def queue_name(value: str) -> str:
    """argparse type: a valid queue name."""
    try:
        return validation.queue(value)
    except InvalidTodo as error:
        raise ArgumentTypeError(str(error)) from error
