"""Concurrency keys: a nullable column (no table rewrite), the unique index that lets one
claimed todo at most hold each key, and the index of each key's ready todos in claim order,
both built concurrently so enqueues and claims go on."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0006_priority"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="concurrency_key",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="todo",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("concurrency_key__isnull", False), ("state", "claimed")
                        ),
                        fields=("concurrency_key",),
                        name="idx_todos_key_claimed",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS idx_todos_key_claimed "
                    "ON todos (concurrency_key) "
                    "WHERE concurrency_key IS NOT NULL AND state = 'claimed'",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS idx_todos_key_claimed",
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                models.F("concurrency_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("created_at"),
                models.F("id"),
                condition=models.Q(
                    ("concurrency_key__isnull", False),
                    ("next_retry_at__isnull", True),
                    ("state", "pending"),
                ),
                name="idx_todos_key_order",
            ),
        ),
    ]
