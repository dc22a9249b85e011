"""Who holds back vacuum, and the dead rows: read, shown on the health page and by todo_stats.

The holder is a real REPEATABLE READ transaction held open on another connection, and its age is
compared with the database's clock, never the test's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client

from switchboard_todos.models import Todo
from switchboard_todos.upkeep import vacuum
from tests.conftest import database_url
from tests.test_metrics import samples, scrape

HEALTH = "/admin/switchboard_todos/todo/health/"


@dataclass(frozen=True)
class Held:
    pid: int
    started: datetime
    """The transaction's start by the database's clock."""
    application: str = "nightly-report"


@pytest.fixture
def held_snapshot(db: None) -> Iterator[Held]:
    """A REPEATABLE READ transaction on another connection, idle after a read of todos."""
    with psycopg.connect(database_url(), application_name=Held.application) as other:
        other.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        started = other.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        other.execute("SELECT pg_sleep(0.2)")
        other.execute("SELECT count(*) FROM todos")
        yield Held(other.info.backend_pid, started)
        other.rollback()


def todo_stats(*args: str) -> str:
    out = StringIO()
    call_command("todo_stats", *args, stdout=out)
    return out.getvalue()


def test_the_holder_of_the_xmin_horizon_is_named(held_snapshot: Held) -> None:
    """Its pid, application and state, and its age by the database clock since it began."""
    health = vacuum.vacuum_health()
    holder = health.holder
    assert holder is not None
    assert (holder.kind, holder.pid, holder.application, holder.state) == (
        "session",
        held_snapshot.pid,
        "nightly-report",
        "idle in transaction",
    )
    assert holder.age == health.at - held_snapshot.started >= timedelta(seconds=0.2)
    assert holder.xids >= 0


def test_the_reading_session_is_not_its_own_holder(db: None) -> None:
    """The test's own transaction holds a snapshot too, but it is not the one to report."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM todos")
    holder = vacuum.vacuum_health().holder
    assert holder is None or holder.pid != connection.connection.info.backend_pid


def test_a_holder_past_the_threshold_is_a_warning(held_snapshot: Held, settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_DEAD_TUPLES_WARNING = 10**12  # whatever earlier tests left
    settings.SWITCHBOARD_TODOS_HORIZON_WARNING_AGE = 3600
    assert vacuum.vacuum_health().warnings == []
    settings.SWITCHBOARD_TODOS_HORIZON_WARNING_AGE = 0.1
    [warning] = vacuum.vacuum_health().warnings
    assert f"pid {held_snapshot.pid}" in warning and "nightly-report" in warning


@pytest.mark.django_db(transaction=True)
def test_dead_rows_are_counted_and_past_the_threshold_a_warning(
    settings: Any,
) -> None:
    """Rows deleted show up as dead once the statistics are flushed (autovacuum held off)."""
    if connection.pg_version < 150000:  # type: ignore[attr-defined]
        pytest.skip("pg_stat_force_next_flush() is PostgreSQL 15+")

    def dead_rows() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        return vacuum.vacuum_health().dead_tuples

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE todos SET (autovacuum_enabled = false)")
    try:
        before = dead_rows()
        settings.SWITCHBOARD_TODOS_DEAD_TUPLES_WARNING = before + 5
        assert not vacuum.vacuum_health().warnings
        Todo.objects.bulk_create([Todo(kind="k") for _ in range(10)])
        Todo.objects.all().delete()
        assert dead_rows() >= before + 10
        [warning] = vacuum.vacuum_health().warnings
        assert "dead rows" in warning
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE todos RESET (autovacuum_enabled)")


def test_todo_stats_shows_the_holder_and_the_dead_rows(held_snapshot: Held, settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_HORIZON_WARNING_AGE = 0.1
    lines = todo_stats().splitlines()
    assert lines[0] == "No todos."
    assert lines[2].startswith(f"xmin horizon: session pid {held_snapshot.pid} (nightly-report, ")
    assert "idle in transaction, open " in lines[2]
    assert lines[3].startswith("todos table: ")
    assert lines[4].startswith(f"WARNING: A session (pid {held_snapshot.pid}, ")
    report = json.loads(todo_stats("--json"))
    horizon = report["vacuum"]["xmin_horizon"]
    at = datetime.fromisoformat(report["at"])
    assert horizon["pid"] == held_snapshot.pid and horizon["state"] == "idle in transaction"
    assert horizon["age"] == pytest.approx((at - held_snapshot.started).total_seconds(), abs=1e-3)
    assert report["vacuum"]["warnings"] and report["vacuum"]["dead_tuples"] >= 0


def test_the_health_page_shows_the_holder_and_warns(
    held_snapshot: Held, admin_client: Client, settings: Any
) -> None:
    settings.SWITCHBOARD_TODOS_HORIZON_WARNING_AGE = 0.1
    page = admin_client.get(HEALTH).content.decode()
    assert f"session pid {held_snapshot.pid} (nightly-report, idle in transaction)" in page
    assert '<li class="warning">A session' in page
    assert "live rows" in page


def test_the_health_page_without_a_holder(admin_client: Client) -> None:
    assert "no other session holds a snapshot" in admin_client.get(HEALTH).content.decode()


def test_the_metrics_give_the_holders_age(
    held_snapshot: Held, client: Client, settings: Any
) -> None:
    """At least the 0.2 s the holder waited in the database after it began, by its clock."""
    found = samples(scrape(client, settings))
    assert found["switchboard_todos_xmin_horizon_age_seconds", (("database", "default"),)] >= 0.2
    assert found["switchboard_todos_xmin_horizon_xids", (("database", "default"),)] >= 0
