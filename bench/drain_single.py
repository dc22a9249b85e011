"""Scenario 3: drain a backlog one todo at a time, `claim_next` + `complete` per todo.

The reference is the raw single-claim loop: one claim statement and one complete statement
per todo. Both run in 1, 4 and 8 processes at once, against the same backlog.
"""

from __future__ import annotations

from functools import partial

from bench import raw
from bench.harness import QUEUE, TTL, Bench, Child, Row, Target, plural

#: The single-op path should reach this share of the raw single-claim loop's rate.
TARGET = Target(ratio=0.8)


def ours(child: Child, *, owner: str) -> int:
    """Claim and complete one todo at a time through the manager, until the queue is empty."""
    from django.db import connection

    from switchboard_todos.models import Todo

    connection.ensure_connection()
    child.start()
    done = 0
    while True:
        todo = Todo.objects.claim_next(QUEUE, owner, TTL)
        if todo is None:
            return done
        Todo.objects.complete(todo.id, owner)
        done += 1
        child.count()


def run(bench: Bench) -> None:
    backlog = bench.size(full=4000, smoke=60)
    for workers in bench.workers:
        figures = bench.interleave(
            {
                "ours": partial(bench.drain, ours, workers, backlog),
                "raw": partial(bench.drain, raw.drain, workers, backlog, batch=1),
            }
        )
        bench.add(
            Row(
                f"drain, claim_next + complete, {plural(workers, 'process')}",
                figures["ours"],
                figures["raw"],
                "claim + complete",
                target=TARGET,
            )
        )
