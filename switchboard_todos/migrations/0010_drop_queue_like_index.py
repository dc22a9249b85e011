"""Drop the text_pattern_ops copy Django makes of the queue settings' text primary key, as 0002
did for todos and events: a queue's row is looked up by equality, by every claim that reads it.
(It cannot go in 0009: Django creates it when that migration ends.)
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("switchboard_todos", "0009_queues_and_limits")]

    operations = [
        migrations.RunSQL(
            sql='DROP INDEX IF EXISTS "todo_queues_name_609d1a5d_like"',
            reverse_sql=(
                'CREATE INDEX "todo_queues_name_609d1a5d_like" ON "todo_queues" '
                '("name" text_pattern_ops)'
            ),
        ),
    ]
