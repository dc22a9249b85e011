"""Numbers, durations and instants: bounded ints (a priority, max_attempts, a limit), a lease,
a delay or a wait as a timedelta or seconds, an aware datetime, and a flag.

Each bound sits beside the check that holds an argument to it (MAX_LEASE, MAX_DELAY, MAX_WAIT),
because the worker, the queue settings and the commands hold their own arguments to the same.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from switchboard_todos.exceptions import InvalidTodo

Seconds = timedelta | int | float

MAX_ATTEMPTS_LIMIT = 1000
PRIORITY_MIN, PRIORITY_MAX = -100, 100
CLAIM_BATCH_LIMIT = 1000
#: SQS's longest visibility timeout; heartbeat to hold a todo longer.
MAX_LEASE = timedelta(hours=12)
#: Longest release delay or explicit retry wait; catches milliseconds passed as seconds.
MAX_DELAY = timedelta(days=30)
#: Longest blocking claim (`wait=`); SQS stops at 20 seconds, HTTP long polls near a minute.
MAX_WAIT = timedelta(minutes=15)
#: Longest `wait_for`.
MAX_TIMEOUT = timedelta(days=1)


def whole_number(value: object, name: str, low: int, high: int) -> int:
    """An int within [low, high]; bool is refused although it is an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTodo(f"{name} must be an int, not {type(value).__name__}.")
    if not low <= value <= high:
        raise InvalidTodo(f"{name} must be between {low} and {high}, not {value}.")
    return value


def duration(value: object, name: str, *, maximum: timedelta, allow_zero: bool) -> timedelta:
    """A timedelta or a number of seconds: finite, positive (or zero if allowed), bounded."""
    if isinstance(value, timedelta):
        span = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise InvalidTodo(f"{name} must be finite, not {value}.")
        if abs(value) > maximum.total_seconds():
            raise InvalidTodo(f"{name} must be at most {maximum}, not {value} seconds.")
        span = timedelta(seconds=value)
    else:
        raise InvalidTodo(
            f"{name} must be a timedelta or a number of seconds, not {type(value).__name__}."
        )
    if span < timedelta(0) or (span == timedelta(0) and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise InvalidTodo(f"{name} must be {bound}, not {span.total_seconds()} seconds.")
    if span > maximum:
        raise InvalidTodo(f"{name} must be at most {maximum}, not {span}.")
    return span


def handler_timeout(value: object) -> float:
    """How long one run of a handler may take, in seconds: more than zero, at most a day."""
    return duration(value, "timeout", maximum=timedelta(days=1), allow_zero=False).total_seconds()


def priority(value: object) -> int:
    """A todo's priority: an int from -100 to 100 (Django's task range); higher runs first."""
    return whole_number(value, "priority", PRIORITY_MIN, PRIORITY_MAX)


def ttl(value: object) -> timedelta:
    """A lease length: more than zero, at most MAX_LEASE."""
    return duration(value, "ttl", maximum=MAX_LEASE, allow_zero=False)


def delay(value: object, name: str) -> timedelta:
    """A wait before a todo is claimable again: zero or more, at most MAX_DELAY."""
    return duration(value, name, maximum=MAX_DELAY, allow_zero=True)


def wait(value: object) -> float:
    """How long a blocking claim may wait, in seconds: zero (do not wait) up to MAX_WAIT."""
    return duration(value, "wait", maximum=MAX_WAIT, allow_zero=True).total_seconds()


def run_after(value: object) -> datetime | None:
    """None, or an aware datetime before which the todo is not claimable."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidTodo(f"run_after must be an aware datetime, not {type(value).__name__}.")
    if timezone.is_naive(value):
        raise InvalidTodo("run_after must be an aware datetime; this one has no tzinfo.")
    try:
        value.astimezone(UTC)
    except OverflowError:  # stored, it could not be read back: the first or last moment instead
        return (datetime.min if value.year == 1 else datetime.max).replace(tzinfo=UTC)
    return value


def instant(value: object, name: str) -> datetime:
    """An aware datetime (a schedule's tick)."""
    if not isinstance(value, datetime) or timezone.is_naive(value):
        raise InvalidTodo(f"{name} must be an aware datetime, not {type(value).__name__}.")
    return value


def flag(value: object, name: str) -> bool:
    """True or False, nothing that merely looks like one."""
    if type(value) is not bool:
        raise InvalidTodo(f"{name} must be True or False, not {type(value).__name__}.")
    return value
