"""Claiming: `claim_next` and `claim_batch` from queues (with their long polls), the claim of
an ORM queryset, and `claim` of one todo by id."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, IntegrityError, connections

from switchboard_todos import cursors, faults, tracing, validation
from switchboard_todos.claims import long_polls
from switchboard_todos.claims.marks import marks
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.managers.holding import Receipt, receipt_guard
from switchboard_todos.managers.machinery import (
    KEY_RACE_TRIES,
    RACED_INDEXES,
    Machinery,
    async_twin,
    constraint_name,
    leased,
    run_now,
)
from switchboard_todos.querysets import TodoQuerySet
from switchboard_todos.sql import queries
from switchboard_todos.validation import Seconds

if TYPE_CHECKING:
    from switchboard_todos.models import Todo


class Claiming(Machinery):
    """`Todo.objects`' claims."""

    def claim_next(
        self,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None = None,
        *,
        wait: Seconds | None = None,
        max_held: int | None = None,
        credential: str | None = None,
    ) -> Todo | None:
        """Claim the longest-claimable todo in `queues` for `owner`, or return None.

        One statement; rows other workers are claiming are skipped, never waited for. With
        `wait`, block until a todo is claimable or `wait` has passed (SQS long polling),
        woken by LISTEN/NOTIFY (unless SWITCHBOARD_TODOS_LISTEN is off) and polling. With
        `max_held`, claim nothing once `owner` holds that many todos. Without `ttl`, each todo's
        lease is its queue's visibility timeout (Queue), else SWITCHBOARD_TODOS_DEFAULT_TTL.
        `credential` is a remote agent's (`owner`'s) credential salt, as its surface read it
        (agents/service): the claim takes nothing unless it still holds.
        """
        claimed = self.claim_batch(
            queues, owner, ttl, limit=1, wait=wait, max_held=max_held, credential=credential
        )
        return claimed[0] if claimed else None

    def claim_batch(
        self,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None,
        limit: int,
        *,
        wait: Seconds | None = None,
        max_held: int | None = None,
        credential: str | None = None,
    ) -> list[Todo]:
        """Claim up to `limit` claimable todos in `queues` for `owner`, oldest first.

        With `wait`, block until at least one is claimable or `wait` has passed. With
        `max_held`, claim only as many as bring the todos `owner` holds up to that many. With
        a `credential`, only while it holds (as `claim_next`).
        """
        return run_now(
            self._claim_batch(
                _Blocking(self), queues, owner, ttl, limit, wait, max_held, credential
            )
        )

    async def aclaim_batch(
        self,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None,
        limit: int,
        *,
        wait: Seconds | None = None,
        max_held: int | None = None,
        credential: str | None = None,
    ) -> list[Todo]:
        """Async twin of `claim_batch`; a blocking claim waits without holding a thread."""
        return await self._claim_batch(
            _Suspending(self), queues, owner, ttl, limit, wait, max_held, credential
        )

    async def aclaim_next(
        self,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None = None,
        *,
        wait: Seconds | None = None,
        max_held: int | None = None,
        credential: str | None = None,
    ) -> Todo | None:
        """Async twin of `claim_next`."""
        claimed = await self.aclaim_batch(
            queues, owner, ttl, limit=1, wait=wait, max_held=max_held, credential=credential
        )
        return claimed[0] if claimed else None

    async def _claim_batch(
        self,
        io: _Blocking,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None,
        limit: int,
        wait: Seconds | None,
        max_held: int | None,
        credential: str | None,
    ) -> list[Todo]:
        """`claim_batch` and its twin, one code: `io` claims and waits, each its way.

        A claim with a wait is a long poll of the process's waiters (long_polls.py): it joins
        them before its first claim, so that a todo committed after that claim began is
        notified to it, then waits for a ring or its turn to poll.
        """
        params = leased(
            validation.arguments(
                queues=queues, owner=owner, ttl=ttl, limit=limit, wait=wait, max_held=max_held
            )
        )
        params["credential"] = credential
        placed = self._placed(params["queues"])
        if placed is not self:
            io = type(io)(placed)
        seconds = params.pop("wait")
        if not seconds:
            return await io.claim(params)
        poll = long_polls.LongPoll(
            placed._db_alias, params["owner"], params["queues"], seconds, listening=conf.LISTEN
        )
        await io.join(poll)
        try:
            while True:
                claimed, fault, backoff = await io.claim_through_faults(params)
                poll.claimed([todo.queue for todo in claimed], params["limit"])
                if claimed:
                    return claimed
                while True:  # until rung, or its turn to poll
                    pause = poll.pause()
                    if pause is None:
                        if fault is not None:
                            raise fault  # still down at the end of the wait: the caller learns so
                        return claimed
                    if fault is not None:
                        await io.wait(poll, min(pause, backoff))
                        break
                    if await io.wait(poll, pause):
                        break
        finally:
            poll.leave()

    def claim_filtered(
        self, queryset: TodoQuerySet, owner: str, ttl: Seconds | None, limit: int
    ) -> list[Todo]:
        """Claim up to `limit` of the todos `queryset` selects, in claim order, in one statement.

        `queryset.claim_batch(owner, ttl, limit)` says the same; see querysets.py.
        """
        if not isinstance(queryset, TodoQuerySet):
            raise InvalidTodo(
                f"queryset must be a queryset of todos (Todo.objects.filter(...)), not "
                f"{type(queryset).__name__}."
            )
        queryset._check_claimable()
        params = leased(validation.arguments(owner=owner, ttl=ttl, limit=limit))
        scans, scan_params = queryset._candidates(params["owner"], params["limit"])
        params = {**params, **scan_params, "max_held": None}
        statement = queries["claim_filtered"].format_map(scans)
        began = tracing.started()
        for _ in range(KEY_RACE_TRIES):
            try:
                claimed = [
                    todo for todo, _ in self._run("claim_filtered", params, statement=statement)
                ]
            except IntegrityError as error:
                if not self._lost_key_race(error):
                    raise
            else:
                if began is not None:
                    tracing.received(began, "claim_filtered", claimed, params["owner"])
                return claimed
        return []

    def _claim(self, params: Mapping[str, Any]) -> list[Todo]:
        """Run the claim from the queues' low-water marks (claims/marks.py) and move them.

        Lean (claim_ready) unless it is a full scan or the last claim from these queues found
        one paused or limited (claims/marks.py); a lean claim that finds one so claims nothing,
        and the full one runs. The full claim of queues known to be paused or limited waits for
        its turn at their rows first, in the same round trip (claim_turn in
        sql/claiming.sql). A claim that keeps losing races for concurrency keys claims nothing.
        """
        alias = self._db_alias
        queues = params["queues"]
        found = marks.for_claim(alias, queues)
        params = {**params, "queues": cursors.array_literal(queues), **found.params()}
        in_turn = not marks.lean(alias, queues)
        lean = not found.full_scan and not in_turn
        began = tracing.started()

        def claim(statement: str, limited: list[Any]) -> list[tuple[Todo, Any]]:
            return self._run(
                "claim_next",
                params,
                extra="ready_turn",
                statement=queries[_statement(statement, params["limit"])],
                markers=limited,
                ahead="claim_turn" if in_turn else None,
            )

        for _ in range(KEY_RACE_TRIES):
            try:
                limited: list[Any] = []
                if lean:
                    rows = claim("claim_ready", limited)
                    lean = not limited
                    in_turn = bool(limited)
                if not lean:
                    limited.clear()
                    rows = claim("claim_next", limited)
                marks.found(alias, queues, limited=bool(limited))
            except IntegrityError as error:
                if not self._lost_key_race(error):
                    raise
                continue
            # The turns of ready todos only: a due retry or an expired lease says nothing of
            # where the ready ones begin.
            marks.claimed(
                alias,
                ((todo.queue, todo.priority, turn) for todo, turn in rows if turn),
                at=max((todo.claimed_at for todo, _ in rows if todo.claimed_at), default=None),
                short_of=queues if len(rows) < params["limit"] else (),
            )
            claimed = [todo for todo, _ in rows]
            if began is not None:
                tracing.received(began, "claim", claimed, params["owner"])
            return claimed
        return []

    def _lost_key_race(self, error: IntegrityError) -> bool:
        """Whether a claim failed because a concurrent claim took a concurrency key, or a slot
        of a queue's concurrency limit, first.

        Both saw it free; the unique index let the other one through. Running the claim again
        sees that holder and passes it over. Inside the caller's transaction the error has
        aborted it, so it is the caller's to see.
        """
        return (
            constraint_name(error) in RACED_INDEXES
            and not connections[self._db_alias].in_atomic_block
        )

    def _claim_through_faults(
        self, params: Mapping[str, Any]
    ) -> tuple[list[Todo], DatabaseError | None, float]:
        """A claim of a blocking wait: a fault of the database (an outage, a failover that left
        it read-only) is returned with the backoff to wait, not raised, so the wait rides it
        out; the process's blocking claims log one line when it begins and one when it ends.
        """
        try:
            claimed = self._claim(params)
        except DatabaseError as error:
            if not faults.is_outage(error):
                raise
            backoff = _BLOCKING_OUTAGE.failed("blocking claim", error)
            connections[self._db_alias].close()  # a new connection, to the new primary
            return [], error, backoff
        _BLOCKING_OUTAGE.passed()
        return claimed, None, 0.0

    def claim(self, todo_id: str, owner: str, ttl: Seconds | None = None) -> Todo:
        """Claim one todo by id; it must be due, and assigned to `owner` or to nobody."""
        params = leased(validation.arguments(todo_id=todo_id, owner=owner, ttl=ttl))
        began = tracing.started()
        try:
            claimed = self._transition("claim", params)
        except IntegrityError as error:
            if not self._lost_key_race(error):
                raise
            claimed = None  # a concurrent claim took its concurrency key: say so below
        if claimed is None:
            return self._classify_miss("claim", todo_id, owner)
        if began is not None:
            tracing.received(began, "claim", [claimed], params["owner"])
        return claimed

    def _give_back(self, todos: Iterable[Todo], owner: str) -> None:
        """Give back `todos`, claimed for `owner` by a claim whose caller could not take them
        (its client went away, or its answer failed): each released in the database it came
        from (sql/holding.sql), pending again at once, the attempt not counted. Only that
        claim is given back (its receipt): one `owner` no longer holds under it (an operator
        cancelled it meanwhile, or its lease lapsed and `owner` claimed it again) is left
        alone."""
        for todo in todos:
            params = validation.arguments(todo_id=todo.id, owner=owner, delay=None)
            assert todo.claimed_at is not None
            guard = receipt_guard(Receipt(todo.attempt, todo.claimed_at))
            self.db_manager(todo._state.db)._transition(
                "release", {**params, **guard, "credential": None, "notify": conf.LISTEN}
            )

    aclaim = async_twin(claim)
    aclaim_filtered = async_twin(claim_filtered)


