"""The worker's statements, each on the database of its todos, through that database's faults."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connections

from switchboard_todos import faults
from switchboard_todos.managers import TodoManager
from switchboard_todos.models import Todo

T = TypeVar("T")

#: Tries of a statement that failed for a fault of the database (a broken connection, say).
DB_TRIES = 3


class Databases:
    """The managers of the databases a worker serves, and one view of each one's faults."""

    def __init__(self, databases: list[str], owner: str) -> None:
        self.aliases = databases
        self.managers: dict[str, TodoManager] = {
            alias: Todo.objects.db_manager(alias) for alias in databases
        }
        self._outages = {
            alias: faults.Outage(
                f"worker {owner}" + (f" (database {alias})" if len(databases) > 1 else "")
            )
            for alias in databases
        }

    def run(
        self, what: str, call: Callable[..., T], *args: Any, database: str, tries: int = DB_TRIES
    ) -> T:
        """Run `call` on `database`; on a fault of it, reconnect and try again, `tries` in all.

        Raises DatabaseUnavailable when the last try fails. Other errors are the statement's
        own and pass through. A retry may repeat a statement that did commit: every one used
        here is guarded by state and owner, so the repeat changes nothing.
        """
        attempt = 0
        while True:
            try:
                result = call(*args)
            except DatabaseError as error:
                if not faults.is_outage(error):
                    raise
                connections[database].close()
                delay = self._outages[database].failed(what, error)
                attempt += 1
                if attempt >= tries:
                    raise faults.DatabaseUnavailable(what, delay) from error
                time.sleep(min(delay, 0.1 * 2**attempt))
            else:
                self._outages[database].passed()
                return result
