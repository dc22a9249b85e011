"""The failure history out of the todo's row: one row per entry in todo_errors, so that a fail
writes its own entry, not the whole history again.

The new table starts empty (its index costs nothing to build); `errors_bytes`, a constant
default, is added without a rewrite. The histories are copied into the table, oldest entry
first, each todo's bytes counted, and the `errors` column dropped in the same transaction, under a lock
that holds back writes to todos (never reads) for the copy alone: an entry a process still
running the old code appends meanwhile would otherwise be lost with the column. Dropping a
column rewrites nothing; a constant default on the way back (unapplied) neither. Unapplied,
the histories go back into the column, in order.
"""

import django.db.models.deletion
from django.db import migrations, models

#: The histories copied, oldest entry first, and the column dropped; a table without the
#: column (the switchboard seed's, taken over with --fake-initial) has none to copy.
COPY = """
LOCK TABLE todos IN SHARE ROW EXCLUSIVE MODE;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_attribute
                WHERE attrelid = 'todos'::regclass AND attname = 'errors' AND NOT attisdropped)
    THEN
        INSERT INTO todo_errors (todo_id, attempt, entry, size)
        SELECT todos.id, coalesce((item.entry ->> 'attempt')::int, 0), item.entry,
               octet_length(item.entry::text)
          FROM todos
         CROSS JOIN LATERAL jsonb_array_elements(todos.errors) WITH ORDINALITY AS item (entry, n)
         WHERE todos.errors <> '[]'::jsonb
         ORDER BY todos.id, item.n;
        UPDATE todos
           SET errors_bytes = history.bytes
          FROM (SELECT todo_id, sum(size) AS bytes FROM todo_errors GROUP BY todo_id) AS history
         WHERE todos.id = history.todo_id;
        ALTER TABLE todos DROP COLUMN errors;
    END IF;
END
$$;
"""

COPY_BACK = """
ALTER TABLE todos ADD COLUMN errors jsonb NOT NULL DEFAULT '[]'::jsonb;
UPDATE todos
   SET errors = history.entries
  FROM (SELECT todo_id, jsonb_agg(entry ORDER BY id) AS entries
          FROM todo_errors GROUP BY todo_id) AS history
 WHERE todos.id = history.todo_id;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0017_todo_edges"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="errors_bytes",
            field=models.BigIntegerField(db_default=0, editable=False),
        ),
        migrations.CreateModel(
            name="ErrorEntry",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("attempt", models.IntegerField()),
                ("entry", models.JSONField()),
                ("size", models.IntegerField()),
                (
                    "todo",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="error_entries",
                        to="switchboard_todos.todo",
                    ),
                ),
            ],
            options={
                "db_table": "todo_errors",
                "ordering": ["id"],
                "indexes": [models.Index(fields=["todo", "id"], name="idx_todo_errors_todo")],
            },
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(COPY, COPY_BACK)],
            state_operations=[migrations.RemoveField(model_name="todo", name="errors")],
        ),
    ]
