"""Texts and names: the checks of a text argument (a queue, a kind, an owner or assignee, a key,
a todo id, a reason) and the lengths and patterns they hold it to.

Apart from the other families because the others check their names with these, and the agents'
API states the same rules as patterns built from these constants (api/schemas.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping

from switchboard_todos.exceptions import InvalidTodo

QUEUE_MAX_LENGTH = 100
KIND_MAX_LENGTH = 200
SOURCE_MAX_LENGTH = 200
TITLE_MAX_LENGTH = 1000
OWNER_MAX_LENGTH = 200
IDEMPOTENCY_KEY_MAX_LENGTH = 255
TODO_ID_MAX_LENGTH = 100
#: Most todos one operator batch (requeue_many, expire_lease_many, cancel_many) takes.
OPERATOR_BATCH_LIMIT = 10_000
REASON_MAX_LENGTH = 1000
#: A schedule's name (schedules.py).
SCHEDULE_NAME_MAX_LENGTH = 200

#: A queue name, as a pattern that means the same to Python, ECMAScript (JSON Schema) and Rust.
QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
#: The characters str.isspace() calls whitespace (a text of only these is blank; a kind has
#: none), as a class of a pattern that means the same to Python, ECMAScript and Rust.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_QUEUE = re.compile(QUEUE_PATTERN.removeprefix("^").removesuffix("$"))
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


def reason(value: object) -> str:
    """Why an operator cancelled a todo: required, kept in its result and failure history."""
    return text(value, "reason", REASON_MAX_LENGTH, required=True).strip()
