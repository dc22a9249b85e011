"""System checks: PostgreSQL only, SWITCHBOARD_TODOS_* settings of the right type and range, and
live tables that match the migrations."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader
from django.db.models.fields import NOT_PROVIDED
from psycopg.conninfo import conninfo_to_dict

from switchboard_todos import placement, pooling
from switchboard_todos.conf import DEFAULTS, POOLERS, conf

#: gen_random_uuid() became core in PostgreSQL 13.
MIN_POSTGRES_VERSION = 130000


def register() -> None:
    checks.register(check_database_vendor, checks.Tags.compatibility)
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_database_version, checks.Tags.database)
    checks.register(check_schema, checks.Tags.database)
    checks.register(check_pooler, checks.Tags.database)


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
        for alias in placement.todo_databases()
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


def _whole_number(name: str, *, error_id: str) -> list[checks.Error]:
    """A count or a size: a whole number of 1 or more."""
    value = getattr(settings, f"SWITCHBOARD_TODOS_{name}", DEFAULTS[name])
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return []
    return [
        checks.Error(
            f"SWITCHBOARD_TODOS_{name} must be a whole number of 1 or more, not {value!r}.",
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
                f"({base}), so every retry would back off the maximum.",
                hint="Raise SWITCHBOARD_TODOS_BACKOFF_MAX or lower the base.",
                id="switchboard_todos.E006",
            )
        )
    errors += _boolean("LISTEN", error_id="switchboard_todos.E008")
    errors += _boolean("PREPARE", error_id="switchboard_todos.E009")
    errors += _boolean("GENERIC_PLANS", error_id="switchboard_todos.E025")
    errors += _number("HORIZON_WARNING_AGE", low=0, high=None, error_id="switchboard_todos.E010")
    errors += _number("DEAD_TUPLES_WARNING", low=0, high=None, error_id="switchboard_todos.E011")
    errors += _number("DEFAULT_TTL", low=1, high=43200, error_id="switchboard_todos.E012")
    errors += _number("AGENT_CACHE_SECONDS", low=0, high=3600, error_id="switchboard_todos.E029")
    errors += _number("AGENT_BURST_SECONDS", low=1, high=60, error_id="switchboard_todos.E030")
    for name, error_id in (
        ("MAX_ERRORS_KEPT", "switchboard_todos.E013"),
        ("MAX_ERROR_HISTORY_BYTES", "switchboard_todos.E028"),
        ("MAX_ERROR_BYTES", "switchboard_todos.E014"),
        ("MAX_PROGRESS_BYTES", "switchboard_todos.E015"),
        ("REAP_BATCH", "switchboard_todos.E016"),
        ("AGENT_MAX_WAITS", "switchboard_todos.E017"),
        ("AGENT_MAX_SESSIONS", "switchboard_todos.E018"),
        ("AGENT_MAX_CONCURRENT", "switchboard_todos.E027"),
        ("AGENT_MAX_HELD", "switchboard_todos.E019"),
        ("AGENT_MAX_CREATES_PER_MINUTE", "switchboard_todos.E023"),
        ("AGENT_MAX_ATTEMPTS", "switchboard_todos.E024"),
        ("AGENT_MAX_BYTES_PER_MINUTE", "switchboard_todos.E026"),
        ("AGENT_MAX_FAILS_PER_MINUTE", "switchboard_todos.E054"),
        ("TASK_TTL_MAX", "switchboard_todos.E044"),
    ):
        errors += _whole_number(name, error_id=error_id)
    errors += _database_options()
    errors += _pooler()
    errors += _schedules()
    errors += _queue_databases()
    return errors


def _queue_databases() -> list[checks.Error]:
    configured = getattr(settings, "SWITCHBOARD_TODOS_QUEUE_DATABASES", {})
    hint = 'For example {"eu-*": "eu"}: queue name or pattern -> an alias of DATABASES.'
    if not isinstance(configured, dict) or not all(
        isinstance(pattern, str) and isinstance(alias, str) for pattern, alias in configured.items()
    ):
        return [
            checks.Error(
                "SWITCHBOARD_TODOS_QUEUE_DATABASES must be a dict of str: str.",
                hint=hint,
                id="switchboard_todos.E042",
            )
        ]
    return [
        checks.Error(
            f"SWITCHBOARD_TODOS_QUEUE_DATABASES places {pattern!r} in database {alias!r}, "
            "which DATABASES does not define.",
            hint=hint,
            id="switchboard_todos.E043",
        )
        for pattern, alias in configured.items()
        if alias not in settings.DATABASES
    ]


#: What each check of the pooler's settings points to.
_POOLER_DOCS = 'See docs/operating.md, "Behind a connection pooler".'


def _pooler() -> list[checks.CheckMessage]:
    """SWITCHBOARD_TODOS_POOLER and LISTEN_URL, and the old settings that contradict them."""
    pooler = getattr(settings, "SWITCHBOARD_TODOS_POOLER", None)
    if pooler not in POOLERS:
        return [
            checks.Error(
                f"SWITCHBOARD_TODOS_POOLER must be None, 'transaction' or 'session', not "
                f"{pooler!r}.",
                hint=_POOLER_DOCS,
                id="switchboard_todos.E050",
            )
        ]
    errors = _listen_url()
    if errors or pooler != "transaction":
        return errors
    if getattr(settings, "SWITCHBOARD_TODOS_LISTEN", False) is True:
        errors += [
            checks.Error(
                f"SWITCHBOARD_TODOS_LISTEN is True behind a transaction pooler, and database "
                f"{alias!r} has no SWITCHBOARD_TODOS_LISTEN_URL: its LISTEN would hear nothing.",
                hint="Give it a LISTEN_URL that bypasses the pooler, or remove "
                "SWITCHBOARD_TODOS_LISTEN (it then polls). " + _POOLER_DOCS,
                id="switchboard_todos.E052",
            )
            for alias in placement.todo_databases()
            if conf.listen_url(alias) is None
        ]
    if getattr(settings, "SWITCHBOARD_TODOS_GENERIC_PLANS", False) is True:
        errors.append(
            checks.Warning(
                "SWITCHBOARD_TODOS_GENERIC_PLANS is ignored behind a transaction pooler: "
                "plan_cache_mode is a session setting, which would stay on a server connection "
                "that other clients then use.",
                hint="Remove it, or set it on the server for the role (ALTER ROLE ... SET "
                "plan_cache_mode = force_generic_plan) if every client of that role wants it.",
                id="switchboard_todos.W050",
            )
        )
    if not conf.PREPARE:
        errors += [
            checks.Error(
                f"DATABASES[{alias!r}] has psycopg prepare statements (server_side_binding and "
                "prepare_threshold in OPTIONS) behind a transaction pooler that "
                "SWITCHBOARD_TODOS_PREPARE = False says cannot keep them.",
                hint="Set OPTIONS prepare_threshold to None, or, on a pooler that keeps "
                "prepared statements (PgBouncer 1.21+ with max_prepared_statements), set "
                "SWITCHBOARD_TODOS_PREPARE = True. " + _POOLER_DOCS,
                id="switchboard_todos.E053",
            )
            for alias in placement.todo_databases()
            if _prepares(settings.DATABASES[alias].get("OPTIONS", {}))
        ]
    return errors


def _prepares(options: dict[str, Any]) -> bool:
    """Whether psycopg prepares Django's statements on its own: Django's client-side binding
    cursors never prepare; its server-side binding ones do past prepare_threshold."""
    return (
        options.get("server_side_binding") is True and options.get("prepare_threshold") is not None
    )


def _listen_url() -> list[checks.CheckMessage]:
    value = getattr(settings, "SWITCHBOARD_TODOS_LISTEN_URL", None)
    urls = value if isinstance(value, dict) else {"default": value}
    problem = None
    if value is not None and not isinstance(value, str | dict):
        problem = f"must be a connection string or a dict of them, not {value!r}"
    for alias, url in urls.items() if problem is None else ():
        if alias not in settings.DATABASES:
            problem = f"names database {alias!r}, which DATABASES does not define"
        elif url is not None and not isinstance(url, str):
            problem = f"must give connection strings, not {url!r}"
        elif url:
            try:
                conninfo_to_dict(url)
            except psycopg.ProgrammingError as error:
                problem = f"gives {alias!r} a connection string libpq cannot read: {error}"
    if problem is None:
        return []
    return [
        checks.Error(
            f"SWITCHBOARD_TODOS_LISTEN_URL {problem}.",
            hint='For example "postgres://app@db.internal:5432/app" (the server itself, not '
            'the pooler), or {"default": ..., "eu": ...}.',
            id="switchboard_todos.E051",
        )
    ]


def check_pooler(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run with `check --database` and by `migrate`: a database reached through a pooler
    (pooling.pooled), without the setting. Whether the pooler hands out transactions or
    sessions cannot be seen, hence a warning."""
    if conf.POOLER is not None:
        return []
    warnings: list[checks.CheckMessage] = []
    for alias in placement.todo_databases(databases or []):
        wrapper = connections[alias]
        if wrapper.vendor != "postgresql":
            continue
        wrapper.ensure_connection()
        if pooling.pooled(wrapper.connection):
            warnings.append(
                checks.Warning(
                    f"Database {alias!r} is reached through a connection pooler, and "
                    "SWITCHBOARD_TODOS_POOLER is not set.",
                    hint="Behind a pooler in transaction mode (PgBouncer's default for Django) "
                    'set SWITCHBOARD_TODOS_POOLER = "transaction": else the first statements '
                    'fail with PoolerNotConfigured. In session mode set it to "session". '
                    + _POOLER_DOCS,
                    id="switchboard_todos.W051",
                )
            )
    return warnings


