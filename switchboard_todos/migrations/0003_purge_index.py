"""The retention index for purge_todos, built CONCURRENTLY.

A plain CREATE INDEX blocks every insert and update of `todos` while it reads the whole table,
which at millions of rows stalls producers and workers for as long; CONCURRENTLY does not
(and so cannot run inside a transaction: atomic = False).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0002_drop_like_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                condition=models.Q(("state__in", ["done", "failed"])),
                fields=["completed_at"],
                name="idx_todos_finished",
            ),
        ),
    ]
