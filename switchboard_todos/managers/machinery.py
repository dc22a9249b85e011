"""The machinery every family of the manager shares: run a statement and hand back its Todos,
send their signals, place a call on its database, and say why a guard matched no row.

Each transition has the same three beats: validate the input (raising InvalidTodo before anything
is written), run the operation's one statement (sql/), and when the guard matched no row, say
why (`_classify_miss`: TodoNotFound, or TodoConflict in the words of the operation's row in
`transitions.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import timedelta
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Self, TypeVar

from asgiref.sync import sync_to_async
from django.core.signals import setting_changed
from django.db import IntegrityError, connections, models, router
from django.db.backends.utils import CursorWrapper

from switchboard_todos import cursors, placement, signals
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import InvalidTodo, TodoNotFound
from switchboard_todos.managers.rows import (
    EMPTY_JSON,
    Layout,
    NewLayout,
    fresh_value,
    instances,
    parsed,
)
from switchboard_todos.querysets import TodoQuerySet
from switchboard_todos.sql import CREATED_FRESH, CREATED_NULLS, queries
from switchboard_todos.transitions import TRANSITIONS

if TYPE_CHECKING:
    from switchboard_todos.models import Todo

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound="Machinery")

#: The indexes that let one claimed todo at most hold a concurrency key, and a slot of a queue's
#: concurrency limit; and how many times a claim that loses the race for one runs before it
#: returns nothing for this call.
RACED_INDEXES = frozenset({"idx_todos_key_claimed", "idx_todos_slot"})
KEY_RACE_TRIES = 10
#: The stored statements' texts (sql/): `_run` runs each on a cursor kept for it
#: (cursors.cursor), which then keeps its columns' loaders from one call to the next.
_STORED = frozenset(queries.values())


def async_twin(
    method: Callable[Concatenate[M, P], R],
) -> Callable[Concatenate[M, P], Coroutine[Any, Any, R]]:
    """Make the `a`-prefixed twin of a manager method: the same code, run off the event loop."""

    async def twin(self: M, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await sync_to_async(method, thread_sensitive=True)(self, *args, **kwargs)

    twin.__name__ = twin.__qualname__ = f"a{method.__name__}"
    twin.__doc__ = f"Async twin of `{method.__name__}`."
    return twin


class Kept:
    """What a manager works out once for its model: the row layouts of its statements, and
    itself pinned to each database a placement named (`_on_database`).

    Kept per manager class and model, not on the instance: Django copies a manager at every
    `db_manager()` and `using()`, and the agents' service makes a copy per call, which worked
    all of this out again each time (about 7% of an API server's CPU a call).
    """

    def __init__(self) -> None:
        self.layouts: dict[tuple[tuple[bytes | None, ...], str | None], Layout] = {}
        self.new_layout: NewLayout | None = None
        self.pinned: dict[str, Any] = {}


_KEPT: dict[tuple[type, type], Kept] = {}

#: The manager's base: Django's, with the queryset's claims (querysets.py) on every queryset.
_TodoManagerBase = models.Manager.from_queryset(TodoQuerySet)


class Machinery(_TodoManagerBase["Todo"]):
    """The base of `TodoManager`'s families (managers/__init__.py): what they all run through."""

    @property
    def _db_alias(self) -> str:
        """The database of by-id transitions: the pinned one, else the router's for Todo."""
        return self._db or routes.database(None, lambda: router.db_for_write(self.model))

    def _cursor(self, *, prepared: bool = True) -> CursorWrapper:
        return cursors.cursor(connections[self._db_alias], prepared=prepared)

    @property
    def _kept(self) -> Kept:
        """What this manager's class keeps for its model, shared with every copy of it."""
        key = (type(self), self.model)
        kept = _KEPT.get(key)
        return kept if kept is not None else _KEPT.setdefault(key, Kept())

    def _layout(self, columns: tuple[bytes | None, ...], extra: str | None) -> Layout:
        """Where each concrete field, and the `extra` column, are in rows of these columns."""
        layouts = self._kept.layouts
        layout = layouts.get((columns, extra))
        if layout is None:
            position: dict[str | None, int] = {
                name.decode(): index for index, name in enumerate(columns) if name
            }
            fields = self.model._meta.concrete_fields
            layout = Layout(
                attnames=[field.attname for field in fields],
                pick=itemgetter(*(position[field.column] for field in fields)),
                json=[
                    (index, field)
                    for index, field in enumerate(fields)
                    if isinstance(field, models.JSONField)
                ],
                extra=position[extra] if extra else None,
                id=fields.index(self.model._meta.pk),
                parents=[field.attname for field in fields].index("parents"),
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
                    (index, fresh_value(field))
                    for index, field in enumerate(fields)
                    if field.column in CREATED_FRESH
                ],
            )
            layouts[columns, extra] = layout
        return layout

    @property
    def _new_layout(self) -> NewLayout:
        """How `_new_todos` fills in a new todo's values, in the order of the model's fields."""
        kept = self._kept
        if kept.new_layout is None:
            kept.new_layout = self._laid_out_new()
        return kept.new_layout

    def _laid_out_new(self) -> NewLayout:
        fields = self.model._meta.concrete_fields
        places = {field.attname: index for index, field in enumerate(fields)}
        return NewLayout(
            self._layout(tuple(field.column.encode() for field in fields if field.column), None),
            [fresh_value(field) for field in fields],
            *(
                places[attname]
                for attname in (
                    "max_attempts",
                    "next_retry_at",
                    "created_at",
                    "updated_at",
                    "fair_at",
                )
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
        prepared: bool = True,
        markers: list[Any] | None = None,
        ahead: str | None = None,
    ) -> list[tuple[Todo, Any]]:
        """Run statement `name` (or `statement`, composed for this call, under that name);
        build a Todo from each row, matching columns by name.

        `RETURNING *` gives the table's physical column order, which a table shared with the
        Go service does not promise to be the model's, so values are placed by name. `extra`
        names one more column to hand back beside each Todo. A create's rows of new todos (its
        `extra`, created, true) leave out what the creator gave (created_columns in
        sql/creating.sql, CREATED_NULLS): `given` gives those values, validated, of the todo of an
        id, and the columns' defaults fill in the rest (CREATED_FRESH). `prepared=False`: planned
        at this call (cursors.cursor). A row whose id is NULL is the statement's marker, not a
        todo (claim_ready's "limited"): its `extra` goes to `markers`. A todo with parents is
        remembered (Dependencies). `ahead` names a statement sent before it with the same
        parameters, in the same round trip and transaction (cursors.one_round_trip).
        """
        alias = self._db_alias
        connection = connections[alias]
        text = queries[name] if statement is None else statement
        # A cursor per stored statement, and one per name for those composed at each call.
        kept_for = text if text in _STORED else name
        with cursors.cursor(connection, prepared=prepared, statement=kept_for) as cursor:
            if ahead is None:
                cursor.execute(text, params)
            else:
                first_text = queries[ahead]
                with cursors.cursor(connection, statement=first_text) as first:

                    def send() -> None:
                        first.execute(first_text, params)
                        cursor.execute(text, params)

                    cursors.one_round_trip(connection, send)
            # Read off psycopg's cursor: Django's wrapper wraps each attribute read through it
            # in a new error-translating function, 5 us a statement.
            with connection.wrap_database_errors:
                rows = cursor.cursor.fetchall()
            columns = cursors.column_names(cursor.cursor)
        layout = self._layout(columns, extra)
        build = instances(self.model, alias, layout.attnames)
        loaded = []
        for row in rows:
            values = list(layout.pick(row))
            if markers is not None and values[layout.id] is None:
                markers.append(None if layout.extra is None else row[layout.extra])
                continue
            if values[layout.parents] is not None:
                dependencies.met(alias)
            if given is not None and row[layout.extra]:
                inserted = given(values[layout.id])
                for index, attname in layout.given:
                    values[index] = inserted[attname]
                for index, value in layout.fresh:
                    values[index] = value
            todo = build(parsed(values, layout, connection))
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

    def _placed(self, queues: Sequence[str]) -> Self:
        """This manager on the database `queues` live in (placement.py); itself when pinned
        by `db_manager`. Queues of several databases are refused: a statement runs in one."""
        if self._db is not None:
            return self
        grouped = routes.database(tuple(queues), lambda: placement.by_database(queues))
        if len(grouped) > 1:
            where = "; ".join(f"{alias}: {', '.join(names)}" for alias, names in grouped.items())
            raise InvalidTodo(
                f"queues live in different databases ({where}); claim from each with "
                "Todo.objects.db_manager(alias)."
            )
        return self._on_database(next(iter(grouped), self._db_alias))

    def _on_database(self, alias: str) -> Self:
        """This manager pinned to `alias` (kept: placement runs on every create and claim);
        itself when pinned there already. Pinned, its statements no longer ask the router
        where they run (`_db_alias`), once per statement and check."""
        if alias == self._db:
            return self
        pinned = self._kept.pinned.get(alias)
        if pinned is None:
            pinned = self._kept.pinned[alias] = self.db_manager(alias)
        return pinned

    def _by_database(
        self, batch: list[dict[str, Any]]
    ) -> list[tuple[Self, dict[int, dict[str, Any]]]]:
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


class Routes:
    """The routers' answers, remembered while the routing is this app's own: every router is
    a QueueRouter, whose answer depends only on the queue and on settings
    (SWITCHBOARD_TODOS_QUEUE_DATABASES). Asking every router in turn cost a single claim or
    complete a few microseconds a call. A project's own router may answer the same question
    differently (a database per tenant of the request, say): then it is asked each time. The
    answers are dropped when the routers change (override_settings makes new ones) or the
    setting does (`setting_changed`)."""

    def __init__(self) -> None:
        self._routers: object = None
        self._ours = False
        self._answers: dict[tuple[str, ...] | None, Any] = {}

    def database(self, queues: tuple[str, ...] | None, ask: Callable[[], R]) -> R:
        """The answer for `queues` (None: a todo by id), from `ask` unless remembered."""
        routers = router.routers
        if routers is not self._routers:
            self._answers = {}
            self._ours = all(type(each) is placement.QueueRouter for each in routers)
            self._routers = routers
        if not self._ours:
            return ask()
        answer: R | None = self._answers.get(queues)
        if answer is None:
            answer = self._answers[queues] = ask()
        return answer

    def forget(self, *, setting: str, **kwargs: Any) -> None:
        """Drop every answer when the placement setting changes (a `setting_changed` receiver)."""
        if setting == "SWITCHBOARD_TODOS_QUEUE_DATABASES":
            self._answers = {}


#: This process's routing answers.
routes = Routes()
setting_changed.connect(routes.forget)


#: For how many seconds after this process last met a todo that waits for others in a
#: database its completes and fails there run `complete` and `fail` at once (Dependencies).
DEPENDENCIES_REMEMBERED = 10.0


class Dependencies:
    """When this process last met, in each database, a todo that waits for others (one the
    manager's statements returned, or a complete or fail that its lean statement left alone).

    `complete` and `fail` of a todo run complete_leaf and fail_leaf, lean, which leave a todo
    that others wait for alone, and then the full statement; for DEPENDENCIES_REMEMBERED
    seconds after such a meeting they run the full one at once, sparing the parents of a graph
    that process runs the lean statement's round trip. A choice of statement only: neither is
    ever wrong.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._met: dict[str, float] = {}

    def met(self, alias: str) -> None:
        """A todo that waits for others, or one others wait for, was met in database `alias`."""
        self._met[alias] = self.clock()

    def lately(self, alias: str) -> bool:
        """Whether one was met in `alias` within the last DEPENDENCIES_REMEMBERED seconds."""
        at = self._met.get(alias)
        return at is not None and self.clock() - at < DEPENDENCIES_REMEMBERED

    def forget(self) -> None:
        """Forget every meeting (tests)."""
        self._met.clear()


#: This process's memory of dependencies.
dependencies = Dependencies()


def run_now(coroutine: Coroutine[Any, Any, R]) -> R:
    """The result of a coroutine none of whose awaits suspends, run on this thread."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("A coroutine run synchronously suspended.")


def leased(params: dict[str, Any]) -> dict[str, Any]:
    """A claim's or heartbeat's parameters with the lease of a call that gives no ttl, and the
    length of the failure history a claim taking over an expired lease keeps."""
    return {**with_history(params), "default_ttl": timedelta(seconds=conf.DEFAULT_TTL)}


def with_history(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a statement that appends to the failure history (error_entries), with
    how many entries, and bytes of them, it keeps."""
    return {
        **params,
        "max_errors_kept": conf.MAX_ERRORS_KEPT,
        "max_error_history_bytes": conf.MAX_ERROR_HISTORY_BYTES,
    }


def constraint_name(error: IntegrityError) -> str | None:
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)
