"""The cursor the manager runs its statements on: prepared once per connection, quick to read.

Django's psycopg cursors bind parameters on the client and never prepare, so PostgreSQL parses
and plans every statement on every call; for a claim, that costs more than running it. With
SWITCHBOARD_TODOS_PREPARE (the default), the manager's statements run on a cursor that binds
parameters on the server and prepares each statement the first time a connection runs it.
PgBouncer in transaction mode cannot keep prepared statements (before 1.21, or without
`max_prepared_statements`): SWITCHBOARD_TODOS_POOLER = "transaction" turns the setting off.
Without it, the first statement that finds its prepared form missing, or another client's in
its place, raises `PoolerNotConfigured`, which names the setting.

Either way the cursor is wrapped as Django wraps its own, so query logging, tests'
`CaptureQueriesContext`, `execute_wrapper()` hooks and error translation all see it. And
timestamps are read by psycopg's compiled loader, which gives the datetimes Django's Python
loader gives (the instant, in the session's time zone that Django set) at a fraction of the
cost per value: the largest cost per todo once the statements are prepared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import lru_cache
from typing import Any
from weakref import WeakSet

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.base import CursorDebugWrapper, CursorMixin
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper
from psycopg import Connection, Cursor, errors
from psycopg._queries import PostgresQuery, QueryPart, _query2pg_nocache
from psycopg.abc import Params, Query
from psycopg.adapt import PyFormat
from psycopg.pq import TransactionStatus
from psycopg.types.datetime import TimestamptzLoader

from switchboard_todos.conf import conf
from switchboard_todos.exceptions import PoolerNotConfigured

#: psycopg prepares nothing on a connection whose prepare_threshold is None, Django's default.
#: Then the threshold becomes this, so high that only what asks for it is prepared.
EXPLICIT_ONLY = 2**31


#: Bumped when a prepared statement went stale (see PreparingCursor): statements then run under
#: a new text, which psycopg prepares afresh, on every connection of the process.
_generation = 0


@lru_cache(maxsize=256)
def _converted(
    query: str, encoding: str
) -> tuple[bytes, list[PyFormat], list[str] | None, list[QueryPart]]:
    """psycopg's conversion of a statement's %(name)s placeholders to $n, remembered for
    statements of any length. psycopg remembers only those up to 4,096 bytes (longer ones are
    mostly ORMs' ever-changing INSERTs), so it converted the 10 KB claim again at every call:
    100 to 350 us, more than the claim's own work in the database. The manager runs a few fixed
    statements (and a queryset claim's, which vary: hence a bound). Remembered by the text
    itself, not its bytes: the manager's statements are the same str objects at every call,
    whose hash Python keeps, where encoding the claim's 8 KB and hashing the bytes anew cost
    a few microseconds a statement."""
    return _query2pg_nocache(query.encode(encoding), encoding)


class RememberedQuery(PostgresQuery):
    """psycopg's PostgresQuery, converting each statement once however long it is."""

    __slots__ = ()

    def convert(self, query: Query, vars: Params | None) -> None:
        if vars is None or not isinstance(query, str):
            super().convert(query, vars)
            return
        self.query, self._want_formats, self._order, self._parts = _converted(
            query, self._tx.encoding
        )
        self.dump(vars)


class PreparingCursor(CursorMixin, Cursor[Any]):
    """Django's ServerBindingCursor, preparing every statement it runs.

    A schema change that alters what a statement returns (a column added to `todos`, say, by
    another service's migration) makes PostgreSQL refuse its prepared form for good: "cached
    plan must not change result type". Then the statements are prepared again, and the one
    that failed runs again, unless it was inside a transaction, which the error aborted: that
    caller gets the error, the next transaction succeeds.
    """

    _query_cls = RememberedQuery

    def __init__(self, connection: Connection[Any], *, naive: bool) -> None:
        super().__init__(connection)
        #: Made for USE_TZ = False: timestamps read naive (see cursor()).
        self.naive = naive
        #: Handed out by cursor() and not closed since: another cursor() call makes another.
        self.in_use = False
        #: Django's wrapper of this cursor, made once: it keeps nothing of a call.
        self.wrapped: CursorWrapper | None = None

    def close(self) -> None:
        """Give the cursor back to its connection (cursor()), its results dropped; it stays
        open for the connection's next statement."""
        self._reset()
        self.in_use = False

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        kwargs["prepare"] = True
        try:
            return super().execute(_current(query), params, **kwargs)
        except (errors.DuplicatePreparedStatement, errors.InvalidSqlStatementName) as error:
            raise _pooler_lost(error) from error
        except errors.FeatureNotSupported as error:
            if not _went_stale(error, self.connection):
                raise
            return super().execute(_current(query), params, **kwargs)


def one_round_trip(wrapper: BaseDatabaseWrapper, send: Callable[[], None]) -> None:
    """Run the statements that `send` executes on `wrapper`'s cursors in one round trip.

    psycopg's pipeline sends them together and reads their answers at its end (a Sync), where
    the cursors then have their rows. Outside a transaction they are one transaction,
    PostgreSQL's implicit one, committed at the Sync, or rolled back there by an error, which
    is raised then. Each takes its snapshot as it begins: a statement after one that waited for
    a lock reads what committed meanwhile (sql/claiming.sql, claim_turn). A prepared statement
    gone stale is prepared again and `send` runs again, as PreparingCursor does for one.
    """
    connection = wrapper.connection
    with wrapper.wrap_database_errors:
        for last in (False, True):
            try:
                with connection.pipeline():
                    send()
                return
            except (errors.DuplicatePreparedStatement, errors.InvalidSqlStatementName) as error:
                raise _pooler_lost(error) from error
            except errors.FeatureNotSupported as error:
                if last or not _went_stale(error, connection):
                    raise


def _pooler_lost(error: errors.DatabaseError) -> PoolerNotConfigured:
    """A prepared statement lost, as PoolerNotConfigured, which names the setting."""
    return PoolerNotConfigured(_POOLED_PREPARE % (error.sqlstate, error))


def _went_stale(error: errors.FeatureNotSupported, connection: Connection[Any]) -> bool:
    """Whether `error` is a prepared statement whose result type changed, to be run again under
    a new text; the statements are prepared anew either way, from the next one on. Not inside a
    transaction, which the error aborted."""
    global _generation
    if error.diag.source_function != "RevalidateCachedQuery":
        return False
    _generation += 1
    return connection.info.transaction_status == TransactionStatus.IDLE


#: What a prepared statement's loss says. psycopg forgets its statements when the session runs
#: DISCARD ALL or DEALLOCATE ALL, so what is left is a pooler between the app and the server,
#: which hands a client another session's prepared statements, or a session without its own.
_POOLED_PREPARE = (
    "A prepared statement of switchboard_todos was lost (%s: %s), most likely to a connection "
    "pooler in transaction mode, which hands each transaction to any server connection. Set "
    'SWITCHBOARD_TODOS_POOLER = "transaction" (docs/operating.md, "Behind a connection pooler"),'
    " or SWITCHBOARD_TODOS_PREPARE = False."
)


class LoggingCursorWrapper(CursorDebugWrapper):
    """Django's logging wrapper, logging the statement with its parameters in place.

    Django reads the logged SQL back from a client-side binding cursor; a prepared statement
    leaves nothing there to read, so the SQL is composed as Django composes it for its own
    server-side binding cursors.
    """

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(self.db.ops.compose_sql(sql, params), params):
            return self._execute_with_wrappers(sql, params, many=False, executor=self._execute)


def _current(query: Any) -> Any:
    """`query` as the current generation of prepared statements knows it."""
    return f"{query}\n/* prepared again: {_generation} */" if _generation else query


def cursor(
    wrapper: BaseDatabaseWrapper, *, prepared: bool = True, statement: str | None = None
) -> CursorWrapper:
    """A cursor on Django's connection `wrapper` for the todo statements (see above).

    `prepared=False` plans each statement at each call, on the table as it is then: for a
    statement whose best plan depends on the table's size (the turns of fair keys,
    sql/shared.sql fair_turn), which a generic plan made while the table was nearly empty
    would read in full at every call until the next ANALYZE. `statement` (a statement's text,
    or a name) says which statement the cursor is for: each has a kept cursor of its own
    (_kept_cursor says why).
    """
    if not conf.PREPARE or not prepared:
        wrapped = wrapper.cursor()
        _read_timestamps_quickly(wrapper, wrapped.cursor)
        return wrapped
    # What Django's BaseDatabaseWrapper.cursor() does, with a cursor class of our own.
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    with wrapper.wrap_database_errors:
        connection = wrapper.connection
        if connection.prepare_threshold is None:
            connection.prepare_threshold = EXPLICIT_ONLY
        if conf.GENERIC_PLANS and connection not in _generic:
            _plan_generically(connection)
        kept = _kept_cursor(wrapper, connection, statement)
    wrapper.validate_thread_sharing()
    if wrapper.queries_logged:
        return LoggingCursorWrapper(kept, wrapper)
    if kept.wrapped is None or kept.wrapped.db is not wrapper:
        # django-stubs type this as taking a CursorWrapper; it takes the DB-API cursor.
        kept.wrapped = wrapper.make_cursor(kept)  # type: ignore[arg-type]
    return kept.wrapped


#: The attribute of Django's connection that keeps its psycopg connection and its cursors for
#: the todo statements, by statement (_kept_cursor): they go with the psycopg connection, and are
#: made again on a new one.
KEPT_CURSOR = "_switchboard_todos_cursors"


def _kept_cursor(
    wrapper: BaseDatabaseWrapper, connection: Connection[Any], statement: str | None
) -> PreparingCursor:
    """The cursor `wrapper` keeps on its psycopg `connection` for `statement`, made once and
    handed out again after each close: making a cursor (its adapters, its timestamp loader,
    Django's checks) cost 20 us of client CPU per statement, a tenth of a `create_todo`'s.

    One per statement: psycopg keeps a cursor's loaders (its Transformer) only while the cursor
    runs the same query again, so one cursor taking turns between a claim and a complete looked
    up the loader of every column type at each statement, about 25 us of client CPU each
    (`claim_next` + `complete`: 400 us a todo). While it is in use (a statement run inside
    another's `with`), a fresh one is made, as before; and again when the connection or USE_TZ
    has changed since. A connection that threads share (Django's `inc_thread_sharing`) hands
    out a fresh cursor each time: two threads could take one."""
    naive, shared = wrapper.timezone is None, wrapper.allow_thread_sharing
    held: tuple[Connection[Any], dict[str | None, PreparingCursor]] | None
    held = getattr(wrapper, KEPT_CURSOR, None)
    if held is None or held[0] is not connection:  # a new connection: the old cursors go
        held = (connection, {})
        setattr(wrapper, KEPT_CURSOR, held)
    kept_cursors = held[1]
    kept = kept_cursors.get(statement)
    if not shared and kept is not None and not kept.in_use and kept.naive == naive:
        kept.in_use = True
        return kept
    fresh = PreparingCursor(connection, naive=naive)
    if naive:
        register_tzloader(None, fresh)  # USE_TZ = False: naive, as Django reads them
    _read_timestamps_quickly(wrapper, fresh)
    fresh.in_use = True
    if not shared and (kept is None or not kept.in_use):
        kept_cursors[statement] = fresh
    return fresh


#: The connections whose session plans prepared statements generically (_plan_generically).
_generic: WeakSet[Connection[Any]] = WeakSet()


def _plan_generically(connection: Connection[Any]) -> None:
    """Have the session run each prepared statement on its generic plan, once per connection.

    PostgreSQL plans a prepared statement anew at each call while its first custom plans
    looked cheaper than the generic one, and the claim's estimates grow with the table between
    two vacuums: the worker's claims were all planned anew, which cost the server 60 us of CPU
    per todo drained against 52 (docs/benchmarks.md). The manager's statements are written to
    keep one plan whatever their parameters (sql/claiming.sql, claim_next). The setting is the
    session's: it also holds for the other named prepared statements and PL/pgSQL plans of the
    connection (SWITCHBOARD_TODOS_GENERIC_PLANS = False leaves it alone). And JIT off: a
    generic plan's estimate does not know the parameters, and one that crossed jit_above_cost
    (a table's statistics seen with few distinct turns, say) compiled the claim at every call,
    230 ms each where it runs in 2 (docs/benchmarks.md, scenario 10). Set only outside a
    transaction, whose rollback would undo it; a connection in one is tried again at its next
    cursor.
    """
    if connection.autocommit and connection.info.transaction_status == TransactionStatus.IDLE:
        connection.execute(
            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false),"
            " set_config('jit', 'off', false)"
        )
        _generic.add(connection)


def array_literal(values: Iterable[str | int | datetime]) -> str:
    """PostgreSQL's text form of a one-dimensional array of texts, integers or aware datetimes,
    for a parameter the statement casts (`%(x)s::text[]`). psycopg's list dumper looks at each
    element in Python to pick the array's type: the seven arrays of a claim's marks cost
    25-60 us of client CPU per claim, as much as the rest of its Python."""
    return "{" + ",".join(map(_array_element, values)) + "}"


def _array_element(value: str | int | datetime) -> str:
    if isinstance(value, datetime):
        return f'"{value.isoformat()}"'
    if isinstance(value, int):
        return str(int(value))  # a bool as 1 or 0
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def column_names(cursor: CursorWrapper | Cursor[Any]) -> tuple[bytes | None, ...]:
    """The names of the columns of the statement just run, read straight off its result:
    `cursor.description` builds an object per column, costing more than a short row."""
    result = cursor.pgresult
    assert result is not None, "a statement has run"
    return tuple(map(result.fname, range(result.nfields)))


def _read_timestamps_quickly(wrapper: BaseDatabaseWrapper, raw: Cursor[Any]) -> None:
    # Django's loader parses in Python, then labels the result with `wrapper.timezone`, the
    # session's time zone: psycopg's compiled loader gives that same datetime. Without time
    # zones (USE_TZ = False) Django's naive one stays.
    if wrapper.timezone is not None:
        raw.adapters.register_loader("timestamptz", TimestamptzLoader)
