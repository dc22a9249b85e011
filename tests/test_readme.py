"""The README keeps up with the code: every public manager method and every check id is in it."""

from __future__ import annotations

import inspect
import re

import pytest
from django.db import models

from switchboard_todos.events import EventManager
from switchboard_todos.managers import TodoManager
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The one sentence that documents every `a`-prefixed twin at once.
TWINS_SENTENCE = "every method has an `a`-prefixed async twin"
CHECK_ID = re.compile(r"""["'](switchboard_todos\.([EW]\d{3}))["']""")


def public_methods(manager: type[models.Manager[models.Model]]) -> set[str]:
    """The methods a manager adds to Django's: no underscore, not inherited from Manager."""
    inherited = set(dir(models.Manager))
    return {
        name
        for name, member in inspect.getmembers(manager, callable)
        if not name.startswith("_") and name not in inherited
    }


def undocumented(methods: set[str], readme: str) -> list[str]:
    """The methods no code span of the README names, e.g. `claim(...)` or `claim`.

    An async twin (`aclaim` beside `claim`) counts as documented by the sentence on twins.
    """
    twins_documented = TWINS_SENTENCE in " ".join(readme.split())
    return sorted(
        name
        for name in methods
        if not re.search(rf"`(?:\w+\.objects\.)?{name}[(`]", readme)
        and not (twins_documented and name.startswith("a") and name[1:] in methods)
    )


def test_the_rule_sees_a_missing_method_and_a_missing_twin_sentence() -> None:
    methods = {"claim", "aclaim", "purge"}
    assert undocumented(methods, f"`claim(todo_id)`, {TWINS_SENTENCE}") == ["purge"]
    assert undocumented(methods, "`claim(todo_id)` and `purge`") == ["aclaim"]


@pytest.mark.parametrize("manager", [TodoManager, EventManager])
def test_every_public_manager_method_is_in_the_readme(
    manager: type[models.Manager[models.Model]],
) -> None:
    methods = public_methods(manager)
    assert methods, f"{manager.__name__} has no public method of its own"
    assert undocumented(methods, README) == []


def test_every_system_check_id_is_in_the_readme() -> None:
    """Each id the app's checks can report, as `switchboard_todos.E007` or, in a list, `E007`."""
    found = {
        match.group(1): match.group(2)
        for path in (ROOT / "switchboard_todos").rglob("*.py")
        for match in CHECK_ID.finditer(path.read_text(encoding="utf-8"))
    }
    assert {"switchboard_todos.E001", "switchboard_todos.E007"} <= set(found)
    missing = [
        full
        for full, short in sorted(found.items())
        if f"`{full}`" not in README and f"`{short}`" not in README
    ]
    assert missing == []
