"""What the management commands share: argparse `type=` validators, and output wording.

Each validator turns the text into the value the command wants or raises ArgumentTypeError,
which argparse reports as "argument --x: <message>" (and call_command raises as CommandError).
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable
from typing import TypeVar

from switchboard_todos import validation
from switchboard_todos.durations import parse_duration
from switchboard_todos.exceptions import InvalidTodo

T = TypeVar("T")


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def checked(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse `type=` from a check that raises InvalidTodo or ValueError on bad text."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except (InvalidTodo, ValueError) as error:
            raise ArgumentTypeError(str(error)) from None

    parse.__name__ = check.__name__  # argparse names the type in "invalid <name> value"
    return parse


def at_most(high: int) -> Callable[[str], int]:
    """A whole number from 1 to `high`."""

    def whole_number(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise ArgumentTypeError(f"{text!r} must be {high} or less")
        return value

    return whole_number


def seconds(text: str) -> float:
    """A positive duration in seconds, written as `duration` reads it (30, 0.5, 90s, 5m)."""
    return duration(text).total_seconds()


#: A positive duration: `30d`, `12h`, `90m`, `45s`, or plain seconds (`3600`, `0.5`).
duration = checked(parse_duration)
#: A queue name or an owner, checked as the manager checks them.
queue_name = checked(validation.queue)
owner = checked(validation.owner)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """A count with its noun: `1 sweep`, `2 sweeps`, `3 batches` (given as `nouns`)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"
