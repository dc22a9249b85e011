"""Fair shares: each todo's fair key (its tenant) and turn (fair_at), the claim's index in turn
order, and the index of each key's last pending todo.

Written for a live table, which is written all the time. The columns are added without
rewriting it: fair_key is nullable, and fair_at's default, now(), is stable, so PostgreSQL 11+
stores its value once for the rows already there. Those rows then share one turn, the time of
the migration; the pending ones get their creation time back, in batches of BATCH rows that
each commit, so that no claim waits for more than one of them. The claim's index is built
again in turn order beside the old one, CONCURRENTLY (writes go on), before the old one is
dropped and the new one takes its name; it carries the creation times (INCLUDE), which the
health page's oldest ready age reads.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.models import Q

BATCH = 10_000

NEW_PENDING = models.Index(
    fields=["queue", "-priority", "fair_at"],
    include=["created_at"],
    condition=Q(state="pending", next_retry_at__isnull=True),
    name="idx_todos_pending",
)


def pending_in_creation_order(apps, schema_editor):
    """Give each pending todo its creation time as its turn, BATCH rows per transaction."""
    with schema_editor.connection.cursor() as cursor:
        while True:
            cursor.execute(
                "UPDATE todos SET fair_at = created_at"
                " WHERE id IN (SELECT id FROM todos"
                "               WHERE state = 'pending' AND fair_at <> created_at"
                "               LIMIT %s FOR UPDATE SKIP LOCKED)",
                [BATCH],
            )
            if cursor.rowcount == 0:
                return


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0015_agent_max_bytes_per_minute"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="fair_key",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="todo",
            name="fair_at",
            field=models.DateTimeField(
                db_default=models.Func(function="now", output_field=models.DateTimeField()),
                editable=False,
            ),
        ),
        migrations.RunPython(pending_in_creation_order, migrations.RunPython.noop, elidable=True),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="todo", name="idx_todos_pending"),
                migrations.AddIndex(model_name="todo", index=NEW_PENDING),
            ],
            database_operations=[
                migrations.RunSQL(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_todos_pending_fair ON todos"
                    " (queue, priority DESC, fair_at) INCLUDE (created_at)"
                    " WHERE state = 'pending' AND next_retry_at IS NULL",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS idx_todos_pending_fair",
                ),
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY IF EXISTS idx_todos_pending",
                    reverse_sql="CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_todos_pending ON"
                    " todos (queue, priority DESC, created_at)"
                    " WHERE state = 'pending' AND next_retry_at IS NULL",
                ),
                migrations.RunSQL(
                    "ALTER INDEX idx_todos_pending_fair RENAME TO idx_todos_pending",
                    reverse_sql="ALTER INDEX idx_todos_pending RENAME TO idx_todos_pending_fair",
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="todo",
            index=models.Index(
                fields=["queue", "priority", "fair_key", "fair_at"],
                condition=Q(state="pending", fair_key__isnull=False),
                name="idx_todos_lane",
            ),
        ),
    ]
