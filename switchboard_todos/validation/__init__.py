"""Input checks for the todo API: each returns the value as the SQL wants it or raises InvalidTodo.

Every check runs before any statement, so bad input never writes anything, and nothing a caller
passes reaches the database as a DataError, a UnicodeEncodeError or a RecursionError. The
manager's methods go through one path: `arguments()` for the transitions (one check per
argument name, `ARGUMENTS`) and `creations()` for every way of enqueueing. The limits are
documented in the README; the columns themselves are unbounded `text`, as in the seed schema.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar

from django.utils import timezone

from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo

if TYPE_CHECKING:
    from switchboard_todos.models import Event

Seconds = timedelta | int | float
R = TypeVar("R")

QUEUE_MAX_LENGTH = 100
KIND_MAX_LENGTH = 200
SOURCE_MAX_LENGTH = 200
TITLE_MAX_LENGTH = 1000
OWNER_MAX_LENGTH = 200
IDEMPOTENCY_KEY_MAX_LENGTH = 255
MAX_ATTEMPTS_LIMIT = 1000
PRIORITY_MIN, PRIORITY_MAX = -100, 100
CLAIM_BATCH_LIMIT = 1000
TODO_ID_MAX_LENGTH = 100
#: Most todos one operator batch (requeue_many, expire_lease_many, cancel_many) takes.
OPERATOR_BATCH_LIMIT = 10_000
REASON_MAX_LENGTH = 1000
#: Kept of an error's type when the error is trimmed to SWITCHBOARD_TODOS_MAX_ERROR_BYTES.
ERROR_TYPE_MAX_LENGTH = 200
#: SQS's longest visibility timeout; heartbeat to hold a todo longer.
MAX_LEASE = timedelta(hours=12)
#: Longest release delay or explicit retry wait; catches milliseconds passed as seconds.
MAX_DELAY = timedelta(days=30)
#: Longest blocking claim (`wait=`); SQS stops at 20 seconds, HTTP long polls near a minute.
MAX_WAIT = timedelta(minutes=15)
#: Deepest nesting of arrays and objects in a payload, result or error. Python's JSON parser
#: recurses once per level: a value that nests near the interpreter's recursion limit could be
#: stored, then fail to load in a worker whose stack is already deeper.
MAX_JSON_DEPTH = 200

#: A queue name, as a pattern that means the same to Python, ECMAScript (JSON Schema) and Rust.
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
#: The characters str.isspace() calls whitespace (a text of only these is blank; a kind has
#: none), as a class of a pattern that means the same to Python, ECMAScript and Rust.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_QUEUE = re.compile(QUEUE_PATTERN.removeprefix("^").removesuffix("$"))
_NO_SPACE = re.compile(r"\S+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


#: A schedule's name (schedules.py).
SCHEDULE_NAME_MAX_LENGTH = 200


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
    if not value.isascii():  # isascii is a flag lookup: ASCII text pays nothing more
        _encodable(value, name)
    return value


def _encodable(value: str, name: str) -> bytes:
    """`value` as UTF-8; a lone surrogate (what os.fsdecode makes of bad bytes) is refused."""
    try:
        return value.encode()
    except UnicodeEncodeError as error:
        raise InvalidTodo(
            f"{name} contains an unpaired surrogate ({value[error.start]!r} at position "
            f"{error.start}), which is not valid Unicode text; PostgreSQL cannot store it."
        ) from None


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
    try:
        names = [value] if isinstance(value, str) else list(value)
    except TypeError:
        raise InvalidTodo(
            f"queues must be a queue name or a list of them, not {type(value).__name__}."
        ) from None
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


def concurrency_key(value: object) -> str:
    """A key no two claimed todos may share: a non-blank str of at most 255 characters."""
    return text(value, "concurrency_key", IDEMPOTENCY_KEY_MAX_LENGTH, required=True)


def fair_key(value: object) -> str:
    """The tenant a todo counts for in fair claims: a non-blank str of at most 255 characters."""
    return text(value, "fair_key", IDEMPOTENCY_KEY_MAX_LENGTH, required=True)


def assignee(value: object) -> str | None:
    """None lets any owner claim; a name reserves the todo for that owner."""
    if value is None:
        return None
    return identifier(value, "assignee", OWNER_MAX_LENGTH)


def todo_id(value: object, name: str = "todo id") -> str:
    """A todo's (or event's) id: a non-blank str; any format, as other services insert rows too."""
    return text(value, name, TODO_ID_MAX_LENGTH, required=True)


def todo_ids(values: Iterable[str]) -> list[str]:
    """Ids for an operator batch: 1 to OPERATOR_BATCH_LIMIT strs, repeats dropped, order kept."""
    if isinstance(values, str):
        raise InvalidTodo("todo_ids must be a list of ids, not a single str.")
    if isinstance(values, bytes | Mapping) or not isinstance(values, Iterable):
        raise InvalidTodo(f"todo_ids must be a list of ids, not {type(values).__name__}.")
    ids = list(dict.fromkeys(todo_id(value) for value in values))
    if not ids:
        raise InvalidTodo("todo_ids must name at least one todo.")
    if len(ids) > OPERATOR_BATCH_LIMIT:
        raise InvalidTodo(
            f"todo_ids names {len(ids)} todos; one batch takes at most {OPERATOR_BATCH_LIMIT}."
        )
    return ids


#: Longest `wait_for`.
MAX_TIMEOUT = timedelta(days=1)
#: Most todos one todo may wait for (`after`).
MAX_PARENTS = 1000
#: What a todo that waits for others may do when one of them ends as a dead letter.
PARENT_FAILURE_POLICIES = ("cancel", "run_anyway")


def parents(value: object) -> list[str]:
    """The todos a new todo waits for (`after`): 1 to MAX_PARENTS ids or batch refs, repeats
    dropped, order kept."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidTodo(f"after must be a list of todo ids, not {type(value).__name__}.")
    named = list(dict.fromkeys(todo_id(item, "after") for item in value))
    if not named:
        raise InvalidTodo("after must name at least one todo (or be left out).")
    if len(named) > MAX_PARENTS:
        raise InvalidTodo(
            f"after names {len(named)} todos; a todo waits for at most {MAX_PARENTS}."
        )
    return named


