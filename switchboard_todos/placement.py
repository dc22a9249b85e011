"""Where each queue's todos live: Django's database routing, asked with the queue as a hint.

A queue lives in one database, and a todo never leaves it: its transitions, its lease and its
retries run there. `QueueRouter` places queues by SWITCHBOARD_TODOS_QUEUE_DATABASES (see
docs/scaling.md); any router of the project may do the same from the `queue` hint that every
placement asks `db_for_write` with. Without a router, everything lives in `default`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.models import Model

APP_LABEL = "switchboard_todos"


def database_for(queue: str) -> str:
    """The database alias the todos of `queue` live in."""
    from switchboard_todos.models import Todo

    return router.db_for_write(Todo, queue=queue)


def by_database(queues: Iterable[str]) -> dict[str, list[str]]:
    """`queues` grouped by the database each lives in, in the order first seen."""
    grouped: dict[str, list[str]] = {}
    for queue in queues:
        grouped.setdefault(database_for(queue), []).append(queue)
    return grouped


def todo_databases(aliases: Iterable[str] | None = None) -> list[str]:
    """The aliases among `aliases` (all, by default) that hold the todos table."""
    from switchboard_todos.models import Todo

    return [
        alias
        for alias in (aliases if aliases is not None else list(connections))
        if router.allow_migrate_model(alias, Todo)
    ]


def queue_databases() -> Mapping[str, str]:
    """SWITCHBOARD_TODOS_QUEUE_DATABASES: queue name or fnmatch pattern -> database alias."""
    configured: Mapping[str, str] = getattr(settings, "SWITCHBOARD_TODOS_QUEUE_DATABASES", {})
    return configured


def _queue_of(instance: Model | None) -> object:
    """The queue a model instance belongs to: a todo's queue, a queue's settings row's name."""
    if instance is not None and instance._meta.model_name == "queue":
        return getattr(instance, "name", None)
    return getattr(instance, "queue", None)


class QueueRouter:
    """Place each queue's todos by SWITCHBOARD_TODOS_QUEUE_DATABASES; the rest in `default`.

    Patterns are tried in the setting's order; the first match wins. The app's tables (todos,
    events, schedules, agents) are migrated in `default` and in every database the setting
    names, and nowhere else. Other apps' models are left to the project's other routers.
    """

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        if model._meta.app_label != APP_LABEL:
            return None
        instance = hints.get("instance")
        if instance is not None and instance._state.db is not None:
            return str(instance._state.db)
        queue = hints.get("queue", _queue_of(instance))
        if not isinstance(queue, str):
            return None
        for pattern, alias in queue_databases().items():
            if fnmatchcase(queue, pattern):
                return alias
        return None

    db_for_read = db_for_write

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if app_label != APP_LABEL:
            return None
        return db == DEFAULT_DB_ALIAS or db in queue_databases().values()
