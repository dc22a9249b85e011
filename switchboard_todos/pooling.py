"""What a connection pooler between the app and PostgreSQL (PgBouncer, a managed one) changes.

Behind a pooler in transaction mode, each transaction of a client runs on whichever server
connection is free, so nothing may outlive it there: no LISTEN, no prepared statement, no
session setting (SWITCHBOARD_TODOS_POOLER, conf.POOLED_DEFAULTS). The LISTEN connection can
bypass the pooler (SWITCHBOARD_TODOS_LISTEN_URL).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections
from psycopg.conninfo import conninfo_to_dict

from switchboard_todos.conf import conf

#: The libpq parameters that are fields of a DATABASES entry; the others go to its OPTIONS.
_FIELDS = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}


def pooled(connection: psycopg.Connection[Any]) -> bool:
    """Whether `connection` reaches its server through a pooler.

    A pooler answers the client's connection itself, under a backend process id of its own
    (the cancel key it hands out), so the server's pg_backend_pid() differs from it.
    """
    row = connection.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and row[0] != connection.info.backend_pid


def listen_settings(alias: str) -> dict[str, Any] | None:
    """The DATABASES entry of the LISTEN connection to `alias`, if LISTEN_URL gives one: the
    alias's own, with what the connection string gives over it, and never from a pool."""
    url = conf.listen_url(alias)
    if url is None:
        return None
    base = connections.settings[alias]
    entry = {**base, "OPTIONS": dict(base.get("OPTIONS") or {})}
    entry["OPTIONS"].pop("pool", None)
    for name, value in conninfo_to_dict(url).items():
        if name in _FIELDS:
            entry[_FIELDS[name]] = value
        else:
            entry["OPTIONS"][name] = value
    return entry
