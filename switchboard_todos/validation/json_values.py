"""JSON values: a payload, a result, an error (trimmed to SWITCHBOARD_TODOS_MAX_ERROR_BYTES, not
refused) and a progress note, each serialized here, once, into the text the database stores.

Together because they share one encoder, the size and depth limits, and JsonText, the mark of a
text already checked. (Not `json.py`: that would shadow the standard library's module.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.validation.texts import _encodable, todo_id

#: Kept of an error's type when the error is trimmed to SWITCHBOARD_TODOS_MAX_ERROR_BYTES.
ERROR_TYPE_MAX_LENGTH = 200
#: Deepest nesting of arrays and objects in a payload, result or error. Python's JSON parser
#: recurses once per level: a value that nests near the interpreter's recursion limit could be
#: stored, then fail to load in a worker whose stack is already deeper.
MAX_JSON_DEPTH = 200

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
