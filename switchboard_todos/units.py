"""The systemd unit files shipped in `switchboard_todos/systemd/`, and filling in placeholders.

The files hold `@NAME@` placeholders for what differs per installation; they are written out
ready to install by `manage.py todo_systemd_units`, or edited by hand (docs/operating.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.resources import files

#: Each placeholder, and what it stands for.
PLACEHOLDERS = {
    "PYTHON": "the Python of the project's virtualenv",
    "PROJECT_DIR": "the directory holding the project's manage.py",
    "USER": "the non-root account the services run as",
    "ENV_FILE": "the file with DATABASE_URL and DJANGO_SETTINGS_MODULE",
}

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def unit_files() -> dict[str, str]:
    """Return {file name: text} of every shipped unit file."""
    directory = files("switchboard_todos").joinpath("systemd")
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(directory.iterdir(), key=lambda entry: entry.name)
        if entry.name.endswith((".service", ".timer"))
    }


def render(template: str, values: Mapping[str, str]) -> str:
    """Replace every `@NAME@` in `template`; each must be one of PLACEHOLDERS and given."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in PLACEHOLDERS:
            raise KeyError(f"unknown placeholder @{name}@")
        return values[name]

    return _PLACEHOLDER.sub(replace, template)
