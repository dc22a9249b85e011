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
