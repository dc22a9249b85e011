"""The remote agents (agents/service.py): a name, the queues granted, a token stored as a hash.

A new table: nothing else reads it, so it is created in one transaction on a live database.
"""

import django.contrib.postgres.fields
import django.core.validators
import switchboard_todos.models
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0004_admin_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Agent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "name",
                    models.TextField(
                        validators=[
                            django.core.validators.RegexValidator(
                                "\\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}\\Z",
                                "Use up to 100 letters, digits and _ . : -, starting with a letter or digit.",
                            )
                        ]
                    ),
                ),
                (
                    "claim_queues",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.TextField(),
                        blank=True,
                        default=list,
                        help_text="Queues it may claim from, separated by commas.",
                        size=None,
                        validators=[switchboard_todos.models.validate_queue_names],
                    ),
                ),
                (
                    "create_queues",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.TextField(),
                        blank=True,
                        default=list,
                        help_text="Queues it may create todos in, separated by commas.",
                        size=None,
                        validators=[switchboard_todos.models.validate_queue_names],
                    ),
                ),
                (
                    "is_active",
                    models.BooleanField(default=True, help_text="Unset to revoke its token."),
                ),
                ("token_prefix", models.TextField(editable=False)),
                ("token_hash", models.TextField(editable=False)),
                ("token_generation", models.IntegerField(default=1, editable=False)),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=models.Func(function="now", output_field=models.DateTimeField()),
                        editable=False,
                    ),
                ),
                ("last_seen_at", models.DateTimeField(blank=True, editable=False, null=True)),
            ],
            options={
                "db_table": "todo_agents",
                "ordering": ["name"],
                "constraints": [
                    models.UniqueConstraint(fields=("name",), name="todo_agents_name_key"),
                    models.UniqueConstraint(fields=("token_hash",), name="todo_agents_token_key"),
                ],
            },
        ),
    ]
