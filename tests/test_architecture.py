"""docs/architecture.md held against the tree: a map whose paths exist, and which names every
package, so that a move or a new package cannot leave it behind."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "docs" / "architecture.md"
#: The concepts a maintainer asks about, each a row of the map's table.
CONCEPTS = (
    "an expired lease",
    "an agent's quota",
    "a queue limit",
    "a dependency",
    "a schedule",
    "a long poll",
    "a NOTIFY",
    "a dead letter",
)


def named_paths(text: str) -> set[str]:
    """The repository paths the text names in backticks (those under a folder of the repo)."""
    return {
        path
        for path in re.findall(r"`([\w./]+)`", text)
        if "/" in path and path.split("/")[0] in {"switchboard_todos", "tests", "docs", "bench"}
    }


def concept_rows(text: str) -> dict[str, str]:
    """{concept: its files cell} of the map's table."""
    return dict(re.findall(r"^\| (.+?) \| (.+) \|$", text, re.MULTILINE))


def test_every_path_the_map_names_exists() -> None:
    paths = named_paths(MAP.read_text())
    assert len(paths) > 40
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert missing == []


def test_the_map_has_a_row_naming_files_for_every_concept() -> None:
    rows = concept_rows(MAP.read_text())
    for concept in CONCEPTS:
        assert concept in rows, concept
        assert named_paths(rows[concept]), concept


def test_the_map_names_every_package() -> None:
    text = MAP.read_text()
    packages = sorted(
        f"switchboard_todos/{path.name}/"
        for path in (ROOT / "switchboard_todos").iterdir()
        if path.is_dir() and path.name != "__pycache__"
    )
    assert len(packages) > 10
    assert [package for package in packages if f"`{package}`" not in text] == []


def test_the_check_finds_a_path_that_is_gone() -> None:
    text = "| a lease | `switchboard_todos/leases.py`, `switchboard_todos/models/todos.py` |"
    assert named_paths(text) == {"switchboard_todos/leases.py", "switchboard_todos/models/todos.py"}
    assert not (ROOT / "switchboard_todos/leases.py").exists()
