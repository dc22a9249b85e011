"""The named SQL statements of `todos.sql` and `events.sql`, loaded once at import."""

from __future__ import annotations

import re
from importlib.resources import files

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a named-query file into {name: statement}; a name may appear only once."""
    parts = _NAME.split(text)
    statements: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in statements:
            raise ValueError(f"SQL statement {name!r} is defined twice.")
        statements[name] = body.strip().rstrip(";")
    return statements


queries = parse(files(__package__).joinpath("todos.sql").read_text(encoding="utf-8"))
event_queries = parse(files(__package__).joinpath("events.sql").read_text(encoding="utf-8"))
