"""Queue settings (todo_queues), the agents' quotas and credential salt, and the todo columns of
the failure history's cap, progress notes and waiting for a result.

Written for a live table, which is written all the time: the new columns of todos have constant
defaults, which PostgreSQL 11+ adds without rewriting the table; the index of the todos each
agent holds is built concurrently (it covers claimed todos only, the in-flight few). The agents
table is small: its random salt column is filled in one short rewrite.
"""

import datetime
import django.db.models.functions.comparison
import secrets
import switchboard_todos.models
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0008_schedule"),
    ]

    operations = [
        migrations.CreateModel(
            name="Queue",
            fields=[
                (
                    "name",
                    models.TextField(
                        primary_key=True,
                        serialize=False,
                        validators=[switchboard_todos.models.validate_queue_name],
                    ),
                ),
                ("description", models.TextField(blank=True, default="")),
                (
                    "paused",
                    models.BooleanField(
                        default=False,
                        help_text="A paused queue's todos are not claimed; held ones finish.",
                    ),
                ),
                (
                    "resume_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="A paused queue resumes by itself at this time.",
                        null=True,
                    ),
                ),
                (
                    "visibility_timeout",
                    models.DurationField(
                        blank=True,
                        help_text="The lease of a claim that gives none (SQS's visibility timeout); empty: SWITCHBOARD_TODOS_DEFAULT_TTL.",
                        null=True,
                    ),
                ),
                (
                    "max_attempts",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Attempts a new todo gets unless it says otherwise.",
                        null=True,
                    ),
                ),
                (
                    "rate_limit",
                    models.PositiveIntegerField(
                        blank=True, help_text="At most this many claims per rate period.", null=True
                    ),
                ),
                ("rate_period", models.DurationField(blank=True, null=True)),
                (
                    "concurrency_limit",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="At most this many of its todos claimed at once.",
                        null=True,
                    ),
                ),
                (
                    "retention",
                    models.DurationField(
                        blank=True,
                        help_text="The reaper deletes its done and failed todos older than this.",
                        null=True,
                    ),
                ),
                ("rate_window", models.DateTimeField(blank=True, editable=False, null=True)),
                ("rate_count", models.IntegerField(default=0, editable=False)),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=models.Func(function="now", output_field=models.DateTimeField()),
                        editable=False,
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=models.Func(function="now", output_field=models.DateTimeField()),
                        editable=False,
                    ),
                ),
            ],
            options={
                "db_table": "todo_queues",
                "ordering": ["name"],
                "permissions": [("pause_queue", "Can pause and resume queues")],
            },
        ),
        migrations.AddField(
            model_name="agent",
            name="creates_in_window",
            field=models.IntegerField(default=0, editable=False),
        ),
        migrations.AddField(
            model_name="agent",
            name="creates_window",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="agent",
            name="credential_salt",
            field=models.TextField(
                db_default=django.db.models.functions.comparison.Cast(
                    models.Func(function="gen_random_uuid", output_field=models.UUIDField()),
                    models.TextField(),
                ),
                default=secrets.token_hex,
                editable=False,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="max_attempts_limit",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="The highest max_attempts it may give a todo; empty: SWITCHBOARD_TODOS_AGENT_MAX_ATTEMPTS.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="max_creates_per_minute",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Most todos it may create per minute; empty: SWITCHBOARD_TODOS_AGENT_MAX_CREATES_PER_MINUTE.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="max_held",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Most todos it may hold at once; empty: SWITCHBOARD_TODOS_AGENT_MAX_HELD.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="awaited",
            field=models.BooleanField(db_default=False),
        ),
        migrations.AddField(
            model_name="todo",
            name="errors_dropped",
            field=models.IntegerField(db_default=0),
        ),
        migrations.AddField(
            model_name="todo",
            name="progress",
            field=models.JSONField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("state", "claimed")), fields=["owner"], name="idx_todos_held"
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("rate_limit__isnull", True), ("rate_period__isnull", True)),
                    models.Q(("rate_limit__gt", 0), ("rate_period__gt", datetime.timedelta(0))),
                    _connector="OR",
                ),
                name="todo_queues_rate_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("concurrency_limit__isnull", True),
                    ("concurrency_limit__gt", 0),
                    _connector="OR",
                ),
                name="todo_queues_concurrency_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("visibility_timeout__isnull", True),
                    ("visibility_timeout__gt", datetime.timedelta(0)),
                    _connector="OR",
                ),
                name="todo_queues_visibility_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("max_attempts__isnull", True), ("max_attempts__gt", 0), _connector="OR"
                ),
                name="todo_queues_max_attempts_valid",
            ),
        ),
    ]
