"""Durations as operators type them (`30d`, `12h`, `90m`, `45s`, a plain number) and back.

The commands' arguments (management/cli.py) and the admin's duration fields read the same
forms, so what one prints the other takes.
"""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
#: Seconds per unit; "" is a plain number, read in the unit the caller names.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NAMES = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str, *, plain: str = "s") -> timedelta:
    """A positive duration: a number with an optional unit s, m, h or d; a plain number is in
    unit `plain`. Raise ValueError, saying what is accepted, for anything else."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise ValueError(
            f"invalid duration {text!r}: use a number with an optional unit s, m, h or d "
            f"(30d, 12h, 90m, 45s; plain numbers are {_NAMES[plain]})"
        )
    number, unit = match.groups()
    try:
        value = timedelta(seconds=float(number) * UNITS[unit or plain])
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long") from None
    if value <= timedelta(0):
        raise ValueError(f"duration {text!r} must be more than zero")
    return value


def format_duration(value: timedelta) -> str:
    """Write a duration as `parse_duration` reads it, in the largest unit that fits exactly
    (90m)."""
    seconds = value.total_seconds()
    for unit in ("d", "h", "m"):
        if seconds % UNITS[unit] == 0:
            return f"{int(seconds) // UNITS[unit]}{unit}"
    return f"{seconds:g}s"
