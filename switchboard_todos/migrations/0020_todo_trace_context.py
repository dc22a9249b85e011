"""Each todo's creating code's trace context (tracing.py): a nullable text column, added
without a rewrite and NULL for the todos already there (they were created untraced)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("switchboard_todos", "0019_tasks"),
    ]

    operations = [
        migrations.AddField(
            model_name="todo",
            name="trace_context",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
    ]
