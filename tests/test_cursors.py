"""The cursor the statements run on: prepared once per connection, seen and read as Django's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import NotSupportedError, connection, transaction
from django.test.utils import CaptureQueriesContext

from switchboard_todos import cursors
from switchboard_todos.claims.marks import marks
from switchboard_todos.models import Queue, Todo
from switchboard_todos.sql import queries
from tests.conftest import database_url
from tests.helpers import CLAIM_STATEMENTS

TIMESTAMPS = ("created_at", "updated_at", "claimed_at", "lease_expires_at")


def prepared_statements() -> dict[str, tuple[int, int]]:
    """The statements prepared on this connection: text -> (generic plans, custom plans)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return {text: (generic, custom) for text, generic, custom in cursor.fetchall()}


def prepared_as(name: str, statements: dict[str, tuple[int, int]]) -> list[tuple[int, int]]:
    """The entries of `statements` that are statement `name` (its placeholders numbered): its
    whole text, which twins (claim_next, claim_next_few) share but for a constant."""
    contract = re.sub(r"%\(\w+\)s", "?", queries[name])
    return [
        plans
        for text, plans in statements.items()
        if re.sub(r"\$\d+", "?", text).startswith(contract)
    ]


def round_trip(times: int) -> None:
    for _ in range(times):
        todo, _ = Todo.objects.create_todo(kind="k")
        Todo.objects.claim_next("default", "w1", 30)
        Todo.objects.complete(todo.id, "w1")


@pytest.mark.django_db(transaction=True)
def test_statements_are_prepared_once_per_connection() -> None:
    """Each statement is prepared once per connection, and the claim keeps a generic plan."""
    connection.close()  # a fresh session, with nothing prepared yet
    round_trip(8)
    for _ in range(8):
        Todo.objects.filter(kind="k").count()
    statements = prepared_statements()
    # The first claim is a full scan (claims/marks.py), of one todo: claim_next_few.
    for name in ("create_todo", "claim_next_few", "claim_one", "complete_leaf"):
        assert len(prepared_as(name, statements)) == 1, name
    # Never planned anew: the session plans prepared statements generically (cursors.py).
    assert claim_plans(statements) == (8, 0)
    # Django's own queries are left as Django runs them.
    assert len(statements) == 4, statements


def claim_plans(statements: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """The generic and custom plans of the claims, full (claim_next) and lean (claim_ready, and
    claim_one for a claim of one), each also for a few todos."""
    plans = [plans for name in CLAIM_STATEMENTS for plans in prepared_as(name, statements)]
    return sum(generic for generic, _ in plans), sum(custom for _, custom in plans)


def plan_cache_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_the_claim_keeps_its_generic_plan_while_the_table_grows() -> None:
    """A drain's claims run on one generic plan, never planned anew.

    Left to PostgreSQL, the custom plans of the first claims, costed while the table was
    small, looked cheaper than the generic plan, and every later claim was planned again
    (some 2 ms a claim): 0 generic plans in 30.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (queue, kind) SELECT 'default', 'k' FROM generate_series(1, 5000)"
        )
        cursor.execute("VACUUM ANALYZE todos")
    connection.close()  # a fresh session, with nothing prepared yet
    for _ in range(30):
        claimed = Todo.objects.claim_batch("default", "w1", 30, limit=50)
        Todo.objects.complete_many("w1", {todo.id: None for todo in claimed})
    assert claim_plans(prepared_statements()) == (30, 0)
    assert plan_cache_mode() == "force_generic_plan"


@pytest.mark.django_db(transaction=True)
def test_the_session_of_the_statements_has_jit_off() -> None:
    """A backlog whose turns are few distinct values (bulk inserts, each of one now()) beside
    another queue's: the claim's generic plan was estimated past jit_above_cost, and each claim
    was compiled anew, some 230 ms where it runs in 2 (docs/benchmarks.md, scenario 10). The
    session the statements run on has JIT off, as its plans are generic."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("on",)  # the server's default here
    connection.close()
    Todo.objects.claim_next("work", "w1", 30)
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)


@pytest.mark.django_db(transaction=True)
def test_generic_plans_wait_for_a_transaction_to_end_and_can_be_left_off(settings: Any) -> None:
    """The session setting is made outside a transaction (a rollback would undo it); with
    SWITCHBOARD_TODOS_GENERIC_PLANS = False the session is left as it was."""
    connection.close()
    with transaction.atomic():
        round_trip(1)
        assert plan_cache_mode() == "auto"
    assert plan_cache_mode() == "auto"
    round_trip(1)
    assert plan_cache_mode() == "force_generic_plan"
    settings.SWITCHBOARD_TODOS_GENERIC_PLANS = False
    connection.close()
    round_trip(8)
    assert plan_cache_mode() == "auto"


@pytest.mark.django_db(transaction=True)
def test_nothing_is_prepared_when_the_setting_is_off(settings: Any) -> None:
    """SWITCHBOARD_TODOS_PREPARE = False (PgBouncer in transaction mode) prepares nothing."""
    settings.SWITCHBOARD_TODOS_PREPARE = False
    connection.close()
    round_trip(8)
    assert prepared_statements() == {}


