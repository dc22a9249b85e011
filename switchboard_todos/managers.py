"""The public API: one manager method per transition of the todo state machine.

Each method has the same three beats: validate the input (raising InvalidTodo before anything
is written), run the operation's one statement from `sql/todos.sql`, and when the guard
matched no row, say why (`_classify_miss`: TodoNotFound, or TodoConflict in the words of the
operation's row in `transitions.py`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from functools import cached_property
from operator import itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg import sql

from switchboard_todos import (
    cursors,
    endings,
    faults,
    graphs,
    placement,
    signals,
    validation,
    waiting,
)
from switchboard_todos.backoff import retry_schedule
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo, TodoConflict, TodoNotFound
from switchboard_todos.marks import marks
from switchboard_todos.querysets import TodoQuerySet
from switchboard_todos.sql import CREATED_FRESH, CREATED_NULLS, queries
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS, TRANSITIONS, State
from switchboard_todos.validation import Seconds

if TYPE_CHECKING:
    from switchboard_todos.models import Event, Todo

P = ParamSpec("P")
R = TypeVar("R")

#: The indexes that let one claimed todo at most hold a concurrency key, and a slot of a queue's
#: concurrency limit; and how many times a claim that loses the race for one runs before it
#: returns nothing for this call.
RACED_INDEXES = frozenset({"idx_todos_key_claimed", "idx_todos_slot"})
KEY_RACE_TRIES = 10
#: complete_many's first pause before it runs again for todos it left alone, in seconds; doubled
#: at each try, at most 50 ms (about 0.2 s over every try).
LEFT_ALONE_PAUSE = 0.001


#: The commonest JSON texts of a todo's columns (a fresh todo's errors, an empty payload), made
#: without the parser: json.loads cost a claimed todo more than building its Todo.
EMPTY_JSON: Mapping[str, Callable[[], Any]] = MappingProxyType({"[]": list, "{}": dict})


class _Layout(NamedTuple):
    """Where a Todo's values are in rows of one shape (see `TodoManager._layout`)."""

    attnames: list[str]
    pick: Callable[[Sequence[Any]], tuple[Any, ...]]
    json: list[tuple[int, models.JSONField[Any]]]
    extra: int | None
    id: int
    #: The JSON texts read without parsing (EMPTY_JSON), unless a JSON field has a decoder.
    empty_json: Mapping[str, Callable[[], Any]]
    #: Where a create's row leaves out what its creator gave (CREATED_NULLS), by field name;
    given: list[tuple[int, str]]
    #: and what every new todo starts with (CREATED_FRESH), as the database would send it.
    fresh: list[tuple[int, Any]]


class _NewLayout(NamedTuple):
    """How a todo create_many inserted is built from what it sent (`TodoManager._new_todos`):
    where each value goes (`layout`, whose `given` are filled from the creator's parameters),
    what every new todo starts with (`fresh`, each field's database default), and where the
    values the database decided go."""

    layout: _Layout
    fresh: list[Any]
    max_attempts: int
    next_retry_at: int
    created_at: int
    updated_at: int


class _GraphNotCreated(Exception):
    """Rolls a batch of todos that wait for each other back when it was not created whole."""


class ReapResult(NamedTuple):
    """What one reaper sweep did."""

    requeued: int
    dead_lettered: int


class Heartbeats(NamedTuple):
    """What `heartbeat_many` did: the leases it extended, the todos the owner lost, and those
    an operator cancelled while the owner held them (stop work on them; their complete and
    fail are refused).

    An id in none of the lists was locked by another session; the next beat tries it again.
    """

    extended: list[str]
    lost: list[str]
    cancelled: list[str]


class BatchResult(NamedTuple):
    """What an operator batch did: the todos it changed, and why it left each of the others."""

    changed: list[Todo]
    refused: dict[str, str]
    """Todo id -> why it was left alone, e.g. "a live todo holds the same idempotency key"."""


