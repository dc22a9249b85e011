"""Drop the text_pattern_ops copies Django makes of text primary keys.

They serve only LIKE 'prefix%' queries; ids are looked up by equality, so the copies would
just slow down every insert. (They cannot go in 0001: Django creates them when that
migration ends.)
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("switchboard_todos", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql=[
                'DROP INDEX IF EXISTS "events_id_b3c5d47d_like"',
                'DROP INDEX IF EXISTS "todos_id_f492ed70_like"',
            ],
            reverse_sql=[
                'CREATE INDEX "events_id_b3c5d47d_like" ON "events" ("id" text_pattern_ops)',
                'CREATE INDEX "todos_id_f492ed70_like" ON "todos" ("id" text_pattern_ops)',
            ],
        ),
    ]