#: The blocking claims of this process share one view of a database fault.
_BLOCKING_OUTAGE = faults.Outage("blocking claims")

#: The largest limit of the `_few` claims, whose scans lock under this cap (claim_next in
#: sql/claiming.sql says why a cap near the limit keeps a claim in the index's order).
FEW = 100


def _statement(claim: str, limit: int) -> str:
    """The statement of a claim (claim_next, full, or claim_ready, lean) of at most `limit`
    todos: the one whose scans lock under the smallest cap that holds the limit."""
    if limit == 1 and claim == "claim_ready":
        return "claim_one"
    return f"{claim}_few" if limit <= FEW else claim


class _Blocking:
    """How `claim_batch` claims and waits: on the calling thread, keeping its connection while
    it waits (long_polls.py says why). Its awaits never suspend."""

    def __init__(self, manager: Claiming) -> None:
        self.manager = manager

    async def claim(self, params: Mapping[str, Any]) -> list[Todo]:
        return self.manager._claim(params)

    async def claim_through_faults(
        self, params: Mapping[str, Any]
    ) -> tuple[list[Todo], DatabaseError | None, float]:
        return self.manager._claim_through_faults(params)

    async def join(self, poll: long_polls.LongPoll) -> None:
        poll.join()

    async def wait(self, poll: long_polls.LongPoll, seconds: float) -> bool:
        return poll.wait(seconds)


