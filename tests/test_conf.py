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