def parent_failure(value: object) -> str:
    """What a todo does when a todo it waits for ends as a dead letter."""
    if value not in PARENT_FAILURE_POLICIES:
        raise InvalidTodo(f"on_parent_failure must be 'cancel' or 'run_anyway', not {value!r}.")
    return str(value)


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


#: Shared, because json.dumps with any option builds a new encoder on every call. Text is kept
#: as it is (not escaped to ASCII), so that encoding it to UTF-8 finds any lone surrogate.
JSON_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
#: A JSON string, escapes included; and every character but the brackets that nest.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
#: A NUL character as the encoder writes it: \u0000 after an even number of backslashes.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class JsonText(str):
    """JSON text that a check of this module made (a payload, result, error or progress note):
    given again as that same argument, it is taken as it is, not serialized a second time. The
    service layer measures what an agent writes before it writes it (agents/service/quotas.py).
    """


def json_bytes(text: str) -> int:
    """The bytes of a JSON text this module made, as UTF-8 (which its checks made sure of)."""
    return len(text) if text.isascii() else len(text.encode())


def json_text(value: Any, name: str, *, limit: int | None = None) -> str:
    """Serialize `value` as the JSON the database will store, within `limit` bytes (by default
    MAX_JSON_BYTES)."""
    if type(value) is JsonText:
        return value
    try:
        serialized = JSON_ENCODER.encode(value)
    except (TypeError, ValueError) as error:
        raise InvalidTodo(f"{name} is not JSON-serializable: {error}") from error
    except RecursionError:
        raise InvalidTodo(
            f"{name} nests arrays and objects too deeply; the limit is {MAX_JSON_DEPTH} levels."
        ) from None
    if "\\u0000" in serialized and _JSON_NUL.search(serialized):
        raise InvalidTodo(f"{name} must not contain NUL characters (PostgreSQL rejects them).")
    size = len(serialized) if serialized.isascii() else len(_encodable(serialized, name))
    if limit is None:
        limit = conf.MAX_JSON_BYTES
    if size > limit:
        raise InvalidTodo(f"{name} is {size} bytes as JSON; the limit is {limit}.")
    # Fewer brackets than the limit cannot nest deeper than it: most values stop here.
    if serialized.count("[") + serialized.count("{") > MAX_JSON_DEPTH:
        depth = _nesting(serialized)
        if depth > MAX_JSON_DEPTH:
            raise InvalidTodo(
                f"{name} nests arrays and objects {depth} levels deep; the limit is "
                f"{MAX_JSON_DEPTH}."
            )
    return serialized


