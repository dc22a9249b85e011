"""The example uses switchboard-todos as any project may: through its public API only."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

#: Library modules that are its own plumbing, whatever their names.
PRIVATE_MODULES = {"switchboard_todos.compat"}


def library_imports(source: str) -> list[str]:
    """Each `module` or `module.name` the source imports from switchboard_todos."""
    imported = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported += [f"{node.module}.{alias.name}" for alias in node.names]
    return [name for name in imported if name.split(".")[0] == "switchboard_todos"]


def is_private(name: str) -> bool:
    parts = name.split(".")
    within = {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    return bool(within & PRIVATE_MODULES) or any(part.startswith("_") for part in parts)


def test_the_rule_recognises_private_imports() -> None:
    source = (
        "import switchboard_todos.compat\n"
        "from switchboard_todos.compat import task\n"
        "from switchboard_todos.managers import _async_twin\n"
        "from switchboard_todos.models import Todo\n"
        "from django.db import models\n"
    )
    assert [is_private(name) for name in library_imports(source)] == [True, True, True, False]


def test_the_example_imports_nothing_private() -> None:
    files = sorted((ROOT / "example_project").rglob("*.py"))
    assert len(files) > 5
    private = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in library_imports(path.read_text())
        if is_private(name)
    ]
    assert private == []