def _async_twin(
    method: Callable[Concatenate[TodoManager, P], R],
) -> Callable[Concatenate[TodoManager, P], Coroutine[Any, Any, R]]:
    """Make the `a`-prefixed twin of a manager method: the same code, run off the event loop."""

    async def twin(self: TodoManager, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await sync_to_async(method, thread_sensitive=True)(self, *args, **kwargs)

    twin.__name__ = twin.__qualname__ = f"a{method.__name__}"
    twin.__doc__ = f"Async twin of `{method.__name__}`."
    return twin


#: The manager's base: Django's, with the queryset's claims (querysets.py) on every queryset.
_TodoManagerBase = models.Manager.from_queryset(TodoQuerySet)


class TodoManager(_TodoManagerBase["Todo"]):
    """`Todo.objects`: the queries Django gives every model, plus the queue's transitions."""

    # Creating

    def create_todo(
        self,
        *,
        queue: str = "default",
        kind: str = "",
        title: str = "",
        payload: dict[str, Any] | None = None,
        source: str = "",
        idempotency_key: str | None = None,
        assignee: str | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        event: Event | str | None = None,
        run_after: datetime | None = None,
        after: Iterable[str] | None = None,
        on_parent_failure: str = "cancel",
    ) -> tuple[Todo, bool]:
        """Enqueue a todo; with an idempotency key held by a live todo, return that one instead.

        Returns (todo, created). Concurrent calls with one key make exactly one row. Without
        `max_attempts`, the todo gets its queue's default (Queue), else DEFAULT_MAX_ATTEMPTS. With
        `after` (todo ids), the todo waits: it is claimable once each of them is done, and when
        one ends as a dead letter it is cancelled too, or (`on_parent_failure="run_anyway"`)
        no longer waits for that one (docs/dependencies.md).
        """
        spec = {
            "queue": queue,
            "kind": kind,
            "title": title,
            "payload": payload,
            "source": source,
            "idempotency_key": idempotency_key,
            "assignee": assignee,
            "max_attempts": max_attempts,
            "priority": priority,
            "concurrency_key": concurrency_key,
            "event": event,
            "run_after": run_after,
            "after": after,
            "on_parent_failure": on_parent_failure,
        }
        params = validation.creation(spec)
        placed = self._placed([params["queue"]])
        return placed._create(placed._known_events([params])[0])

    def create_many(self, todos: Iterable[Mapping[str, Any]]) -> list[tuple[Todo, bool]]:
        """Enqueue many todos in one statement; each mapping takes `create_todo`'s arguments.

        Returns (todo, created) per input, in input order. A key repeated within the batch,
        or held by a live todo, yields that todo with created=False. Todos of queues placed in
        several databases take one statement per database.

        A todo may name itself with `ref`, and wait (`after`) for other todos of the batch by
        their ref, as for existing todos by id: then the batch is created whole or not at all,
        in one database, and a cycle is refused (graphs.py, docs/dependencies.md).
        """
        specs, refs = graphs.split_refs(todos)
        batch = validation.creations(specs)
        if any(params["parents"] is not None for params in batch) or any(refs):
            grouped = self._by_database(batch)
            if len(grouped) > 1:
                raise InvalidTodo(
                    "Todos that wait for each other live in one database; these queues are "
                    "placed in several."
                )
            return grouped[0][0]._create_graph(batch, refs)
        groups = self._by_database(batch)
        if len(groups) == 1:
            placed, rows = groups[0]
            return placed._create_many(list(rows.values()))
        results: dict[int, tuple[Todo, bool]] = {}
        for placed, rows in groups:
            created = placed._create_many(list(rows.values()))
            results.update(zip(rows, created, strict=True))
        return [results[position] for position in sorted(results)]

    def _create_many(self, batch: list[dict[str, Any]]) -> list[tuple[Todo, bool]]:
        """Run `create_many` with validated parameters, all of this manager's database."""
        from switchboard_todos.models import new_todo_ids

        ids = new_todo_ids(len(batch))
        sent = list(zip(ids, batch, strict=True))
        columns = {
            **_batch_rows(batch, ids),
            "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        }
        with self._cursor() as cursor:
            cursor.execute(queries["create_many"], columns)
            ((now, defaults, missed, scheduled, next_retry_at),) = cursor.fetchall()
        made = self._new_todos(
            sent,
            now,
            json.loads(defaults or "{}"),
            set(missed),
            dict(zip(scheduled or (), next_retry_at or (), strict=True)),
        )
        held = self._key_holders([params for todo_id, params in sent if todo_id in missed])
        self._signal(
            "create_many",
            lambda: [(todo, True) for todo in made.values()] + [(todo, False) for todo in held],
        )
        live = {(todo.queue, todo.idempotency_key): todo for todo in held}
        live.update(((todo.queue, todo.idempotency_key), todo) for todo in made.values())
        results: list[tuple[Todo, bool]] = []
        for todo_id, params in sent:
            todo = made.get(todo_id)
            if todo is not None:
                results.append((todo, True))
                continue
            key = (params["queue"], params["idempotency_key"])
            if key not in live:
                # Held by a todo committed after the statement's snapshot: see create_todo.
                live[key] = self._create(params)[0]
            results.append((live[key], False))
        return results

    def _key_holders(self, batch: list[dict[str, Any]]) -> list[Todo]:
        """The live todos that hold the idempotency keys of `batch` (one query, none for an
        empty batch): those of the rows create_many did not insert."""
        if not batch:
            return []
        wanted = {(params["queue"], params["idempotency_key"]) for params in batch}
        found = self.filter(
            queue__in={queue for queue, _ in wanted},
            idempotency_key__in={key for _, key in wanted},
        ).exclude(state__in=endings.ENDED)
        return [todo for todo in found if (todo.queue, todo.idempotency_key) in wanted]

    def _new_todos(
        self,
        sent: list[tuple[str, dict[str, Any]]],
        now: datetime,
        defaults: Mapping[str, int],
        missed: set[str],
        scheduled: Mapping[str, datetime],
    ) -> dict[str, Todo]:
        """The todos create_many inserted, by id, built from what it sent (`sent`: each id
        with its validated parameters) and what its answer says the database decided: `now`,
        the queues' default max_attempts (`defaults`), the ids of the rows it did not insert
        (`missed`), and the next_retry_at of those inserted with one (`scheduled`)."""
        new = self._new_layout
        layout = new.layout
        connection = connections[self._db_alias]
        build = _instances(self.model, self._db_alias, layout.attnames)
        made = {}
        for todo_id, params in sent:
            if todo_id in missed:
                continue
            values = new.fresh.copy()
            for index, attname in layout.given:
                values[index] = params[attname]
            max_attempts = params["max_attempts"]
            values[layout.id] = todo_id
            values[new.max_attempts] = (
                max_attempts
                if max_attempts is not None
                else defaults.get(params["queue"], DEFAULT_MAX_ATTEMPTS)
            )
            values[new.next_retry_at] = scheduled.get(todo_id)
            values[new.created_at] = values[new.updated_at] = now
            made[todo_id] = build(_parsed(values, layout, connection))
        return made

    def _create_graph(
        self, batch: list[dict[str, Any]], refs: list[str | None]
    ) -> list[tuple[Todo, bool]]:
        """Run `create_graph`: the batch whole or not at all (see create_many)."""
        from switchboard_todos.models import new_todo_ids

        graph = graphs.plan(batch, refs, new_todo_ids(len(batch)))
        columns = {
            **_batch_rows(
                batch,
                graph.ids,
                [
                    [parents, waited, children, params["on_parent_failure"]]
                    for parents, waited, children, params in zip(
                        graph.parents,
                        graph.members_waited,
                        graph.children,
                        batch,
                        strict=True,
                    )
                ],
            ),
            "existing": graph.existing,
            "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        }
        created: list[tuple[Todo, Any]] = []
        try:
            with transaction.atomic(using=self._db_alias):
                created = self._run(
                    "create_graph",
                    columns,
                    extra="created",
                    given=dict(zip(graph.ids, batch, strict=True)).__getitem__,
                )
                if len(created) != len(batch) or not all(made for _, made in created):
                    raise _GraphNotCreated
        except _GraphNotCreated:
            pass
        else:
            by_id = {todo.id: todo for todo, _ in created}
            return [(by_id[todo_id], True) for todo_id in graph.ids]
        twins = {(todo.queue, todo.idempotency_key): todo for todo, made in created if not made}
        if not created:
            self._check_parents(graph.existing)
        if len(twins) == len(batch):
            return [(twins[params["queue"], params["idempotency_key"]], False) for params in batch]
        taken = sorted(str(key) for _queue, key in twins)
        raise TodoConflict(
            f"Live todos hold the idempotency keys {', '.join(taken) or 'of some todos'} of this "
            "batch: todos that wait for each other are created all together or not at all.",
            todo_id="",
        )

    def enqueue_many(self, todos: Iterable[Mapping[str, Any]]) -> int:
        """Enqueue many todos without idempotency keys through COPY; return how many.

        The bulk path for imports and fan-outs: as fast as PostgreSQL takes rows, but it
        returns no Todos and cannot deduplicate, so a todo with an idempotency key is refused
        (use `create_many`). Each mapping takes `create_todo`'s arguments and is validated
        before anything is written; the batch commits as one, with the caller's transaction if
        there is one. A `run_after` in the past makes the todo claimable at once. Rows without
        `max_attempts` take their queue's default, looked up in one query before the COPY.
        """
        batch = validation.creations(todos)
        for number, params in enumerate(batch):
            if params["idempotency_key"] is not None:
                raise InvalidTodo(
                    f"todo #{number}: enqueue_many cannot deduplicate; enqueue todos with an "
                    "idempotency key through create_many or create_todo."
                )
            if params["parents"] is not None:
                raise InvalidTodo(
                    f"todo #{number}: enqueue_many cannot make a todo wait for others; create "
                    "todos with `after` through create_many or create_todo."
                )
        return sum(
            placed._enqueue_many(list(rows.values())) for placed, rows in self._by_database(batch)
        )

    def _enqueue_many(self, rows: list[dict[str, Any]]) -> int:
        """Run `enqueue_many` with validated rows, all of this manager's database."""
        if not rows:
            return 0
        rows = self._with_queue_max_attempts(rows)
        # Columns at their database default in every row are left to the default, as a
        # hand-written COPY would: the fewer columns, the less to send and to parse.
        columns = [
            column
            for column, (_name, default) in _COPY_COLUMNS.items()
            if default is _ALWAYS or any(row[column] != default for row in rows)
        ]
        copy = sql.SQL("COPY todos ({}) FROM STDIN").format(
            sql.SQL(", ").join(sql.Identifier(_COPY_COLUMNS[column][0]) for column in columns)
        )
        values = itemgetter(*columns)  # queue and payload are always there: a tuple each
        ready = sorted({row["queue"] for row in rows if row["run_after"] is None})
        connection = connections[self._db_alias]
        connection.ensure_connection()
        # COPY bypasses Django's cursor, so it is not in connection.queries. Outside a
        # transaction it commits on its own, and the notification follows the commit.
        with (
            connection.wrap_database_errors,
            connection.connection.cursor() as cursor,
            cursor.copy(copy) as stream,
        ):
            for row in rows:
                stream.write_row(values(row))
        if conf.LISTEN and ready:
            with self._cursor() as cursor:
                cursor.execute(queries["notify_queues"], {"queues": ready})
        return len(rows)

    def _with_queue_max_attempts(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows`, each without max_attempts given its queue's default (Queue), else
        DEFAULT_MAX_ATTEMPTS: one query for the batch, none when every row gives its own."""
        wanted = sorted({row["queue"] for row in rows if row["max_attempts"] is None})
        if not wanted:
            return rows
        with self._cursor() as cursor:
            cursor.execute(queries["queue_max_attempts"], {"queues": wanted})
            defaults: dict[str, int] = dict(cursor.fetchall())
        return [
            row
            if row["max_attempts"] is not None
            else {**row, "max_attempts": defaults.get(row["queue"], DEFAULT_MAX_ATTEMPTS)}
            for row in rows
        ]

    def _placed(self, queues: Sequence[str]) -> TodoManager:
        """This manager on the database `queues` live in (placement.py); itself when pinned
        by `db_manager`. Queues of several databases are refused: a statement runs in one."""
        if self._db is not None:
            return self
        grouped = placement.by_database(queues)
        if len(grouped) > 1:
            where = "; ".join(f"{alias}: {', '.join(names)}" for alias, names in grouped.items())
            raise InvalidTodo(
                f"queues live in different databases ({where}); claim from each with "
                "Todo.objects.db_manager(alias)."
            )
        return self._on_database(next(iter(grouped), self._db_alias))

    def _on_database(self, alias: str) -> TodoManager:
        """This manager pinned to `alias` (kept: placement runs on every create and claim);
        itself when pinned there already. Pinned, its statements no longer ask the router
        where they run (`_db_alias`), once per statement and check."""
        if alias == self._db:
            return self
        pinned = self._pinned.get(alias)
        if pinned is None:
            pinned = self._pinned[alias] = self.db_manager(alias)
        return pinned

    def _by_database(
        self, batch: list[dict[str, Any]]
    ) -> list[tuple[TodoManager, dict[int, dict[str, Any]]]]:
        """A validated batch's rows by the database each lives in, as {position: row}; the
        events the rows name are checked in each database before anything is written."""
        groups: dict[str, dict[int, dict[str, Any]]] = {}
        if self._db is not None:
            groups[self._db] = dict(enumerate(batch))
        else:
            aliases: dict[str, str] = {}  # the router asked once per queue, not once per row
            for position, params in enumerate(batch):
                queue = params["queue"]
                if queue not in aliases:
                    aliases[queue] = placement.database_for(queue)
                groups.setdefault(aliases[queue], {})[position] = params
        placed = [(self._on_database(alias), rows) for alias, rows in groups.items()]
        for manager, rows in placed:
            manager._known_events(list(rows.values()))
        return placed or [(self, {})]

    def _known_events(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Return validated todos once the events they name exist in this manager's database
        (one lookup a batch for events named by id)."""
        alias = self._db_alias
        for params in batch:
            if params["event_database"] not in (None, alias):
                raise InvalidTodo(
                    f"event {params['event_id']!r} is in database {params['event_database']!r}, "
                    f"but queue {params['queue']!r} lives in {alias!r}: a todo and its event "
                    "share a database (Event.objects.db_manager(alias).record(...))."
                )
        named = {params["event_id"] for params in batch if params["event_given_by_id"]}
        if named:
            from switchboard_todos.models import Event

            found = Event.objects.using(alias).filter(pk__in=named).values_list("pk")
            missing = named - {pk for (pk,) in found}
            if missing:
                raise InvalidTodo(f"event {min(missing)!r} does not exist.")
        return batch

    def tick_schedule(
        self,
        schedule: str,
        *,
        awaited: datetime,
        tick: datetime,
        next_run_at: datetime,
        enqueue: bool = True,
    ) -> Todo | None:
        """Take a schedule's tick: advance it from `awaited` to `next_run_at`, and enqueue the
        todo of `tick` unless `enqueue` is false. Returns the todo, or None when another
        scheduler took the tick first (or the schedule is paused). Used by schedules.run_due.
        """
        from switchboard_todos.models import new_todo_id

        params = validation.arguments(
            schedule=schedule, awaited=awaited, tick=tick, next_run_at=next_run_at, enqueue=enqueue
        )
        return self._transition(
            "tick_schedule",
            {
                **params,
                "id": new_todo_id(),
                "idempotency_key": f"schedule:{params['schedule']}@{params['tick'].isoformat()}",
                "notify": conf.LISTEN,
            },
        )

    def _create(self, params: Mapping[str, Any]) -> tuple[Todo, bool]:
        """Run `create_todo` (or `create_child`, for a todo that waits for others) with
        validated parameters."""
        from switchboard_todos.models import new_todo_id

        # The live twin may commit after this statement's snapshot was taken: then ON CONFLICT
        # waits for it and skips the insert, yet the fallback SELECT cannot see it. Running the
        # statement again sees it (or inserts, if the twin has finished meanwhile). A todo that
        # waits is given its id here (its parents list it); the database picks the others'.
        name = "create_todo" if params["parents"] is None else "create_child"
        params = {
            **params,
            "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
            "notify": conf.LISTEN,
            "id": None if params["parents"] is None else new_todo_id(),
        }
        for _ in range(3):
            rows = self._run(name, params, extra="created", given=lambda _id: params)
            if rows:
                todo, created = rows[0]
                return todo, bool(created)
            if params["parents"] is not None:
                self._check_parents(params["parents"])
        raise TodoConflict(  # pragma: no cover - needs three commits racing one statement
            f"Could not create or find the todo with idempotency key "
            f"{params['idempotency_key']!r} in queue {params['queue']!r}: it kept changing.",
            todo_id="",
        )

    def _check_parents(self, ids: list[str]) -> None:
        """Raise InvalidTodo naming a todo of `ids` that is missing or a dead letter: a todo
        cannot wait for either."""
        states = dict(self.filter(pk__in=ids).values_list("pk", "state"))
        for todo_id in ids:
            if todo_id not in states:
                raise InvalidTodo(f"after: todo {todo_id!r} does not exist.")
            if states[todo_id] == State.FAILED:
                raise InvalidTodo(
                    f"after: todo {todo_id!r} is a dead letter; requeue it before waiting for it."
                )

    # Claiming

    def claim_next(
        self,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None = None,
        *,
        wait: Seconds | None = None,
        max_held: int | None = None,
    ) -> Todo | None:
        """Claim the longest-claimable todo in `queues` for `owner`, or return None.

        One statement; rows other workers are claiming are skipped, never waited for. With
        `wait`, block until a todo is claimable or `wait` has passed (SQS long polling),
        woken by LISTEN/NOTIFY (unless SWITCHBOARD_TODOS_LISTEN is off) and polling. With
        `max_held`, claim nothing once `owner` holds that many todos. Without `ttl`, each todo's
        lease is its queue's visibility timeout (Queue), else SWITCHBOARD_TODOS_DEFAULT_TTL.
        """
        claimed = self.claim_batch(queues, owner, ttl, limit=1, wait=wait, max_held=max_held)
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
    ) -> list[Todo]:
        """Claim up to `limit` claimable todos in `queues` for `owner`, oldest first.

        With `wait`, block until at least one is claimable or `wait` has passed. With
        `max_held`, claim only as many as bring the todos `owner` holds up to that many.
        """
        return run_now(
            self._claim_batch(_Blocking(self), queues, owner, ttl, limit, wait, max_held)
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
    ) -> list[Todo]:
        """Async twin of `claim_batch`; a blocking claim waits without holding a thread."""
        return await self._claim_batch(_Suspending(self), queues, owner, ttl, limit, wait, max_held)

    async def aclaim_next(
        self,
        queues: str | Iterable[str],
        owner: str,
        ttl: Seconds | None = None,
        *,
        wait: Seconds | None = None,
        max_held: int | None = None,
    ) -> Todo | None:
        """Async twin of `claim_next`."""
        claimed = await self.aclaim_batch(queues, owner, ttl, limit=1, wait=wait, max_held=max_held)
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
    ) -> list[Todo]:
        """`claim_batch` and its twin, one code: `io` claims and waits, each its way.

        A claim with a wait is a long poll of the process's waiters (waiting.py): it joins
        them before its first claim, so that a todo committed after that claim began is
        notified to it, then waits for a ring or its turn to poll.
        """
        params = _leased(
            validation.arguments(
                queues=queues, owner=owner, ttl=ttl, limit=limit, wait=wait, max_held=max_held
            )
        )
        placed = self._placed(params["queues"])
        if placed is not self:
            io = type(io)(placed)
        seconds = params.pop("wait")
        if not seconds:
            return await io.claim(params)
        poll = waiting.LongPoll(
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
        params = _leased(validation.arguments(owner=owner, ttl=ttl, limit=limit))
        scans, scan_params = queryset._candidates(params["owner"], params["limit"])
        params = {**params, **scan_params, "max_held": None}
        statement = queries["claim_filtered"].format_map(scans)
        for _ in range(KEY_RACE_TRIES):
            try:
                return [
                    todo for todo, _ in self._run("claim_filtered", params, statement=statement)
                ]
            except IntegrityError as error:
                if not self._lost_key_race(error):
                    raise
        return []

    def _claim(self, params: Mapping[str, Any]) -> list[Todo]:
        """Run the claim from the queues' low-water marks (marks.py) and move them.

        A claim that keeps losing races for concurrency keys claims nothing.
        """
        alias = self._db_alias
        params = {
            **params,
            "queues": cursors.array_literal(params["queues"]),
            **marks.for_claim(alias, params["queues"]).params(),
        }
        for _ in range(KEY_RACE_TRIES):
            try:
                rows = self._run("claim_next", params, extra="claimable_at")
            except IntegrityError as error:
                if not self._lost_key_race(error):
                    raise
                continue
            # Ready todos only (claimable since created): a due retry or a lapsed lease says
            # nothing of where the ready ones begin.
            marks.claimed(
                alias,
                (
                    (todo.queue, todo.priority, todo.created_at)
                    for todo, at in rows
                    if at == todo.created_at
                ),
            )
            return [todo for todo, _ in rows]
        return []

    def _lost_key_race(self, error: IntegrityError) -> bool:
        """Whether a claim failed because a concurrent claim took a concurrency key, or a slot
        of a queue's concurrency limit, first.

        Both saw it free; the unique index let the other one through. Running the claim again
        sees that holder and passes it over. Inside the caller's transaction the error has
        aborted it, so it is the caller's to see.
        """
        return (
            _constraint_name(error) in RACED_INDEXES
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
        params = _leased(validation.arguments(todo_id=todo_id, owner=owner, ttl=ttl))
        try:
            claimed = self._transition("claim", params)
        except IntegrityError as error:
            if not self._lost_key_race(error):
                raise
            claimed = None  # a concurrent claim took its concurrency key: say so below
        return claimed or self._classify_miss("claim", todo_id, owner)

    # The owner's verbs

    def heartbeat(
        self, todo_id: str, owner: str, ttl: Seconds | None = None, *, progress: Any = None
    ) -> Todo:
        """Extend the lease on a todo `owner` holds to `ttl` from now.

        `progress` (any JSON value, at most SWITCHBOARD_TODOS_MAX_PROGRESS_BYTES) becomes the
        todo's latest progress note; without it the last note stays. A todo an operator
        cancelled raises TodoCancelled: stop work on it.
        """
        params = _leased(
            validation.arguments(todo_id=todo_id, owner=owner, ttl=ttl, progress=progress)
        )
        return self._transition("heartbeat", params) or self._classify_miss(
            "heartbeat", todo_id, owner
        )

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
        params = _leased(
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

    def complete(self, todo_id: str, owner: str, result: Any = None) -> Todo:
        """Mark a todo `owner` holds done, storing `result` (any JSON value); the todos waiting
        for it that wait for nothing else become claimable in the same statement."""
        params = {
            **validation.arguments(todo_id=todo_id, owner=owner, result=result),
            "notify": conf.LISTEN,
        }
        return self._holders_transition("complete", params)

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
            # Left alone while still held: another session held its row locked, or a child of
            # it appeared while the statement waited for its row (children_seen in
            # sql/todos.sql); completed again, it sees the child.
            again = {todo_id for todo_id, completed in rows if not completed}
            values = [value for todo_id, value in zip(ids, values, strict=True) if todo_id in again]
            ids = [todo_id for todo_id in ids if todo_id in again]
        self._signal("complete_many", lambda: self._reread(done))
        return done

    def fail(
        self, todo_id: str, owner: str, error: Any = None, retry_in: Seconds | None = None
    ) -> Todo:
        """Record a failed attempt: pending again after a backoff, or dead-lettered at the cap.

        `error` is a message, a dict, or an exception; `retry_in` overrides the backoff.
        """
        params = {
            **_history(
                validation.arguments(todo_id=todo_id, owner=owner, error=error, retry_in=retry_in)
            ),
            "delays": retry_schedule(
                base=conf.BACKOFF_BASE, cap=conf.BACKOFF_MAX, jitter=conf.BACKOFF_JITTER
            ),
            "notify": conf.LISTEN,
        }
        return self._holders_transition("fail", params)

    def release(self, todo_id: str, owner: str, delay: Seconds | None = None) -> Todo:
        """Give a lease back: pending again (after `delay`), the attempt not counted."""
        params = {
            **validation.arguments(todo_id=todo_id, owner=owner, delay=delay),
            "notify": conf.LISTEN,
        }
        return self._transition("release", params) or self._classify_miss("release", todo_id, owner)

    # Operators and the reaper

    def reap_expired(self) -> ReapResult:
        """Requeue every todo whose lease lapsed, or dead-letter it when no attempt is left.

        In batches of SWITCHBOARD_TODOS_REAP_BATCH, one statement (and, outside a transaction,
        one commit) each, so that no sweep holds many rows locked at once.
        """
        requeued = dead_lettered = 0
        params = _history({"notify": conf.LISTEN, "limit": conf.REAP_BATCH})
        while True:
            with self._cursor() as cursor:
                cursor.execute(queries["reap_expired"], params)
                batch_requeued, batch_dead_lettered, ids = cursor.fetchone()
            self._signal("reap_expired", functools.partial(self._reread, ids))
            requeued += batch_requeued
            dead_lettered += batch_dead_lettered
            if len(ids) < params["limit"]:
                return ReapResult(requeued=requeued, dead_lettered=dead_lettered)

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
            if _constraint_name(error) != "idx_todos_dedupe":
                raise
        if len(ids) == 1:
            return []
        return [todo for todo_id in ids for todo in self._requeue([todo_id])]

    def expire_lease(self, todo_id: str) -> Todo:
        """Make a claimed todo's lease lapse now, so the reaper or the next claim takes it back."""
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
        params = _history(
            {"ids": [checked["todo_id"]], "reason": checked["reason"], "notify": conf.LISTEN}
        )
        return self._transition("cancel", params) or self._classify_miss("cancel", todo_id, None)

    def cancel_many(self, todo_ids: Iterable[str], reason: str) -> BatchResult:
        """Cancel many pending or claimed todos in one statement."""
        checked = validation.arguments(todo_ids=todo_ids, reason=reason)
        ids = checked["todo_ids"]
        changed = self._rows(
            "cancel", _history({"ids": ids, "reason": checked["reason"], "notify": conf.LISTEN})
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

    # The machinery every transition shares

    @property
    def _db_alias(self) -> str:
        """The database of by-id transitions: the pinned one, else the router's for Todo."""
        return self._db or router.db_for_write(self.model)

    @cached_property
    def _pinned(self) -> dict[str, TodoManager]:
        """This manager pinned to each database a placement has named (`_on_database`)."""
        return {}

    def _cursor(self) -> CursorWrapper:
        return cursors.cursor(connections[self._db_alias])

    @cached_property
    def _layouts(self) -> dict[tuple[tuple[bytes | None, ...], str | None], _Layout]:
        """Where the fields are in each shape of row seen so far (a handful: one per RETURNING)."""
        return {}

    def _layout(self, columns: tuple[bytes | None, ...], extra: str | None) -> _Layout:
        """Where each concrete field, and the `extra` column, are in rows of these columns."""
        layout = self._layouts.get((columns, extra))
        if layout is None:
            position: dict[str | None, int] = {
                name.decode(): index for index, name in enumerate(columns) if name
            }
            fields = self.model._meta.concrete_fields
            layout = _Layout(
                attnames=[field.attname for field in fields],
                pick=itemgetter(*(position[field.column] for field in fields)),
                json=[
                    (index, field)
                    for index, field in enumerate(fields)
                    if isinstance(field, models.JSONField)
                ],
                extra=position[extra] if extra else None,
                id=fields.index(self.model._meta.pk),
                empty_json=(
                    {}
                    if any(
                        field.decoder is not None
                        for field in fields
                        if isinstance(field, models.JSONField)
                    )
                    else EMPTY_JSON
                ),
                given=[
                    (index, field.attname)
                    for index, field in enumerate(fields)
                    if field.column in CREATED_NULLS - CREATED_FRESH
                ],
                fresh=[
                    (index, _fresh_value(field))
                    for index, field in enumerate(fields)
                    if field.column in CREATED_FRESH
                ],
            )
            self._layouts[columns, extra] = layout
        return layout

    @cached_property
    def _new_layout(self) -> _NewLayout:
        """How `_new_todos` fills in a new todo's values, in the order of the model's fields."""
        fields = self.model._meta.concrete_fields
        places = {field.attname: index for index, field in enumerate(fields)}
        return _NewLayout(
            self._layout(tuple(field.column.encode() for field in fields if field.column), None),
            [_fresh_value(field) for field in fields],
            *(
                places[attname]
                for attname in ("max_attempts", "next_retry_at", "created_at", "updated_at")
            ),
        )

    def _run(
        self,
        name: str,
        params: Mapping[str, Any],
        *,
        extra: str | None = None,
        statement: str | None = None,
        given: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> list[tuple[Todo, Any]]:
        """Run statement `name` (or `statement`, composed for this call, under that name);
        build a Todo from each row, matching columns by name.

        `RETURNING *` gives the table's physical column order, which a table shared with the
        Go service does not promise to be the model's, so values are placed by name. `extra`
        names one more column to hand back beside each Todo. A create's rows of new todos (its
        `extra`, created, true) leave out what the creator gave (created_columns in
        sql/todos.sql, CREATED_NULLS): `given` gives those values, validated, of the todo of an
        id, and the columns' defaults fill in the rest (CREATED_FRESH).
        """
        alias = self._db_alias
        connection = connections[alias]
        with cursors.cursor(connection) as cursor:
            cursor.execute(queries[name] if statement is None else statement, params)
            rows = cursor.fetchall()
            columns = cursors.column_names(cursor)
        layout = self._layout(columns, extra)
        build = _instances(self.model, alias, layout.attnames)
        loaded = []
        for row in rows:
            values = list(layout.pick(row))
            if given is not None and row[layout.extra]:
                inserted = given(values[layout.id])
                for index, attname in layout.given:
                    values[index] = inserted[attname]
                for index, value in layout.fresh:
                    values[index] = value
            todo = build(_parsed(values, layout, connection))
            loaded.append((todo, None if layout.extra is None else row[layout.extra]))
        self._signal(name, lambda: loaded)
        return loaded

    def _signal(self, name: str, rows: Callable[[], list[tuple[Todo, Any]]]) -> None:
        """Send statement `name`'s lifecycle signals (signals.SENT_BY) if a receiver listens.

        The one place every transition's rows pass; `rows` is called only when one does.
        """
        if signals.listened(name, self.model):
            signals.send(name, self.model, rows())

    def _reread(self, ids: list[str]) -> list[tuple[Todo, Any]]:
        """The todos of a statement that returns only ids, for its signals (one more query)."""
        return [(todo, None) for todo in self.filter(pk__in=ids)] if ids else []

    def _rows(self, name: str, params: Mapping[str, Any]) -> list[Todo]:
        """Run statement `name` and return the todos it returned."""
        return [todo for todo, _ in self._run(name, params)]

    def _transition(self, name: str, params: Mapping[str, Any]) -> Todo | None:
        """Run a single-todo transition; None when its guard matched no row."""
        rows = self._run(name, params)
        return rows[0][0] if rows else None

    def _seen(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """What the guarded statements saw of each todo in `ids` that exists, by id."""
        with self._cursor() as cursor:
            cursor.execute(queries["classify_miss"], {"ids": ids})
            columns = [column.name for column in cursor.description or ()]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        return {row["id"]: row for row in rows}

    def _batch_result(self, operation: str, ids: list[str], changed: list[Todo]) -> BatchResult:
        """Pair the todos a batch changed with the reason for each one it left alone."""
        changed_ids = {todo.id for todo in changed}
        missed = [todo_id for todo_id in ids if todo_id not in changed_ids]
        seen = self._seen(missed) if missed else {}
        refusal = TRANSITIONS[operation].refusal
        refused = {todo_id: refusal(seen.get(todo_id)) for todo_id in missed}
        return BatchResult(changed=changed, refused=refused)

    def _holders_transition(self, name: str, params: Mapping[str, Any]) -> Todo:
        """Run a transition of the lease's holder (`params["owner"]`) that finishes a todo.

        When its guard missed while the todo is still held, a child of the todo appeared while
        the statement waited for its row (children_seen in sql/todos.sql): it runs again, and
        sees the child.
        """
        todo_id, owner = params["todo_id"], params["owner"]
        for _ in range(KEY_RACE_TRIES):
            done = self._transition(name, params)
            if done is not None:
                return done
            seen = self._seen([todo_id]).get(todo_id)
            if seen is None or seen["state"] != State.CLAIMED or seen["owner"] != owner:
                return self._explain_miss(name, todo_id, owner, seen)
        return self._classify_miss(name, todo_id, owner)

    def _classify_miss(self, operation: str, todo_id: str, owner: str | None) -> Todo:
        """Raise TodoNotFound or a TodoConflict (TodoCancelled) that says what stood in the way."""
        return self._explain_miss(operation, todo_id, owner, self._seen([todo_id]).get(todo_id))

    def _explain_miss(
        self, operation: str, todo_id: str, owner: str | None, seen: dict[str, Any] | None
    ) -> Todo:
        """Raise TodoNotFound, or a TodoConflict (TodoCancelled) saying what of `seen` stood in
        the way."""
        if seen is None:
            raise TodoNotFound(todo_id)
        transition = TRANSITIONS[operation]
        raise transition.error(seen, owner)(
            transition.conflict(seen, owner),
            todo_id=todo_id,
            state=seen["state"],
            owner=seen["owner"],
        )

    acreate_todo = _async_twin(create_todo)
    acreate_many = _async_twin(create_many)
    aenqueue_many = _async_twin(enqueue_many)
    aclaim = _async_twin(claim)
    aclaim_filtered = _async_twin(claim_filtered)
    atick_schedule = _async_twin(tick_schedule)
    aheartbeat = _async_twin(heartbeat)
    aheartbeat_many = _async_twin(heartbeat_many)
    acomplete = _async_twin(complete)
    acomplete_many = _async_twin(complete_many)
    afail = _async_twin(fail)
    arelease = _async_twin(release)
    areap_expired = _async_twin(reap_expired)
    arequeue = _async_twin(requeue)
    arequeue_many = _async_twin(requeue_many)
    aexpire_lease = _async_twin(expire_lease)
    aexpire_lease_many = _async_twin(expire_lease_many)
    acancel = _async_twin(cancel)
    acancel_many = _async_twin(cancel_many)
    aset_priority = _async_twin(set_priority)
    aset_priority_many = _async_twin(set_priority_many)


#: The blocking claims of this process share one view of a database fault.
_BLOCKING_OUTAGE = faults.Outage("blocking claims")


class _Blocking:
    """How `claim_batch` claims and waits: on the calling thread, keeping its connection while
    it waits (waiting.py says why). Its awaits never suspend."""

    def __init__(self, manager: TodoManager) -> None:
        self.manager = manager

    async def claim(self, params: Mapping[str, Any]) -> list[Todo]:
        return self.manager._claim(params)

    async def claim_through_faults(
        self, params: Mapping[str, Any]
    ) -> tuple[list[Todo], DatabaseError | None, float]:
        return self.manager._claim_through_faults(params)

    async def join(self, poll: waiting.LongPoll) -> None:
        poll.join()

    async def wait(self, poll: waiting.LongPoll, seconds: float) -> bool:
        return poll.wait(seconds)


class _Suspending(_Blocking):
    """How `aclaim_batch` claims and waits: a claim without a wait in the caller's thread, as
    every async twin; the claims of a long poll on the process's claim threads, suspended
    while it waits, so that it holds neither a thread nor a connection meanwhile."""

    async def claim(self, params: Mapping[str, Any]) -> list[Todo]:
        return await sync_to_async(self.manager._claim, thread_sensitive=True)(params)

    async def claim_through_faults(
        self, params: Mapping[str, Any]
    ) -> tuple[list[Todo], DatabaseError | None, float]:
        claims = waiting.claim_threads()
        return await claims.run(params["owner"], self.manager._claim_through_faults, params)

    async def join(self, poll: waiting.LongPoll) -> None:
        await poll.ajoin()

    async def wait(self, poll: waiting.LongPoll, seconds: float) -> bool:
        return await poll.await_ring(seconds)


def _batch_rows(
    batch: list[dict[str, Any]], ids: list[str], more: list[list[Any]] | None = None
) -> dict[str, Any]:
    """The `rows` and `payloads` of create_many and create_graph (batch_rows in sql/todos.sql):
    each todo's column values, with `more` of its own after them; the payloads are JSON already.
    """
    rows = [
        [
            todo_id,
            p["queue"],
            p["source"],
            p["kind"],
            p["title"],
            p["event_id"],
            p["idempotency_key"],
            p["assignee"],
            p["max_attempts"],
            p["priority"],
            p["concurrency_key"],
            None if p["run_after"] is None else p["run_after"].astimezone(UTC).isoformat(),
        ]
        for todo_id, p in zip(ids, batch, strict=True)
    ]
    if more is not None:
        for row, extra in zip(rows, more, strict=True):
            row += extra
    return {
        "rows": json.dumps(rows),
        "payloads": "[" + ",".join(p["payload"] for p in batch) + "]",
        "notify": conf.LISTEN,
    }


def _json_object(keys: list[str], texts: list[str | None]) -> str:
    """The JSON object of each of `keys` to its JSON text in `texts` (None: null), joined as
    text: the texts are JSON already, and are not parsed again."""
    members = (
        f"{json.dumps(key)}:{'null' if text is None else text}"
        for key, text in zip(keys, texts, strict=True)
    )
    return "{" + ",".join(members) + "}"


def _instances(model: type[Todo], alias: str, attnames: list[str]) -> Callable[[list[Any]], Todo]:
    """How to build `model` instances of database `alias` from values of every concrete field.

    What `Model.from_db` builds, a third of its cost: the values go straight into the
    instance's `__dict__`, as `Model.__init__` would put them (a fresh instance has no related
    object cached for its foreign key's setter to clear). Only when nothing could tell: the
    model keeps Django's `__init__` and no pre_init or post_init receiver listens; else
    `from_db` itself.
    """
    if model.__init__ is not models.Model.__init__ or (
        # Any receiver at all, then whether one is this model's: the common case pays two tests.
        (pre_init.receivers or post_init.receivers)
        and any(signal.has_listeners(model) for signal in (pre_init, post_init))
    ):
        return functools.partial(model.from_db, alias, attnames)

    def build(values: list[Any]) -> Todo:
        instance = model.__new__(model)
        state = instance.__dict__["_state"] = ModelState()
        state.db, state.adding = alias, False
        instance.__dict__.update(zip(attnames, values, strict=True))
        return instance

    return build


def _parsed(values: list[Any], layout: _Layout, connection: BaseDatabaseWrapper) -> list[Any]:
    """`values` (of the fields of `layout`), their JSON texts parsed in place: Django's psycopg
    setup hands JSON columns over as text."""
    for index, field in layout.json:
        text = values[index]
        if text is not None:
            empty = layout.empty_json.get(text)  # a fresh todo's errors, say
            values[index] = (
                empty()
                if empty is not None
                else field.from_db_value(text, field.cached_col, connection)
            )
    return values


def _fresh_value(field: models.Field[Any, Any]) -> Any:
    """What a new todo's row holds in `field` (CREATED_FRESH) as the database sends it: its
    db_default (JSON as text, parsed with the row's other JSON), else NULL."""
    default = field.db_default
    if default is models.NOT_PROVIDED:
        return None
    value = default.value if isinstance(default, models.Value) else default
    if isinstance(field, models.JSONField):
        return json.dumps(value)
    return value.value if isinstance(value, Enum) else value  # State.PENDING: "pending"


def run_now(coroutine: Coroutine[Any, Any, R]) -> R:
    """The result of a coroutine none of whose awaits suspends, run on this thread."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("A coroutine run synchronously suspended.")


#: `enqueue_many`'s COPY columns: the table's name for each, and the value that leaves it to the
#: database default.
_ALWAYS = object()
_COPY_COLUMNS: dict[str, tuple[str, Any]] = {
    "queue": ("queue", _ALWAYS),
    "kind": ("kind", ""),
    "title": ("title", ""),
    "source": ("source", ""),
    "payload": ("payload", _ALWAYS),
    "event_id": ("event_id", None),
    "assignee": ("assignee", None),
    "max_attempts": ("max_attempts", DEFAULT_MAX_ATTEMPTS),
    "priority": ("priority", 0),
    "concurrency_key": ("concurrency_key", None),
    "run_after": ("next_retry_at", None),
}


def _leased(params: dict[str, Any]) -> dict[str, Any]:
    """A claim's or heartbeat's parameters with the lease of a call that gives no ttl, and the
    length of the failure history a claim taking over a lapsed lease keeps."""
    return {**_history(params), "default_ttl": timedelta(seconds=conf.DEFAULT_TTL)}


def _history(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a statement that appends to the failure history (errors_with), with
    how many entries it keeps."""
    return {**params, "max_errors_kept": conf.MAX_ERRORS_KEPT}


def _constraint_name(error: IntegrityError) -> str | None:
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)
