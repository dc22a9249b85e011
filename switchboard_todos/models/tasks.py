"""The `todo_tasks` table: the MCP tasks agents follow their todos by."""

from __future__ import annotations

from django.db import models
from django.db.models import F

from switchboard_todos.models.defaults import db_now


class TodoTask(models.Model):
    """An MCP task (docs/agents.md, tasks): a todo an agent created as a task-augmented tool
    call, which it follows by the task's id.

    The id is random (`tk_` and 256 bits) and bound to the agent: another agent's id for the
    same todo, or any id of another agent, is not found. A row lives in its todo's database.
    While `keep_until` has not passed, retention leaves its todo alone; a purge of the todo
    deletes its tasks with it (sql/retention.sql). No foreign key, as for TodoEdge.
    """

    id = models.TextField(primary_key=True, editable=False)
    agent = models.TextField()
    todo_id = models.TextField()
    # The tool that made it (create_for, create_many), whose output shape its result takes, and
    # whether that call created the todo (false: its idempotency key found it live).
    tool = models.TextField()
    created = models.BooleanField()
    created_at = models.DateTimeField(db_default=db_now())
    keep_until = models.DateTimeField()

    class Meta:
        db_table = "todo_tasks"
        indexes = [
            # An agent's tasks, newest first, for tasks/list's pages.
            models.Index(
                F("agent"),
                F("created_at").desc(),
                F("id").desc(),
                name="idx_todo_tasks_agent",
            ),
            # A todo's tasks: the purge that deletes them, and the retention that keeps it.
            models.Index(fields=["todo_id"], name="idx_todo_tasks_todo"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.todo_id})"
