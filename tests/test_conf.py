"""Settings are read once and kept, and read again when Django says one changed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from switchboard_todos.conf import DEFAULTS, conf

DEFAULT = DEFAULTS["MAX_JSON_BYTES"]


@pytest.fixture
def unannounced() -> Iterator[None]:
    """Clean up a setting changed behind Django's back."""
    yield
    delattr(django_settings, "SWITCHBOARD_TODOS_MAX_JSON_BYTES")
    conf.forget()


def test_a_changed_setting_is_read_again(settings: Any) -> None:
    """override_settings and pytest-django's `settings` take effect at the next use."""
    assert conf.MAX_JSON_BYTES == DEFAULT
    settings.SWITCHBOARD_TODOS_MAX_JSON_BYTES = 100
    assert conf.MAX_JSON_BYTES == 100
    with override_settings(SWITCHBOARD_TODOS_MAX_JSON_BYTES=7):
        assert conf.MAX_JSON_BYTES == 7
    assert conf.MAX_JSON_BYTES == 100


def test_a_setting_is_kept_between_uses(unannounced: None) -> None:
    """The hot paths read settings per todo: a value is kept, not looked up each time."""
    assert conf.MAX_JSON_BYTES == DEFAULT
    django_settings.SWITCHBOARD_TODOS_MAX_JSON_BYTES = 7  # no setting_changed signal
    assert conf.MAX_JSON_BYTES == DEFAULT


@pytest.mark.parametrize(
    ("given", "listen", "prepare", "generic_plans"),
    [
        ({}, True, True, True),
        ({"POOLER": "session"}, True, True, True),
        ({"POOLER": "transaction"}, False, False, False),
        ({"POOLER": "transaction", "LISTEN_URL": "host=db"}, True, False, False),
        ({"POOLER": "transaction", "PREPARE": True, "GENERIC_PLANS": True}, False, True, False),
        ({"POOLER": "session", "LISTEN": False, "PREPARE": False}, False, False, True),
    ],
)
def test_the_pooler_gives_the_old_settings_their_defaults(
    settings: Any, given: dict[str, Any], listen: bool, prepare: bool, generic_plans: bool
) -> None:
    """POOLER gives LISTEN, PREPARE and GENERIC_PLANS defaults; set, LISTEN and PREPARE win;
    GENERIC_PLANS stays off behind a transaction pooler (a session setting)."""
    for name, value in given.items():
        setattr(settings, f"SWITCHBOARD_TODOS_{name}", value)
    resolved = conf.LISTEN, conf.PREPARE, conf.GENERIC_PLANS
    assert resolved == (listen, prepare, generic_plans)


def test_listen_url_is_the_default_database_s_or_each_alias_s(settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_LISTEN_URL = "host=db"
    assert (conf.listen_url("default"), conf.listen_url("eu")) == ("host=db", None)
    settings.SWITCHBOARD_TODOS_LISTEN_URL = {"eu": "host=eu-db"}
    assert (conf.listen_url("default"), conf.listen_url("eu")) == (None, "host=eu-db")


def test_behind_a_pooler_the_worker_sends_no_server_settings_of_its_own(settings: Any) -> None:
    """PgBouncer before 1.20 refuses a connection with `options`: the default statement and
    lock timeouts are left out; one the project sets is sent."""
    from switchboard_todos.faults import connection_options

    assert connection_options()["statement_timeout"] == "5min"
    settings.SWITCHBOARD_TODOS_POOLER = "transaction"
    assert "statement_timeout" not in connection_options()
    assert connection_options()["connect_timeout"] == 10
    settings.SWITCHBOARD_TODOS_DATABASE_OPTIONS = {"lock_timeout": "10s"}
    assert connection_options()["lock_timeout"] == "10s"
