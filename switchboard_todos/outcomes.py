"""A handler's outcome made storable: what it returned or raised, as PostgreSQL will take it.

Input from producers is validated and refused (`validation`); a handler's outcome cannot be
refused, since the todo would stay claimed with nothing recorded and run again, and again. So
the worker stores what it can: unpaired surrogates (what `os.fsdecode` makes of a bad file
name) escaped as `\\udcff`, NUL characters dropped, an exception whose `str()` raises described
by its `repr()`, and a result too large for the column replaced by a note and its head.
"""

from __future__ import annotations

import traceback
from typing import Any

from switchboard_todos import validation
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo

#: Kept of a failure's traceback: the innermost frames, and at most this many characters.
TRACEBACK_FRAMES = 30
TRACEBACK_CHARS = 8000
MESSAGE_CHARS = 2000
#: Kept of an oversize result's JSON text, in characters.
HEAD_CHARS = 1000


def storable_text(value: str) -> str:
    """`value` with unpaired surrogates escaped and NUL characters dropped."""
    if not value.isascii():
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value.replace("\x00", "")


def message(error: BaseException) -> str:
    """The exception's `str()`, else its `repr()`, else its type: never raises."""
    for describe in (str, repr):
        try:
            return storable_text(describe(error))
        except Exception:
            continue
    return f"<unprintable {type(error).__qualname__}>"


def error_detail(error: BaseException) -> dict[str, str]:
    """What a failed attempt stores: the exception's type, message and trimmed traceback."""
    kind = type(error)
    try:
        lines = traceback.format_exception(
            kind, error, error.__traceback__, limit=-TRACEBACK_FRAMES
        )
    except Exception:  # a hostile __str__ or frame can break even the formatter
        lines = []
    return {
        "type": storable_text(f"{kind.__module__}.{kind.__qualname__}"),
        "message": message(error)[:MESSAGE_CHARS],
        "traceback": storable_text("".join(lines)[-TRACEBACK_CHARS:]),
    }


def fallback_error(error: BaseException, refusal: BaseException) -> dict[str, str]:
    """A fixed-shape detail for a failure whose own detail could not be stored."""
    return {
        "type": storable_text(f"{type(error).__module__}.{type(error).__qualname__}"),
        "message": (
            f"The handler failed, and its error could not be stored "
            f"({type(refusal).__name__}: {message(refusal)[:200]})."
        ),
    }


def result(value: Any) -> Any:
    """The handler's return value as it can be stored.

    Raises InvalidTodo for a value that is not JSON at all (an object, NaN) or nests too deep:
    that is the handler's bug, and the todo fails with the message.
    """
    if value is None:
        return None
    name = "The handler's return value"
    try:
        validation.json_text(value, name)
        return value
    except InvalidTodo as refused:
        first = refused
    try:
        cleaned = _cleaned(value)
        serialized = validation.JSON_ENCODER.encode(cleaned)
    except (TypeError, ValueError, RecursionError):
        raise first from None  # not JSON at all, or nested too deep: the clear message
    size = len(serialized.encode())
    if size > conf.MAX_JSON_BYTES:
        return {
            "note": (
                f"The handler returned {size} bytes of JSON; the limit is "
                f"{conf.MAX_JSON_BYTES} (SWITCHBOARD_TODOS['MAX_JSON_BYTES']), so only the "
                f"first {HEAD_CHARS} characters are kept."
            ),
            "head": serialized[:HEAD_CHARS],
        }
    validation.json_text(cleaned, name)  # nested too deep still fails
    return cleaned


def _cleaned(value: Any) -> Any:
    """`value` with every string in it (keys too) made storable."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {
            storable_text(key) if isinstance(key, str) else key: _cleaned(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_cleaned(item) for item in value]
    return value
