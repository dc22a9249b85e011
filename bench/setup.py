"""Point Django at a scratch benchmark database, created and migrated on demand."""

from __future__ import annotations

import os

import django
import psycopg
from psycopg import sql

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/switchboard_bench"


def configure() -> str:
    """Set up Django on BENCH_DATABASE_URL (default: a `switchboard_bench` database)."""
    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    server, _, name = url.rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url
