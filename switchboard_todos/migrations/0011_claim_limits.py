"""Queue concurrency limits: the slot a claimed todo of a limited queue holds (a nullable column,
no table rewrite) and the unique index that lets one claimed todo hold each slot, built
concurrently so enqueues and claims go on. It holds only claimed todos of limited queues."""

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0010_drop_queue_like_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="slot",
            field=models.SmallIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="todo",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(("slot__isnull", False), ("state", "claimed")),
                        fields=("queue", "slot"),
                        name="idx_todos_slot",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idx_todos_slot "
                    "ON todos (queue, slot) WHERE slot IS NOT NULL AND state = 'claimed'",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS idx_todos_slot",
                ),
            ],
        ),
    ]
