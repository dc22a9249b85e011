"""MCP tasks (issue 37): a new, empty table, which no running code reads before this release."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0018_todo_errors"),
    ]

    operations = [
        migrations.CreateModel(
            name="TodoTask",
            fields=[
                ("id", models.TextField(editable=False, primary_key=True, serialize=False)),
                ("agent", models.TextField()),
                ("todo_id", models.TextField()),
                ("tool", models.TextField()),
                ("created", models.BooleanField()),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=models.Func(function="now", output_field=models.DateTimeField())
                    ),
                ),
                ("keep_until", models.DateTimeField()),
            ],
            options={
                "db_table": "todo_tasks",
                "indexes": [
                    models.Index(
                        models.F("agent"),
                        models.OrderBy(models.F("created_at"), descending=True),
                        models.OrderBy(models.F("id"), descending=True),
                        name="idx_todo_tasks_agent",
                    ),
                    models.Index(fields=["todo_id"], name="idx_todo_tasks_todo"),
                ],
            },
        ),
    ]
