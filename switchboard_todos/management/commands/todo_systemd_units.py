"""`manage.py todo_systemd_units`: write the shipped systemd units with their placeholders filled.

It exists because the usual mistake is the interpreter: run from the project's virtualenv, it
writes that Python into ExecStart= without being told, and it refuses what systemd would
misread (relative paths, spaces, `%` and `$`) or what the units must not do (run as root).
"""

from __future__ import annotations

import os
import re
import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from switchboard_todos.units import render, unit_files

DEFAULT_ENV_FILE = "/etc/switchboard-todos/env"
# systemd would split on whitespace and expand % (specifiers), $ (variables) and quotes.
_UNSAFE = re.compile(r"[\s%$\"'\\;]")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?")


class Command(BaseCommand):
    help = (
        "Write the systemd units shipped with switchboard-todos (reaper service, reaper timer, "
        "worker template, purge timer) into --output with their placeholders filled in: the "
        "Python that runs this command, the project directory, the account and the "
        "environment file. Then: systemctl daemon-reload and enable the units you want "
        "(see docs/operating.md)."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--output",
            required=True,
            metavar="DIR",
            help="Where to write the units, e.g. /etc/systemd/system (created if missing).",
        )
        parser.add_argument(
            "--user",
            required=True,
            help="The account the services run as; not root.",
        )
        parser.add_argument(
            "--project-dir",
            default=str(Path.cwd()),
            metavar="DIR",
            help="The directory holding manage.py; default: the current directory.",
        )
        parser.add_argument(
            "--python",
            default=sys.executable,
            metavar="PATH",
            help=(
                "The interpreter of the project's virtualenv; default: the one running this "
                f"command ({sys.executable})."
            ),
        )
        parser.add_argument(
            "--env-file",
            default=DEFAULT_ENV_FILE,
            metavar="PATH",
            help=(
                "The file the units read DATABASE_URL, DJANGO_SETTINGS_MODULE and the "
                f"SWITCHBOARD_* tunables from; default {DEFAULT_ENV_FILE}."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user: str = options["user"]
        if not _USER.fullmatch(user):
            raise CommandError(f"--user {user!r} is not a valid account name.")
        if user == "root":
            raise CommandError("--user root: the units must run as an unprivileged account.")
        project_dir = _absolute(options["project_dir"], "--project-dir")
        if not (project_dir / "manage.py").is_file():
            raise CommandError(f"--project-dir {project_dir} holds no manage.py.")
        python = _absolute(options["python"], "--python")
        if not python.is_file():
            raise CommandError(f"--python {python} is not a file.")
        env_file = _absolute(options["env_file"], "--env-file")
        output = Path(options["output"])
        values = {
            "PYTHON": str(python),
            "PROJECT_DIR": str(project_dir),
            "USER": user,
            "ENV_FILE": str(env_file),
        }
        output.mkdir(parents=True, exist_ok=True)
        for name, template in unit_files().items():
            (output / name).write_text(render(template, values), encoding="utf-8")
            self.stdout.write(f"Wrote {output / name}")
        if not env_file.exists():
            self.stdout.write(
                f"Create {env_file} (DATABASE_URL=…, DJANGO_SETTINGS_MODULE=…) before starting."
            )
        self.stdout.write(
            "Next: systemctl daemon-reload, then enable switchboard-reaper.service (or "
            "switchboard-reaper.timer), switchboard-worker@QUEUE.service per queue, and "
            "switchboard-purge.timer."
        )


def _absolute(text: str, flag: str) -> Path:
    """An absolute, normalised path that systemd takes literally; symlinks are kept.

    Symlinks are kept on purpose: a virtualenv's bin/python is a link out of the virtualenv.
    """
    if _UNSAFE.search(text):
        raise CommandError(
            f"{flag} {text!r} holds a space, quote, backslash, ';', '%' or '$', which systemd "
            "would misread; choose another path or edit the units by hand."
        )
    return Path(os.path.abspath(text))
