"""Input checks for the todo API: each returns the value as the SQL wants it or raises InvalidTodo.

Every check runs before any statement, so bad input never writes anything. The limits are
documented in the README; the columns themselves are unbounded `text`, as in the seed schema.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo

Seconds = timedelta | int | float

QUEUE_MAX_LENGTH = 100
KIND_MAX_LENGTH = 200
SOURCE_MAX_LENGTH = 200
TITLE_MAX_LENGTH = 1000
OWNER_MAX_LENGTH = 200
IDEMPOTENCY_KEY_MAX_LENGTH = 255
MAX_ATTEMPTS_LIMIT = 1000
CLAIM_BATCH_LIMIT = 1000
TODO_ID_MAX_LENGTH = 100
#: Most todos one operator batch (requeue_many, expire_lease_many, dead_letter_many) takes.
OPERATOR_BATCH_LIMIT = 10_000
REASON_MAX_LENGTH = 1000
#: SQS's longest visibility timeout; heartbeat to hold a todo longer.
MAX_LEASE = timedelta(hours=12)
#: Longest release delay or explicit retry wait; catches milliseconds passed as seconds.
MAX_DELAY = timedelta(days=30)
#: Longest blocking claim (`wait=`); SQS stops at 20 seconds, HTTP long polls near a minute.
MAX_WAIT = timedelta(minutes=15)

_QUEUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_NO_SPACE = re.compile(r"\S+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def text(value: object, name: str, max_length: int, *, required: bool = False) -> str:
    """A text column: a str of at most `max_length` characters without NUL bytes."""
    if not isinstance(value, str):
        raise InvalidTodo(f"{name} must be a str, not {type(value).__name__}.")
    if required and not value.strip():
        raise InvalidTodo(f"{name} must not be empty.")
    if len(value) > max_length:
        raise InvalidTodo(f"{name} is {len(value)} characters long; the limit is {max_length}.")
    if "\x00" in value:
        raise InvalidTodo(f"{name} must not contain NUL characters.")
    return value


def identifier(value: object, name: str, max_length: int) -> str:
    """A required one-line name (owner, assignee): non-blank, no control characters."""
    checked = text(value, name, max_length, required=True)
    if _CONTROL.search(checked):
        raise InvalidTodo(f"{name} must not contain control characters.")
    return checked


def owner(value: object) -> str:
    """The worker or agent that holds (or wants) a lease."""
    return identifier(value, "owner", OWNER_MAX_LENGTH)


def _remembered(check: Callable[[object], str]) -> Callable[[object], str]:
    """Remember the strings that passed `check`: a batch repeats its queue and kind on each row."""
    passed = functools.lru_cache(maxsize=1024)(check)

    def remembered(value: object) -> str:
        return passed(value) if type(value) is str else check(value)

    return functools.update_wrapper(remembered, check)


@_remembered
def queue(value: object) -> str:
    """A queue name: letters, digits and `_ . : -`, starting with a letter or digit."""
    checked = text(value, "queue", QUEUE_MAX_LENGTH, required=True)
    if not _QUEUE.fullmatch(checked):
        raise InvalidTodo(
            f"queue {checked!r} is not a valid queue name: use letters, digits and _ . : -, "
            "starting with a letter or digit."
        )
    return checked


def queues(value: str | Iterable[str]) -> list[str]:
    """One queue name or several, without duplicates, in the order given."""
    names = [value] if isinstance(value, str) else list(value)
    if not names:
        raise InvalidTodo("queues must name at least one queue.")
    return list(dict.fromkeys(queue(name) for name in names))


@_remembered
def kind(value: object) -> str:
    """What a todo is (a handler or task name); empty, or one word without spaces."""
    checked = text(value, "kind", KIND_MAX_LENGTH)
    if checked and not _NO_SPACE.fullmatch(checked):
        raise InvalidTodo(f"kind {checked!r} must not contain whitespace.")
    return checked


def idempotency_key(value: object) -> str | None:
    """None for no deduplication, otherwise a non-blank key."""
    if value is None:
        return None
    return text(value, "idempotency_key", IDEMPOTENCY_KEY_MAX_LENGTH, required=True)


def assignee(value: object) -> str | None:
    """None lets any owner claim; a name reserves the todo for that owner."""
    if value is None:
        return None
    return identifier(value, "assignee", OWNER_MAX_LENGTH)


def todo_ids(values: Iterable[str]) -> list[str]:
    """Ids for an operator batch: 1 to OPERATOR_BATCH_LIMIT strs, repeats dropped, order kept."""
    if isinstance(values, str):
        raise InvalidTodo("todo_ids must be a list of ids, not a single str.")
    ids = list(
        dict.fromkeys(text(value, "todo id", TODO_ID_MAX_LENGTH, required=True) for value in values)
    )
    if not ids:
        raise InvalidTodo("todo_ids must name at least one todo.")
    if len(ids) > OPERATOR_BATCH_LIMIT:
        raise InvalidTodo(
            f"todo_ids names {len(ids)} todos; one batch takes at most {OPERATOR_BATCH_LIMIT}."
        )
    return ids


def reason(value: object) -> str:
    """Why an operator cancelled a todo: required, kept in its result and failure history."""
    return text(value, "reason", REASON_MAX_LENGTH, required=True).strip()


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
    return value


#: Shared, because json.dumps with any option builds a new encoder on every call.
_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def json_text(value: Any, name: str) -> str:
    """Serialize `value` as the JSON the database will store, within MAX_JSON_BYTES."""
    try:
        serialized = _JSON.encode(value)
    except (TypeError, ValueError) as error:
        raise InvalidTodo(f"{name} is not JSON-serializable: {error}") from error
    if "\\u0000" in serialized:
        raise InvalidTodo(f"{name} must not contain NUL characters (PostgreSQL rejects them).")
    limit = conf.MAX_JSON_BYTES
    size = len(serialized)  # ASCII: the encoder escapes everything else, one byte a character
    if size > limit:
        raise InvalidTodo(f"{name} is {size} bytes as JSON; the limit is {limit}.")
    return serialized


def payload(value: Any) -> str:
    """The todo's input: a JSON object (a dict), or None for an empty one."""
    if value is None:
        return "{}"
    if not isinstance(value, dict):
        raise InvalidTodo(f"payload must be a dict (a JSON object), not {type(value).__name__}.")
    return json_text(value, "payload")


def error(value: object) -> str:
    """What a failed attempt reports, stored as a JSON object with at least a message."""
    if value is None:
        detail: dict[str, Any] = {"type": "", "message": ""}
    elif isinstance(value, BaseException):
        exc_type = type(value)
        detail = {"type": f"{exc_type.__module__}.{exc_type.__qualname__}", "message": str(value)}
    elif isinstance(value, str):
        detail = {"type": "", "message": value}
    elif isinstance(value, dict):
        detail = value
    else:
        raise InvalidTodo(
            f"error must be a str, a dict or an exception, not {type(value).__name__}."
        )
    return json_text(detail, "error")
