"""Point Django at a scratch benchmark database, created and migrated on demand.

The benchmarks empty `todos` over and over, so they never run on the project's own database:
BENCH_DATABASE_URL names theirs; without it, they use the database of DATABASE_URL (set by
`make bench`'s database wrapper) with `_bench` added to its name, on the same server, so that
two checkouts with databases of their own never empty each other's; without either,
`switchboard_bench` on the local server.
A scratch database migrated by another version of the code (one whose migrations have since been
renamed, as on a CI machine that keeps its databases) is dropped and created again.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import django
import psycopg
from psycopg import sql

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/switchboard_bench"
#: What the benchmark database's name adds to the project database's.
BENCH_SUFFIX = "_bench"
#: Set (by `--no-prepare`) to run our side with SWITCHBOARD_TODOS_PREPARE = False.
NO_PREPARE = "BENCH_NO_PREPARE"


def database_url() -> str:
    """The benchmark database's URL (see the module docstring)."""
    url = os.environ.get("BENCH_DATABASE_URL")
    if url:
        return url
    project = os.environ.get("DATABASE_URL")
    if project:
        parts = urlsplit(project)
        name = parts.path.lstrip("/") or "switchboard"
        return urlunsplit(parts._replace(path=f"/{name}{BENCH_SUFFIX}"))
    return DEFAULT_URL


def create_database(url: str, *, again: bool = False) -> None:
    """Create the database of `url` if it is missing; with `again`, drop it first."""
    server, _, name = url.rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        if again:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def foreign_migrations() -> set[tuple[str, str]]:
    """Migrations recorded as applied in the benchmark database that this code does not have."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    ours = {"switchboard_todos"}
    applied = {key for key in loader.applied_migrations if key[0] in ours}
    return applied - set(loader.disk_migrations)


def configure(*, migrate: bool = True) -> str:
    """Set up Django on the benchmark database; create and migrate it first with `migrate`."""
    url = database_url()
    if migrate:
        create_database(url)
    # Child processes inherit these, and with them the same database and settings.
    os.environ["DATABASE_URL"] = os.environ["BENCH_DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    if os.environ.get(NO_PREPARE):
        from django.conf import settings

        settings.SWITCHBOARD_TODOS_PREPARE = False
    if migrate:
        from django.core.management import call_command
        from django.db import connection

        if foreign_migrations():
            connection.close()
            create_database(url, again=True)
        call_command("migrate", verbosity=0)
    return url
