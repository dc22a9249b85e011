"""The schema check: live tables that differ from the migrations are errors, found for real.

Each case alters the real test table inside a transaction that is rolled back (PostgreSQL's
DDL is transactional), so the table is back as it was for the next test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, transaction

from switchboard_todos.checks import check_schema


def schema_errors() -> list[tuple[str, str]]:
    return [(error.id or "", error.msg) for error in check_schema(databases=["default"])]


@pytest.fixture
def altered(db: None) -> Iterator[None]:
    """Run the test's DDL in a savepoint that is rolled back afterwards."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def run(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


def test_the_migrated_schema_passes(db: None) -> None:
    assert schema_errors() == []


def test_without_the_database_option_no_query_runs() -> None:
    """Plain `check` does not connect: the schema is compared by `check --database` and migrate."""
    assert check_schema() == []


@pytest.mark.parametrize(
    ("ddl", "error_id", "message"),
    [
        ("DROP INDEX idx_todos_lease", "E021", "has no index idx_todos_lease"),
        (
            "DROP INDEX idx_todos_pending;"
            " CREATE INDEX idx_todos_pending ON todos (queue, created_at) WHERE state = 'pending'",
            "E021",
            "an index idx_todos_pending that differs",
        ),
        (
            "DROP INDEX idx_todos_queue; CREATE INDEX idx_todos_queue ON todos (queue, created_at)",
            "E021",
            "an index idx_todos_queue that differs",
        ),
        (
            "DROP INDEX idx_todos_dedupe;"
            " CREATE INDEX idx_todos_dedupe ON todos (queue, idempotency_key)"
            " WHERE idempotency_key IS NOT NULL AND state <> 'done' AND state <> 'failed'",
            "E021",
            "an index idx_todos_dedupe that differs",  # no longer UNIQUE
        ),
        (
            "ALTER TABLE todos DROP COLUMN errors_dropped",
            "E020",
            "has no column errors_dropped (integer)",
        ),
        ("ALTER TABLE todos ALTER payload TYPE json", "E020", "column payload is json, not jsonb"),
        ("ALTER TABLE todos ALTER owner SET NOT NULL", "E020", "column owner is NOT NULL"),
        ("ALTER TABLE todos ALTER state DROP DEFAULT", "E020", "column state has no default"),
        (
            "ALTER TABLE todos ADD COLUMN tenant text NOT NULL",
            "E020",
            "a column tenant the model does not know",
        ),
        ("ALTER TABLE todos DROP CONSTRAINT todos_event_id_fkey", "E022", "todos_event_id_fkey"),
        ("ALTER TABLE todos DROP CONSTRAINT todos_state_check", "E022", "todos_state_check"),
        ("DROP INDEX idx_events_received", "E021", "'events' has no index idx_events_received"),
    ],
)
def test_a_table_that_differs_is_an_error(
    altered: None, ddl: str, error_id: str, message: str
) -> None:
    run(ddl)
    errors = schema_errors()
    assert [found for found, _ in errors] == [f"switchboard_todos.{error_id}"]
    assert message in errors[0][1]


def test_nothing_is_compared_before_every_migration_is_applied(altered: None) -> None:
    """migrate runs the checks before it migrates: a pending migration must not stop it."""
    run("DROP INDEX idx_todos_lease")
    run(
        "DELETE FROM django_migrations WHERE app = 'switchboard_todos' AND name = "
        "(SELECT max(name) FROM django_migrations WHERE app = 'switchboard_todos')"
    )
    assert schema_errors() == []


#: The switchboard seed's tables, as the Go service creates them: the claim index without the
#: app's narrowing, none of the app's other indexes.
SEED = """
CREATE TABLE events (
    id text PRIMARY KEY DEFAULT 'ev_' || gen_random_uuid()::text,
    source text NOT NULL DEFAULT '', kind text NOT NULL DEFAULT '',
    payload jsonb NOT NULL DEFAULT '{}', delivery_id text NULL,
    received_at timestamptz NOT NULL DEFAULT now());
CREATE UNIQUE INDEX idx_events_delivery ON events (source, delivery_id)
    WHERE delivery_id IS NOT NULL;
CREATE TABLE todos (
    id text PRIMARY KEY DEFAULT 'td_' || gen_random_uuid()::text,
    queue text NOT NULL DEFAULT 'default', source text NOT NULL DEFAULT '',
    kind text NOT NULL DEFAULT '', title text NOT NULL DEFAULT '',
    payload jsonb NOT NULL DEFAULT '{}',
    event_id text NULL CONSTRAINT todos_event_id_fkey REFERENCES events (id) ON DELETE SET NULL,
    idempotency_key text NULL, assignee text NULL,
    state text NOT NULL DEFAULT 'pending' CONSTRAINT todos_state_check
        CHECK (state IN ('pending', 'claimed', 'done', 'failed')),
    owner text NULL, lease_expires_at timestamptz NULL,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 5 CONSTRAINT todos_max_attempts_check
        CHECK (max_attempts > 0),
    next_retry_at timestamptz NULL, result jsonb NULL,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz NULL, completed_at timestamptz NULL);
CREATE INDEX idx_todos_pending ON todos (queue, created_at) WHERE state = 'pending';
CREATE UNIQUE INDEX idx_todos_dedupe ON todos (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state <> 'done' AND state <> 'failed';
"""


@pytest.mark.django_db(transaction=True)
def test_migrate_fake_initial_over_the_seed_tables_fails_the_check() -> None:
    """The reported fault: --fake-initial over the seed's tables left a schema `check` passed."""
    run(
        "DROP TABLE todos, events, todo_agents, todo_schedules, todo_queues, todo_edges,"
        " todo_errors, todo_tasks CASCADE"
    )  # every table of ours
    run("DELETE FROM django_migrations WHERE app = 'switchboard_todos'")
    try:
        run(SEED)
        call_command("migrate", "switchboard_todos", fake_initial=True, verbosity=0)
        with pytest.raises(SystemCheckError) as failed:
            call_command("check", databases=["default"])
        report = str(failed.value)
        assert "has no index idx_todos_scheduled" in report
    finally:
        run(
            "DROP TABLE IF EXISTS todos, events, todo_agents, todo_schedules, todo_queues,"
            " todo_edges, todo_errors, todo_tasks CASCADE"
        )
        run("DELETE FROM django_migrations WHERE app = 'switchboard_todos'")
        call_command("migrate", "switchboard_todos", verbosity=0)
    assert schema_errors() == []
