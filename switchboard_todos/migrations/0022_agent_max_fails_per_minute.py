"""An agent's quota of fails and releases a minute (agents/service/quotas.py): its own value and
the time until which its fails are paid for. Nullable columns without a default: PostgreSQL adds
them without rewriting the table, and agents go on authenticating meanwhile; an agent starts with
its whole burst (nothing owed)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0021_agent_pacing"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="max_fails_per_minute",
            field=models.PositiveIntegerField(
                blank=True,
                help_text=(
                    "Most todos it may fail or release per minute (each puts a todo back in its "
                    "queue); empty: SWITCHBOARD_TODOS_AGENT_MAX_FAILS_PER_MINUTE."
                ),
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="agent",
            name="fails_paid_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
