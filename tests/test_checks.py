"""System checks: one test per check id."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.db import connection, connections
from django.test import override_settings

from switchboard_todos import checks


def ids(errors: list[Any]) -> list[str]:
    return [error.id for error in errors]


def test_postgresql_passes() -> None:
    """The test database is PostgreSQL: no errors, and no connection was needed."""
    assert checks.check_database_vendor() == []
    assert checks.check_settings() == []


def test_e001_other_database_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-PostgreSQL database for the app is an error with a hint."""
    monkeypatch.setattr(connection, "vendor", "sqlite")
    errors = checks.check_database_vendor()
    assert ids(errors) == ["switchboard_todos.E001"]
    assert "uses sqlite" in errors[0].msg and errors[0].hint


def test_e001_from_manage_py_check_with_sqlite(tmp_path: Any) -> None:
    """`manage.py check` fails with E001 when the default database is SQLite."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "switchboard_todos.E001" in result.stderr


@pytest.mark.parametrize(
    ("setting", "value", "error_id"),
    [
        ("BACKOFF_BASE", -1, "switchboard_todos.E002"),
        ("BACKOFF_BASE", "5", "switchboard_todos.E002"),
        ("BACKOFF_MAX", None, "switchboard_todos.E003"),
        ("BACKOFF_JITTER", 1.5, "switchboard_todos.E004"),
        ("BACKOFF_JITTER", True, "switchboard_todos.E004"),
        ("MAX_JSON_BYTES", 0, "switchboard_todos.E005"),
        ("LISTEN", "no", "switchboard_todos.E008"),
        ("PREPARE", 0, "switchboard_todos.E009"),
        ("GENERIC_PLANS", "yes", "switchboard_todos.E025"),
        ("HORIZON_WARNING_AGE", -1, "switchboard_todos.E010"),
        ("DEAD_TUPLES_WARNING", "many", "switchboard_todos.E011"),
        ("DEFAULT_TTL", 0, "switchboard_todos.E012"),
        ("AGENT_CACHE_SECONDS", -1, "switchboard_todos.E029"),
        ("AGENT_CACHE_SECONDS", 7200, "switchboard_todos.E029"),
        ("AGENT_BURST_SECONDS", 0.5, "switchboard_todos.E030"),
        ("AGENT_BURST_SECONDS", 61, "switchboard_todos.E030"),
        ("AGENT_BURST_SECONDS", "6", "switchboard_todos.E030"),
        ("MAX_ERRORS_KEPT", 0, "switchboard_todos.E013"),
        ("MAX_ERROR_BYTES", 1.5, "switchboard_todos.E014"),
        ("MAX_PROGRESS_BYTES", "16k", "switchboard_todos.E015"),
        ("REAP_BATCH", -1, "switchboard_todos.E016"),
        ("AGENT_MAX_WAITS", None, "switchboard_todos.E017"),
        ("AGENT_MAX_SESSIONS", 0, "switchboard_todos.E018"),
        ("AGENT_MAX_CONCURRENT", "16", "switchboard_todos.E027"),
        ("AGENT_MAX_HELD", True, "switchboard_todos.E019"),
        ("AGENT_MAX_CREATES_PER_MINUTE", 0, "switchboard_todos.E023"),
        ("AGENT_MAX_ATTEMPTS", 2.0, "switchboard_todos.E024"),
        ("TASK_TTL_MAX", 0, "switchboard_todos.E044"),
        ("DATABASE_OPTIONS", "connect_timeout=5", "switchboard_todos.E040"),
        ("DATABASE_OPTIONS", {"statement_timeout": "5 min"}, "switchboard_todos.E040"),
        ("SCHEDULES", {"x": {"cron": "* * *", "kind": "k"}}, "switchboard_todos.E041"),
        ("SCHEDULES", {"x": {"cron": "* * * * *"}}, "switchboard_todos.E041"),
        ("QUEUE_DATABASES", ["eu-*"], "switchboard_todos.E042"),
        ("QUEUE_DATABASES", {"eu-*": 1}, "switchboard_todos.E042"),
        ("QUEUE_DATABASES", {"eu-*": "nowhere"}, "switchboard_todos.E043"),
        ("POOLER", "pgbouncer", "switchboard_todos.E050"),
        ("LISTEN_URL", 5432, "switchboard_todos.E051"),
        ("LISTEN_URL", "not a connection string", "switchboard_todos.E051"),
        ("LISTEN_URL", {"nowhere": "host=db"}, "switchboard_todos.E051"),
        ("LISTEN_URL", {"default": ["host=db"]}, "switchboard_todos.E051"),
    ],
)
def test_settings_type_and_range(setting: str, value: Any, error_id: str) -> None:
    """Each SWITCHBOARD_TODOS_* setting out of type or range is reported by its id."""
    with override_settings(**{f"SWITCHBOARD_TODOS_{setting}": value}):
        errors = checks.check_settings()
    assert ids(errors) == [error_id]
    assert f"SWITCHBOARD_TODOS_{setting}" in errors[0].msg and errors[0].hint


@override_settings(SWITCHBOARD_TODOS_BACKOFF_BASE=60, SWITCHBOARD_TODOS_BACKOFF_MAX=10)
def test_e006_cap_below_base() -> None:
    """A cap below the base makes every retry wait the cap."""
    assert ids(checks.check_settings()) == ["switchboard_todos.E006"]


@pytest.mark.django_db
def test_e007_server_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The database-tagged check reads the server version; 12 is too old."""
    assert checks.check_database_version(databases=["default"]) == []
    monkeypatch.setattr(connections["default"], "pg_version", 120005)
    errors = checks.check_database_version(databases=["default"])
    assert ids(errors) == ["switchboard_todos.E007"]
    assert isinstance(errors[0], Error)


