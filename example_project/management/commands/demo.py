"""`manage.py demo`: web server, workers, reaper and seeded work until Ctrl-C (docs/demo.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from devtools.processes import Console
from example_project.demo import Demo, port_is_free
from switchboard_todos.management.cli import positive_int

MAX_WORKERS = 16


def _port(text: str) -> int:
    port = positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)")
    return port


def _workers(text: str) -> int:
    workers = positive_int(text)
    if workers > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_WORKERS} workers, not {workers}")
    return workers


class Command(BaseCommand):
    help = (
        "Run the example project end to end for local development: migrate, create a demo "
        "admin user (printing its password), start the web server (runserver), the workers "
        "and the reaper, seed todos, django.tasks tasks and signed webhook deliveries, and "
        "report what becomes of them. Ctrl-C or SIGTERM stops everything. Refused with DEBUG "
        "off."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port", type=_port, default=8000, help="Port of 127.0.0.1 to serve on (8000)."
        )
        parser.add_argument(
            "--workers", type=_workers, default=1, metavar="N", help="Worker processes (1)."
        )
        parser.add_argument(
            "--no-seed",
            dest="seed",
            action="store_false",
            help="Seed nothing: start the processes only.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError(
                "manage.py demo is for local development only: it creates an admin user with "
                "a password it prints, and runs Django's development server. It refuses to "
                "run with DEBUG off; run it with DEBUG=1 (make demo does)."
            )
        port: int = options["port"]
        if not port_is_free(port):
            raise CommandError(
                f"Port {port} of 127.0.0.1 is in use. Choose another with --port "
                f"(make demo DEMO_ARGS='--port {port + 1}')."
            )
        demo = Demo(
            Console(sys.stdout), port=port, workers=options["workers"], seed=options["seed"]
        )
        if not demo.run():
            raise CommandError("The demo did not run or stop cleanly; see above.")
