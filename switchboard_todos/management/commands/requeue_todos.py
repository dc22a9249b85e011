"""`manage.py requeue_todos`: send dead letters back to pending (the admin action's CLI twin)."""

from __future__ import annotations

import logging
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from switchboard_todos.bulk import BATCH_SIZE, BulkOutcome, apply_in_batches
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.management.base import OperatorCommand, add_queue_argument
from switchboard_todos.management.cli import positive_int
from switchboard_todos.models import State, Todo
from switchboard_todos.validation import OPERATOR_BATCH_LIMIT

logger = logging.getLogger("switchboard_todos.requeue")

#: How many refused ids are printed per reason; the rest are counted.
IDS_SHOWN = 20


def requeue(
    todo_ids: list[str], queues: list[str], *, all_dead: bool, size: int = BATCH_SIZE
) -> BulkOutcome:
    """Requeue the named todos, or every dead letter in `queues`, `size` per statement."""
    if all_dead:
        dead = Todo.objects.filter(state=State.FAILED, queue__in=queues)
        return apply_in_batches(dead, Todo.objects.requeue_many, batch_size=size)
    outcome = BulkOutcome()
    ids = list(dict.fromkeys(todo_ids))
    for start in range(0, len(ids), size):
        outcome.add(Todo.objects.requeue_many(ids[start : start + size]))
    return outcome


class Command(OperatorCommand):
    help = (
        "Requeue dead letters (failed todos): back to pending with their attempts reset, so "
        "workers run them again. Name todos by id, or take every dead letter of a queue with "
        "--queue Q --all-dead. A dead letter whose idempotency key a live todo holds is left "
        "alone (requeuing it would duplicate that work). Exits 1 if any todo was not requeued."
    )

    examples = [
        "manage.py requeue_todos td_0c6f... td_9a1e...",
        "manage.py requeue_todos --queue mail --all-dead",
        "manage.py requeue_todos --queue mail --queue billing --all-dead",
    ]

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("todo_ids", nargs="*", metavar="TODO_ID", help="Todos to requeue.")
        add_queue_argument(
            parser, "With --all-dead: the queue whose dead letters to requeue; repeat for several."
        )
        parser.add_argument(
            "--all-dead",
            action="store_true",
            help="Requeue every dead letter in the --queue queues, in batches.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=BATCH_SIZE,
            help=f"Todos per statement (default {BATCH_SIZE}); each batch commits on its own.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        todo_ids: list[str] = options["todo_ids"]
        queues: list[str] = options["queues"] or []
        all_dead: bool = options["all_dead"]
        if todo_ids and all_dead:
            raise CommandError("Give todo ids or --all-dead, not both.")
        if all_dead and not queues:
            raise CommandError("--all-dead needs --queue QUEUE (repeat it for several queues).")
        if queues and not all_dead:
            raise CommandError("--queue only goes with --all-dead; to requeue by id, give ids.")
        if options["batch_size"] > OPERATOR_BATCH_LIMIT:
            raise CommandError(f"--batch-size is at most {OPERATOR_BATCH_LIMIT}.")
        if not todo_ids and not all_dead:
            raise CommandError("Nothing to requeue: give todo ids, or --queue QUEUE --all-dead.")
        try:
            outcome = requeue(todo_ids, queues, all_dead=all_dead, size=options["batch_size"])
        except InvalidTodo as error:
            raise CommandError(str(error)) from error
        self.stdout.write(f"Requeued {outcome.changed} todos.")
        logger.info("requeued %d todos, refused %d", outcome.changed, outcome.refused_count)
        for reason, ids in sorted(outcome.refused.items()):
            shown = ", ".join(ids[:IDS_SHOWN])
            more = f" and {len(ids) - IDS_SHOWN} more" if len(ids) > IDS_SHOWN else ""
            self.stderr.write(f"{len(ids)} not requeued: {reason}: {shown}{more}")
        if outcome.refused:
            raise CommandError(f"{outcome.refused_count} todos were not requeued.", returncode=1)
