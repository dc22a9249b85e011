"""The failure history stays bounded: the last MAX_ERRORS_KEPT entries, each error trimmed to
MAX_ERROR_BYTES, and a count of the entries dropped; and its readers stay right once some are."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.db.models import F
from django.test import Client

from switchboard_todos import validation
from switchboard_todos.admin.display import failure_table
from switchboard_todos.backends import task_result
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo
from tests.tasks import add

LAPSED = timedelta(seconds=-5)


@pytest.fixture
def keep_three(settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_MAX_ERRORS_KEPT = 3


def failed_once(todo: Todo, number: int) -> None:
    Todo.objects.fail(todo.id, "w1", f"failure {number}", retry_in=0)


def lapsed_and_reaped(todo: Todo, number: int) -> None:
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=F("lease_expires_at") - timedelta(1))
    assert Todo.objects.reap_expired().requeued == 1


def lapsed_and_taken_over(todo: Todo, number: int) -> None:
    Todo.objects.filter(pk=todo.pk).update(lease_expires_at=F("lease_expires_at") - timedelta(1))
    assert Todo.objects.claim(todo.id, "w1", 60).owner == "w1"


@pytest.mark.parametrize(
    "ends_attempt",
    [failed_once, lapsed_and_reaped, lapsed_and_taken_over],
    ids=["fail", "reap_expired", "claim over a lapsed lease"],
)
def test_each_writer_keeps_the_last_entries_and_counts_the_dropped(
    keep_three: None, make_todo: MakeTodo, ends_attempt: Callable[[Todo, int], None]
) -> None:
    todo = make_todo(max_attempts=100)
    for number in range(1, 8):
        if Todo.objects.get(pk=todo.pk).state == State.PENDING:
            Todo.objects.claim(todo.id, "w1", 60)
        ends_attempt(todo, number)
    stored = Todo.objects.get(pk=todo.pk)
    assert [entry["attempt"] for entry in stored.errors] == [5, 6, 7]
    assert stored.errors_dropped == 4


def test_cancel_keeps_the_last_entries_too(keep_three: None, make_todo: MakeTodo) -> None:
    history = [{"attempt": n, "error": {"type": "", "message": str(n)}} for n in range(3)]
    todo = make_todo(errors=history, errors_dropped=2)
    Todo.objects.cancel(todo.id, "not needed")
    stored = Todo.objects.get(pk=todo.pk)
    assert [entry["error"]["message"] for entry in stored.errors] == ["1", "2", "not needed"]
    assert stored.errors_dropped == 3


def test_a_history_longer_than_the_setting_is_cut_at_its_next_entry(
    keep_three: None, make_todo: MakeTodo
) -> None:
    """Lowering the setting shortens existing histories as they grow, counting all dropped."""
    history = [{"attempt": n, "error": {"type": "", "message": str(n)}} for n in range(10)]
    todo = make_todo(state=State.CLAIMED, owner="w1", errors=history, attempt=11, max_attempts=20)
    Todo.objects.fail(todo.id, "w1", "eleventh")
    stored = Todo.objects.get(pk=todo.pk)
    assert [entry["attempt"] for entry in stored.errors] == [8, 9, 11]
    assert stored.errors_dropped == 8


def test_an_oversize_error_is_stored_trimmed_with_a_note(
    settings: Any, make_todo: MakeTodo
) -> None:
    settings.SWITCHBOARD_TODOS_MAX_ERROR_BYTES = 1000
    todo = make_todo(state=State.CLAIMED, owner="w1")
    failed = Todo.objects.fail(todo.id, "w1", {"type": "Boom", "message": "é" * 5000, "n": 1})
    entry = failed.errors[-1]["error"]
    assert len(json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode()) <= 1000
    assert entry["type"] == "Boom"
    assert entry["message"] and set(entry["message"]) == {"é"}
    assert "the limit is 1000" in entry["note"] and "head of its message" in entry["note"]
    assert failed.result == entry  # the result of a failed attempt is the same trimmed error


@pytest.mark.parametrize(
    "error",
    [
        "x" * 10_000,
        "\x01" * 10_000,  # each character a 6-byte escape
        "😀" * 10_000,
        {"type": "T" * 10_000, "detail": ["y" * 100] * 100},  # no message: the head of the JSON
    ],
    ids=["ascii", "escapes", "four-byte", "no message"],
)
def test_trimmed_errors_fit_the_limit(settings: Any, error: Any) -> None:
    settings.SWITCHBOARD_TODOS_MAX_ERROR_BYTES = 2048
    stored = validation.error(error)
    assert len(stored.encode()) <= 2048
    trimmed = json.loads(stored)
    assert set(trimmed) == {"type", "message", "note"}
    assert len(trimmed["message"]) > 100
    assert len(trimmed["type"]) <= validation.ERROR_TYPE_MAX_LENGTH


def test_an_error_within_the_limit_is_stored_as_given(settings: Any) -> None:
    settings.SWITCHBOARD_TODOS_MAX_ERROR_BYTES = 2048
    error = {"type": "T", "message": "m" * 1000, "traceback": "t" * 900}
    assert json.loads(validation.error(error)) == error


def test_task_results_count_every_attempt_once_entries_were_dropped(
    keep_three: None, make_todo: MakeTodo
) -> None:
    """TaskContext.attempt equals todo.attempt: a dropped attempt has an empty worker id."""
    todo = make_todo(
        kind="tests.tasks.add",
        payload={"args": [1, 2], "kwargs": {}, "backend": "default"},
        max_attempts=100,
    )
    for number in range(1, 7):
        Todo.objects.claim(todo.id, f"w{number}", 60)
        Todo.objects.fail(todo.id, f"w{number}", f"failure {number}", retry_in=0)
    Todo.objects.claim(todo.id, "w7", 60)
    result = task_result(Todo.objects.get(pk=todo.pk), add)
    assert result.worker_ids == ["", "", "", "w4", "w5", "w6", "w7"]
    assert result.attempts == 7 == Todo.objects.get(pk=todo.pk).attempt
    assert len(result.errors) == 3


def test_the_admin_says_how_many_attempts_are_not_kept(
    keep_three: None, make_todo: MakeTodo, admin_client: Client
) -> None:
    todo = make_todo(max_attempts=100)
    for number in range(1, 6):
        Todo.objects.claim(todo.id, "w1", 60)
        failed_once(todo, number)
    assert "The 2 failed attempts before these are not kept." in str(
        failure_table(Todo.objects.get(pk=todo.pk).errors, 2)
    )
    page = admin_client.get(f"/admin/switchboard_todos/todo/{quote(todo.pk)}/change/")
    assert "The 2 failed attempts before these are not kept." in page.content.decode()