def _schedules() -> list[checks.Error]:
    from switchboard_todos import schedules

    try:
        schedules.declared()
    except ImproperlyConfigured as error:
        return [
            checks.Error(
                f"SWITCHBOARD_TODOS_SCHEDULES: {error}",
                hint='For example {"triage": {"cron": "*/15 * * * *", "kind": "triage"}}.',
                id="switchboard_todos.E041",
            )
        ]
    return []


def _database_options() -> list[checks.Error]:
    value = getattr(settings, "SWITCHBOARD_TODOS_DATABASE_OPTIONS", {})
    if isinstance(value, dict) and all(
        isinstance(name, str) and name.isidentifier() and (option is None or " " not in str(option))
        for name, option in value.items()
    ):
        return []
    return [
        checks.Error(
            "SWITCHBOARD_TODOS_DATABASE_OPTIONS must be a dict of option names to values "
            f"without spaces (or None to drop a default), not {value!r}.",
            hint='For example {"statement_timeout": "10min", "lock_timeout": None}.',
            id="switchboard_todos.E040",
        )
    ]


def _boolean(name: str, *, error_id: str) -> list[checks.Error]:
    value = getattr(settings, f"SWITCHBOARD_TODOS_{name}", DEFAULTS[name])
    if isinstance(value, bool):
        return []
    return [
        checks.Error(
            f"SWITCHBOARD_TODOS_{name} must be True or False, not {value!r}.",
            hint="Remove it to use the default (behind a transaction pooler, set "
            'SWITCHBOARD_TODOS_POOLER = "transaction" instead).',
            id=error_id,
        )
    ]


