"""Migrations match the models and run both ways on a live database."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from switchboard_todos.models import Todo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.django_db(databases=["default", "eu"])  # it reads each database's history
def test_models_and_migrations_agree() -> None:
    """makemigrations --check finds nothing to do."""
    call_command("makemigrations", "switchboard_todos", "--check", "--dry-run", stdout=StringIO())


def test_migrate_to_zero_and_back() -> None:
    """Unapplying every migration drops the tables; reapplying restores a working queue."""
    call_command("migrate", "switchboard_todos", "zero", verbosity=0)
    assert "todos" not in connection.introspection.table_names()
    call_command("migrate", "switchboard_todos", verbosity=0)
    assert {"todos", "events"} <= set(connection.introspection.table_names())
    todo, _ = Todo.objects.create_todo(kind="k")
    assert Todo.objects.claim_next("default", "w1", 30) == todo


def test_fair_shares_give_the_backlog_its_creation_order() -> None:
    """Migration 0016 on a table with todos: the pending ones take their creation time as their
    turn, so the backlog is claimed in the order it was before; the claim's index is in turn
    order, and the index of each key's last todo is there."""
    call_command("migrate", "switchboard_todos", "0015", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO todos (kind, created_at, state, completed_at)"
                " SELECT 'k', now() - n * interval '1 minute',"
                "        CASE WHEN n % 2 = 0 THEN 'done' ELSE 'pending' END,"
                "        CASE WHEN n % 2 = 0 THEN now() END"
                "   FROM generate_series(1, 6) AS n"
            )
        call_command("migrate", "switchboard_todos", "0016", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT state, fair_at = created_at, fair_key IS NULL FROM todos ORDER BY 1"
            )
            assert cursor.fetchall() == [("done", False, True)] * 3 + [("pending", True, True)] * 3
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes"
                " WHERE indexname IN ('idx_todos_pending', 'idx_todos_lane') ORDER BY 1"
            )
            (lane, lane_def), (pending, pending_def) = cursor.fetchall()
        assert "(queue, priority, fair_key, fair_at)" in lane_def
        assert "(queue, priority DESC, fair_at) INCLUDE (created_at)" in pending_def
    finally:
        call_command("migrate", "switchboard_todos", verbosity=0)
    oldest = Todo.objects.filter(state="pending").order_by("created_at").first()
    assert Todo.objects.claim_next("default", "w1", 30) == oldest
