"""Periodic todos (schedules.py): one row per declared schedule, the tick it awaits.

A new table that nothing reads yet: created in one transaction on a live database.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0007_concurrency_key"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("cron", models.TextField()),
                ("timezone", models.TextField()),
                ("queue", models.TextField()),
                ("kind", models.TextField()),
                ("title", models.TextField()),
                ("payload", models.JSONField(default=dict)),
                ("priority", models.SmallIntegerField(default=0)),
                ("max_attempts", models.IntegerField(default=5)),
                ("concurrency_key", models.TextField(blank=True, null=True)),
                (
                    "missed",
                    models.TextField(
                        choices=[("latest", "enqueue the latest"), ("skip", "skip")],
                        default="latest",
                        help_text="What a tick missed during downtime or a pause gets.",
                    ),
                ),
                (
                    "paused",
                    models.BooleanField(
                        db_default=False,
                        help_text="A paused schedule enqueues nothing; resuming it skips ahead.",
                    ),
                ),
                ("next_run_at", models.DateTimeField(help_text="The tick it awaits.")),
                ("last_tick_at", models.DateTimeField(blank=True, null=True)),
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
                (
                    "last_todo",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="switchboard_todos.todo",
                    ),
                ),
            ],
            options={
                "db_table": "todo_schedules",
                "ordering": ["name"],
                "permissions": [("pause_schedule", "Can pause and resume schedules")],
            },
        ),
    ]
