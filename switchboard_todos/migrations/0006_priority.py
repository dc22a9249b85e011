"""Priority: a column, its range check, the claim index ordered by it, and the permission to
set it from the admin.

Written for a live table, which is written all the time:
* the column has a constant default, which PostgreSQL 11+ adds without rewriting the table;
* the check is added NOT VALID (no scan under the table's exclusive lock), then validated
  under a lock that lets writes through;
* the new claim index is built concurrently beside the old one, the old one dropped
  concurrently, and the new one renamed to the seed's name, `idx_todos_pending`; claims keep
  using the old index until the new one is ready.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

PENDING = models.Q(("next_retry_at__isnull", True), ("state", "pending"))
PRIORITY_CHECK = models.CheckConstraint(
    condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
    name="todos_priority_check",
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0005_agent"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="todo",
            options={
                "ordering": ["-created_at"],
                "permissions": [
                    ("requeue_todo", "Can requeue dead-lettered todos"),
                    ("expire_lease_todo", "Can expire the lease of claimed todos"),
                    ("dead_letter_todo", "Can dead-letter pending todos"),
                    ("set_priority_todo", "Can set the priority of pending todos"),
                ],
            },
        ),
        migrations.AddField(
            model_name="todo",
            name="priority",
            field=models.SmallIntegerField(db_default=0),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(model_name="todo", constraint=PRIORITY_CHECK)
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE todos ADD CONSTRAINT todos_priority_check "
                    "CHECK (priority >= -100 AND priority <= 100) NOT VALID",
                    reverse_sql="ALTER TABLE todos DROP CONSTRAINT todos_priority_check",
                ),
                migrations.RunSQL(
                    "ALTER TABLE todos VALIDATE CONSTRAINT todos_priority_check",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                models.F("queue"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("created_at"),
                condition=PENDING,
                name="idx_todos_pending_priority",
            ),
        ),
        RemoveIndexConcurrently(model_name="todo", name="idx_todos_pending"),
        migrations.RenameIndex(
            model_name="todo",
            new_name="idx_todos_pending",
            old_name="idx_todos_pending_priority",
        ),
    ]
