"""The named SQL statements of the `*.sql` files beside this module, composed once at import.

A block starts at `-- name: x` (a statement) or `-- fragment: x` / `-- fragment: x(a, b)` (a
piece that statements share) and runs to the next such line. A statement writes `{{x}}` or
`{{x(value, value)}}` where the fragment goes; in the fragment, `$a` stands for the value given
for `a`. One block may be the statement of several names that differ only in a constant:
`-- name: x(a=1), y(a=2)`, where `$a` in its text stands for each name's value. A fragment's
leading comment lines document it and are not copied, and the lines after its first are
indented as the line it goes into, so a statement composed from fragments reads, in logs and
in pg_stat_statements, as if written out in full. The files share one namespace: a fragment of
any file serves the statements of every file, and a name defined twice, in one file or in two,
is an error.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import NamedTuple

#: The line a block starts at: its kind, and its name with its parameters (a fragment's names;
#: a statement's values) or, for a statement, several such names, separated by ", ".
_BLOCK = re.compile(
    r"^-- (name|fragment): (\w+(?:\([\w, =]*\))?(?:, \w+(?:\([\w, =]*\))?)*)\s*$", re.MULTILINE
)
_NAMED = re.compile(r"(\w+)(?:\(([\w, =]*)\))?")
_REFERENCE = re.compile(r"(\w+)(?:\((.*)\))?", re.DOTALL)
#: More nested fragments than this means one includes itself.
_MAX_EXPANSIONS = 1000


class Fragment(NamedTuple):
    params: tuple[str, ...]
    body: str


def written(text: str) -> tuple[dict[str, str], dict[str, Fragment]]:
    """Split named-query text into its statements and fragments, as written (not composed).

    The text may be several files joined: the header comment of the next file, which follows
    the last block of the one before, is not part of that block.
    """
    parts = _BLOCK.split(text)
    statements: dict[str, str] = {}
    fragments: dict[str, Fragment] = {}
    for kind, header, body in zip(*(parts[start::3] for start in (1, 2, 3)), strict=True):
        named = _NAMED.findall(header)
        if kind == "fragment" and (len(named) > 1 or "=" in header):
            raise ValueError(f"SQL fragment {header!r}: one name, and its parameters' names.")
        lines = body.strip().splitlines()
        while lines and (not lines[-1].strip() or lines[-1].startswith("--")):
            lines.pop()
        for name, params in named:
            if name in statements or name in fragments:
                raise ValueError(f"SQL statement {name!r} is defined twice.")
            given = [param.strip() for param in params.split(",") if param.strip()]
            if kind == "name":
                statements[name] = _bound(name, "\n".join(lines).rstrip(";"), given)
            else:
                while lines and lines[0].startswith("--"):
                    lines.pop(0)
                fragments[name] = Fragment(tuple(given), "\n".join(lines))
    return statements, fragments


def _bound(name: str, text: str, values: list[str]) -> str:
    """The text of statement `name` with each `$a` of its values (`a=1`) replaced by its value."""
    for value in values:
        param, equals, constant = value.partition("=")
        if not equals or not re.search(rf"\${param}\b", text):
            raise ValueError(f"SQL statement {name!r}: {value!r} is not a value its text uses.")
        text = re.sub(rf"\${param}\b", constant, text)
    return text


def parse(text: str, fragments: dict[str, Fragment] | None = None) -> dict[str, str]:
    """{name: statement} of named-query text, composed from its own fragments, or `fragments`."""
    statements, own = written(text)
    return {
        name: compose(body, own if fragments is None else fragments)
        for name, body in statements.items()
    }


def compose(text: str, fragments: dict[str, Fragment]) -> str:
    """`text` with each `{{fragment(values)}}` replaced, outermost first, until none is left."""
    for _ in range(_MAX_EXPANSIONS):
        start = text.find("{{")
        if start < 0:
            return text
        end = _closing(text, start)
        reference = _REFERENCE.fullmatch(text[start + 2 : end - 2].strip())
        if reference is None or "\n" in reference.group(0):
            raise ValueError(f"Bad fragment reference {text[start:end]!r}: one line, x(a, b).")
        name, values = reference.group(1), _split(reference.group(2))
        if name not in fragments:
            raise ValueError(f"Unknown SQL fragment {name!r}.")
        fragment = fragments[name]
        if len(values) != len(fragment.params):
            raise ValueError(f"SQL fragment {name!r} takes {fragment.params}, given {values}.")
        body = fragment.body
        for param, value in zip(fragment.params, values, strict=True):
            body = re.sub(rf"\${param}\b", value.replace("\\", "\\\\"), body)
        line = text[text.rfind("\n", 0, start) + 1 :]
        indent = line[: len(line) - len(line.lstrip(" "))]
        text = text[:start] + body.replace("\n", "\n" + indent) + text[end:]
    raise ValueError("SQL fragments nest too deep: does one include itself?")


def _closing(text: str, start: int) -> int:
    """The end of the `{{...}}` that opens at `start`, past any nested in it."""
    depth, index = 0, start
    while index < len(text) - 1:
        pair = text[index : index + 2]
        if pair in ("{{", "}}"):
            depth += 1 if pair == "{{" else -1
            index += 2
            if depth == 0:
                return index
        else:
            index += 1
    raise ValueError(f"Unclosed fragment reference at {text[start : start + 40]!r}.")


def _split(values: str | None) -> list[str]:
    """The comma-separated values of a reference; commas within (), {{}} or '' stay."""
    if values is None or not values.strip():
        return []
    found, depth, quoted, current = [], 0, False, ""
    for char in values:
        if char == "'":
            quoted = not quoted
        elif not quoted and char in "({":
            depth += 1
        elif not quoted and char in ")}":
            depth -= 1
        elif char == "," and not quoted and depth == 0:
            found.append(current.strip())
            current = ""
            continue
        current += char
    found.append(current.strip())
    return found


def _read(name: str) -> str:
    """The text of `name`.sql, read from the installed package (a wheel, a zip)."""
    return files(__package__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


#: The todo state machine's files, by family; shared.sql holds what several families share.
FAMILIES = ("shared", "creating", "claiming", "holding", "operating", "retention")
#: The todo state machine's SQL as written: its files joined, in the order of FAMILIES.
SOURCE = "\n".join(_read(family) for family in FAMILIES)
_EVENTS, _AGENTS = _read("events"), _read("agents")
#: The fragments of every file; written() refuses a name that two files define.
_FRAGMENTS = written("\n".join([SOURCE, _EVENTS, _AGENTS]))[1]
queries = parse(SOURCE, _FRAGMENTS)
"""The todo state machine's statements, one per transition and a few it needs besides."""
event_queries = parse(_EVENTS, _FRAGMENTS)
"""The statements of Event.objects, in `events.sql`."""
agent_queries = parse(_AGENTS, _FRAGMENTS)
"""The remote agents' statements of `agents.sql`."""
#: The columns a create leaves NULL in a new todo's row (fragment created_columns): the values
#: its creator gave, which the manager fills in from its own parameters, and CREATED_FRESH.
CREATED_NULLS = frozenset(re.findall(r"NULL::\w+ AS (\w+)", _FRAGMENTS["created_columns"].body))
#: Of CREATED_NULLS, the columns every new todo starts with at their defaults, whoever created
#: it: the manager fills them in from the model's fields (their db_default, else NULL).
CREATED_FRESH = frozenset(
    {
        "state",
        "owner",
        "lease_expires_at",
        "attempt",
        "slot",
        "result",
        "errors_dropped",
        "errors_bytes",
        "progress",
        "awaited",
        "claimed_at",
        "completed_at",
    }
)