def _nesting(serialized: str) -> int:
    """How deep the arrays and objects of a JSON text nest (brackets inside strings aside)."""
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", serialized))
    return max(accumulate(1 if bracket in "[{" else -1 for bracket in brackets), default=0)


def payload(value: Any) -> str:
    """The todo's input: a JSON object (a dict), or None for an empty one."""
    if value is None:
        return "{}"
    if type(value) is JsonText:
        return value
    if not isinstance(value, dict):
        raise InvalidTodo(f"payload must be a dict (a JSON object), not {type(value).__name__}.")
    return json_text(value, "payload")


def error(value: object) -> str:
    """What a failed attempt reports, stored as a JSON object with at least a message; one of
    more than SWITCHBOARD_TODOS_MAX_ERROR_BYTES is trimmed to that, with a note."""
    if type(value) is JsonText:
        return value
    if value is None:
        detail: dict[str, Any] = {"type": "", "message": ""}
    elif isinstance(value, BaseException):
        exc_type = type(value)
        try:
            message = str(value)
        except Exception as failure:
            raise InvalidTodo(
                f"error is an exception whose str() raised {type(failure).__name__}; pass "
                "its message as a str instead."
            ) from failure
        detail = {"type": f"{exc_type.__module__}.{exc_type.__qualname__}", "message": message}
    elif isinstance(value, str):
        detail = {"type": "", "message": value}
    elif isinstance(value, dict):
        detail = value
    else:
        raise InvalidTodo(
            f"error must be a str, a dict or an exception, not {type(value).__name__}."
        )
    serialized = json_text(detail, "error")
    size = json_bytes(serialized)
    if size <= conf.MAX_ERROR_BYTES:
        return serialized
    return _trimmed_error(detail, serialized, size, conf.MAX_ERROR_BYTES)


def _trimmed_error(detail: dict[str, Any], serialized: str, size: int, limit: int) -> str:
    """An error of more than `limit` bytes of JSON as one of at most `limit`: its type, a note,
    and as much of its message (or, without a str message, of its JSON) as fits.

    Stored, not refused: a failure must be recorded, and a long one is usually a long
    traceback or log whose head says what went wrong.
    """
    kind = detail.get("type")
    message = detail.get("message")
    text = message if isinstance(message, str) else serialized
    trimmed = {
        "type": kind[:ERROR_TYPE_MAX_LENGTH] if isinstance(kind, str) else "",
        "message": "",
        "note": (
            f"The error was {size} bytes of JSON; the limit is {limit} "
            "(SWITCHBOARD_TODOS_MAX_ERROR_BYTES), so only the head of its "
            f"{'message' if text is message else 'JSON'} is kept."
        ),
    }
    budget = max(0, limit - len(JSON_ENCODER.encode(trimmed).encode()))
    keep = min(len(text), budget)
    while True:
        head = text[:keep]
        # Escapes and multi-byte characters take more bytes than characters: the quotes of an
        # encoded string are counted in the budget already.
        used = len(JSON_ENCODER.encode(head).encode()) - 2
        if used <= budget:
            trimmed["message"] = head
            return JSON_ENCODER.encode(trimmed)
        keep = keep * budget // used


