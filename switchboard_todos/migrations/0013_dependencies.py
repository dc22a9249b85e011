"""Dependencies between todos: the parents a todo waits for, how many are not done yet, its
policy when one fails, and its children.

Written for a live table, which is written all the time: nullable columns and one with a
constant default, which PostgreSQL 11+ adds without rewriting the table; the check is added
NOT VALID (no scan under the table's exclusive lock), then validated under a lock that lets
writes through. No index: a blocked todo waits in idx_todos_scheduled at 'infinity', and the
statement completing a parent finds its children in the parent's own row.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

PARENT_FAILURE_CHECK = models.CheckConstraint(
    condition=models.Q(("on_parent_failure__in", ["cancel", "run_anyway"]))
    | models.Q(("on_parent_failure__isnull", True)),
    name="todos_on_parent_failure_check",
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("switchboard_todos", "0012_cancel_permission"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="parents",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.TextField(), blank=True, editable=False, null=True, size=None
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="waiting_for",
            field=models.IntegerField(db_default=0, editable=False),
        ),
        migrations.AddField(
            model_name="todo",
            name="on_parent_failure",
            field=models.TextField(
                blank=True,
                choices=[("cancel", "cancel it"), ("run_anyway", "run it anyway")],
                editable=False,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="todo",
            name="children",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.TextField(), blank=True, editable=False, null=True, size=None
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(model_name="todo", constraint=PARENT_FAILURE_CHECK)
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE todos ADD CONSTRAINT todos_on_parent_failure_check CHECK "
                    "(on_parent_failure IN ('cancel', 'run_anyway') OR on_parent_failure IS NULL) "
                    "NOT VALID",
                    reverse_sql="ALTER TABLE todos DROP CONSTRAINT todos_on_parent_failure_check",
                ),
                migrations.RunSQL(
                    "ALTER TABLE todos VALIDATE CONSTRAINT todos_on_parent_failure_check",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
        ),
    ]
