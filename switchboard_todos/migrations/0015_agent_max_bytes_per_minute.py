"""An agent's quota of bytes of JSON a minute (agents/service/quotas.py): its own value and the
window that counts it. Nullable columns and a constant default: PostgreSQL 11+ adds them
without rewriting the table, and agents go on authenticating meanwhile."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0014_queue_slot_cursor"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="max_bytes_per_minute",
            field=models.PositiveIntegerField(
                blank=True,
                help_text=(
                    "Most bytes of JSON (payloads, results, errors, progress notes) it may write "
                    "per minute; empty: SWITCHBOARD_TODOS_AGENT_MAX_BYTES_PER_MINUTE."
                ),
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="bytes_window",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="agent",
            name="bytes_in_window",
            field=models.BigIntegerField(db_default=0, default=0, editable=False),
        ),
    ]