class _Suspending(_Blocking):
    """How `aclaim_batch` claims and waits: a claim without a wait in the caller's thread, as
    every async twin; the claims of a long poll on the process's claim threads, suspended
    while it waits, so that it holds neither a thread nor a connection meanwhile. Cancelled
    (its client went away), it claims nothing more, and gives back what a claim running then
    took (long_polls.cancellable_claim)."""

    async def claim(self, params: Mapping[str, Any]) -> list[Todo]:
        owner = params["owner"]
        claim = sync_to_async(self.manager._claim, thread_sensitive=True)(params)
        give_back = functools.partial(self.manager._give_back, owner=owner)
        return await long_polls.cancellable_claim(owner, claim, give_back)

    async def claim_through_faults(
        self, params: Mapping[str, Any]
    ) -> tuple[list[Todo], DatabaseError | None, float]:
        owner = params["owner"]
        claim = long_polls.claim_threads().run(owner, self.manager._claim_through_faults, params)
        return await long_polls.cancellable_claim(
            owner, claim, lambda found: self.manager._give_back(found[0], owner)
        )

    async def join(self, poll: long_polls.LongPoll) -> None:
        await poll.ajoin()

    async def wait(self, poll: long_polls.LongPoll, seconds: float) -> bool:
        return await poll.await_ring(seconds)
