"""Where the claims of a queue with a concurrency limit look for free slots next.

A constant default on a small table that claims lock one row at a time: PostgreSQL 11+ adds
the column without rewriting the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0013_dependencies"),
    ]

    operations = [
        migrations.AddField(
            model_name="queue",
            name="slot_cursor",
            field=models.IntegerField(db_default=0, default=0, editable=False),
        ),
    ]
