"""`manage.py todo_scheduler`: enqueue the periodic todos that fell due, once or in a loop."""

from __future__ import annotations

from switchboard_todos.management.commands import reap_todos


class Command(reap_todos.Command):
    help = (
        "Enqueue the todos of the schedules declared with @periodic or "
        "SWITCHBOARD_TODOS_SCHEDULES whose tick has come: one pass and exit (for a timer), or "
        "with --loop every --interval until SIGTERM or SIGINT (a service). Each tick yields "
        "exactly one todo however many schedulers run; after downtime only the latest missed "
        "tick is enqueued (none for a schedule declared with missed='skip'). `reap_todos` "
        "does the same in each sweep unless given --no-schedules: run either."
    )
    reaping = False
    default_interval = 1.0
    doing = "Enqueuing periodic todos"