def result(value: Any) -> str | None:
    """What a completed todo returned: any JSON value; None stores SQL NULL."""
    return None if value is None else json_text(value, "result")


def progress(value: Any, name: str = "progress") -> str | None:
    """A holder's progress note: any JSON value, at most MAX_PROGRESS_BYTES; None sends none."""
    return None if value is None else json_text(value, name, limit=conf.MAX_PROGRESS_BYTES)


def progress_by_id(value: object) -> str | None:
    """`heartbeat_many`'s mapping of todo id to progress note, as one JSON object; each note is
    bounded on its own (a None note sends none)."""
    if value is None:
        return None
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidTodo(f"progress must map todo ids to notes, not {type(value).__name__}.")
    texts = {
        todo_id(key): progress(note, f"the progress of {key!r}") for key, note in value.items()
    }
    notes = [
        f"{JSON_ENCODER.encode(key)}:{text}" for key, text in texts.items() if text is not None
    ]
    return "{" + ",".join(notes) + "}" if notes else None


def results(value: object) -> tuple[list[str], list[str | None]]:
    """`complete_many`'s mapping of todo id to result, as the statement's two arrays."""
    if type(value) is not dict and not isinstance(value, Mapping):
        raise InvalidTodo(f"results must map todo ids to results, not {type(value).__name__}.")
    return [todo_id(key) for key in value], [result(item) for item in value.values()]


def event(value: Event | str | None) -> str | None:
    """The event a todo points back to: a saved Event, or an event id (looked up before insert)."""
    if value is None:
        return None
    from switchboard_todos.models import Event

    if isinstance(value, Event):
        if value._state.adding:
            raise InvalidTodo("event must be a saved Event (or its id); this one is not saved.")
        return todo_id(value.pk, "event")
    if isinstance(value, str):
        return todo_id(value, "event")
    raise InvalidTodo(f"event must be an Event or its id (a str), not {type(value).__name__}.")


#: `create_todo`'s arguments and their defaults; each mapping of a batch takes the same keys.
CREATION_DEFAULTS: dict[str, Any] = {
    "queue": "default",
    "kind": "",
    "title": "",
    "payload": None,
    "source": "",
    "idempotency_key": None,
    "assignee": None,
    "max_attempts": None,
    "priority": 0,
    "concurrency_key": None,
    "fair_key": None,
    "event": None,
    "run_after": None,
    "after": None,
    "on_parent_failure": "cancel",
}
_CREATION_ARGUMENTS = frozenset(CREATION_DEFAULTS)


