"""Faults of the database told apart from a todo's, the outage log, the connection timeouts."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, InternalError, OperationalError, connections

from switchboard_todos import faults


class _ReadOnly(Exception):
    sqlstate = faults.READ_ONLY


def read_only_error() -> InternalError:
    error = InternalError("cannot execute UPDATE in a read-only transaction")
    error.__cause__ = _ReadOnly()
    return error


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (OperationalError("server closed the connection unexpectedly"), True),
        (read_only_error(), True),
        (IntegrityError("violates check constraint"), False),
        (InternalError("current transaction is aborted"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_is_outage_tells_the_database_from_the_statement(error: Exception, outage: bool) -> None:
    assert faults.is_outage(error) is outage


def test_an_outage_is_logged_once_when_it_begins_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = faults.Outage("worker w1", base=0.5, cap=4.0)
    outage.passed()  # nothing to report
    with caplog.at_level(logging.INFO, "switchboard_todos.faults"):
        delays = [outage.failed("claim", read_only_error()) for _ in range(6)]
        threads = [
            threading.Thread(target=outage.failed, args=("heartbeat", OperationalError("x")))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        outage.passed()
        outage.passed()
    assert caplog.messages == [
        "worker w1: the database is read-only (claim: cannot execute UPDATE in a read-only "
        "transaction); backing off until it is back",
        caplog.messages[1],
    ]
    assert caplog.messages[1].startswith("worker w1: the database is back after")
    assert caplog.messages[1].endswith("(14 failed statements)")
    assert 0.25 <= delays[0] <= 0.5 and 2.0 <= delays[-1] <= 4.0  # doubling, capped, jittered
    assert not outage.ongoing


def test_timeouts_are_added_where_the_project_sets_none() -> None:
    options: dict[str, Any] = {"connect_timeout": 3, "options": "-c statement_timeout=1h"}
    merged = faults.with_timeouts(
        options, {"connect_timeout": 10, "keepalives": 1, "statement_timeout": "5min",
                  "lock_timeout": "30s"}
    )  # fmt: skip
    assert merged == {
        "connect_timeout": 3,
        "keepalives": 1,
        "options": "-c statement_timeout=1h -c lock_timeout=30s",
    }


def test_none_drops_a_default(settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_DATABASE_OPTIONS = {"statement_timeout": None, "lock_timeout": "2s"}
    options = faults.connection_options()
    assert "statement_timeout" not in options
    assert options["lock_timeout"] == "2s"
    assert options["connect_timeout"] == 10


@pytest.mark.django_db(transaction=True)
def test_the_worker_connections_get_the_timeouts() -> None:
    """Inside the block new connections carry them; after it, the settings are as before."""
    before = dict(connections.settings["default"].get("OPTIONS") or {})
    seen: list[Any] = []

    def connect() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
                )
                seen.append(cursor.fetchone())
        except DatabaseError as error:  # pragma: no cover - reported by the assertion
            seen.append(error)
        finally:
            connections.close_all()

    with faults.timeouts("default"):
        thread = threading.Thread(target=connect)  # a new thread: a new connection
        thread.start()
        thread.join()
    assert seen == [("5min", "30s")]
    assert dict(connections.settings["default"].get("OPTIONS") or {}) == before