@pytest.mark.parametrize("prepare", [True, False])
def test_queries_are_captured_as_djangos(db: None, settings: Any, prepare: bool) -> None:
    """Query logging and CaptureQueriesContext see each statement, with its SQL."""
    settings.SWITCHBOARD_TODOS_PREPARE = prepare
    Todo.objects.create_todo(kind="k")
    with CaptureQueriesContext(connection) as captured:
        Todo.objects.claim_next("default", "w1", 30)
    [query] = captured.captured_queries
    assert "FOR UPDATE SKIP LOCKED" in query["sql"] and "'w1'" in query["sql"]


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive"])
@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "unprepared"])
def test_timestamps_are_read_as_django_reads_them(
    db: None, settings: Any, prepare: bool, use_tz: bool
) -> None:
    """The returned timestamps equal the ORM's, down to the tzinfo object (or its absence)."""
    settings.SWITCHBOARD_TODOS_PREPARE = prepare
    settings.USE_TZ = use_tz
    Todo.objects.create_todo(kind="k")
    claimed = Todo.objects.claim_next("default", "w1", 30)
    assert claimed is not None
    fresh = Todo.objects.get(pk=claimed.pk)
    for name in TIMESTAMPS:
        mine, orms = getattr(claimed, name), getattr(fresh, name)
        assert (mine, type(mine)) == (orms, type(orms)), name
        assert mine.tzinfo is orms.tzinfo, name
    assert (claimed.created_at.tzinfo is None) is not use_tz


def test_a_connection_keeps_one_cursor_for_the_statements(db: None, settings: Any) -> None:
    """The statements of a connection run on one cursor, handed out again after each close,
    its results dropped; one asked for while it is in use is another, each reading its own
    results; a change of USE_TZ makes another, reading timestamps as Django then does."""
    with cursors.cursor(connection) as first:
        first.execute("SELECT 1")
        with cursors.cursor(connection) as nested:
            nested.execute("SELECT 2")
            assert nested.fetchall() == [(2,)]
        assert first.fetchall() == [(1,)]
    assert nested.cursor is not first.cursor
    with cursors.cursor(connection) as again:
        assert again.cursor is first.cursor and again.cursor.pgresult is None
    Todo.objects.create_todo(kind="k")
    settings.USE_TZ = False
    with cursors.cursor(connection) as naive:
        naive.execute("SELECT now()")
        [(now,)] = naive.fetchall()
    assert naive.cursor is not first.cursor and now.tzinfo is None
    assert Todo.objects.claim_next("default", "w1", 30).created_at.tzinfo is None  # type: ignore[union-attr]


def test_each_statement_has_a_kept_cursor_of_its_own(db: None) -> None:
    """A cursor per statement name, each handed out again for its name: psycopg keeps a
    cursor's loaders only while it runs the same query again."""
    with cursors.cursor(connection, statement="claim_one") as claim:
        claim.execute("SELECT 1")
    with cursors.cursor(connection, statement="complete_leaf") as complete:
        complete.execute("SELECT 2")
    with cursors.cursor(connection, statement="claim_one") as again:
        assert again.cursor is claim.cursor
    with cursors.cursor(connection) as unnamed:
        assert unnamed.cursor not in (claim.cursor, complete.cursor)
    assert claim.cursor is not complete.cursor