def creation(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one todo's `create_todo` arguments into the insert's parameters.

    Arguments left at their default skip their check: batches call this once per row. A
    `max_attempts` of None stays None: the insert takes the queue's default (Queue), else
    DEFAULT_MAX_ATTEMPTS.
    `event_given_by_id` says whether the event was named by a str id, which the manager looks
    up before inserting (a saved Event needs no lookup), and `event_database` where a saved
    Event was loaded from (a todo must live in its event's database).
    """
    if type(spec) is not dict and not isinstance(spec, Mapping):  # dict first: ABCs are slow
        raise InvalidTodo(f"a todo must be a mapping of arguments, not {type(spec).__name__}.")
    if not _CREATION_ARGUMENTS.issuperset(spec):
        unknown = spec.keys() - _CREATION_ARGUMENTS
        raise InvalidTodo(f"unknown arguments: {', '.join(sorted(map(repr, unknown)))}.")
    get = spec.get
    checked_kind = kind(get("kind", ""))
    title = get("title", "")
    checked_title = title if title == "" else text(title, "title", TITLE_MAX_LENGTH)
    if not checked_kind and not checked_title.strip():
        raise InvalidTodo("A todo needs a kind or a title; both are empty.")
    source, key, holder, attempts, rank, one_at_a_time, given_event, after = (
        get("source", ""),
        get("idempotency_key"),
        get("assignee"),
        get("max_attempts"),
        get("priority", 0),
        get("concurrency_key"),
        get("event"),
        get("run_after"),
    )
    waits_for, policy, tenant = get("after"), get("on_parent_failure", "cancel"), get("fair_key")
    checked_policy = policy if policy == "cancel" else parent_failure(policy)
    if waits_for is not None and after is not None:
        raise InvalidTodo(
            "A todo that waits for others (after) starts when they are done; it cannot also "
            "have a run_after."
        )
    return {
        "queue": queue(get("queue", "default")),
        "kind": checked_kind,
        "title": checked_title,
        "payload": payload(get("payload")),
        "source": source if source == "" else text(source, "source", SOURCE_MAX_LENGTH),
        "idempotency_key": None if key is None else idempotency_key(key),
        "assignee": None if holder is None else assignee(holder),
        "max_attempts": (
            None
            if attempts is None
            else whole_number(attempts, "max_attempts", 1, MAX_ATTEMPTS_LIMIT)
        ),
        "priority": rank if rank == 0 and type(rank) is int else priority(rank),
        "concurrency_key": None if one_at_a_time is None else concurrency_key(one_at_a_time),
        "fair_key": None if tenant is None else fair_key(tenant),
        "event_id": None if given_event is None else event(given_event),
        "event_given_by_id": isinstance(given_event, str),
        "event_database": getattr(getattr(given_event, "_state", None), "db", None),
        "run_after": None if after is None else run_after(after),
        "parents": None if waits_for is None else parents(waits_for),
        "on_parent_failure": None if waits_for is None else checked_policy,
        # Not an argument: the manager sets it from the creator's active trace (tracing.py).
        "trace_context": None,
    }


def creations(todos: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate a batch of todos (`create_many`, `enqueue_many`), naming the first bad one."""
    if isinstance(todos, str | bytes | Mapping) or not isinstance(todos, Iterable):
        raise InvalidTodo(f"todos must be a list of mappings, not {type(todos).__name__}.")
    batch = []
    for number, spec in enumerate(todos):
        try:
            batch.append(creation(spec))
        except InvalidTodo as error:
            raise InvalidTodo(f"todo #{number}: {error}") from error
    return batch


def optional(check: Callable[[Any], R], default: R | None = None) -> Callable[[Any], R | None]:
    """`check` for an argument that may be None, which stands for `default`."""

    def checked(value: Any) -> R | None:
        return default if value is None else check(value)

    return checked


#: The check of each argument of the manager's transitions, by name: an argument means the same
#: wherever it appears, and a new method is validated by naming its arguments.
ARGUMENTS: dict[str, Callable[[Any], Any]] = {
    "todo_id": todo_id,
    "todo_ids": todo_ids,
    "owner": owner,
    "queues": queues,
    "ttl": optional(ttl),
    "limit": lambda value: whole_number(value, "limit", 1, CLAIM_BATCH_LIMIT),
    "wait": optional(wait, 0.0),
    "max_held": optional(lambda value: whole_number(value, "max_held", 0, 2**31 - 1)),
    "timeout": lambda value: duration(
        value, "timeout", maximum=MAX_TIMEOUT, allow_zero=True
    ).total_seconds(),
    "result": result,
    "results": results,
    "error": error,
    "retry_in": optional(lambda value: delay(value, "retry_in")),
    "delay": optional(lambda value: delay(value, "delay"), timedelta(0)),
    "reason": reason,
    "progress": progress,
    "progress_by_id": progress_by_id,
    "priority": priority,
    "schedule": lambda value: identifier(value, "schedule", SCHEDULE_NAME_MAX_LENGTH),
    "awaited": lambda value: instant(value, "awaited"),
    "tick": lambda value: instant(value, "tick"),
    "next_run_at": lambda value: instant(value, "next_run_at"),
    "enqueue": lambda value: flag(value, "enqueue"),
}


def arguments(**given: Any) -> dict[str, Any]:
    """Check a transition's arguments, each by its name's rule in ARGUMENTS; return them checked.

    The one way into the manager's statements: every public method calls it (or `creations`)
    before it runs anything.
    """
    return {name: ARGUMENTS[name](value) for name, value in given.items()}
