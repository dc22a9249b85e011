"""What operators and the reaper do: reap expired leases, requeue dead letters, expire a
lease, cancel, set a priority, each for one todo or many (a `BatchResult`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple

from django.db import IntegrityError, transaction

from switchboard_todos import validation
from switchboard_todos.conf import conf
from switchboard_todos.managers.machinery import (
    Machinery,
    async_twin,
    constraint_name,
    with_history,
)
from switchboard_todos.sql import queries
from switchboard_todos.transitions import TRANSITIONS, State

if TYPE_CHECKING:
    from switchboard_todos.models import Todo


class ReapResult(NamedTuple):
    """What one reaper sweep did."""

    requeued: int
    dead_lettered: int


class RepairResult(NamedTuple):
    """What `repair_blocked` did to children whose count a race left stale."""

    unblocked: int
    """Due now: they wait for nothing any more."""
    recounted: int
    """Still blocked, by fewer parents."""
    cancelled: int
    """Dead letters: a parent had failed, and their policy is 'cancel'."""


#: How far back repair_blocked looks for stale children by default (the reaper's every sweep):
#: a child whose creating transaction stayed open longer than this is not repaired by itself.
#: Each sweep reads the parents of every blocked todo created this recently.
REPAIR_WINDOW = timedelta(minutes=5)


class BatchResult(NamedTuple):
    """What an operator batch did: the todos it changed, and why it left each of the others."""

    changed: list[Todo]
    refused: dict[str, str]
    """Todo id -> why it was left alone, e.g. "a live todo holds the same idempotency key"."""


class Operating(Machinery):
    """`Todo.objects`' repairs, and the reaper's sweep."""

    def reap_expired(self) -> ReapResult:
        """Requeue every todo whose lease expired, or dead-letter it when no attempt is left.

        In batches of SWITCHBOARD_TODOS_REAP_BATCH, one statement (and, outside a transaction,
        one commit) each, so that no sweep holds many rows locked at once.
        """
        requeued = dead_lettered = 0
        params = with_history({"notify": conf.LISTEN, "limit": conf.REAP_BATCH})
        while True:
            with self._cursor() as cursor:
                cursor.execute(queries["reap_expired"], params)
                batch_requeued, batch_dead_lettered, ids = cursor.fetchone()
            self._signal("reap_expired", functools.partial(self._reread, ids))
            requeued += batch_requeued
            dead_lettered += batch_dead_lettered
            if len(ids) < params["limit"]:
                return ReapResult(requeued=requeued, dead_lettered=dead_lettered)

    def repair_blocked(self, within: timedelta = REPAIR_WINDOW) -> RepairResult:
        """Recount the blocked todos created within `within` whose count a race left stale.

        A child created while a parent of it ended can count that parent as not ended, and
        never hear of its end (docs/dependencies.md): this gives it the count its parents'
        states say, unblocking it (or cancelling it, for a failed parent and the policy
        'cancel'). The reaper runs it at every sweep. One statement a batch of
        SWITCHBOARD_TODOS_REAP_BATCH, repeated while one changes something: the children of a
        todo it changed may be stale in turn (one level a run).
        """
        unblocked = recounted = cancelled = 0
        params = with_history({"notify": conf.LISTEN, "limit": conf.REAP_BATCH, "within": within})
        while True:
            with self._cursor() as cursor:
                cursor.execute(queries["repair_blocked"], params)
                rows = cursor.fetchall()
            if not rows:
                return RepairResult(unblocked, recounted, cancelled)
            for _, state, waiting_for in rows:
                if state == State.FAILED:
                    cancelled += 1
                elif waiting_for == 0:
                    unblocked += 1
                else:
                    recounted += 1

    def requeue(self, todo_id: str) -> Todo:
        """Send a dead letter back to pending with its attempt budget reset."""
        requeued = self._requeue([validation.arguments(todo_id=todo_id)["todo_id"]])
        return requeued[0] if requeued else self._classify_miss("requeue", todo_id, None)

    def requeue_many(self, todo_ids: Iterable[str]) -> BatchResult:
        """Requeue many dead letters in one statement; of several sharing a key, the newest."""
        ids = validation.arguments(todo_ids=todo_ids)["todo_ids"]
        return self._batch_result("requeue", ids, self._requeue(ids))

    def _requeue(self, ids: list[str]) -> list[Todo]:
        """Run `requeue`; when a todo with a requeued key appears mid-statement, go one by one."""
        try:
            with transaction.atomic(using=self._db_alias):
                return self._rows("requeue", {"ids": ids, "notify": conf.LISTEN})
        except IntegrityError as error:
            # A todo with the same key was created between the guard's check and the write.
            if constraint_name(error) != "idx_todos_dedupe":
                raise
        if len(ids) == 1:
            return []
        return [todo for todo_id in ids for todo in self._requeue([todo_id])]

    def expire_lease(self, todo_id: str) -> Todo:
        """Make a claimed todo's lease expire now, so the reaper or the next claim takes it back."""
        params = {"ids": [validation.arguments(todo_id=todo_id)["todo_id"]], "notify": conf.LISTEN}
        return self._transition("expire_lease", params) or self._classify_miss(
            "expire_lease", todo_id, None
        )

    def expire_lease_many(self, todo_ids: Iterable[str]) -> BatchResult:
        """Expire the leases of many claimed todos in one statement."""
        ids = validation.arguments(todo_ids=todo_ids)["todo_ids"]
        expired = self._rows("expire_lease", {"ids": ids, "notify": conf.LISTEN})
        return self._batch_result("expire_lease", ids, expired)

    def cancel(self, todo_id: str, reason: str) -> Todo:
        """Cancel a pending or claimed todo: failed (a dead letter), `reason` kept as its result
        and error. Its holder, if any, is told at its next heartbeat (TodoCancelled), and its
        complete and fail are refused."""
        checked = validation.arguments(todo_id=todo_id, reason=reason)
        params = with_history(
            {"ids": [checked["todo_id"]], "reason": checked["reason"], "notify": conf.LISTEN}
        )
        return self._transition("cancel", params) or self._classify_miss("cancel", todo_id, None)

    def cancel_many(self, todo_ids: Iterable[str], reason: str) -> BatchResult:
        """Cancel many pending or claimed todos in one statement."""
        checked = validation.arguments(todo_ids=todo_ids, reason=reason)
        ids = checked["todo_ids"]
        changed = self._rows(
            "cancel", with_history({"ids": ids, "reason": checked["reason"], "notify": conf.LISTEN})
        )
        return self._batch_result("cancel", ids, changed)

    def set_priority(self, todo_id: str, priority: int) -> Todo:
        """Give a pending todo a new priority (-100 to 100; higher is claimed sooner)."""
        checked = validation.arguments(todo_id=todo_id, priority=priority)
        params = {"ids": [checked["todo_id"]], "priority": checked["priority"]}
        return self._transition("set_priority", params) or self._classify_miss(
            "set_priority", todo_id, None
        )

    def set_priority_many(self, todo_ids: Iterable[str], priority: int) -> BatchResult:
        """Give many pending todos a new priority in one statement."""
        checked = validation.arguments(todo_ids=todo_ids, priority=priority)
        ids = checked["todo_ids"]
        changed = self._rows("set_priority", {"ids": ids, "priority": checked["priority"]})
        return self._batch_result("set_priority", ids, changed)

    def _batch_result(self, operation: str, ids: list[str], changed: list[Todo]) -> BatchResult:
        """Pair the todos a batch changed with the reason for each one it left alone."""
        changed_ids = {todo.id for todo in changed}
        missed = [todo_id for todo_id in ids if todo_id not in changed_ids]
        seen = self._seen(missed) if missed else {}
        refusal = TRANSITIONS[operation].refusal
        refused = {todo_id: refusal(seen.get(todo_id)) for todo_id in missed}
        return BatchResult(changed=changed, refused=refused)

    areap_expired = async_twin(reap_expired)
    arepair_blocked = async_twin(repair_blocked)
    arequeue = async_twin(requeue)
    arequeue_many = async_twin(requeue_many)
    aexpire_lease = async_twin(expire_lease)
    aexpire_lease_many = async_twin(expire_lease_many)
    acancel = async_twin(cancel)
    acancel_many = async_twin(cancel_many)
    aset_priority = async_twin(set_priority)
    aset_priority_many = async_twin(set_priority_many)
