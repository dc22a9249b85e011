"""Run Django's own `tests/tasks` modules against TodoBackend (tests/django_tasks_suite.py).

Django's wheel has no tests, its sdist has: this fetches the sdist of the installed version
from PyPI (pip download, cached under .cache/), unpacks `tests/tasks` and runs it with Django's
test runner. On Django 5.2 the framework is the django-tasks backport, whose sdist ships no
tests: the run is skipped with a line that says so (the backport is Django 6's code, which the
Django 6 run covers).

    python -m devtools.django_tests [test labels, default: tasks]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "django-tests"


def tests_of(version: str) -> Path:
    """The directory holding `tasks/`, Django `version`'s test package, fetched once."""
    target = CACHE / version
    if (target / "tasks" / "__init__.py").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         "--dest", str(target), f"django=={version}"],
        check=True,
    )  # fmt: skip
    (archive,) = target.glob("[dD]jango-*.tar.gz")
    prefix = f"{archive.name.removesuffix('.tar.gz')}/tests/tasks/"
    with tarfile.open(archive) as sdist:
        members = [member for member in sdist.getmembers() if member.name.startswith(prefix)]
        for member in members:
            member.name = "tasks/" + member.name.removeprefix(prefix)
        sdist.extractall(target, members=members, filter="data")
    archive.unlink()
    return target


def main(labels: list[str]) -> int:
    if django.VERSION < (6, 0):
        print(f"Django {django.get_version()}: the tasks framework is the backport, whose sdist")
        print("ships no tests; Django's own tasks tests run under Django 6 only.")
        return 0
    tests = tests_of(django.get_version())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "django", "test", *(labels or ["tasks"]),
               "--settings=tests.settings", "--testrunner=tests.django_tasks_suite.Runner",
               "--noinput"]  # fmt: skip
    return subprocess.run(command, env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
