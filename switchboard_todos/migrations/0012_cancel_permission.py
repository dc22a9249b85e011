"""The permission to cancel pending and claimed todos (`cancel_todo`) replaces the one to
dead-letter pending todos (`dead_letter_todo`): `cancel` took over from `dead_letter`.

Django leaves a stale permission's row in place (grants of `dead_letter_todo` stay, and give
nothing); `cancel_todo` is created after `migrate`, as every permission is.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("switchboard_todos", "0011_claim_limits")]

    operations = [
        migrations.AlterModelOptions(
            name="todo",
            options={
                "ordering": ["-created_at"],
                "permissions": [
                    ("requeue_todo", "Can requeue dead-lettered todos"),
                    ("expire_lease_todo", "Can expire the lease of claimed todos"),
                    ("cancel_todo", "Can cancel pending and claimed todos"),
                    ("set_priority_todo", "Can set the priority of pending todos"),
                ],
            },
        ),
    ]