def check_database_version(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run with `check --database` and by `migrate`: the server must be PostgreSQL 13 or newer."""
    errors: list[checks.CheckMessage] = []
    for alias in placement.todo_databases(databases or []):
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


#: Objects the migrations create with RunSQL, which the models cannot declare: name -> kind
#: (pg_constraint.contype). The seed's foreign key is ON DELETE SET NULL in the database.
_SQL_CONSTRAINTS = {"todos": {"todos_event_id_fkey": "f"}}
_LITERAL = re.compile(r"'((?:[^']|'')*)'")
_WORD = re.compile(r"[a-z_][a-z0-9_]*")
_NOISE = re.compile(r'"|\bpublic\.|\busing btree\b|::[a-z ]+(?:\[\])?|\(|\)')


def check_schema(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run with `check --database` and by `migrate`: the live tables are what the migrations made.

    `migrate --fake-initial` over tables created elsewhere (the Go service's seed, an older
    copy) records the migrations as applied whatever the tables hold: a missing column or
    index, or a partial index with another predicate, then fails or crawls at run time. Until
    every migration of the app is applied there is nothing to compare (migrate will do it).
    """
    from switchboard_todos.models import Event, Todo

    errors: list[checks.CheckMessage] = []
    for alias in placement.todo_databases(databases or []):
        connection = connections[alias]
        if connection.vendor != "postgresql" or not _fully_migrated(connection):
            continue
        for model in (Event, Todo):
            errors += _compare_table(connection, model)
    return errors


def _fully_migrated(connection: BaseDatabaseWrapper) -> bool:
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    leaves = loader.graph.leaf_nodes("switchboard_todos")
    return bool(leaves) and all(leaf in loader.applied_migrations for leaf in leaves)


def _compare_table(
    connection: BaseDatabaseWrapper, model: type[models.Model]
) -> list[checks.CheckMessage]:
    """The differences between `model`'s table in the database and what its migrations make."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef"
            "  FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0"
            "   AND NOT attisdropped",
            [table],
        )
        columns = {name: (kind, not_null, default) for name, kind, not_null, default in cursor}
        cursor.execute(
            "SELECT index.relname, pg_get_indexdef(pg_index.indexrelid)"
            "  FROM pg_index JOIN pg_class AS index ON index.oid = pg_index.indexrelid"
            " WHERE pg_index.indrelid = to_regclass(%s)",
            [table],
        )
        indexes = dict(cursor.fetchall())
        cursor.execute(
            "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = to_regclass(%s)",
            [table],
        )
        constraints = {name: (kind, definition) for name, kind, definition in cursor}
    if not columns:
        return [_schema_error(table, "does not exist", "Run migrate.", "E020")]
    errors = _compare_columns(connection, model, columns)
    with connection.schema_editor(collect_sql=True, atomic=False) as editor:
        expected = {
            index.name: str(index.create_sql(model, editor))
            for index in [
                *model._meta.indexes,
                *(
                    constraint
                    for constraint in model._meta.constraints
                    if isinstance(constraint, models.UniqueConstraint)
                ),
            ]
        }
    for name, statement in expected.items():
        if name not in indexes:
            errors.append(_schema_error(table, f"has no index {name}", statement, "E021"))
        elif _index_shape(indexes[name], columns) != _index_shape(statement, columns):
            errors.append(
                _schema_error(
                    table,
                    f"has an index {name} that differs from the migrations' ({indexes[name]})",
                    f"Drop it and create it as the migrations do: {statement}",
                    "E021",
                )
            )
    wanted = {
        constraint.name: "c"
        for constraint in model._meta.constraints
        if isinstance(constraint, models.CheckConstraint)
    }
    wanted |= _SQL_CONSTRAINTS.get(table, {})
    wanted[f"{table}_pkey"] = "p"
    for name, kind in wanted.items():
        if constraints.get(name, ("",))[0] != kind:
            errors.append(
                _schema_error(
                    table,
                    f"has no constraint {name}",
                    "Compare the table with `sqlmigrate switchboard_todos 0001` and add it.",
                    "E022",
                )
            )
    return errors


def _compare_columns(
    connection: BaseDatabaseWrapper,
    model: type[models.Model],
    columns: dict[str, tuple[str, bool, bool]],
) -> list[checks.CheckMessage]:
    table = model._meta.db_table
    errors: list[checks.CheckMessage] = []
    fields = {field.column: field for field in model._meta.concrete_fields}
    for column, field in fields.items():
        wanted_type = field.db_type(connection)
        if column not in columns:
            errors.append(
                _schema_error(table, f"has no column {column} ({wanted_type})", None, "E020")
            )
            continue
        kind, not_null, has_default = columns[column]
        if kind != wanted_type:
            errors.append(
                _schema_error(table, f"column {column} is {kind}, not {wanted_type}", None, "E020")
            )
        if not_null == field.null:
            errors.append(
                _schema_error(
                    table,
                    f"column {column} is {'NOT NULL' if not_null else 'nullable'}, "
                    f"not {'nullable' if field.null else 'NOT NULL'}",
                    None,
                    "E020",
                )
            )
        if field.db_default is not NOT_PROVIDED and not has_default:
            errors.append(
                _schema_error(
                    table,
                    f"column {column} has no default; raw SQL inserts rely on it",
                    None,
                    "E020",
                )
            )
    for column, (_kind, not_null, has_default) in columns.items():
        if column not in fields and not_null and not has_default:
            errors.append(
                _schema_error(
                    table,
                    f"has a column {column} the model does not know, NOT NULL without a "
                    "default, so every insert fails",
                    None,
                    "E020",
                )
            )
    return errors


def _index_shape(statement: str, columns: dict[str, Any]) -> tuple[Any, ...]:
    """What matters in an index's CREATE statement, written by Django or by PostgreSQL.

    Uniqueness and the key (columns, order, INCLUDE) compared as written; a predicate by the
    columns and the literals it names, as PostgreSQL rewrites IN, NOT and casts its own way.
    """
    text = statement.lower()
    body, _, predicate = text.partition(" where ")
    key = " ".join(_NOISE.sub(" ", body.split(" on ", 1)[1]).split()[1:]).replace(" ,", ",")
    literals = sorted(_LITERAL.findall(predicate))
    words = sorted({word for word in _WORD.findall(_LITERAL.sub("", predicate)) if word in columns})
    return (text.startswith("create unique"), key, bool(predicate), words, literals)


def _schema_error(table: str, problem: str, fix: str | None, error_id: str) -> checks.Error:
    return checks.Error(
        f"Table {table!r} {problem}: it does not match the switchboard_todos migrations.",
        hint=(f"{fix} " if fix else "")
        + "A table created before `migrate --fake-initial` must be brought to the migrations' "
        "schema (see `manage.py sqlmigrate switchboard_todos`).",
        id=f"switchboard_todos.{error_id}",
    )