@pytest.mark.parametrize(
    ("pooler_settings", "expected"),
    [
        ({"POOLER": "transaction"}, []),
        ({"POOLER": "session", "LISTEN": True, "GENERIC_PLANS": True}, []),
        ({"POOLER": "transaction", "LISTEN": True}, ["switchboard_todos.E052"]),
        ({"POOLER": "transaction", "LISTEN": True, "LISTEN_URL": "host=db"}, []),
        ({"POOLER": "transaction", "GENERIC_PLANS": True}, ["switchboard_todos.W050"]),
    ],
)
def test_e052_w050_old_settings_against_a_transaction_pooler(
    pooler_settings: dict[str, Any], expected: list[str]
) -> None:
    """LISTEN set True behind a transaction pooler needs a LISTEN_URL; GENERIC_PLANS is ignored
    there, which a warning says."""
    with override_settings(**{f"SWITCHBOARD_TODOS_{k}": v for k, v in pooler_settings.items()}):
        assert ids(checks.check_settings()) == expected


@override_settings(SWITCHBOARD_TODOS_POOLER="transaction")
def test_e053_psycopg_prepares_behind_a_transaction_pooler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Django's server-side binding cursors with a prepare_threshold prepare on their own."""
    from django.conf import settings

    options = {"server_side_binding": True, "prepare_threshold": 5}
    monkeypatch.setitem(settings.DATABASES["default"], "OPTIONS", options)
    errors = checks.check_settings()
    assert ids(errors) == ["switchboard_todos.E053"]
    assert "prepare_threshold" in str(errors[0].hint)
    with override_settings(SWITCHBOARD_TODOS_PREPARE=True):  # PgBouncer 1.21+ keeps them
        assert checks.check_settings() == []


@pytest.mark.django_db
def test_w051_is_quiet_on_a_direct_connection() -> None:
    """Connected to the server itself, the pooler's check finds nothing (tests/test_pooler.py
    has it warn through PgBouncer)."""
    assert checks.check_pooler(databases=["default"]) == []
