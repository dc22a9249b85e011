"""Dependencies in their own table: one row per (parent, child), in place of the parent's
`children` array, which every new child rewrote, and locked the parent to rewrite (issue 35).

Written for a live table. The new table starts empty; the arrays are copied into it and the
column dropped in one transaction that first takes todos in SHARE mode, so that no child is
linked the old way between the copy and the drop (writes wait for that one scan of the todos
with children; reads go on). The index of the children's side is built CONCURRENTLY once
the table is filled. Backwards, the arrays are rebuilt from the edges, children in id order.
"""

from collections.abc import Callable

from django.db import migrations, models, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

COPY_AND_DROP = [
    "LOCK TABLE todos IN SHARE MODE",
    "INSERT INTO todo_edges (parent_id, child_id) "
    "SELECT DISTINCT todos.id, edge.child_id "
    "FROM todos CROSS JOIN LATERAL unnest(todos.children) AS edge (child_id) "
    "WHERE todos.children IS NOT NULL",
    "ALTER TABLE todos DROP COLUMN children",
]

RESTORE = [
    "LOCK TABLE todos IN SHARE MODE",
    "ALTER TABLE todos ADD COLUMN children text[]",
    "UPDATE todos SET children = edge.children "
    "FROM (SELECT parent_id, array_agg(child_id ORDER BY child_id) AS children "
    "FROM todo_edges GROUP BY parent_id) AS edge "
    "WHERE todos.id = edge.parent_id",
]


def _run(statements: list[str]) -> Callable[[StateApps, BaseDatabaseSchemaEditor], None]:
    """`statements`, run in one transaction (RunSQL would commit each in this non-atomic
    migration)."""

    def run(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        connection = schema_editor.connection
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)

    return run


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0016_fair_shares"),
    ]

    operations = [
        migrations.CreateModel(
            name="TodoEdge",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "parent_id",
                        "child_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("parent_id", models.TextField()),
                ("child_id", models.TextField()),
            ],
            options={"db_table": "todo_edges"},
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.RemoveField(model_name="todo", name="children")],
            database_operations=[
                migrations.RunPython(_run(COPY_AND_DROP), _run(RESTORE)),
            ],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="todoedge",
                    index=models.Index(fields=["child_id"], name="idx_todo_edges_child"),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_todo_edges_child "
                    "ON todo_edges (child_id)",
                    reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS idx_todo_edges_child",
                ),
            ],
        ),
    ]
