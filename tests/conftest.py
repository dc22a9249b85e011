"""Shared fixtures: a factory for todos in any state, and helpers for real concurrent clients."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection, connections
from django.db.models import DateTimeField, Func
from django.test import Client
from psycopg import sql

from devtools import database
from switchboard_todos.agents.service import identity
from switchboard_todos.claims.marks import marks
from switchboard_todos.managers.machinery import dependencies
from switchboard_todos.mcp.threads import close_threads
from switchboard_todos.models import ErrorEntry, State, Todo
from tests.helpers import entry_size

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent

#: The transaction's start, the clock every guarded statement and the health numbers read. Django's
#: Now() is the statement's, which under load runs seconds later inside the test's transaction.
TRANSACTION_NOW = Func(template="now()", output_field=DateTimeField())

#: What each state needs to be a state the transitions can produce.
_STATE_DEFAULTS: dict[str, dict[str, Any]] = {
    State.PENDING: {},
    State.CLAIMED: {"owner": "w1", "attempt": 1, "lease_expires_in": timedelta(seconds=30)},
    State.DONE: {"owner": "w1", "attempt": 1, "result": {"ok": True}},
    State.FAILED: {"attempt": 5, "result": {"type": "", "message": "boom"}},
}


def pytest_report_header() -> str:
    """Name the server under test, and how devtools/database.py chose it."""
    from django.conf import settings

    server = settings.DATABASES["default"]
    given = f"{server['NAME']} at {server['HOST']}:{server['PORT']}, from DATABASE_URL"
    return f"database: {database.chosen() or given}"


@pytest.fixture(autouse=True)
def _fresh_claim_marks() -> None:
    """Each test's claims start from the head of the index, whatever earlier tests claimed; its
    completes run lean, whatever dependencies earlier tests met; and its agents are read afresh
    (agents of the same names had other credentials before)."""
    marks.forget()
    dependencies.forget()
    identity.forget()


@pytest.fixture(autouse=True)
def _mcp_threads_closed() -> Iterator[None]:
    """The threads of the MCP tool calls a test made in this process keep their connections
    between calls (mcp/threads.py): closed after each test, so that none outlives its test's
    data, nor holds the test database when it is dropped."""
    yield
    close_threads()


@pytest.fixture
def make_todo(db: None) -> Callable[..., Todo]:
    """Insert a todo in any state; times are offsets from the database clock, never sleeps.

    make_todo(state=State.CLAIMED, owner="w1", lease_expires_in=timedelta(seconds=-5))

    `errors`, a list of entries, is written as the todo's failure history.
    """

    def make(
        *,
        state: str = State.PENDING,
        lease_expires_in: timedelta | None = None,
        next_retry_in: timedelta | None = None,
        created_ago: timedelta | None = None,
        **fields: Any,
    ) -> Todo:
        defaults = dict(_STATE_DEFAULTS[state])
        default_lease = defaults.pop("lease_expires_in", None)
        lease_expires_in = lease_expires_in if lease_expires_in is not None else default_lease
        values: dict[str, Any] = {"kind": "test.kind", **defaults, **fields, "state": state}
        if state == State.CLAIMED:
            values.setdefault("claimed_at", TRANSACTION_NOW)
        if state in (State.DONE, State.FAILED):
            values.setdefault("completed_at", TRANSACTION_NOW)
        if lease_expires_in is not None:
            values["lease_expires_at"] = TRANSACTION_NOW + lease_expires_in
        if next_retry_in is not None:
            values["next_retry_at"] = TRANSACTION_NOW + next_retry_in
        if created_ago is not None:
            # A todo without a fair key takes its turn when it is created.
            values["created_at"] = values["fair_at"] = TRANSACTION_NOW - created_ago
        history = values.pop("errors", [])
        values["errors_bytes"] = sum(entry_size(entry) for entry in history)
        todo = Todo.objects.create(**values)
        ErrorEntry.objects.bulk_create(
            ErrorEntry(
                todo=todo, attempt=entry.get("attempt", 0), entry=entry, size=entry_size(entry)
            )
            for entry in history
        )
        todo.refresh_from_db()
        return todo

    return make


@pytest.fixture
def gate(tmp_path: Path) -> dict[str, str]:
    """Payload for the `test.gate` handler: it records its start, then waits for the gate file."""
    return {"started": str(tmp_path / "started"), "gate": str(tmp_path / "gate")}


def run_in_threads(count: int, target: Callable[[int], T]) -> list[T]:
    """Run target(0..count-1) at once, each thread on its own database connection.

    A barrier lines the threads up so they really race; each closes its connection after.
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = target(index)
        except BaseException as error:  # re-raised in the main thread below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def database_url() -> str:
    """The URL of the database the tests use right now (the test database, during a test)."""
    settings = connection.settings_dict
    user = quote(settings["USER"] or "", safe="")
    password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    host = settings["HOST"] or "127.0.0.1"
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"postgres://{user}{password}@{host}{port}/{settings['NAME']}"


#: Set on a test by `vacuumed`: its todos are vacuumed once its transaction has rolled back.
_VACUUM_AFTER = pytest.StashKey[bool]()


@pytest.fixture
def vacuumed(request: pytest.FixtureRequest) -> None:
    """VACUUM todos after the test, once its transaction has rolled back.

    The rows a test inserts and rolls back stay in the table, dead, until a vacuum, and the
    server runs without autovacuum: after test_sql's backlogs (60,000 rows each), every
    sequential scan of todos read millions of them, and the property tests of test_validation
    took 7 s each instead of 0.5. A test that inserts tens of thousands of rows asks for this.
    """
    request.node.stash[_VACUUM_AFTER] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run `vacuumed`'s VACUUM after every fixture's teardown: the db fixture's rollback too.
    Not after the last test, whose teardown drops the test database."""
    wanted = item.stash.get(_VACUUM_AFTER, False) and nextitem is not None
    url = database_url() if wanted else None
    yield
    if url is not None:
        with psycopg.connect(url, autocommit=True) as vacuuming:
            vacuuming.execute("VACUUM todos")


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for a child Python process that talks to the test database."""
    return child_environment()


def child_environment() -> dict[str, str]:
    """`subprocess_env`, for fixtures of a wider scope than a test's."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url(),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def spawn(subprocess_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `python -m <module> <args>` against the test database; kill leftovers after."""
    started: list[subprocess.Popen[str]] = []

    def start(module: str, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def alter_test_database(clause: str) -> None:
    """ALTER DATABASE <the test database> <clause>, from the maintenance database."""
    name = connection.settings_dict["NAME"]
    with psycopg.connect(database_url().rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} {}").format(sql.Identifier(name), sql.SQL(clause)))


def set_read_only(on: bool) -> None:
    """Make new sessions of the test database read-only, as after a failover to a standby."""
    alter_test_database(
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )


@pytest.fixture
def read_only_database() -> Iterator[Callable[[bool], None]]:
    """Turn the test database read-only for new sessions and back; always writable after."""
    try:
        yield set_read_only
    finally:
        set_read_only(False)


_usernames = (f"operator{n}" for n in itertools.count())


@pytest.fixture
def operator(db: None) -> Callable[..., Client]:
    """A logged-in staff client holding exactly the given permissions of the app (admin tests).

    operator("view_todo", "requeue_todo")
    """

    def make(*codenames: str) -> Client:
        from django.contrib.auth.models import Permission, User

        user = User.objects.create_user(username=next(_usernames), password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="switchboard_todos", codename__in=codenames
            )
        )
        client = Client()
        client.force_login(user)
        return client

    return make
