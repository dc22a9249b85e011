"""The `todo_queues` table: each queue's settings, steered by an operator."""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from switchboard_todos.models.defaults import db_now
from switchboard_todos.models.validators import validate_queue_name


class Queue(models.Model):
    """A queue's settings, for an operator to steer it: no row means the defaults.

    Claims read the row of each queue they scan in their one statement: a paused queue is
    passed over, and a queue with a rate or concurrency limit is claimed from one claim at a
    time (its row locked) within what the limits leave (docs/queues.md). Rows are made by the
    operator (admin, `manage.py todo_queue`), and live in the database the queue's todos do.
    """

    name = models.TextField(primary_key=True, validators=[validate_queue_name])
    description = models.TextField(blank=True, default="")
    paused = models.BooleanField(
        default=False, help_text=_("A paused queue's todos are not claimed; held ones finish.")
    )
    resume_at = models.DateTimeField(
        null=True, blank=True, help_text=_("A paused queue resumes by itself at this time.")
    )
    visibility_timeout = models.DurationField(
        null=True,
        blank=True,
        help_text=_(
            "The lease of a claim that gives none (SQS's visibility timeout); empty: "
            "SWITCHBOARD_TODOS_DEFAULT_TTL."
        ),
    )
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Attempts a new todo gets unless it says otherwise.")
    )
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("At most this many claims per rate period.")
    )
    rate_period = models.DurationField(null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("At most this many of its todos claimed at once.")
    )
    retention = models.DurationField(
        null=True,
        blank=True,
        help_text=_("The reaper deletes its done and failed todos older than this."),
    )
    #: The rate limit's current window (its start) and the claims made in it.
    rate_window = models.DateTimeField(null=True, blank=True, editable=False)
    rate_count = models.IntegerField(default=0, editable=False)
    #: Where the next claim starts looking for free slots of the concurrency limit (counted
    #: from 0): past the slots the claim before it took, which its snapshot may not show.
    slot_cursor = models.IntegerField(default=0, db_default=0, editable=False)
    created_at = models.DateTimeField(db_default=db_now(), editable=False)
    updated_at = models.DateTimeField(db_default=db_now(), editable=False)

    class Meta:
        db_table = "todo_queues"
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True, rate_period__isnull=True)
                | Q(rate_limit__gt=0, rate_period__gt=timedelta(0)),
                name="todo_queues_rate_valid",
            ),
            models.CheckConstraint(
                condition=Q(concurrency_limit__isnull=True) | Q(concurrency_limit__gt=0),
                name="todo_queues_concurrency_valid",
            ),
            models.CheckConstraint(
                condition=Q(visibility_timeout__isnull=True)
                | Q(visibility_timeout__gt=timedelta(0)),
                name="todo_queues_visibility_valid",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gt=0),
                name="todo_queues_max_attempts_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name
