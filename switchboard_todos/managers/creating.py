"""Creating todos: one with `create_todo`, many with `create_many` (and graphs of todos that
wait for each other), the bulk COPY of `enqueue_many`, and a schedule's tick."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from psycopg import sql

from switchboard_todos import endings, graphs, tracing, validation
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo, TodoConflict
from switchboard_todos.managers.machinery import Machinery, async_twin
from switchboard_todos.managers.rows import instances, parsed
from switchboard_todos.sql import queries
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS, State

#: The step between two turns of one fair key (fair_turn in sql/shared.sql).
FAIR_STEP = timedelta(milliseconds=1)

if TYPE_CHECKING:
    from switchboard_todos.models import Event, Todo


class Creating(Machinery):
    """`Todo.objects`' creates."""

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
        fair_key: str | None = None,
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
        no longer waits for that one (docs/dependencies.md). Within a priority, the `fair_key`s
        of a queue take turns at its claims: one tenant's backlog does not hold up the others'
        todos (docs/queues.md, fairness); todos without one share one lane.
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
            "fair_key": fair_key,
            "event": event,
            "run_after": run_after,
            "after": after,
            "on_parent_failure": on_parent_failure,
        }
        params = validation.creation(spec)
        placed = self._placed([params["queue"]])
        placed._known_events([params])
        with tracing.creating("create_todo", (params["queue"],), 1) as creation:
            params["trace_context"] = creation.context
            made = placed._create(params)
            creation.created(made[0].id)
        return made

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
        with tracing.creating("create_many", {p["queue"] for p in batch}, len(batch)) as creation:
            if creation.context is not None:
                for params in batch:
                    params["trace_context"] = creation.context
            return self._create_batch(batch, refs)

    def _create_batch(
        self, batch: list[dict[str, Any]], refs: list[str | None]
    ) -> list[tuple[Todo, bool]]:
        """Run `create_many` with a validated batch: a graph, or one statement per database."""
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
        # With fair keys, planned at each call: their turns' probes (cursors.cursor).
        with self._cursor(prepared=not any(params["fair_key"] for params in batch)) as cursor:
            cursor.execute(queries["create_many"], columns)
            ((now, defaults, missed, scheduled, next_retry_at, keyed, turns),) = cursor.fetchall()
        made = self._new_todos(
            sent,
            now,
            json.loads(defaults or "{}"),
            set(missed),
            dict(zip(scheduled or (), next_retry_at or (), strict=True)),
            dict(zip(keyed or (), turns or (), strict=True)),
        )
        held = self.key_holders([params for todo_id, params in sent if todo_id in missed])
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

    def key_holders(self, batch: Iterable[Mapping[str, Any]]) -> list[Todo]:
        """The live todos that hold the idempotency keys of `batch` (create_todo arguments, with
        their keys as stored): one query, none when no row has a key. What create_many returns
        for the rows it did not insert, and what a plan checks before it writes anything."""
        wanted = {
            (params["queue"], params["idempotency_key"])
            for params in batch
            if params["idempotency_key"] is not None
        }
        if not wanted:
            return []
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
        turns: Mapping[str, datetime],
    ) -> dict[str, Todo]:
        """The todos create_many inserted, by id, built from what it sent (`sent`: each id
        with its validated parameters) and what its answer says the database decided: `now`,
        the queues' default max_attempts (`defaults`), the ids of the rows it did not insert
        (`missed`), the next_retry_at of those inserted with one (`scheduled`), and the turns
        of those with a fair key (`turns`; the others' is `now`)."""
        new = self._new_layout
        layout = new.layout
        connection = connections[self._db_alias]
        build = instances(self.model, self._db_alias, layout.attnames)
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
            values[new.fair_at] = turns.get(todo_id, now)
            made[todo_id] = build(parsed(values, layout, connection))
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
                    [parents, waited, params["on_parent_failure"]]
                    for parents, waited, params in zip(
                        graph.parents, graph.members_waited, batch, strict=True
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
                    prepared=not any(params["fair_key"] for params in batch),
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
        with tracing.creating("enqueue_many", {p["queue"] for p in batch}, len(batch)) as creation:
            if creation.context is not None:
                for params in batch:
                    params["trace_context"] = creation.context
            return sum(
                placed._enqueue_many(list(rows.values()))
                for placed, rows in self._by_database(batch)
            )

    def _enqueue_many(self, rows: list[dict[str, Any]]) -> int:
        """Run `enqueue_many` with validated rows, all of this manager's database."""
        if not rows:
            return 0
        rows = self._with_turns(self._with_queue_max_attempts(rows))
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

    def _with_turns(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows`, each with its turn (fair_at): None (the column's default, the creation time)
        for all when none has a fair key; else each key's rows one step (1 ms) apart from its
        key's turn (fair_turns: one query for the batch), and the others at the database's now.
        """
        lanes = sorted({(r["queue"], r["priority"], r["fair_key"]) for r in rows if r["fair_key"]})
        if not lanes:
            return [{**row, "fair_at": None} for row in rows]
        queues, priorities, keys = (list(column) for column in zip(*lanes, strict=True))
        with self._cursor(prepared=False) as cursor:  # planned on the table as it is
            cursor.execute(
                queries["fair_turns"], {"queues": queues, "priorities": priorities, "keys": keys}
            )
            found = cursor.fetchall()
        now = found[0][0]
        turns = {(queue, priority, key): start for _now, queue, priority, key, start in found}
        turned = []
        for row in rows:
            lane = (row["queue"], row["priority"], row["fair_key"])
            turn = turns.get(lane)
            if turn is not None:
                turns[lane] = turn + FAIR_STEP
            turned.append({**row, "fair_at": now if turn is None else turn})
        return turned

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

    acreate_todo = async_twin(create_todo)
    acreate_many = async_twin(create_many)
    aenqueue_many = async_twin(enqueue_many)
    atick_schedule = async_twin(tick_schedule)


class _GraphNotCreated(Exception):
    """Rolls a batch of todos that wait for each other back when it was not created whole."""


def _batch_rows(
    batch: list[dict[str, Any]], ids: list[str], more: list[list[Any]] | None = None
) -> dict[str, Any]:
    """The `rows` and `payloads` of create_many and create_graph (batch_rows in sql/creating.sql):
    each todo's column values, with `more` of its own after them; the payloads are JSON already.
    The batch's one trace context (tracing.creating) goes beside them.
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
            p["fair_key"],
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
        "trace_context": batch[0]["trace_context"] if batch else None,
    }


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
    "fair_key": ("fair_key", None),
    "fair_at": ("fair_at", None),
    "run_after": ("next_retry_at", None),
    "trace_context": ("trace_context", None),
}
