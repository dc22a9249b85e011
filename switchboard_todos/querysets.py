"""Claims narrowed with the ORM: `Todo.objects.filter(...).claim_next(owner, ttl)`.

Any filter picks the candidates (agents specialised by payload, by kind, by event); what makes
a todo claimable is always added here and cannot be filtered away: pending and due (or holding
an expired lease with attempts left), assigned to nobody or to the owner, its concurrency key not
held. The candidates are a `select_for_update(skip_locked=True)` query, highest priority and
longest claimable first, run as the subquery of the guarded claim (`claim_filtered` in
sql/claiming.sql): one statement, one round trip.

What it costs depends on the filter: the candidate scan uses whatever index serves the whole
WHERE clause, and a filter no index serves (a payload key, say) reads the claimable todos in
order until it has found `limit` matches — at worst the whole backlog (docs/claims.md shows the
plans). Index what agents filter on, or give each specialisation its own queue.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Self

from django.contrib.postgres.aggregates import JSONBAgg
from django.db import connections, models, transaction
from django.db.models import Exists, F, OuterRef, Q, Subquery
from django.db.models.functions import Greatest, Now
from django.db.models.query import ModelIterable

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.managers.rows import HISTORY
from switchboard_todos.transitions import State
from switchboard_todos.validation import Seconds

if TYPE_CHECKING:
    from switchboard_todos.models import Todo

#: Django's compiled SQL: a "%s" placeholder, or an escaped "%".
_PLACEHOLDER = re.compile(r"%%|%s")


class TodoQuerySet(models.QuerySet["Todo"]):
    """`Todo.objects.filter(...)`: Django's queryset, plus claims of the todos it selects."""

    def with_errors(self) -> Self:
        """These todos with their failure histories, read in the same query (a subquery per
        todo, the entries aggregated in order): `Todo.errors` then costs none."""
        from switchboard_todos.models import ErrorEntry

        return self.annotate(
            **{
                HISTORY: Subquery(
                    ErrorEntry.objects.filter(todo=OuterRef("pk"))
                    .values("todo")
                    .annotate(entries=JSONBAgg("entry", order_by="id"))
                    .values("entries")
                )
            }
        )

    def claim_next(self, owner: str, ttl: Seconds | None = None) -> Todo | None:
        """Claim the longest-claimable todo of the highest priority this queryset selects."""
        claimed = self.claim_batch(owner, ttl, 1)
        return claimed[0] if claimed else None

    def claim_batch(self, owner: str, ttl: Seconds | None, limit: int) -> list[Todo]:
        """Claim up to `limit` todos this queryset selects, in claim order, in one statement."""
        manager = self.model._default_manager.db_manager(self.db)
        return manager.claim_filtered(self, owner, ttl, limit)

    async def aclaim_next(self, owner: str, ttl: Seconds | None = None) -> Todo | None:
        """Async twin of `claim_next`."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.claim_next, thread_sensitive=True)(owner, ttl)

    async def aclaim_batch(self, owner: str, ttl: Seconds | None, limit: int) -> list[Todo]:
        """Async twin of `claim_batch`."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.claim_batch, thread_sensitive=True)(owner, ttl, limit)

    def _check_claimable(self) -> None:
        """Refuse a queryset whose rows are not todos that one statement can lock and claim."""
        from switchboard_todos.models import Todo

        query = self.query
        why = None
        if not issubclass(self.model, Todo):
            why = f"it selects {self.model.__name__} rows, not todos"
        elif query.combinator:
            why = f"it is a {query.combinator}() of querysets"
        elif query.is_sliced:
            why = "it is sliced; give claim_batch a limit instead"
        elif self._iterable_class is not ModelIterable:
            why = "it returns values, not todos (values(), values_list())"
        elif query.distinct or query.group_by is not None:
            why = "it is distinct or aggregated, which FOR UPDATE cannot lock"
        if why is not None:
            raise InvalidTodo(f"This queryset cannot be claimed: {why}.")

    def _candidates(self, owner: str, limit: int) -> tuple[dict[str, str], dict[str, Any]]:
        """The SELECT ... FOR UPDATE SKIP LOCKED of each kind of claimable todo, by the name of
        its place in `claim_filtered` (ready, due, lapsed), and their named parameters.

        Three scans, as the claim's own, so that each can follow its index in claim order (a
        filter on the queue makes the ready scan walk idx_todos_pending) and stop at `limit`.
        """
        from switchboard_todos.models import Todo

        now = Now()
        key_held = Exists(
            Todo.objects.filter(
                concurrency_key=OuterRef("concurrency_key"), state=State.CLAIMED
            ).exclude(pk=OuterRef("pk"))
        )
        mine = self.filter(Q(assignee__isnull=True) | Q(assignee=owner)).filter(
            Q(concurrency_key__isnull=True) | ~key_held
        )
        # Each kind's condition, the column its index is in order of, and the time it ranks
        # at: a ready todo at its turn, the others at their turn or when they became
        # claimable, whichever is later (claim_next in sql/claiming.sql).
        kinds = {
            "ready": (
                Q(state=State.PENDING, next_retry_at__isnull=True),
                "fair_at",
                F("fair_at"),
            ),
            "due": (
                Q(state=State.PENDING, next_retry_at__lte=now),
                "next_retry_at",
                Greatest("fair_at", "next_retry_at"),
            ),
            "lapsed": (
                Q(state=State.CLAIMED, lease_expires_at__lte=now, attempt__lt=F("max_attempts")),
                "lease_expires_at",
                Greatest("fair_at", "lease_expires_at"),
            ),
        }
        connection = connections[self.db]
        scans: dict[str, str] = {}
        params: dict[str, Any] = {}
        # Django compiles FOR UPDATE only inside a transaction. Outside one, an atomic block
        # that runs no statement sends nothing (psycopg skips the COMMIT of an idle
        # connection); inside the caller's, a savepoint would cost two round trips.
        outside = connection.get_autocommit()
        with transaction.atomic(using=self.db) if outside else nullcontext():
            for name, (claimable, since, ranked_at) in kinds.items():
                order = ["-priority", since] if name == "ready" else [since]
                scan = (
                    mine.filter(claimable)
                    .annotate(claimable_at=ranked_at)
                    .order_by(*order)
                    .values_list("id", "queue", "priority", "concurrency_key", "claimable_at")
                    .select_for_update(skip_locked=True, of=("self",))[:limit]
                )
                sql, values = scan.query.get_compiler(using=self.db).as_sql()
                scans[name], named = _named(sql, values, prefix=name)
                params.update(named)
        return scans, params


def _named(
    sql: str, values: tuple[Any, ...] | list[Any], *, prefix: str
) -> tuple[str, dict[str, Any]]:
    """Django's positional "%s" parameters as named ones, for the claim's named statement."""
    named: dict[str, Any] = {}

    def place(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%%"
        key = f"{prefix}_{len(named)}"
        named[key] = values[len(named)]
        return f"%({key})s"

    return _PLACEHOLDER.sub(place, sql), named
