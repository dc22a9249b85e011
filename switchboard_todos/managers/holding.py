"""The holder's verbs: what the owner of a lease does with the todo it holds (heartbeat,
complete, fail, release), and `wait_for`, which waits for a todo to end."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from switchboard_todos import endings, tracing, validation
from switchboard_todos.backoff import retry_schedule
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import TodoConflict
from switchboard_todos.managers.machinery import (
    KEY_RACE_TRIES,
    Machinery,
    async_twin,
    dependencies,
    leased,
    with_history,
)
from switchboard_todos.sql import queries
from switchboard_todos.validation import Seconds

if TYPE_CHECKING:
    from switchboard_todos.models import Todo

#: complete_many's first pause before it runs again for todos it left alone, in seconds; doubled
#: at each try, at most 50 ms (about 0.2 s over every try).
LEFT_ALONE_PAUSE = 0.001


class Receipt(NamedTuple):
    """One claim of a todo, as its holder was told of it: the attempt, and the moment of the
    claim (the todo's claimed_at). A holder's verb given a receipt acts only on that claim, not
    on a later claim of the same todo by the same owner (SQS's receipt handles)."""

    attempt: int
    claimed_at: datetime


def receipt_guard(receipt: Receipt | None) -> dict[str, Any]:
    """The parameters of a statement's under_receipt guard (sql/shared.sql)."""
    if receipt is None:
        return {"receipt_attempt": None, "receipt_claimed_at": None}
    return {"receipt_attempt": receipt.attempt, "receipt_claimed_at": receipt.claimed_at}


class Heartbeats(NamedTuple):
    """What `heartbeat_many` did: the leases it extended, the todos the owner lost, and those
    an operator cancelled while the owner held them (stop work on them; their complete and
    fail are refused).

    An id in none of the lists was locked by another session; the next beat tries it again.
    """

    extended: list[str]
    lost: list[str]
    cancelled: list[str]


class Holding(Machinery):
    """`Todo.objects`' verbs of a lease's holder."""

    def heartbeat(
        self,
        todo_id: str,
        owner: str,
        ttl: Seconds | None = None,
        *,
        progress: Any = None,
        receipt: Receipt | None = None,
        credential: str | None = None,
    ) -> Todo:
        """Extend the lease on a todo `owner` holds to `ttl` from now.

        `progress` (any JSON value, at most SWITCHBOARD_TODOS_MAX_PROGRESS_BYTES) becomes the
        todo's latest progress note; without it the last note stays. A todo an operator
        cancelled raises TodoCancelled: stop work on it. With a `receipt`, only under that
        claim (TodoConflict otherwise); with a `credential`, only while it holds (as
        `complete`).
        """
        params = leased(
            validation.arguments(todo_id=todo_id, owner=owner, ttl=ttl, progress=progress)
        )
        return self._held_transition("heartbeat", params, receipt, credential)

    def wait_for(self, todo_id: str, timeout: Seconds) -> Todo:
        """Block until a todo is done or failed, or `timeout` (seconds, up to a day) passes;
        return it as it is then. Woken by NOTIFY the moment it ends (endings.py)."""
        checked = validation.arguments(todo_id=todo_id, timeout=timeout)
        return endings.wait(self, checked["todo_id"], checked["timeout"])

    async def await_for(self, todo_id: str, timeout: Seconds) -> Todo:
        """Async twin of `wait_for`: suspended while it waits, holding no thread or connection."""
        checked = validation.arguments(todo_id=todo_id, timeout=timeout)
        return await endings.await_(self, checked["todo_id"], checked["timeout"])

    def heartbeat_many(
        self,
        owner: str,
        ttl: Seconds | None,
        todo_ids: Iterable[str],
        *,
        progress: Mapping[str, Any] | None = None,
    ) -> Heartbeats:
        """Extend the leases of the todos `owner` holds among `todo_ids`, in one statement.

        `progress` maps some of the ids to their latest progress notes. The statement never
        waits on a row lock: a todo another session holds locked is left out of every list of
        the answer, to be tried again at the next beat. `lost` names the todos `owner` no
        longer holds, `cancelled` those an operator cancelled while `owner` held them.
        """
        checked = validation.arguments(
            owner=owner, ttl=ttl, todo_ids=todo_ids, progress_by_id=progress
        )
        ids = checked["todo_ids"]
        params = leased(
            {
                "owner": checked["owner"],
                "ttl": checked["ttl"],
                "todo_ids": ids,
                "progress": checked["progress_by_id"],
            }
        )
        with self._cursor() as cursor:
            cursor.execute(queries["heartbeat_many"], params)
            seen = cursor.fetchall()
        answered = {todo_id for todo_id, _, _ in seen}
        return Heartbeats(
            extended=[todo_id for todo_id, extended, _ in seen if extended],
            lost=[todo_id for todo_id in ids if todo_id not in answered],
            cancelled=[todo_id for todo_id, _, cancelled in seen if cancelled],
        )

    def complete(
        self,
        todo_id: str,
        owner: str,
        result: Any = None,
        *,
        receipt: Receipt | None = None,
        credential: str | None = None,
    ) -> Todo:
        """Mark a todo `owner` holds done, storing `result` (any JSON value); the todos waiting
        for it that wait for nothing else become claimable in the same statement.

        With a `receipt`, only under that claim (TodoConflict otherwise). `credential` is a
        remote agent's (`owner`'s) credential salt, as its surface read it (agents/service):
        the statement acts only while it still holds.
        """
        params = {
            **validation.arguments(todo_id=todo_id, owner=owner, result=result),
            "notify": conf.LISTEN,
        }
        began = tracing.started()
        done = self._held_transition("complete", params, receipt, credential, lean="complete_leaf")
        if began is not None:
            tracing.settled(began, "complete", [done], params["owner"])
        return done

    def complete_many(self, owner: str, results: Mapping[str, Any]) -> list[str]:
        """Mark many todos done, `results` mapping each id to its result, in one statement.

        Returns the ids completed; the others were no longer held by `owner`, or stayed locked
        by another session through every try (a claim's lock lasts its statement; `complete`
        waits for it).
        """
        checked = validation.arguments(owner=owner, results=results)
        ids, values = checked["results"]
        done: list[str] = []
        for attempt in range(KEY_RACE_TRIES):
            if not ids:
                break
            if attempt:
                time.sleep(min(LEFT_ALONE_PAUSE * 2**attempt, 0.05))
            params = {
                "owner": checked["owner"],
                "results": _json_object(ids, values),
                "notify": conf.LISTEN,
            }
            with self._cursor() as cursor:
                cursor.execute(queries["complete_many"], params)
                rows = cursor.fetchall()
            done += [todo_id for todo_id, completed in rows if completed]
            # Left alone while still held: another session held its row locked.
            again = {todo_id for todo_id, completed in rows if not completed}
            values = [value for todo_id, value in zip(ids, values, strict=True) if todo_id in again]
            ids = [todo_id for todo_id in ids if todo_id in again]
        self._signal("complete_many", lambda: self._reread(done))
        return done

    def fail(
        self,
        todo_id: str,
        owner: str,
        error: Any = None,
        retry_in: Seconds | None = None,
        *,
        credential: str | None = None,
    ) -> Todo:
        """Record a failed attempt: pending again after a backoff, or dead-lettered at the cap.

        `error` is a message, a dict, or an exception; `retry_in` overrides the backoff. With
        a `credential`, only while it holds (as `complete`).
        """
        params = {
            **with_history(
                validation.arguments(todo_id=todo_id, owner=owner, error=error, retry_in=retry_in)
            ),
            "delays": retry_schedule(
                base=conf.BACKOFF_BASE, cap=conf.BACKOFF_MAX, jitter=conf.BACKOFF_JITTER
            ),
            "notify": conf.LISTEN,
        }
        began = tracing.started()
        failed = self._held_transition("fail", params, None, credential, lean="fail_leaf")
        if began is not None:
            tracing.settled(began, "fail", [failed], params["owner"])
        return failed

    def release(
        self,
        todo_id: str,
        owner: str,
        delay: Seconds | None = None,
        *,
        receipt: Receipt | None = None,
        credential: str | None = None,
    ) -> Todo:
        """Give a lease back: pending again (after `delay`), the attempt not counted. With a
        `receipt`, only under that claim (TodoConflict otherwise); with a `credential`, only
        while it holds (as `complete`)."""
        params = {
            **validation.arguments(todo_id=todo_id, owner=owner, delay=delay),
            "notify": conf.LISTEN,
        }
        began = tracing.started()
        released = self._held_transition("release", params, receipt, credential)
        if began is not None:
            tracing.settled(began, "release", [released], params["owner"])
        return released

    def _held_transition(
        self,
        name: str,
        params: dict[str, Any],
        receipt: Receipt | None,
        credential: str | None,
        *,
        lean: str | None = None,
    ) -> Todo:
        """Run a holder's transition of one todo, guarded by `receipt` and `credential` if
        given; a miss is explained (TodoNotFound, TodoConflict): a todo held by its owner under
        another claim than the receipt names is a conflict that says so. (A credential that no
        longer holds is its surface's to tell: agents/service checks it after a miss.)

        `lean` names a leaner statement for the common case (complete_leaf, fail_leaf), run
        first unless this process met dependencies lately (Dependencies): one that matches no
        row leaves the todo to statement `name`, which then runs.
        """
        params = {**params, **receipt_guard(receipt), "credential": credential}
        alias = self._db_alias
        placed = self._on_database(alias)  # its statements ask the router no more
        if dependencies.lately(alias):
            lean = None
        todo = None
        if lean is not None:
            rows = placed._run(name, params, statement=queries[lean])
            todo = rows[0][0] if rows else None
        if todo is None:
            todo = placed._transition(name, params)
            if lean is not None and todo is not None:
                dependencies.met(alias)  # a todo others wait for, left by the lean statement
        if todo is not None:
            return todo
        todo_id, owner = params["todo_id"], params["owner"]
        seen = placed._seen([todo_id]).get(todo_id)
        if (
            receipt is not None
            and seen is not None
            and (seen["owner"], seen["attempt"], seen["claimed_at"])
            != (owner, receipt.attempt, receipt.claimed_at)
        ):
            raise TodoConflict(
                f"Todo {todo_id} is not held under this receipt: it was received again since, "
                "or its lease ended.",
                todo_id=todo_id,
                state=seen["state"],
                owner=seen["owner"],
            )
        return placed._explain_miss(name, todo_id, owner, seen)

    aheartbeat = async_twin(heartbeat)
    aheartbeat_many = async_twin(heartbeat_many)
    acomplete = async_twin(complete)
    acomplete_many = async_twin(complete_many)
    afail = async_twin(fail)
    arelease = async_twin(release)


def _json_object(keys: list[str], texts: list[str | None]) -> str:
    """The JSON object of each of `keys` to its JSON text in `texts` (None: null), joined as
    text: the texts are JSON already, and are not parsed again."""
    members = (
        f"{json.dumps(key)}:{'null' if text is None else text}"
        for key, text in zip(keys, texts, strict=True)
    )
    return "{" + ",".join(members) + "}"
