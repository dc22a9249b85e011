"""The `todo_errors` table: the failure history of each todo, an entry a row."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models

from switchboard_todos.models.todos import Todo, known_history


class ErrorEntry(models.Model):
    """One entry of a todo's failure history (Todo.errors), a row each: a fail inserts its
    entry and deletes the oldest beyond the limits, deciding on `size` alone
    (sql/shared.sql, trimmed), instead of writing the whole history again."""

    # The order of the entries: the entries of one todo are written one at a time, under its
    # row's lock.
    id = models.BigAutoField(primary_key=True)
    # No foreign key constraint: a purge deletes a todo's entries in its own statement, and
    # TRUNCATE todos needs no CASCADE.
    todo = models.ForeignKey(
        Todo,
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,
        related_name="error_entries",
    )
    attempt = models.IntegerField()
    entry = models.JSONField()
    # Bytes of the entry's JSON text, what MAX_ERROR_HISTORY_BYTES counts.
    size = models.IntegerField()

    class Meta:
        db_table = "todo_errors"
        ordering = ["id"]
        indexes = [models.Index(fields=["todo", "id"], name="idx_todo_errors_todo")]

    def __str__(self) -> str:
        return f"{self.todo_id} #{self.attempt}"


def last_errors_of(todos: Iterable[Todo]) -> dict[str, Any]:
    """The error of the last entry of each of `todos`' failure histories, by id, for those that
    have one: one query per database they were read from, none for those whose history is
    known (known_history)."""
    found: dict[str, Any] = {}
    wanted: dict[str | None, set[str]] = {}
    for todo in todos:
        known = known_history(todo)
        if known is None:
            wanted.setdefault(todo._state.db, set()).add(todo.id)
        elif known:
            found[todo.id] = known[-1].get("error")
    for alias, ids in wanted.items():
        last = (
            ErrorEntry.objects.using(alias)
            .filter(todo_id__in=ids)
            .order_by("todo_id", "-id")
            .distinct("todo_id")
            .values_list("todo_id", "entry")
        )
        found.update((todo_id, entry.get("error")) for todo_id, entry in last)
    return found
