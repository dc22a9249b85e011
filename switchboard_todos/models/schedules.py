"""The `todo_schedules` table: the durable records of periodic todos."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from switchboard_todos.models.defaults import db_now
from switchboard_todos.models.todos import Todo
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS


class Schedule(models.Model):
    """A periodic todo's durable record (schedules.py): declared in code, ticked by the scheduler.

    Every column but `paused` is written from the declaration; `next_run_at` is the tick the
    schedule awaits, advanced by a compare-and-set in the statement that enqueues its todo.
    """

    name = models.TextField(primary_key=True)
    cron = models.TextField()
    timezone = models.TextField()
    queue = models.TextField()
    kind = models.TextField()
    title = models.TextField()
    payload = models.JSONField(default=dict)
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.IntegerField(default=DEFAULT_MAX_ATTEMPTS)
    concurrency_key = models.TextField(null=True, blank=True)
    missed = models.TextField(
        choices=[("latest", _("enqueue the latest")), ("skip", _("skip"))],
        default="latest",
        help_text=_("What a tick missed during downtime or a pause gets."),
    )
    paused = models.BooleanField(
        db_default=False,
        help_text=_("A paused schedule enqueues nothing; resuming it skips ahead."),
    )
    next_run_at = models.DateTimeField(help_text=_("The tick it awaits."))
    last_tick_at = models.DateTimeField(null=True, blank=True)
    # No constraint: purging the todo must not fail, nor have to touch this table.
    last_todo = models.ForeignKey(
        Todo,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    created_at = models.DateTimeField(db_default=db_now(), editable=False)
    updated_at = models.DateTimeField(db_default=db_now(), editable=False)

    class Meta:
        db_table = "todo_schedules"
        ordering = ["name"]
        permissions = [("pause_schedule", "Can pause and resume schedules")]

    def __str__(self) -> str:
        return self.name
