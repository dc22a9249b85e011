"""The raw psycopg reference: the textbook SKIP LOCKED queue on the same table, without Django.

It connects the way a plain psycopg program does (autocommit, psycopg's defaults: parameters
bound on the server, a statement prepared from its fifth run), and claims from the same
index our claim uses. What it leaves out is what our statements add: retries coming due,
expired leases, assignees, failure history, the miss diagnosis, and the Todo instances.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import psycopg

from bench.harness import QUEUE, TTL, Child

#: Claim up to %(limit)s pending todos of a queue, highest priority first, then by turn (a todo
#: without a fair key has its creation time as its turn), skipping locked rows: in the order of
#: idx_todos_pending, so the scan stops at the first unlocked rows, and updating by primary key
#: (`= ANY (ARRAY(...))`). (An `UPDATE ... FROM` of a CTE ordered by `created_at` alone sorted
#: the queue's whole backlog at every claim: a reference half as fast as a careful hand-written
#: loop, which flattered our ratios; so did `ORDER BY priority DESC, created_at` once the index
#: was in turn order, a third as fast.)
CLAIM = """
UPDATE todos
   SET state = 'claimed', owner = %(owner)s, lease_expires_at = now() + %(ttl)s,
       attempt = attempt + 1, claimed_at = now(), updated_at = now()
 WHERE id = ANY (ARRAY(
           SELECT id
             FROM todos
            WHERE state = 'pending' AND next_retry_at IS NULL AND queue = %(queue)s
            ORDER BY priority DESC, fair_at
            LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED))
RETURNING todos.*
"""

#: Mark one todo done; the same guard as ours (claimed, same owner).
COMPLETE = """
UPDATE todos
   SET state = 'done', lease_expires_at = NULL, completed_at = now(), updated_at = now()
 WHERE id = %(id)s AND state = 'claimed' AND owner = %(owner)s
"""

#: Mark many todos done in one statement.
COMPLETE_MANY = """
UPDATE todos
   SET state = 'done', lease_expires_at = NULL, completed_at = now(), updated_at = now()
 WHERE id = ANY(%(ids)s) AND state = 'claimed' AND owner = %(owner)s
"""


def connect() -> psycopg.Connection[tuple[Any, ...]]:
    """A plain psycopg connection to the benchmark database (`setup.configure` exports it)."""
    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def column(cursor: psycopg.Cursor[tuple[Any, ...]], name: str) -> int:
    """Where column `name` is in the rows `cursor` returned."""
    return [described.name for described in cursor.description or ()].index(name)


def handle(row: tuple[Any, ...]) -> None:
    """The reference's no-op handler, called once per todo as ours is."""


def drain(child: Child, *, owner: str, batch: int) -> int:
    """Claim `batch` todos at a time and complete them, until the queue is empty."""
    params = {"queue": QUEUE, "limit": batch, "owner": owner, "ttl": timedelta(seconds=TTL)}
    done = 0
    with connect() as connection, connection.cursor() as cursor:
        child.start()
        while True:
            rows = cursor.execute(CLAIM, params).fetchall()
            if not rows:
                return done
            at = column(cursor, "id")
            for row in rows:
                handle(row)
            if batch == 1:
                cursor.execute(COMPLETE, {"id": rows[0][at], "owner": owner})
            else:
                cursor.execute(COMPLETE_MANY, {"ids": [row[at] for row in rows], "owner": owner})
            done += len(rows)
            child.count(len(rows))
