"""Paced quotas (agents/service/quotas.py, count_writes): each quota a minute keeps the time until
which the agent's writes are paid for, rather than a window and a count in it, and an agent may
have its own burst. Renaming and dropping columns and adding a nullable one are catalogue changes
only in PostgreSQL: no table rewrite, agents go on authenticating meanwhile. A window's start,
read as paid-until, lies in the past: every agent starts with its whole burst."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0020_todo_trace_context"),
    ]

    operations = [
        migrations.RenameField(
            model_name="agent", old_name="creates_window", new_name="creates_paid_until"
        ),
        migrations.RenameField(
            model_name="agent", old_name="bytes_window", new_name="bytes_paid_until"
        ),
        migrations.RemoveField(model_name="agent", name="creates_in_window"),
        migrations.RemoveField(model_name="agent", name="bytes_in_window"),
        migrations.AddField(
            model_name="agent",
            name="burst_seconds",
            field=models.PositiveSmallIntegerField(
                blank=True,
                help_text=(
                    "Most seconds' worth of its quotas a minute it may spend at once (1 to 60); "
                    "empty: SWITCHBOARD_TODOS_AGENT_BURST_SECONDS."
                ),
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(60),
                ],
            ),
        ),
    ]
