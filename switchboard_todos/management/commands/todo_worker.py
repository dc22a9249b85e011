"""`manage.py todo_worker`: run the handlers of claimed todos until stopped (see docs/worker.md)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from switchboard_todos import validation
from switchboard_todos.claims.selection import EVERY
from switchboard_todos.exceptions import InvalidTodo, WorkerCrashed
from switchboard_todos.management import cli
from switchboard_todos.management.base import chosen_databases
from switchboard_todos.worker import Worker
from switchboard_todos.worker.claiming import DEFAULT_BATCH_SIZE


def _ttl(text: str) -> float:
    """A lease length: a duration of at most 12 hours."""
    return validation.ttl(cli.seconds(text)).total_seconds()


class Command(BaseCommand):
    help = (
        "Claim todos from the given queues and run their handlers until SIGTERM or SIGINT: "
        "the first lets the todos in hand finish, a second releases them and exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            type=_queue_or_every,
            help="A queue to claim from; repeat for several, or '*' for every queue "
            "(default: 'default').",
        )
        parser.add_argument(
            "--exclude-queue",
            action="append",
            dest="exclude_queues",
            default=[],
            type=cli.queue_name,
            metavar="QUEUE",
            help="With --queue '*': a queue not to claim from; repeat for several.",
        )
        parser.add_argument(
            "--database",
            action="append",
            dest="databases",
            metavar="ALIAS",
            help="Serve the queues of this database; repeat for several. Default: the databases "
            "the queues live in (with --queue '*': every database that holds todos).",
        )
        parser.add_argument(
            "--backend",
            metavar="ALIAS",
            help="Serve the queues of this TASKS backend (a TodoBackend): its QUEUES, or every "
            "queue when QUEUES is empty. Instead of --queue.",
        )
        parser.add_argument(
            "--concurrency",
            type=cli.at_most(1000),
            default=1,
            help="Todos run at once, each on its own thread (default: 1).",
        )
        parser.add_argument(
            "--ttl",
            type=cli.checked(_ttl),
            default=30.0,
            help="Lease length (30, 90s, 5m), renewed by heartbeats every third (default: 30s).",
        )
        parser.add_argument(
            "--batch-size",
            type=cli.at_most(validation.CLAIM_BATCH_LIMIT),
            default=DEFAULT_BATCH_SIZE,
            help=f"Most todos claimed at once, for quick handlers (default: {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--owner",
            type=cli.owner,
            help="The worker id holding the leases (default: host:pid:random).",
        )
        parser.add_argument(
            "--listen",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="Wake on new work through LISTEN/NOTIFY; --no-listen polls only, as needed "
            "behind PgBouncer in transaction mode (default: SWITCHBOARD_TODOS_LISTEN, off "
            "with SWITCHBOARD_TODOS_POOLER = 'transaction').",
        )
        parser.add_argument(
            "--poll-interval",
            type=cli.seconds,
            default=1.0,
            help="Longest wait between claims that found nothing, in seconds (default: 1).",
        )
        parser.add_argument(
            "--max-todos",
            type=cli.positive_int,
            help="Exit after this many todos (recycling, tests).",
        )
        parser.add_argument(
            "--max-seconds",
            type=cli.seconds,
            help="Stop claiming after this many seconds, then exit once the todos in hand end.",
        )
        parser.add_argument(
            "--timeout",
            type=cli.checked(validation.handler_timeout),
            help="Fail a todo whose handler runs longer than this (30, 90s, 5m) and replace its "
            "thread; a handler's own @handler(timeout=) wins (default: none).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=cli.seconds,
            help="After the first SIGTERM, wait this long for the running todos, then release "
            "them and exit, as a second SIGTERM does (default: wait for them).",
        )
        parser.add_argument(
            "--import-module",
            action="append",
            dest="import_modules",
            default=[],
            metavar="MODULE",
            help="Import this module first, for handlers outside todo_handlers modules.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _configure_logging(options["verbosity"])
        for module in options["import_modules"]:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise CommandError(f"--import-module {module}: {error}") from error
        try:
            queues = _queues(options["queues"], options["backend"])
        except (ImproperlyConfigured, InvalidTodo) as error:
            raise CommandError(str(error)) from error
        if options["exclude_queues"] and queues != [EVERY]:
            raise CommandError("--exclude-queue applies to --queue '*' (every queue) only.")
        databases = chosen_databases(options) if options["databases"] else None
        try:
            worker = self._worker(queues, databases, options)
        except InvalidTodo as error:
            raise CommandError(str(error)) from error
        try:
            worker.run()
        except WorkerCrashed as error:
            raise CommandError(str(error)) from error

    def _worker(
        self, queues: list[str], databases: list[str] | None, options: dict[str, Any]
    ) -> Worker:
        return Worker(
            queues,
            databases=databases,
            exclude_queues=options["exclude_queues"],
            concurrency=options["concurrency"],
            ttl=options["ttl"],
            owner=options["owner"],
            batch_size=options["batch_size"],
            listen=options["listen"],
            poll_interval=options["poll_interval"],
            max_todos=options["max_todos"],
            max_seconds=options["max_seconds"],
            timeout=options["timeout"],
            shutdown_timeout=options["shutdown_timeout"],
        )


def _queue_or_every(text: str) -> str:
    return EVERY if text == EVERY else cli.queue_name(text)


def _queues(named: list[str] | None, backend: str | None) -> list[str]:
    """The queues of --queue, or of --backend's TASKS entry (default: 'default')."""
    if backend is None:
        return named or ["default"]
    if named:
        raise CommandError("Give --queue or --backend, not both.")
    from switchboard_todos.backends import TodoBackend
    from switchboard_todos.compat import task_backends

    try:
        configured = task_backends[backend]
    except Exception as error:  # InvalidTaskBackend, whose module differs by Django version
        raise CommandError(f"--backend {backend}: {error}") from error
    if not isinstance(configured, TodoBackend):
        raise CommandError(
            f"--backend {backend}: {type(configured).__name__} is not a TodoBackend; its tasks "
            "are not todos."
        )
    return sorted(configured.queues) or [EVERY]


def _configure_logging(verbosity: int) -> None:
    """Show the app's log on stderr unless the project's LOGGING already routes it."""
    logger = logging.getLogger("switchboard_todos")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    levels = {0: logging.WARNING, 1: logging.INFO}
    logger.setLevel(levels.get(verbosity, logging.DEBUG))
