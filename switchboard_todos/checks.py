"""System checks: PostgreSQL only, and SWITCHBOARD_TODOS_* settings of the right type and range."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, router

from switchboard_todos.conf import DEFAULTS

#: gen_random_uuid() became core in PostgreSQL 13.
MIN_POSTGRES_VERSION = 130000


def register() -> None:
    checks.register(check_database_vendor, checks.Tags.compatibility)
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_database_version, checks.Tags.database)


def _todo_databases(aliases: Sequence[str] | None = None) -> list[str]:
    """The database aliases the todos tables live in."""
    from switchboard_todos.models import Todo

    return [
        alias
        for alias in (aliases if aliases is not None else list(connections))
        if router.allow_migrate_model(alias, Todo)
    ]


def check_database_vendor(**kwargs: Any) -> list[checks.CheckMessage]:
    """The queue's SQL is PostgreSQL's; any other backend would fail at the first claim."""
    return [
        checks.Error(
            f"switchboard_todos needs PostgreSQL, but database {alias!r} uses "
            f"{connections[alias].vendor}.",
            hint="Set its ENGINE to 'django.db.backends.postgresql', or route the "
            "switchboard_todos app to a PostgreSQL database with a database router.",
            id="switchboard_todos.E001",
        )
        for alias in _todo_databases()
        if connections[alias].vendor != "postgresql"
    ]


def _number(name: str, *, low: float, high: float | None, error_id: str) -> list[checks.Error]:
    value = getattr(settings, f"SWITCHBOARD_TODOS_{name}", DEFAULTS[name])
    in_range = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and low <= value
        and (high is None or value <= high)
    )
    if in_range:
        return []
    bound = f"between {low} and {high}" if high is not None else f"{low} or more"
    return [
        checks.Error(
            f"SWITCHBOARD_TODOS_{name} must be a number {bound}, not {value!r}.",
            hint=f"Remove it to use the default, {DEFAULTS[name]!r}.",
            id=error_id,
        )
    ]


def check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    """Each SWITCHBOARD_TODOS_* setting has a usable type and range."""
    errors: list[checks.CheckMessage] = [
        *_number("BACKOFF_BASE", low=0, high=None, error_id="switchboard_todos.E002"),
        *_number("BACKOFF_MAX", low=0, high=None, error_id="switchboard_todos.E003"),
        *_number("BACKOFF_JITTER", low=0, high=1, error_id="switchboard_todos.E004"),
        *_number("MAX_JSON_BYTES", low=2, high=None, error_id="switchboard_todos.E005"),
    ]
    base = getattr(settings, "SWITCHBOARD_TODOS_BACKOFF_BASE", DEFAULTS["BACKOFF_BASE"])
    cap = getattr(settings, "SWITCHBOARD_TODOS_BACKOFF_MAX", DEFAULTS["BACKOFF_MAX"])
    if not errors and cap < base:
        errors.append(
            checks.Error(
                f"SWITCHBOARD_TODOS_BACKOFF_MAX ({cap}) is below SWITCHBOARD_TODOS_BACKOFF_BASE "
                f"({base}), so every retry would wait the maximum.",
                hint="Raise SWITCHBOARD_TODOS_BACKOFF_MAX or lower the base.",
                id="switchboard_todos.E006",
            )
        )
    errors += _boolean("LISTEN", error_id="switchboard_todos.E008")
    errors += _boolean("PREPARE", error_id="switchboard_todos.E009")
    errors += _number("HORIZON_WARNING_AGE", low=0, high=None, error_id="switchboard_todos.E010")
    errors += _number("DEAD_TUPLES_WARNING", low=0, high=None, error_id="switchboard_todos.E011")
    return errors


def _boolean(name: str, *, error_id: str) -> list[checks.Error]:
    value = getattr(settings, f"SWITCHBOARD_TODOS_{name}", DEFAULTS[name])
    if isinstance(value, bool):
        return []
    return [
        checks.Error(
            f"SWITCHBOARD_TODOS_{name} must be True or False, not {value!r}.",
            hint="Set it to False behind a transaction-pooling PgBouncer, else remove it.",
            id=error_id,
        )
    ]


def check_database_version(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run with `check --database` and by `migrate`: the server must be PostgreSQL 13 or newer."""
    errors: list[checks.CheckMessage] = []
    for alias in _todo_databases(databases or []):
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        version = connection.pg_version  # type: ignore[attr-defined]
        if version < MIN_POSTGRES_VERSION:
            errors.append(
                checks.Error(
                    f"switchboard_todos needs PostgreSQL 13 or newer; database {alias!r} "
                    f"runs {version // 10000}.",
                    hint="Upgrade the server: the todos table's id default uses gen_random_uuid().",
                    id="switchboard_todos.E007",
                )
            )
    return errors
