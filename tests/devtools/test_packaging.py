"""The installed distribution is the app alone: no dev tooling, example or tests in it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path

from tests.conftest import ROOT


def test_only_the_app_package_is_distributed() -> None:
    """pyproject's package list, applied to the folders of the repository, picks the app only."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert {"devtools", "example_project", "tests", "switchboard_todos"} <= packages
    shipped = {name for name in packages if any(fnmatchcase(name, p) for p in include)}
    assert shipped == {"switchboard_todos"}


def test_devtools_is_not_importable_outside_the_repository(tmp_path: Path) -> None:
    """Installed with `pip install -e .`, the app imports from anywhere; devtools does not."""
    probe = (
        "import importlib.util, switchboard_todos\n"
        "print([importlib.util.find_spec(n) is None for n in ('devtools', 'example_project')])"
    )
    found = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert found.stdout.strip() == "[True, True]"