def test_claims_and_completes_in_turn_look_up_no_loader_again(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a claim and a complete have run on a connection, the next ones take their columns'
    loaders from their cursors: one cursor taking turns between them looked up the loader of
    each column type at every statement (25 us of client CPU each)."""
    for _ in range(4):
        Todo.objects.create_todo(kind="k")
    marks.forget()  # the next claim scans from the heads (the full claim), the others are lean
    monkeypatch.setattr("switchboard_todos.claims.marks.FULL_SCAN_EVERY", 3600.0)
    for _ in range(2):
        todo = Todo.objects.claim_next("default", "w1", 30)
        assert todo is not None
        Todo.objects.complete(todo.id, "w1")
    looked_up: list[int] = []
    get_loader = psycopg.adapt.AdaptersMap.get_loader

    def counted(self: psycopg.adapt.AdaptersMap, oid: int, format: Any) -> Any:
        looked_up.append(oid)
        return get_loader(self, oid, format)

    monkeypatch.setattr(psycopg.adapt.AdaptersMap, "get_loader", counted)
    for _ in range(2):
        todo = Todo.objects.claim_next("default", "w1", 30)
        assert todo is not None
        Todo.objects.complete(todo.id, "w1")
    assert looked_up == []


def test_a_connection_threads_share_keeps_no_cursor(db: None) -> None:
    """While threads share the connection, each statement gets a cursor of its own: a kept one
    could be taken by two threads at once."""
    with cursors.cursor(connection) as kept:
        kept.execute("SELECT 1")
    connection.inc_thread_sharing()
    try:
        with cursors.cursor(connection) as first, cursors.cursor(connection) as second:
            first.execute("SELECT 1")
        shared = [first.cursor, second.cursor]
    finally:
        connection.dec_thread_sharing()
    assert kept.cursor not in shared and shared[0] is not shared[1]
    with cursors.cursor(connection) as again:
        assert again.cursor is kept.cursor


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_gets_a_new_cursor() -> None:
    """The kept cursor goes with its psycopg connection: once Django connects again, the
    statements run on a cursor of the new one."""
    Todo.objects.create_todo(kind="k")
    with cursors.cursor(connection) as before:
        before.execute("SELECT pg_backend_pid()")
        [(old_pid,)] = before.fetchall()
    connection.close()
    with cursors.cursor(connection) as after:
        after.execute("SELECT pg_backend_pid()")
        [(new_pid,)] = after.fetchall()
    assert after.cursor is not before.cursor and new_pid != old_pid
    assert after.cursor.connection is connection.connection
    assert Todo.objects.claim_next("default", "w1", 30) is not None


@pytest.fixture
def another_service() -> Iterator[psycopg.Connection[Any]]:
    """A connection of another service sharing the table; the columns it adds are dropped after."""
    with psycopg.connect(database_url(), autocommit=True) as other:
        yield other
        other.execute("ALTER TABLE todos DROP COLUMN IF EXISTS first_extra")
        other.execute("ALTER TABLE todos DROP COLUMN IF EXISTS second_extra")


@pytest.mark.django_db(transaction=True)
def test_a_column_added_by_another_service_is_survived(
    another_service: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement prepared before a column was added runs again instead of failing for good.

    Inside a transaction the error has already aborted it: that one caller gets it, and the
    next transaction works.
    """
    monkeypatch.setattr(cursors, "_generation", 0)
    round_trip(2)
    Todo.objects.create_todo(kind="k")
    another_service.execute("ALTER TABLE todos ADD COLUMN first_extra text")
    with pytest.raises(NotSupportedError), transaction.atomic():
        Todo.objects.claim_next("default", "w1", 30)
    claimed = Todo.objects.claim_next("default", "w1", 30)
    assert claimed is not None and claimed == Todo.objects.get(pk=claimed.pk)

    round_trip(1)
    another_service.execute("ALTER TABLE todos ADD COLUMN second_extra text")
    round_trip(2)  # outside a transaction: prepared again and run again, no error
    assert cursors._generation == 2


@pytest.mark.django_db(transaction=True)
def test_a_column_added_is_survived_by_a_claim_sent_behind_its_turn(
    another_service: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a limited queue's claim, sent behind claim_turn in one pipeline
    (cursors.one_round_trip): its error comes at the pipeline's end, where both run again."""
    monkeypatch.setattr(cursors, "_generation", 0)
    Queue.objects.create(name="limited", concurrency_limit=5)
    for _ in range(2):
        Todo.objects.create_todo(queue="limited", kind="k")
    assert Todo.objects.claim_next("limited", "w1", 30) is not None  # the turn and claim prepared
    another_service.execute("ALTER TABLE todos ADD COLUMN first_extra text")
    claimed = Todo.objects.claim_next("limited", "w1", 30)
    assert claimed is not None and claimed.slot is not None
    assert cursors._generation == 1


def test_other_unsupported_features_are_errors(db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a stale prepared statement is prepared again; other such errors are raised."""
    monkeypatch.setattr(cursors, "_generation", 0)
    with pytest.raises(NotSupportedError), cursors.cursor(connection) as cursor:
        cursor.execute("SELECT count(*) FROM todos FOR UPDATE")
    assert cursors._generation == 0


def test_a_long_statement_is_converted_once(make_todo: Any) -> None:
    """The claim (over psycopg's 4,096-byte cache of converted statements) is converted from
    its named placeholders once, not at every call (the first claim, a full scan, and the
    second, lean, convert theirs)."""
    assert all(len(queries[name]) > 4096 for name in CLAIM_STATEMENTS)
    make_todo()
    for _ in range(2):
        Todo.objects.claim_next("default", "w1", 30)
    converted = cursors._converted.cache_info()
    for _ in range(3):
        Todo.objects.claim_next("default", "w1", 30)
    again = cursors._converted.cache_info()
    assert (again.misses, again.hits) == (converted.misses, converted.hits + 3)


def test_array_literals_reach_postgresql_as_the_values(db: None) -> None:
    """The claim sends its arrays as text (cursors.array_literal): every value arrives as
    itself, whatever characters a queue name holds, as do integers and time zones."""
    from datetime import UTC, datetime, timedelta, timezone

    names = ["plain", 'quote " and \\ backslash', "comma, {brace}", "NULL", "", "ünï ✓", " pad "]
    numbers = [-101, 0, 7, 100]
    instants = [
        datetime.min.replace(tzinfo=UTC),
        datetime(2026, 12, 5, 6, 0, 0, 123456, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
    ]
    with cursors.cursor(connection) as cursor:
        cursor.execute(
            "SELECT %(names)s::text[], %(numbers)s::int[], %(instants)s::timestamptz[]",
            {
                "names": cursors.array_literal(names),
                "numbers": cursors.array_literal(numbers),
                "instants": cursors.array_literal(instants),
            },
        )
        assert cursor.fetchone() == (names, numbers, instants)
